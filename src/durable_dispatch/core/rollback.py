"""The paths every failure takes (pure, no I/O): a rollback of a dispatch (after which nothing
is dispatched until the shell persisted a snapshot), the retry or deferral of its items under
their work IDs, the join of READYs without a valid RESULT and the watchdog's sweep (the last two
steps of the shell's turn), a lost rank, the deferral bookkeeping, and the restart of a master
(every dispatch that was in flight is rolled back uncharged). One compensation path:
:meth:`Rollbacks._roll_back`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter
from typing import Any, Self

from ..errors import UsageError
from ..tokens import Token
from .config import RetryPolicy, WatchdogConfig
from .decisions import (
    SOURCE_DEPENDENCY,
    SOURCE_INVALID_RESULT,
    SOURCE_MASTER_RESTART,
    SOURCE_NODE_LOST,
    SOURCE_OPERATOR,
    SOURCE_RANK_LOST,
    SOURCE_WATCHDOG,
    UNCHARGED_SOURCES,
    Decision,
    Defer,
    ItemFailure,
    Park,
    Requeue,
    WorkItem,
    failure_source,
)
from .dispatch_base import DispatcherBase
from .events import Cancelled, EpochStarted, RequeuedDeferred
from .ledger import Ledger
from .ranks import RankState
from .transactions import Transaction, TxEvent, TxState, advance

__all__ = ["Rollbacks"]

_by_rank = attrgetter("rank")


class Rollbacks(DispatcherBase):
    """The failure paths of a :class:`~durable_dispatch.core.dispatcher.Dispatcher`."""

    # ------------------------------------------------------- join and sweep
    def join_invalid(self, now: float) -> list[Decision]:
        """Roll back every generation whose current READY came without a valid RESULT (the
        join: step 4 of the shell's turn).

        The worker finished (READY) but its result was lost or broken: the task is recovered through
        the shared retry path with ``source=invalid-result`` and the rank goes back to idle.
        """
        out: list[Decision] = []
        if not self._joinable:
            return out
        found, self._joinable = self._joinable, {}
        for tx in sorted(found.values(), key=_by_rank):
            if tx.state is TxState.DISPATCHED:  # (else its RESULT came, or it rolled back)
                f = tx.failure or ItemFailure("missing-result", "READY without RESULT")
                source = failure_source(f.kind)
                if source == SOURCE_INVALID_RESULT:
                    self._n.invalid_result_rollbacks += 1
                else:
                    self._n.item_failures += 1
                out += self._roll_back(tx, source, f.kind, f.reason, RankState.IDLE, failure=f)
        return out

    def expired(self, now: float) -> list[tuple[int, Token]]:
        """A sorted snapshot of ``(rank, exact token)`` of dispatches past their deadline.

        Generations whose current READY was already seen are not included (the turn's join
        judges them: the worker finished). Cost: O(1) when
        nothing expired, O(k log n) for k expired entries.
        """
        out: list[tuple[int, Token]] = []
        for token in self._deadlines.due(now, self._deadline_stands):
            tx = self._open[str(token)]
            if not tx.ready_seen:
                out.append((tx.rank, token))
        return sorted(out)

    def sweep(self, now: float) -> list[Decision]:
        """Roll back every expired dispatch and park its rank until a READY with that
        dispatch's exact token (the sweep: the last step of the shell's turn).

        Nothing is judged while :attr:`clock` holds (after a master pause, until the shell has
        drained what arrived during it: a pause of the master is not held against the
        workers). It first settles the items held since their rank
        was lost alone (:meth:`settle_lost`)."""
        out: list[Decision] = self.settle_lost(now) if self._held_lost else []
        if self.clock.hold:
            return out
        for _rank, token in self.expired(now):
            tx = self._open[str(token)]
            self._n.dispatch_watchdog_timeouts += 1
            out += self._roll_back(
                tx, SOURCE_WATCHDOG, "timeout", "deadline passed", RankState.PARKED
            )
        return out

    def rank_lost(
        self, rank: int, now: float, error: str = "rank lost", *, domain: bool = True
    ) -> list[Decision]:
        """The runtime reported ``rank`` dead (ULFM): roll back its dispatch now, drop the rank.
        The same as :meth:`ranks_lost` with ``[rank]``."""
        return self.ranks_lost([rank], now, error, domain=domain)

    def ranks_lost(
        self, ranks: Iterable[int], now: float, error: str = "rank lost", *, domain: bool = True
    ) -> list[Decision]:
        """The runtime reported ``ranks`` dead together (ULFM: the ranks one check found
        failed): roll back their dispatches now, drop the ranks.

        A node is a failure domain (:mod:`.domains`): a rank whose host lost several ranks at
        once, or that was suspect (its host lost a rank and it had not answered since), died
        with its node, and its item goes back to the front uncharged (source ``node-lost``); a
        rank that died alone charges its item ``lost-rank`` (an item may kill its own rank).
        Every other rank of such a host gets no new work until it answers or the window
        passes. ``domain=False`` (a worker that said
        it failed and ends: its own error, not its node's) charges as a rank alone and
        suspects nobody.

        Raises:
            UsageError: a rank is unknown or already lost (nothing changed).
        """
        ranks = sorted(set(ranks))
        for rank in ranks:
            if not self._ranks.is_live(rank):
                raise UsageError(f"unknown rank {rank}")
        node: dict[int, bool] = {r: False for r in ranks}
        if domain:
            node = self.domains.lost(ranks, now)
        out: list[Decision] = []
        if domain and self._held_lost:  # a held item's host lost another rank: its node died
            hosts = {self.domains.host(r) for r in ranks}
            out += self._release_held(lambda h: h in hosts, SOURCE_NODE_LOST)
        for rank in ranks:
            tx = self._ranks.current(rank)
            self._n.ranks_lost += 1
            source = SOURCE_NODE_LOST if node[rank] else SOURCE_RANK_LOST
            if tx is None or tx.state not in (TxState.PREPARING, TxState.DISPATCHED):
                self._ranks.lose(rank)
                continue
            host = self.domains.host(rank)
            if (
                domain
                and source == SOURCE_RANK_LOST
                and len(tx.items) == 1
                and host is not None
                and self.domains.host_suspect(host)
            ):  # alone so far, but its node may be dying: the charge waits (see _held_lost)
                out += self._hold(tx, host, error)
                continue
            out += self._roll_back(tx, source, "lost-rank", error, RankState.LOST)
        return out

    def _hold(self, tx: Transaction, host: str, error: str) -> list[Decision]:
        """Roll back ``tx`` of a lost rank but hold its one item in flight until its host is
        known to live or to have died (:meth:`settle_lost`)."""
        advance(tx, TxEvent.ROLLED_BACK)
        (item,) = tx.items
        self._unlease(item, tx.token)
        del self._open[tx.wire]
        self._ranks.lose(tx.rank)
        self._held_lost[item.work_id] = (item, tx.token, host, error)
        return []

    def _release_held(self, which: Callable[[str], bool], source: str) -> list[Decision]:
        """Requeue (``node-lost``: uncharged) or charge (``rank-lost``) the held items whose
        host ``which`` picks."""
        out: list[Decision] = []
        for wid, (item, token, host, error) in list(self._held_lost.items()):
            if which(host):
                del self._held_lost[wid]
                out.append(self._retry_or_defer(item, token, source, "lost-rank", error))
                out.append(self._require_snapshot(f"lost rank's {wid} under {token} ({source})"))
        return out

    def settle_lost(self, now: float) -> list[Decision]:
        """Charge the items held since their rank was lost alone (``lost-rank``) once their
        host's other ranks all answered or the window passed without another loss there: the
        rank died alone. :meth:`sweep` calls it every turn; O(1) when nothing is held."""
        if not self._held_lost:
            return []
        self._ranks.expire(now)
        return self._release_held(lambda h: not self.domains.host_suspect(h), SOURCE_RANK_LOST)

    # ------------------------------------------------ deferral bookkeeping
    def defer_recorded(self, work_id: str, persisted: bool) -> None:
        """Report the outcome of a :class:`Defer`: on disk, or held in memory after a fault."""
        if work_id not in self.ledger.deferred:
            raise UsageError(f"{work_id!r} is not deferred")
        if persisted:
            self._n.protocol_deferred_dispatches += 1
        else:
            self._n.deferred_in_memory += 1

    def defer_persisted_later(self, count: int = 1) -> None:
        """``count`` deferrals held in memory were since written durably (after a restore)."""
        count = min(count, self._n.deferred_in_memory)
        self._n.deferred_in_memory -= count
        self._n.protocol_deferred_dispatches += count

    def requeue_deferred(self, work_id: str) -> None:
        """Put a deferred item back at the end of the frontier (an operator's decision)."""
        if work_id not in self.ledger.deferred:
            raise UsageError(f"{work_id!r} is not deferred")
        self._apply(RequeuedDeferred(work_id))

    # ------------------------------------------------- dependencies (G4)
    def ended_without_commit(self, work_id: str, why: str = "deferred") -> list[Decision]:
        """``work_id`` ended for good without a commit (deferred for good, or cancelled by an
        operator, ``why``): defer every item that waits for it, directly or transitively, with
        kind ``"dependency"`` and a last error naming ``work_id``. They never run (until an
        operator requeues ``work_id`` and it commits, which releases them again).

        This is the one entry point for that rule: the shell calls it after it persisted each
        :class:`Defer` (so a dependent's deferral follows its dependency's in the journal), and
        for each item an operator cancelled. Each returned :class:`Defer` is already applied to
        the ledger; the shell persists it as any other (and calling this again for it finds
        nothing to do). Safe to call for any work ID, known or not: nothing waits, nothing
        happens.
        """
        ledger = self.ledger
        if not ledger.dependents.get(work_id):
            return []
        error = f"dependency {work_id!r} ended without a commit ({why})"
        return [self._defer_dependency(w, error) for w in ledger.waiting_dependents(work_id)]

    def defer_unreachable(self) -> list[Decision]:
        """When nothing is pending or in flight, every waiting item waits for a work ID that
        was never submitted, that is deferred, or that is part of a cycle: defer each (kind
        ``"dependency"``, the last error naming the dependency it waits for). The shell calls
        it once its work source is exhausted and every commit was delivered; then the campaign
        is done. Returns nothing while something is pending or in flight."""
        ledger = self.ledger
        if ledger.frontier or ledger.in_flight or not ledger.waiting:
            return []
        out: list[Decision] = []
        for wid in list(ledger.waiting):
            dep = ledger.blocker(wid)
            if dep is None or not ledger.known(dep):
                error = f"dependency {dep!r} was never submitted"
            elif dep in ledger.deferred:
                error = f"dependency {dep!r} ended without a commit (deferred)"
            else:
                error = f"dependency {dep!r} cannot run: a cycle, or a dependency upstream failed"
            out.append(self._defer_dependency(wid, error))
        return out

    def defer_for_dependency(self, work_id: str, error: str) -> list[Decision]:
        """Defer the pending ``work_id`` (kind ``"dependency"``) without running it: its
        dependencies' results cannot reach it (too large for a WORK message, say); then defer
        what waits for it. Returns the :class:`Defer` decisions, applied to the ledger.

        Raises:
            UsageError: ``work_id`` is not pending.
        """
        if work_id not in self.ledger.frontier:
            raise UsageError(f"{work_id!r} is not pending")
        return [self._defer_dependency(work_id, error)]

    def _defer_dependency(self, wid: str, error: str) -> Decision:
        ledger = self.ledger
        kinds = (*ledger.kinds.get(wid, ()), "dependency")
        item = ledger.items[wid]
        attempts = ledger.attempts.get(wid, 0)
        return self._record(Defer(item, None, SOURCE_DEPENDENCY, attempts, kinds, error))

    # ------------------------------------------------------- the operator (O1)
    def cancel(
        self, work_id: str, command: str | None = None
    ) -> tuple[str, list[Decision], tuple[int, Token] | None]:
        """An operator cancels ``work_id`` (``durable-dispatch cancel``): it ends for good,
        ``cancelled``, never retried.

        Returns ``(what, decisions, stop)``. ``what`` is ``"cancelled"`` (it was pending or
        deferred: the ``cancelled`` event is applied to the ledger; the shell journals it, then
        ``decisions``), ``"cancelled in flight"`` (its dispatch is rolled back as a timeout's
        is: its rank is parked until the READY of its exact token, and ``stop`` names
        ``(rank, token)`` so the shell can tell the worker to stop it; the dispatch's other
        items are requeued uncharged, each alone, in ``decisions``), or why nothing changed:
        ``"committed"``, ``"committing"`` (its result is journaled, being made durable),
        ``"already cancelled"``, ``"unknown"``.

        Raises:
            UsageError: its dispatch is PREPARING (apply commands between turns, never
                between ``reserve`` and ``mark_dispatched``).
        """
        ledger = self.ledger
        if work_id in ledger.cancelled:
            return "already cancelled", [], None
        if work_id in ledger.committed:
            return "committed", [], None
        if not ledger.known(work_id):
            return "unknown", [], None
        if self._held_lost.pop(work_id, None) is not None:  # its rank was lost: nothing runs it
            self._apply(Cancelled(work_id, command))
            self._n.operator_cancels += 1
            return "cancelled", [], None
        held = ledger.in_flight.get(work_id)
        if held is None:  # pending or deferred
            self._apply(Cancelled(work_id, command))
            self._n.operator_cancels += 1
            return "cancelled", [], None
        tx = self._open.get(str(held[0]))
        if tx is None or tx.state is not TxState.DISPATCHED:
            if tx is not None and tx.state is TxState.PREPARING:
                raise UsageError(f"{work_id!r}: its dispatch {tx.token} is being sent")
            return "committing", [], None
        item = next((w for w in tx.items if w.work_id == work_id), None)
        if item is None:  # sent ahead (a part): its commit is under way
            return "committing", [], None
        self._apply(Cancelled(work_id, command))
        self._n.operator_cancels += 1
        self._n.operator_cancelled_in_flight += 1
        # The rest is a rollback of the dispatch (W4): the rank is parked until its exact
        # READY (W6, W7), unless that READY already came; the other items go back uncharged.
        advance(tx, TxEvent.ROLLED_BACK)
        for w in tx.items:
            self._unlease(w, tx.token)
        del self._open[tx.wire]
        out: list[Decision] = []
        stop: tuple[int, Token] | None = None
        if tx.ready_seen:
            self._ranks.finish(tx.rank, tx.token)
        else:
            self._ranks.park(tx.rank, tx.token)
            out.append(Park(tx.rank, tx.token, SOURCE_OPERATOR))
            stop = (tx.rank, tx.token)
        why = f"{work_id} of the same dispatch was cancelled"
        out += [
            self._requeue_alone(w, tx.token, SOURCE_OPERATOR, "cancelled", why)
            for w in reversed(tx.items)
            if w is not item
        ]
        out.append(self._require_snapshot(f"cancel of {work_id} under {tx.token}"))
        return "cancelled in flight", out, stop

    def retry_item(self, work_id: str) -> str:
        """An operator puts a deferred or cancelled ``work_id`` back at the end of the frontier
        with fresh retry budgets (``durable-dispatch retry``). Returns ``"requeued"`` (the
        ``requeued_deferred`` event is applied; the shell journals it) or why nothing changed:
        ``"pending"``, ``"waiting"`` (for a dependency), ``"in flight"``, ``"committed"``,
        ``"unknown"``."""
        ledger = self.ledger
        if work_id in ledger.deferred or work_id in ledger.cancelled:
            self._apply(RequeuedDeferred(work_id))
            return "requeued"
        if work_id in ledger.committed:
            return "committed"
        if work_id in ledger.in_flight:
            return "in flight"
        if work_id in ledger.waiting:
            return "waiting"
        return "pending" if ledger.known(work_id) else "unknown"

    # ------------------------------------------- the paths every failure takes
    def _roll_back(
        self,
        tx: Transaction,
        source: str,
        kind: str,
        error: str,
        then: RankState,
        *,
        failure: ItemFailure | None = None,
    ) -> list[Decision]:
        """The one compensation path: timeout, invalid result, send failure, rank lost (W4, S8).

        The rank goes to ``then``: PARKED (timeout, send failure: only its exact READY proves
        the old generation over), IDLE (it said READY) or LOST. ``failure``: what the worker
        said of a one-item dispatch (final: deferred at once; its traceback kept).
        """
        advance(tx, TxEvent.ROLLED_BACK)
        for item in tx.items:
            self._unlease(item, tx.token)
        del self._open[tx.wire]
        out: list[Decision] = []
        if then is RankState.PARKED:
            self._ranks.park(tx.rank, tx.token)
            out.append(Park(tx.rank, tx.token, source))
        elif then is RankState.IDLE:
            self._ranks.finish(tx.rank, tx.token)
        else:
            self._ranks.lose(tx.rank)
        if len(tx.items) == 1:
            out.append(
                self._retry_or_defer(tx.items[0], tx.token, source, kind, error, failure=failure)
            )
        else:  # which item failed is unknown: each goes back uncharged, to run alone (W5)
            # last item first: each goes to the front, so the frontier keeps the dispatch's
            # order (and replay, applying the journaled events in this order, gets the same)
            out += [
                self._requeue_alone(w, tx.token, source, kind, error) for w in reversed(tx.items)
            ]
        out.append(self._require_snapshot(f"rollback of {tx.token} ({source})"))
        return out

    def _requeue_alone(
        self, item: WorkItem, token: Token, source: str, kind: str, error: str
    ) -> Decision:
        """Requeue one item of a failed multi-item dispatch at the front, uncharged; from now on
        it is dispatched alone, where a failure is charged to it."""
        wid = item.work_id
        self._n.batch_splits += 1
        attempts = self.ledger.attempts.get(wid, 0)
        return self._record(Requeue(wid, token, source, kind, attempts, error, split=True))

    def _retry_or_defer(
        self,
        item: WorkItem,
        token: Token,
        source: str,
        kind: str,
        error: str,
        *,
        failure: ItemFailure | None = None,
    ) -> Decision:
        """The shared retry path (W5): requeue at the front, or defer after the budget; a
        ``failure`` that is final (deterministic: it would fail again) is deferred at once, and
        its traceback goes with the decision."""
        wid = item.work_id
        ledger = self.ledger
        if source in UNCHARGED_SOURCES:  # (the fault was the master's, or the node's)
            if source == SOURCE_MASTER_RESTART:
                self._n.master_restart_rollbacks += 1
            else:
                self._n.node_lost_requeues += 1
            attempts = ledger.attempts.get(wid, 0)
            return self._record(Requeue(wid, token, source, kind, attempts, error))
        n = ledger.attempts.get(wid, 0) + 1
        tb = failure.traceback if failure is not None else None
        if n <= self.retry.retries_for(kind) and not (failure is not None and failure.final):
            self._n.protocol_requeued_dispatches += 1
            return self._record(Requeue(wid, token, source, kind, n, error, traceback=tb))
        kinds = (*ledger.kinds.get(wid, ()), kind)
        return self._record(Defer(item, token, source, n, kinds, error, tb))

    # ------------------------------------------------------ durable state
    @classmethod
    def restore(
        cls,
        state: Mapping[str, Any] | Ledger,
        *,
        epoch: int,
        watchdog: WatchdogConfig | None = None,
        retry: RetryPolicy | None = None,
        ranks: Iterable[int] = (),
        starting: bool = False,
    ) -> tuple[Self, list[Decision]]:
        """Rebuild a core for a new master ``epoch`` from :meth:`snapshot` output or from a
        ledger that replay built (which it takes over).

        Every dispatch that was in flight is rolled back to the front of the frontier without
        charging a retry (the fault was the master's); its token's epoch is older than ``epoch``,
        so any late message from it is stale.

        Raises:
            UsageError: ``epoch`` is not greater than the saved one.
        """
        ledger = state if isinstance(state, Ledger) else Ledger.from_snapshot(state)
        if epoch <= ledger.epoch:
            raise UsageError(f"new epoch {epoch} must be greater than {ledger.epoch}")
        d = cls(epoch, watchdog, retry, ranks, starting=starting)
        d.ledger = ledger
        ledger.apply(EpochStarted(epoch))
        out: list[Decision] = []
        for wid, (token, _rank) in reversed(list(ledger.in_flight.items())):
            item = ledger.items[wid]
            restart = SOURCE_MASTER_RESTART
            out.append(d._retry_or_defer(item, token, restart, "master-restart", "restart"))
        return d, out
