"""The master loop: a thin shell around the dispatch core and the durable campaign state.

It talks to the workers through a :class:`~durable_dispatch.mpi.transport.Transport`: MPI
(:class:`~durable_dispatch.mpi.transport.MpiTransport`) in a job, or
``durable_dispatch.testing.LocalWorkers`` in a test.

Each turn runs in this order: (1) drain messages and hand every READY and HEARTBEAT to the core,
(2) dispatch (journal the dispatch, send WORK, report the send's outcome), (3) hand every RESULT
to the core and journal each commit durably before the user's callback sees it, (4) join invalid
results, (5) sweep the watchdog. Messages are received with ``ANY_SOURCE``/``ANY_TAG`` and never
with a blocking call on one rank, so a hung or dead worker never blocks the loop.

Failure handling. With ULFM (Open MPI started with ``--with-ft ulfm``) a dead rank is seen
through MPI's failure notification (``Comm.Get_failed``): its dispatch is rolled back at once,
the failure is acknowledged and the rank is excluded (point-to-point only, so no shrink is
needed). Without ULFM the runtime gives no such signal (Open MPI then aborts the whole job when a
rank dies; the durable state makes the restart resume), and a hung rank stays parked while the
watchdog moves its work. The mode in force is reported in the result.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..campaign.control import Inbox, apply_command
from ..campaign.identity import check_name, default_name, record_name
from ..campaign.state import CampaignState, OnCommit
from ..core import RetryPolicy, WatchdogConfig, WorkItem
from ..core.allocation import DRAIN_MARGIN, DrainPlan
from ..errors import UsageError
from ..views.view import CampaignView, campaign_view
from . import guard
from . import protocol as P
from .allocation import AllocationEnd
from .context import CHILD_MARKER
from .launchcheck import require_workers
from .signals import SAME_REQUEST_SECONDS, CaughtSignals
from .transport import MpiTransport, Transport, ulfm_mode

__all__ = ["run_master", "MasterReport", "ulfm_mode", "finish", "Feed"]

log = logging.getLogger("durable_dispatch.mpi")
#: After a message, the master polls again at once (yielding its core to any other runnable
#: process between polls) for this many seconds before it backs off with naps: a worker's
#: RESULT and READY follow its WORK within that in a busy campaign. Napping at once (20 us,
#: doubling to 1 ms; Linux's timer slack makes the shortest about 70 us) cost one-item
#: dispatches half their throughput under mpiexec.
SPIN = 0.0005
_RECEIVE_LIMIT = 4096  # messages read per turn


def finish(comm: Any = None, code: int = 0) -> None:
    """End an MPI process cleanly: call at the very end of the master and of every worker.

    Without ULFM it returns and mpi4py finalizes MPI at exit as usual. Under ULFM, after a rank
    has died, Open MPI's ``MPI_Finalize`` can wait forever for the dead process (a known runtime
    issue, open-mpi/ompi#11404), so the process flushes its output and leaves with ``os._exit``
    instead; with failure recovery enabled the runtime treats that as a normal end. Everything
    durable has been fsynced before: ``run_master`` closes its state before returning. A worker
    whose master died leaves with status 1, whatever ``code`` says: under ULFM the job's status
    is its ranks', and a batch script must not read a killed master's job as a success.
    """
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    if ulfm_mode(comm):
        guard.exit_now(guard.exit_status(code))


@dataclass
class MasterReport:
    """What :func:`run_master` returns.

    Attributes:
        stats: the campaign's statistics (``CampaignStats.as_dict()``).
        mode: ``"ulfm"`` or ``"no-ulfm"``.
        finished: True when every work item was committed, deferred or cancelled. (When the
            disk refuses the journal to the end, commits live in memory only: ``run_master``
            retries it for a few seconds, then raises ``NotDurableError`` from closing the
            state.)
        lost_ranks: rank -> wall-clock time the master rolled back its dispatch: ranks the
            runtime reported dead (ULFM), and workers that said they failed (GONE).
        seconds: the campaign's duration.
        reason: why it stopped before finishing (None when ``finished``): ``"signal"`` (it
            drained on SIGTERM, SIGINT or SIGUSR1), ``"drain"`` (it drained on an operator's
            ``durable-dispatch drain``, as on SIGUSR1), ``"max_seconds"``, ``"allocation"`` (it
            drained before the allocation's end: ``ends_at``), ``"no workers left"`` or
            ``"every worker parked"`` (work remains, and no parked rank sent its exact READY
            within ``stuck_grace``), or ``"withdrawn"`` (the :class:`Feed` withdrew pending work
            from this run, as the futures executor's ``shutdown(cancel_futures=True)`` does:
            it ran everything else). The state directory resumes later.
        view: the campaign as the master left it, the numbers ``durable-dispatch stats``
            shows (:class:`~durable_dispatch.views.view.CampaignView`: committed, deferred, pending,
            failures by kind ...; nothing is in flight once the master returned).
    """

    stats: dict[str, Any]
    mode: str
    finished: bool
    lost_ranks: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0
    reason: str | None = None
    view: CampaignView | None = None


def run_master(
    work: Iterable[WorkItem] | Feed,
    state_dir: str | os.PathLike[str],
    on_commit: OnCommit | None = None,
    *,
    comm: Any = None,
    watchdog: WatchdogConfig | None = None,
    retry: RetryPolicy | None = None,
    sync: str = "batch",
    progress: Callable[[dict[str, Any]], None] | bool | None = None,
    progress_interval: float = 0.5,
    max_seconds: float | None = None,
    stop_timeout: float = 10.0,
    linger: float = 2.0,
    batch: int | str = 1,
    stuck_grace: float | None = None,
    drain_seconds: float = 60.0,
    ends_at: float | None = None,
    drain_margin: float | None = None,
    campaign: str | None = None,
) -> MasterReport:
    """Run a campaign from rank 0 until every work item is committed or deferred.

    Args:
        work: the work items (stable semantic IDs): a list, or a generator of millions,
            consumed as the frontier drains (in chunks of 65,536 whenever fewer than 16,384
            items are pending, never all in memory). On a resumed state directory known IDs are
            skipped, so pass the whole work source every time. Or a :class:`Feed`, for work
            that arrives while the campaign runs.
        state_dir: the campaign's state directory (see ``docs/state-format.md``).
        on_commit: ``on_commit(work_id, result)``, called once a result is journaled durably (while
            the journal is degraded by a disk fault, for a memory-only commit: give it a parameter
            ``durable`` to be told, ``durable=False``); at least once: a commit whose callback
            did not return (a crash, an exception) is delivered again when the campaign resumes,
            before anything is dispatched, so make it idempotent by work ID (an upsert). It may
            return the work items that result spawns: they are submitted durably before the
            commit counts as delivered, known work IDs are skipped (so a child runs once however
            often its parent's callback runs, and a child two parents name is one item); give
            children deterministic IDs (a digest of their input, a path, a node name). The campaign
            is done when nothing is pending or in flight and every callback has returned. Read every
            result back with :func:`durable_dispatch.read_results`.
        comm: the communicator (``MPI.COMM_WORLD``); rank 0 is the master, all others workers.
            Or a :class:`~durable_dispatch.mpi.transport.Transport`, such as
            ``durable_dispatch.testing.LocalWorkers(fn)`` to test a campaign in-process.
        watchdog: deadlines (default: ``WatchdogConfig.from_env(os.environ)``).
        retry: retry budgets (default: ``RetryPolicy.from_env(os.environ)``).
        sync: the state journal's sync policy.
        progress: called with the stats dict every ``progress_interval`` seconds; or True
            for a progress line on rank 0's standard error when it is a terminal (committed,
            left, in flight, deferred, parked, rate and ETA), ended cleanly at the end; off
            when standard error is not a terminal (a batch job's log).
        max_seconds: give up after this long (the state directory resumes later).
        stop_timeout: how long to wait for STOP messages to be delivered at the end.
        linger: once all work is done, keep serving for up to this many seconds while ranks are
            parked, so slow workers, and isolating workers that just killed a timed-out item,
            can send their exact READY (their late RESULTs are classified stale) and end
            unparked. It ends as soon as no rank is parked; 0 stops at once; hung ranks never
            delay the end by more than this.
        batch: work items per dispatch (one token, one WORK message, one journal record and one
            RESULT for all of them). 1 suits tasks that take seconds; for tasks of milliseconds
            or less, 16-64 spreads the per-message cost over many items. A dispatch's deadline
            is its items' timeouts added up (the watchdog's seconds once for items without
            one), so keep ``batch`` x task time well under the watchdog, or send heartbeats. If a
            multi-item dispatch fails as a whole, its items are retried alone, uncharged.
            ``"auto"`` sizes each dispatch from the measured time per item: about 50 ms of work
            and at most a quarter of the watchdog's deadline, 1 to 64 items, starting at 1 and
            at most doubling (``Dispatcher.auto_batch``); tasks of 50 ms or more go alone.
        stuck_grace: when work remains and every live worker is parked (each hung, or too slow
            to send its exact READY), wait this long (default: the watchdog's seconds, at least
            5) for one to come back, then stop with ``reason="every worker parked"`` instead of
            spinning. Hung functions need worker isolation to give their ranks back.
        drain_seconds: on SIGTERM, SIGINT or SIGUSR1 (a batch system's time limit, Ctrl-C),
            stop dispatching, wait up to this long for the work in flight, commit what comes,
            then stop with ``reason="signal"``. Signals within 5 s of the first are the same
            request (Slurm delivers one event several times); a later one stops at once. The
            handlers are installed only while this runs, in the main thread.
        ends_at: when the allocation ends (a UNIX time; default: ``DD_ENDS_AT``, else what the
            batch system says: Slurm's end time, read at the start and every minute, or Flux's
            ``flux job timeleft``; see :mod:`durable_dispatch.mpi.allocation`). The master
            drains as on SIGUSR1 before it, early enough for the work in flight and its close,
            stops with ``reason="allocation"``, and near the end sends only work expected to
            finish in time (:mod:`durable_dispatch.core.allocation`). No signal is needed.
        drain_margin: the least time before that end at which the drain begins (default:
            ``DD_DRAIN_MARGIN``, else 60 s), at most a quarter of the allocation's length; the
            margin is longer when the work in flight is expected to need longer, from the task
            times observed.
        campaign: the campaign's name, recorded in a fresh state directory; default: the main
            script's file name. A state directory that recorded another name is refused with
            :class:`~durable_dispatch.errors.CampaignMismatchError` before anything is added;
            one written before names were recorded adopts this one.

    Returns:
        A :class:`MasterReport`.

    Raises:
        UsageError: ``batch`` is not an integer >= 1 nor ``"auto"``, or this runs inside an
            isolated child (see ``run_worker(isolate=True)``).
        ConfigurationError: an MPI world of size 1 (no workers; several processes that each
            see a world of 1 when a launcher did not match the MPI): the message names the fix
            (:mod:`.launchcheck`).
        CampaignMismatchError: ``state_dir`` belongs to another campaign (nothing added).
    """
    if os.environ.get(CHILD_MARKER):
        raise UsageError(
            "run_master was called inside an isolated child: the campaign script runs its MPI "
            "part when imported; put it under 'if __name__ == \"__main__\":'"
        )
    if batch != "auto" and (type(batch) is not int or batch < 1):
        _refuse(f"batch must be an integer >= 1 or 'auto', got {batch!r}", comm, stop_timeout)
    link: Transport = comm if isinstance(comm, Transport) else MpiTransport(comm)
    if isinstance(link, MpiTransport):
        require_workers(link.comm)  # U10: a world of size 1 fails now, not resumably
    ft = link.ulfm
    if watchdog is None:
        watchdog = WatchdogConfig.from_env(os.environ)
        for c in watchdog.corrections:
            log.warning("configuration: %s", c)
    if retry is None:
        retry = RetryPolicy.from_env(os.environ)
    for c in retry.corrections if isinstance(retry, RetryPolicy) else ():
        log.warning("configuration: %s", c)
    size = link.size
    margin_floor = _drain_margin(drain_margin)
    opening = time.monotonic()
    name = default_name() if campaign is None else campaign
    try:
        check_name(state_dir, name)  # U16: before anything is opened or added
        state = CampaignState.open(
            state_dir,
            sync=sync,
            watchdog=watchdog,
            retry=retry,
            ranks=range(1, size),
            starting=True,  # every worker says READY once it is up (its child is running)
            on_commit=on_commit,  # U6: commits a crash or a failed callback kept come first
        )
    except BaseException as e:
        # U4: the workers are waiting for WORK; a master that cannot start must stop them, or
        # the job hangs forever (a second master on a running state directory, a full disk).
        log.error("master: cannot start (%s: %s); stopping the workers", type(e).__name__, e)
        _stop_or_abort(link, range(1, size), {}, stop_timeout)
        raise
    try:
        record_name(state.directory, name)  # (a fresh state directory, or one of before names)
    except BaseException:
        state.close()
        _stop_or_abort(link, range(1, size), {}, stop_timeout)
        raise
    log.info(
        "master: %d workers, mode %s, watchdog %gs",
        size - 1,
        "ulfm" if ft else "no-ulfm",
        watchdog.seconds,
    )
    core = state.core
    # U14: the allocation's end (read in a thread of its own) and the drain that fits before it
    allocation = AllocationEnd(ends_at=ends_at).start()
    plan = DrainPlan(
        floor=margin_floor,
        close_seconds=max(5.0, 2 * (time.monotonic() - opening)),  # the close writes what it read
        started=time.time(),
        step=_PLAN_SECONDS,
    )
    state.allocation = allocation.as_dict
    auto = batch == "auto"
    fixed = 1 if auto else int(batch)
    lost: dict[int, float] = {}
    start = time.monotonic()
    line = None
    if progress is True:
        import sys

        from ..progress import terminal_progress

        progress = line = terminal_progress(sys.stderr)
    elif progress is False:
        progress = None
    idle_sleep = 0.0
    heard = 0.0
    stopping = _Stopping(
        start,
        max_seconds,
        stuck_grace if stuck_grace is not None else max(5.0, core.watchdog.seconds),
        drain_seconds,
    )
    reason: str | None = None
    operator = Inbox(os.fspath(state.directory))  # O1: the operator's commands (control.py)
    with CaughtSignals() as caught:
        try:
            source = work if isinstance(work, Feed) else _Source(work)  # G3: as it drains
            source.attach(state)
            # the hooks of every turn run at the delivery point, after the queued ones
            state.every_turn.append(source.refill)
            if progress is not None:
                state.every_turn.append(_every(progress_interval, progress, state))
            state.deliver()  # what the last run did not deliver, first; then the first refill
            linger_until: float | None = None
            room = True  # the next dispatch fits before the allocation's end
            next_plan = start
            while True:
                raw = time.monotonic()
                now = core.clock.observe(raw)  # U7: a pause of the master is not counted
                if source.exhausted and core.ledger.waiting:
                    state.settle_waiting()  # G4: nothing else can run: they never will
                if source.exhausted and state.done:  # G1: every callback returned, too
                    if linger_until is None:
                        linger_until = now + linger
                    if not core.parked_rank_count() or now >= linger_until:
                        break
                if raw >= next_plan and allocation.ends_at is not None:
                    size_now = core.auto_batch() if auto else fixed
                    room = stopping.plan(plan, allocation, now, state, size_now)
                    next_plan = raw + _PLAN_SECONDS
                reason = stopping.reason(now, state, caught.requests, raw)
                if reason is not None:
                    break
                # -- drain everything that arrived (never blocking on one rank)
                msgs = link.receive(_RECEIVE_LIMIT)
                inbox = P.sort(msgs)
                if ft:
                    _check_failures(link, state, lost, now)
                # 1. READY and HEARTBEAT (and workers that said they are gone)
                for rank, host in inbox.hosts:  # a worker's first READY: where it runs
                    state.note_host(rank, host)
                for rank, token in inbox.readies:
                    state.on_ready(rank, token, now)
                for rank, token in inbox.beats:
                    state.on_heartbeat(rank, token, now)
                for rank, why in inbox.gone:
                    state.on_gone(rank, why, now)
                    lost.setdefault(rank, time.time())  # it ends: no STOP for it
                # 2. dispatch: persist (journal) before send; the deadline starts when it returned
                while (
                    not stopping.draining
                    and room
                    and (s := state.next_send(now, core.auto_batch() if auto else fixed))
                    is not None
                ):
                    deps = state.dependencies_of(s)  # G4: None unless an item has ``after``
                    msg = P.work_message(s, ahead=auto, dependencies=deps)
                    error = link.send(s.rank, P.WORK, msg)
                    state.sent(s.token, state.now(), error)
                    if error is not None and ft:
                        _check_failures(link, state, lost, now)
                # 3. RESULT (the items a worker sent ahead first: they precede its RESULT)
                for rank, token, costs, said in inbox.usage:  # (kept with the attempts)
                    state.note_usage(rank, token, costs, said)
                for rank, token, ids, values, errors in inbox.parts:
                    state.on_part(rank, token, ids, values, now, errors=errors)
                for rank, token, values, errors, failure in inbox.results:
                    state.on_results(rank, token, values, now, errors=errors, failure=failure)
                # 4. deliver durable commits, join invalid results, 5. sweep the watchdog (once
                # the backlog is read), retry degraded storage
                state.tick(state.now(), drained=len(msgs) < _RECEIVE_LIMIT)
                # 6. the delivery point: the one place user code runs (callbacks, notices, the
                # source's refill, progress)
                state.deliver()
                if now >= operator.next_poll and (commands := operator.due(now)):  # (control.py)
                    _steer(state, link, stopping, commands, now)
                if msgs:
                    idle_sleep = 0.0
                    heard = raw
                elif raw - heard > SPIN:  # back off gently: never more than 1 ms of added latency
                    idle_sleep = min(0.001, idle_sleep * 2 or 0.00002)
                    time.sleep(idle_sleep)
                else:  # a RESULT or READY is due soon (SPIN): poll again, but let others run
                    os.sched_yield()
            if core.ledger.put_back():  # the work a feed withdrew stays pending (Feed docs)
                reason = reason or "withdrawn"
            state.every_turn.clear()  # (no refill once the loop ended)
            state.deliver(wait=True)
            _persisted(state, _PERSIST_SECONDS)  # else close() raises NotDurableError
            _stop_all(link, range(1, size), lost, stop_timeout)
            stats, wall, took = state.statistics().as_dict(), time.time(), time.monotonic() - start
            report = MasterReport(
                stats=stats,
                mode="ulfm" if ft else "no-ulfm",
                finished=source.exhausted and state.done,
                lost_ranks=lost,
                seconds=took,
                reason=None if source.exhausted and state.done else reason,
                view=campaign_view(  # V1: as stats will show it once the master returned
                    state.core.ledger,
                    {"ts": wall, "started": wall - took, "running": False, "stats": stats}
                    | {"pid": os.getpid(), "host": os.uname().nodename},
                    running=False,
                    directory=os.fspath(state.directory),
                    now=wall,
                ),
            )
            if progress is not None:  # (the last report, at the delivery point too)
                state.notify(progress, report.stats)
                state.deliver()
        except BaseException as e:
            # U4: never leave the job hanging. Close the state durably first (what was journaled
            # stays), then stop the workers within stop_timeout, then let the error end rank 0.
            log.error(
                "master: %s: %s; closing the state, stopping the workers", type(e).__name__, e
            )
            try:
                state.close()
            except Exception as e2:  # noqa: BLE001 - the first error is the one to raise
                log.error("master: closing the state after that error failed too: %s", e2)
            _stop_or_abort(link, range(1, size), lost, stop_timeout)
            raise
        finally:
            allocation.close()
            if line is not None:
                line.close()
            state.close()
    return report


def _every(
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


_PERSIST_SECONDS = 5.0  # at the end, how long to retry a disk that refuses the journal
_PLAN_SECONDS = 0.5  # how often the drain before the allocation's end is weighed
#: The environment variable that sets ``drain_margin``.
DRAIN_MARGIN_ENV = "DD_DRAIN_MARGIN"


def _drain_margin(given: float | None) -> float:
    """``drain_margin``, or ``DD_DRAIN_MARGIN``, or the default (60 s); a bad value is refused."""
    if given is None:
        text = os.environ.get(DRAIN_MARGIN_ENV)
        if text is None:
            return DRAIN_MARGIN
        try:
            given = float(text)
        except ValueError:
            log.warning("configuration: %s=%r is not a number; 60 s", DRAIN_MARGIN_ENV, text)
            return DRAIN_MARGIN
    if not (isinstance(given, (int, float)) and given >= 0 and given == given):
        raise UsageError(f"drain_margin must be a number of seconds >= 0, got {given!r}")
    return float(given)


def _persisted(state: CampaignState, seconds: float) -> bool:
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


class Feed:
    """A work source that :func:`run_master` asks for work at the start of every turn, for
    campaigns whose work arrives while they run (the futures executor is one).

    The loop calls :meth:`attach` once, with the opened state (before any dispatch), then
    :meth:`refill` at the start of every turn, in the loop's thread; it ends once
    :attr:`exhausted` is True and nothing is pending, in flight or undelivered. A subclass
    submits with ``state.submit`` in :meth:`refill`, never from another thread.

    A feed may also withdraw pending work from the run in :meth:`refill`
    (:meth:`CampaignState.withdraw`): in memory only, so the campaign ends without it; the
    loop puts it back at the end, and the report says ``finished=False``, ``reason=
    "withdrawn"``: the work is still pending in the state directory and a later run does it.
    """

    exhausted: bool = False
    state: CampaignState

    def attach(self, state: CampaignState) -> None:
        """The campaign's state is open (its commits from earlier runs redelivered)."""
        self.state = state

    def refill(self) -> None:
        """Submit the work that is due (called at the start of every turn)."""


class _Source(Feed):
    """The work source, consumed as the frontier drains (G3): a list or a generator of millions
    of items is submitted in chunks of :attr:`CHUNK` whenever fewer than :attr:`LOW` items are
    pending, so it is never held whole in memory. On a resumed state directory it is iterated
    again from the start and known work IDs are skipped (``CampaignState.submit``)."""

    CHUNK = 65536
    LOW = 16384

    def __init__(self, work: Iterable[WorkItem]) -> None:
        self.items = iter(work)
        self.exhausted = False
        self._known_read = False  # U11: the part an earlier run submitted was read again

    def refill(self) -> None:
        """Submit the next chunks while fewer than :attr:`LOW` items are pending. The first
        call reads on while the chunks hold only known work IDs (what an earlier run submitted),
        so each is compared with the payload it named before anything is dispatched (U11)."""
        frontier = self.state.core.ledger.frontier
        while not self.exhausted and (len(frontier) < self.LOW or not self._known_read):
            chunk = list(itertools.islice(self.items, self.CHUNK))
            self.exhausted = len(chunk) < self.CHUNK
            if chunk and self.state.submit(chunk):
                self._known_read = True


def _steer(
    state: CampaignState, link: Transport, stopping: _Stopping, commands: list[Any], now: float
) -> None:
    """Apply the operator's commands (O1): each is journaled durably before it is
    acknowledged (``control.apply_command``); a dispatch cancelled in flight is told to stop
    (an isolated child is killed); a ``drain`` drains as SIGUSR1 does."""
    for c in commands:
        done = apply_command(state, c, running=True)
        for rank, token in done.stop:
            link.send(rank, P.CANCEL, P.encode({"token": str(token)}))
        if done.drain:
            stopping.operator_drain(now, state)


class _Stopping:
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
        """An operator's ``durable-dispatch drain``: drain as on a first SIGUSR1 (O1, U5)."""
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


def _refuse(message: str, comm: Any, stop_timeout: float) -> NoReturn:
    """A bad argument, found before anything started: stop the workers if they are running
    (they wait for WORK, and would keep the job alive forever, U4), then raise ``UsageError``."""
    import sys

    link: Transport | None = comm if isinstance(comm, Transport) else None
    mpi = sys.modules.get("mpi4py.MPI")
    if link is None and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        link = MpiTransport(comm)
    if link is not None:
        log.error("master: %s; stopping the workers", message)
        _stop_or_abort(link, range(1, link.size), {}, stop_timeout)
    raise UsageError(message)


def _check_failures(
    link: Transport, state: CampaignState, lost: dict[int, float], now: float
) -> None:
    """ULFM: roll back the dispatches of the newly failed ranks and exclude them, all at once
    (ranks of one host reported together died with their node: their items are not charged)."""
    new = sorted({r for r in link.failed_ranks() if r not in lost and r != 0})
    if not new:
        return
    for r in new:
        lost[r] = time.time()
        log.warning(
            "master: rank %d failed (ULFM, host %s); rolling back its dispatch",
            r,
            state.core.domains.host(r) or "unknown",
        )
    guard.peer_failed()  # MPI_Finalize may wait for them forever: leave without them
    state.ranks_lost(new, now, "process failed")


def _stop_or_abort(
    link: Transport, ranks: Iterable[int], lost: dict[int, float], timeout: float
) -> None:
    """On an error on rank 0 (U4): STOP to every worker; if one cannot be delivered, abort the
    job (MPI_Abort), because a worker that never takes its STOP keeps rank 0 waiting in
    MPI_Finalize forever. The caller closed the state first."""
    if not _stop_all(link, ranks, lost, timeout):
        log.error("master: STOP could not be delivered to every worker; MPI_Abort")
        link.abort(1)


def _stop_all(
    link: Transport, ranks: Iterable[int], lost: dict[int, float], timeout: float
) -> bool:
    """Send STOP to every live worker without waiting on any one of them for long; False when
    some send did not complete within ``timeout``."""
    live = [r for r in ranks if r not in lost]
    return link.stop(live, P.encode({}), P.STOP, timeout)
