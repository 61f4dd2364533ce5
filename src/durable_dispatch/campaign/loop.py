"""The calls the master's loop makes on a campaign state, one per thing that happened
(:meth:`~LoopCalls.on_ready`, ``on_results``, ``sent``, ``tick`` ...): each asks the core and
persists what it decided, so a loop built on these cannot forget a persist step (``run_master``
is built on them). A part of :class:`~durable_dispatch.campaign.state.CampaignState`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core import Decision, Dispatcher, PersistSnapshot, Send
from ..core.events import WorkerHost, encode
from ..core.ranks import RankState
from ..storage import Journal
from ..tokens import Token
from .costs import CostTable, cost_entries
from .outputs import Outputs, output_record

__all__ = ["LoopCalls"]

log = logging.getLogger("durable_dispatch.state")
_COSTS_HELD = 4096  # dispatches whose costs wait for their items' outcomes, at most


class LoopCalls:
    """The loop's calls (see the module docs); a part of
    :class:`~durable_dispatch.campaign.state.CampaignState`."""

    core: Dispatcher
    journal: Journal
    _epoch_seq: int | None
    _hosts: dict[int, str]
    _costs: dict[Token, dict[str, Any] | CostTable]
    _outputs: Outputs | None
    _lock: Any
    directory: str
    _stuck_since: float | None
    _pending_commits: list[Any]
    _restore_at: float
    _restore_backoff: float
    _on_commit: Callable[[Any], None] | None
    _has_after: bool
    #: see :class:`~durable_dispatch.campaign.state.CampaignState`
    on_dispatch: Callable[[Send], None] | None

    if TYPE_CHECKING:  # provided by CampaignState and its other parts

        def _durable(self, seq: int) -> bool: ...

        def _check_dependency_sizes(self, max_items: int) -> None: ...

        def _save_snapshot(self, reason: str = "") -> bool: ...

        def _record_send(self, send: Send) -> None: ...

        def _apply(self, decisions: Any, *a: Any, **k: Any) -> list[Decision]: ...

        def _complete_commits(self, *, wait: bool = False) -> int: ...

        def try_restore(self) -> bool: ...

        def publish_statistics(self, *, running: bool = True, force: bool = False) -> bool: ...

    def next_send(self, now: float, max_items: int = 1) -> Send | None:
        """The next dispatch of up to ``max_items`` items, journaled (persist before you send),
        or None.

        Writes any snapshot the core requires first (one after a rollback). The first waits for
        this run's epoch record to be durable: a token of an epoch a crash could forget would
        be the token of another dispatch after the restart, which starts the same epoch again.
        """
        if self._epoch_seq is not None:
            self._durable(self._epoch_seq)
            self._epoch_seq = None
        if self._has_after:  # (no item names an ``after``: nothing to check, no call)
            self._check_dependency_sizes(max_items)
        while True:
            d = self.core.reserve(now, max_items)
            if isinstance(d, PersistSnapshot):
                self._save_snapshot(d.reason)
                continue
            if d is not None:
                self._record_send(d)
                if self.on_dispatch is not None:
                    self.on_dispatch(d)
            return d

    # ---------------------------------------------------------------- the facade
    # One call per thing that happened: each asks the core and persists what it decided, so a
    # loop built on these cannot forget a persist step (run_master is built on them).
    def on_ready(self, rank: int, token: object, now: float) -> list[Decision]:
        """A READY from ``rank``; see :meth:`Dispatcher.on_ready`."""
        return self._apply(self.core.on_ready(rank, token, now), self._on_commit)

    def note_host(self, rank: int, host: str) -> None:
        """Worker ``rank`` runs on ``host`` (its first READY said so): journaled once per rank
        per run (a ``host`` event, for the joblog's host column). The record goes with the
        journal's next flush (the loop does not wait for it): a crash before it loses only the
        name, and the rank's dispatches, journaled after it, cannot become durable without it
        (one journal, in order)."""
        self.core.note_host(rank, host)  # its failure domain
        if self._hosts.get(rank) == host:
            return
        self._hosts[rank] = host
        self.journal.append(encode(WorkerHost(rank, host, time.time())))

    def note_usage(self, rank: int, token: object, costs: Any, outputs: Any = None) -> None:
        """What the items of ``rank``'s current dispatch ``token`` cost (a RESULT's ``costs``,
        by work ID or as a table: :mod:`.costs`; see :mod:`durable_dispatch.mpi.usage`): held
        until each item's outcome is journaled, which then carries it (``cost``, or for a
        dispatch's commit ``costs`` or ``cost_table``); and what they wrote (``outputs``, with
        isolation): appended to the outputs journal now (:mod:`.outputs`: written in the
        background, never waited for). A RESULT that is not current is ignored, as are entries
        that are not costs or outputs (a worker's word, checked before it is kept)."""
        t = self.core.current_token(rank, token)
        if t is None:
            return
        if type(outputs) is dict:
            ts = time.time()
            for w, entry in outputs.items():
                if type(w) is str and (rec := output_record(w, str(t), entry, ts)):
                    if self._outputs is None:
                        self._outputs = Outputs(self.directory, self._lock.claim)
                    self._outputs.append(rec)
        if type(costs) is not dict or not (clean := cost_entries(costs)):
            return
        held = self._costs
        got = held.get(t)
        if got is not None:  # (parts of one dispatch: one by work ID)
            merged = dict(got.items())
            merged.update(clean.items())
            held[t] = merged
            return
        if len(held) > _COSTS_HELD:  # (a token whose items never ended: dropped, oldest)
            del held[next(iter(held))]
        held[t] = clean

    def on_heartbeat(self, rank: int, token: object, now: float) -> list[Decision]:
        """A HEARTBEAT from ``rank``; see :meth:`Dispatcher.on_heartbeat`."""
        return self._apply(self.core.on_heartbeat(rank, token, now), self._on_commit)

    def on_results(
        self,
        rank: int,
        token: object,
        results: Any,
        now: float,
        *,
        errors: Any = None,
        failure: Any = None,
    ) -> list[Decision]:
        """A RESULT from ``rank`` (see :meth:`Dispatcher.on_results`): ``errors`` names the items
        the worker could not do, ``failure`` why the whole dispatch failed. Its commits are
        journaled at once and delivered once durable (:meth:`tick`), so the loop goes on."""
        out = self.core.on_results(rank, token, results, now, errors=errors, failure=failure)
        return self._apply(out, self._on_commit)

    def on_part(
        self, rank: int, token: object, work_ids: Any, results: Any, now: float, *, errors: Any
    ) -> list[Decision]:
        """A partial RESULT from ``rank`` (see :meth:`Dispatcher.on_part`): the outcomes of some
        items of a dispatch that still runs. Their commits are journaled at once and delivered
        once durable (:meth:`tick`), as :meth:`on_results`' are."""
        out = self.core.on_part(rank, token, work_ids, results, now, errors=errors)
        return self._apply(out, self._on_commit)

    def sent(self, token: Token, now: float, error: str | None = None) -> list[Decision]:
        """The WORK send of :meth:`next_send`'s dispatch returned (``error`` None) or failed."""
        if error is None:
            return self._apply(self.core.mark_dispatched(token, now), self._on_commit)
        return self._apply(self.core.send_failed(token, now, error), self._on_commit)

    def rank_lost(self, rank: int, now: float, error: str = "rank lost") -> list[Decision]:
        """``rank`` failed (ULFM); see :meth:`Dispatcher.rank_lost`."""
        return self._apply(self.core.rank_lost(rank, now, error), self._on_commit)

    def ranks_lost(self, ranks: list[int], now: float, error: str = "rank lost") -> list[Decision]:
        """``ranks`` failed together (ULFM: one check found them); see
        :meth:`Dispatcher.ranks_lost` (a node that lost several charges its items nothing)."""
        return self._apply(self.core.ranks_lost(ranks, now, error), self._on_commit)

    def on_gone(self, rank: int, error: str, now: float) -> list[Decision]:
        """``rank`` said it failed and ends (a GONE message): its dispatch is rolled back
        and the rank dropped, as for a lost rank; a rank already lost or unknown is ignored."""
        if self.core.rank_state(rank) in (None, RankState.LOST):
            return []
        log.error("worker %d failed and is gone: %s", rank, error)
        why = f"worker failed: {error}"[:2000]  # its own error, not its node's
        return self._apply(self.core.rank_lost(rank, now, why, domain=False), self._on_commit)

    def now(self) -> float:
        """The master's clock for this turn: ``time.monotonic()`` as the core's observed clock
        counts it (a pause of the master is not held against the workers)."""
        return self.core.clock.observe(time.monotonic())

    @property
    def done(self) -> bool:
        """True when every work item is committed or deferred and every commit was delivered:
        the loop's condition (``while not state.done``)."""
        return self.core.done and not self._pending_commits

    def stop_reason(self, now: float, *, grace: float) -> str | None:
        """Why the campaign cannot go on although work remains, or None: ``"no workers left"``
        (every rank was lost or said it is gone), or ``"every worker parked"`` (every live
        worker is parked or still starting, at least one parked, and none sent its exact READY
        for ``grace`` seconds of ``now``). Logs the reason; the state directory resumes."""
        core = self.core  # (every question O(1): this runs every turn, at 10,000 ranks too)
        live = core.live_rank_count()
        if not live:
            log.error("master: no worker left; %d item(s) pending", len(core.pending()))
            return "no workers left"
        parked = core.parked_rank_count()
        if core.done or not parked or parked + core.starting_ranks() < live:
            self._stuck_since = None  # some worker serves, or may still come up
            return None
        if self._stuck_since is None:
            self._stuck_since = now
        if now - self._stuck_since < grace:
            return None
        log.error(
            "master: every worker (%d) is parked and %d item(s) remain; no exact READY came "
            "within %.0fs: stopping (resumable; hung work functions need worker isolation to "
            "give their ranks back)",
            live,
            len(core.pending()),
            grace,
        )
        return "every worker parked"

    def tick(self, now: float, *, drained: bool = True) -> list[Decision]:
        """The end of a turn (its last two steps): deliver the commits an fsync now covers, roll
        back every READY that came without a valid RESULT, and sweep the watchdog.

        ``drained``: the turn's receive found every message that had arrived (it returned
        fewer than its limit). After a pause of the master, deadlines are judged only once a
        turn drained (a paused master suspects no worker). A degraded journal is retried here
        too, with a back-off (0.5 s, doubling to 30 s).
        """
        if drained:
            self.core.clock.drained()
        self._complete_commits()
        out = self._apply(self.core.join_invalid(now), self._on_commit)
        out += self._apply(self.core.sweep(now), self._on_commit)
        if not self.journal.health.ok and now >= self._restore_at:
            if self.try_restore():
                self._restore_backoff = 0.5
            else:
                self._restore_at = now + self._restore_backoff
                self._restore_backoff = min(self._restore_backoff * 2, 30.0)
        self.publish_statistics()
        return out
