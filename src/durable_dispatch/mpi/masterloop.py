"""The master's loop over an open campaign state, one turn after another, each turn a sequence
of named steps (:class:`MasterLoop`): what ``run_master`` runs once it has opened the state.

Each turn runs in this order: (1) read every message that arrived and hand every READY and
HEARTBEAT to the state, (2) dispatch (journal the dispatch, send WORK, report the send's
outcome), (3) hand every RESULT to the state, which journals each commit, (4) close the commits
an fsync covers and join invalid results, (5) sweep the watchdog, (6) the delivery point: the
one place user code runs (callbacks, notices, the work source's refill, progress), then the
operator's commands and a short pause when nothing came. Messages are received with
``ANY_SOURCE``/``ANY_TAG`` and never with a blocking call on one rank, so a hung or dead worker
never blocks the loop.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..batch import AllocationEnd
from ..campaign.control import Inbox, apply_command
from ..campaign.state import CampaignState
from ..core.drain import DrainPlan
from . import guard
from . import protocol as P
from .signals import SAME_REQUEST_SECONDS
from .transport import Transport

__all__ = ["MasterLoop"]

log = logging.getLogger("durable_dispatch.mpi")
#: After a message, the master polls again at once (yielding its core to any other runnable
#: process between polls) for this many seconds before it backs off with naps: a worker's
#: RESULT and READY follow its WORK within that in a busy campaign. Napping at once (20 us,
#: doubling to 1 ms; Linux's timer slack makes the shortest about 70 us) cost one-item
#: dispatches half their throughput under mpiexec.
SPIN = 0.0005
RECEIVE_LIMIT = 4096  # messages read per turn
PLAN_SECONDS = 0.5  # how often the drain before the allocation's end is weighed
PERSIST_SECONDS = 5.0  # at the end, how long to retry a disk that refuses the journal


class MasterLoop:
    """Turns of the master's loop over ``state`` until the work is done or a stop is due (see
    the module docs). ``run_master`` makes one, calls :meth:`run`, then :meth:`end`."""

    def __init__(
        self,
        state: CampaignState,
        link: Transport,
        *,
        stopping: Stopping,
        allocation: AllocationEnd,
        plan: DrainPlan,
        batch: int | str,
        linger: float,
        ft: bool,
    ) -> None:
        self.state, self.link, self.core = state, link, state.core
        self.stopping, self.allocation, self.plan = stopping, allocation, plan
        self.auto = batch == "auto"
        self.fixed = 1 if self.auto else int(batch)
        self.linger, self.ft = linger, ft
        self.operator = Inbox(os.fspath(state.directory))  # the operator's commands
        #: the ranks lost (or gone) in this run, with when
        self.lost: dict[int, float] = {}
        #: why the loop stopped before the work was done, or None
        self.reason: str | None = None
        self._linger_until: float | None = None
        self._room = True  # the next dispatch fits before the allocation's end
        self._next_plan = 0.0
        self._idle_sleep = 0.0
        self._heard = 0.0
        # a transport that sends without waiting (``MpiTransport``): WORK is posted, and a send
        # that fails later is reported by ``unsent`` (see ``Transport``)
        self._posting: Any = link if hasattr(link, "post") and hasattr(link, "unsent") else None

    def run(self, exhausted: Callable[[], bool], signals: list[int]) -> None:
        """Turn until the work is done (``exhausted()`` and nothing left) or a stop is due;
        ``signals``: the signals received so far (appended to as they come)."""
        while self.turn(exhausted(), signals):
            pass

    def turn(self, exhausted: bool, signals: list[int]) -> bool:
        """One turn (see the module docs); False when the loop ends."""
        state = self.state
        raw = time.monotonic()
        now = self.core.clock.observe(raw)  # a pause of the master is not counted
        if exhausted and self._done(now):
            return False
        if self.allocation.ends_at is not None:
            self._weigh_the_allocation(raw, now)
        self.reason = self.stopping.reason(now, state, signals, raw)
        if self.reason is not None:
            return False
        msgs = self.link.receive(RECEIVE_LIMIT)  # everything that arrived, never blocking
        if self.ft:
            self._check_failures(now)
        if self._posting is not None and self._posting.posted:
            self._send_failures(now)
        # (a turn that received nothing skips the steps with nothing to do: on a machine where
        # the ranks share cores, the master's idle turns take the workers' CPU)
        inbox = P.sort(msgs) if msgs else None
        if inbox is not None:
            self._hear(inbox, now)  # 1. READY and HEARTBEAT, and workers that are gone
        self._dispatch(now)  # 2. persist (journal) before send; the deadline starts after
        if inbox is not None:
            self._take_results(inbox, now)  # 3. RESULT (the items sent ahead first)
        state.tick(state.now(), drained=len(msgs) < RECEIVE_LIMIT)  # 4. close, join; 5. sweep
        state.deliver()  # 6. the delivery point
        if now >= self.operator.next_poll:
            self._steer(now)
        self._pace(raw, bool(msgs))
        return True

    def _done(self, now: float) -> bool:
        """The work source is exhausted: True when the work is done and no rank is parked (or
        the linger ran out)."""
        core, state = self.core, self.state
        if core.ledger.waiting:
            state.settle_waiting()  # nothing else can run: what waits never will
        if not state.done:  # (every callback returned, too)
            return False
        if self._linger_until is None:
            self._linger_until = now + self.linger
        return not core.parked_rank_count() or now >= self._linger_until

    def _batch(self) -> int:
        return self.core.auto_batch() if self.auto else self.fixed

    def _weigh_the_allocation(self, raw: float, now: float) -> None:
        """Every :data:`PLAN_SECONDS`: drain before the allocation's end, and whether the next
        dispatch still fits."""
        if raw >= self._next_plan:
            self._room = self.stopping.plan(
                self.plan, self.allocation, now, self.state, self._batch()
            )
            self._next_plan = raw + PLAN_SECONDS

    def _hear(self, inbox: Any, now: float) -> None:
        state = self.state
        for rank, host in inbox.hosts:  # a worker's first READY: where it runs
            state.note_host(rank, host)
        for rank, token in inbox.readies:
            state.on_ready(rank, token, now)
        for rank, token in inbox.beats:
            state.on_heartbeat(rank, token, now)
        for rank, why in inbox.gone:
            state.on_gone(rank, why, now)
            self.lost.setdefault(rank, time.time())  # it ends: no STOP for it

    def _dispatch(self, now: float) -> None:
        if self.stopping.draining or not self._room:
            return
        state, link = self.state, self.link
        batch = self._batch()
        while (s := state.next_send(now, batch)) is not None:
            if state.queued:  # (``on_dispatch``: told before the send, which may run the call)
                state.deliver(turn=False)
            deps = state.dependencies_of(s)  # None unless an item has ``after``
            msg = P.work_message(s, ahead=self.auto, dependencies=deps)
            if self._posting is not None:  # (its deadline starts once the send is started)
                error = self._posting.post(s.rank, P.WORK, msg, s.token)
            else:
                error = link.send(s.rank, P.WORK, msg)
            state.sent(s.token, state.now(), error)
            if error is not None and self.ft:
                self._check_failures(now)

    def _send_failures(self, now: float) -> None:
        """The WORK sends started in earlier turns that failed: each takes a failed send's
        compensation path (a dispatch whose worker answered meanwhile is not touched)."""
        failures = self._posting.unsent()
        for token, error in failures:
            log.warning("master: WORK %s failed: %s", token, error)
            self.state.sent(token, self.state.now(), error)
        if failures and self.ft:
            self._check_failures(now)

    def _take_results(self, inbox: Any, now: float) -> None:
        state = self.state
        for rank, token, costs, said in inbox.usage:  # (kept with the attempts)
            state.note_usage(rank, token, costs, said)
        for rank, token, ids, values, errors in inbox.parts:
            state.on_part(rank, token, ids, values, now, errors=errors)
        for rank, token, values, errors, failure in inbox.results:
            state.on_results(rank, token, values, now, errors=errors, failure=failure)

    def _steer(self, now: float) -> None:
        """Apply the operator's commands that are due: each is journaled durably before it is
        acknowledged (``control.apply_command``); a dispatch cancelled in flight is told to
        stop (an isolated child is killed); a ``drain`` drains as SIGUSR1 does."""
        if not (commands := self.operator.due(now)):
            return
        for c in commands:
            done = apply_command(self.state, c, running=True)
            for rank, token in done.stop:
                self.link.send(rank, P.CANCEL, P.encode({"token": str(token)}))
            if done.drain:
                self.stopping.operator_drain(now, self.state)

    def _pace(self, raw: float, heard: bool) -> None:
        """Poll again at once while messages come; then back off gently (never more than
        1 ms of added latency)."""
        if heard:
            self._idle_sleep = 0.0
            self._heard = raw
        elif raw - self._heard > SPIN:
            self._idle_sleep = min(0.001, self._idle_sleep * 2 or 0.00002)
            time.sleep(self._idle_sleep)
        else:  # a RESULT or READY is due soon (SPIN): poll again, but let others run
            os.sched_yield()

    def _check_failures(self, now: float) -> None:
        """ULFM: roll back the dispatches of the newly failed ranks and exclude them, all at
        once (ranks of one host reported together died with their node: their items are not
        charged)."""
        lost = self.lost
        new = sorted({r for r in self.link.failed_ranks() if r not in lost and r != 0})
        if not new:
            return
        for r in new:
            lost[r] = time.time()
            log.warning(
                "master: rank %d failed (ULFM, host %s); rolling back its dispatch",
                r,
                self.core.domains.host(r) or "unknown",
            )
        guard.peer_failed()  # MPI_Finalize may wait for them forever: leave without them
        self.state.ranks_lost(new, now, "process failed")

    def end(self) -> None:
        """After the last turn: the work a feed withdrew stays pending, the last deliveries,
        and nothing of the campaign in memory only if the disk allows (retried for
        :data:`PERSIST_SECONDS`; else the state's close raises ``NotDurableError``)."""
        state = self.state
        if self.core.ledger.put_back():  # the work a feed withdrew stays pending (Feed docs)
            self.reason = self.reason or "withdrawn"
        state.every_turn.clear()  # (no refill once the loop ended)
        state.deliver(wait=True)
        persisted(state, PERSIST_SECONDS)


def every(
    interval: float, progress: Callable[[dict[str, Any]], None], state: CampaignState
) -> Callable[[], None]:
    """A per-turn hook that calls ``progress`` with the statistics at most every ``interval``
    seconds (the first turn's included)."""
    due = [0.0]

    def report() -> None:
        t = time.monotonic()
        if t >= due[0]:
            due[0] = t + interval
            progress(state.statistics().as_dict())

    return report


def persisted(state: CampaignState, seconds: float) -> bool:
    """True once nothing of the campaign lives in memory only: with the journal degraded (a
    full or failing disk), retry persisting it for up to ``seconds`` (the workers wait for
    their STOP meanwhile), so a disk that frees soon still gets the records; after that the
    state's close raises ``NotDurableError``."""
    end = time.monotonic() + seconds
    while not state.journal.health.ok or state.statistics().commits_in_memory:
        if state.try_restore() and not state.statistics().commits_in_memory:
            return True
        if time.monotonic() >= end:
            log.error(
                "master: the disk still refuses the journal: %d commit(s) are in memory only "
                "(a later run does them again)",
                state.statistics().commits_in_memory,
            )
            return False
        time.sleep(0.25)
    return True


class Stopping:
    """When the master loop stops before its work is done, and why (no I/O: it is given the
    time, the core and the signals received, and logs its decision)."""

    def __init__(
        self, start: float, max_seconds: float | None, grace: float, drain_seconds: float
    ) -> None:
        self.start, self.max_seconds = start, max_seconds
        self.grace, self.drain_seconds = grace, drain_seconds
        self.drain_until: float | None = None  # set by the first signal
        self.why_drain = "signal"  # or "drain": an operator's ``durable-dispatch drain``

    @property
    def draining(self) -> bool:
        """True once a signal asked the campaign to drain: nothing new is dispatched."""
        return self.drain_until is not None

    def operator_drain(self, now: float, state: CampaignState) -> None:
        """An operator's ``durable-dispatch drain``: drain as on a first SIGUSR1."""
        self._drain(now, state, "drain", "drain requested by an operator")

    def plan(
        self,
        plan: DrainPlan,
        allocation: AllocationEnd,
        now: float,
        state: CampaignState,
        batch: int,
    ) -> bool:
        """Weigh the drain before the allocation's end: begin it when the work in flight
        and the close need the time left, or when nothing runs and nothing fits any more.
        Returns whether a dispatch sent now fits (``now`` is the observed clock)."""
        ends_at = allocation.ends_at
        if ends_at is None or self.draining:
            return True
        core = state.core
        wall = time.time()
        times = core.policy.task_times
        flying = core.open_dispatches(now)
        waiting = batch if core.ledger.frontier and not core.in_flight_count() else 0
        if plan.drain_now(wall, ends_at, flying, times, waiting):
            margin = plan.margin(ends_at, flying, times)
            self._drain(
                now,
                state,
                "allocation",
                f"the allocation ends in {ends_at - wall:.0f}s ({allocation.source}; margin "
                f"{margin:.0f}s)",
                until=now + (plan.drain_until(wall, ends_at) - wall),
            )
        return plan.fits(wall, ends_at, batch, times)

    def _drain(
        self, now: float, state: CampaignState, why: str, cause: str, until: float | None = None
    ) -> None:
        """Begin the drain (once; what asked first names it): nothing new is dispatched, and
        the in-flight work has ``drain_seconds`` (or until ``until``) to finish."""
        if self.drain_until is None:
            self.drain_until = now + self.drain_seconds if until is None else until
            self.why_drain = why
            log.warning(
                "master: %s: draining (no new dispatch; up to %.0fs for %d in flight; a second "
                "signal, %gs or more after it, stops at once)",
                cause,
                self.drain_until - now,
                state.core.in_flight_count(),
                SAME_REQUEST_SECONDS,
            )

    def reason(
        self, now: float, state: CampaignState, signals: list[int], raw: float
    ) -> str | None:
        """``"max_seconds"``, ``"signal"``, ``"drain"``, ``"no workers left"``, ``"every
        worker parked"``, or None to go on. ``now`` is the observed clock (grace and drain
        bounds), ``raw`` the monotonic clock (``max_seconds`` counts a pause of the master
        too)."""
        if self.max_seconds is not None and raw - self.start > self.max_seconds:
            log.warning("master: giving up after %.0fs (resumable)", raw - self.start)
            return "max_seconds"
        core = state.core
        if signals:
            self._drain(now, state, "signal", f"{signal.Signals(signals[0]).name} received")
            if len(signals) > 1:
                return "signal"  # a second request: stop at once
        if self.drain_until is not None and (not core.in_flight_count() or now >= self.drain_until):
            return self.why_drain
        return state.stop_reason(now, grace=self.grace)


def stop_or_abort(
    link: Transport, ranks: Iterable[int], lost: dict[int, float], timeout: float
) -> None:
    """On an error on rank 0 (the job must not hang): STOP to every worker; if one cannot be
    delivered, abort the job (MPI_Abort), because a worker that never takes its STOP keeps
    rank 0 waiting in MPI_Finalize forever. The caller closed the state first."""
    if not stop_all(link, ranks, lost, timeout):
        log.error("master: STOP could not be delivered to every worker; MPI_Abort")
        link.abort(1)


def stop_all(link: Transport, ranks: Iterable[int], lost: dict[int, float], timeout: float) -> bool:
    """Send STOP to every live worker without waiting on any one of them for long; False when
    some send did not complete within ``timeout``."""
    live = [r for r in ranks if r not in lost]
    return link.stop(live, P.encode({}), P.STOP, timeout)
