"""What a dispatcher shows (pure, no I/O): where a work ID is, the ranks, the open
transactions, the statistics, and the durable snapshot of its ledger."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..tokens import Token
from .decisions import (
    WorkItem,
)
from .dispatch_base import DispatcherBase
from .drain import InFlight
from .ranks import RankState
from .stats import DispatchStats
from .transactions import Transaction, TxState, WorkStatus

__all__ = ["Queries"]


class Queries(DispatcherBase):
    """The queries of a :class:`~durable_dispatch.core.dispatcher.Dispatcher`."""

    def status(self, work_id: str) -> WorkStatus | None:
        """Where ``work_id`` is, or None if the core never saw it."""
        ledger = self.ledger
        if work_id in ledger.committed:
            return WorkStatus.COMMITTED
        if work_id in ledger.in_flight:
            return WorkStatus.IN_FLIGHT
        if work_id in ledger.deferred:
            return WorkStatus.DEFERRED
        if work_id in ledger.frontier:
            return WorkStatus.PENDING
        if work_id in ledger.waiting:
            return WorkStatus.WAITING
        if work_id in ledger.cancelled:
            return WorkStatus.CANCELLED
        return None

    @property
    def done(self) -> bool:
        """True when nothing is pending, waiting or in flight (everything committed, deferred
        or cancelled)."""
        return not self.ledger.frontier and not self.ledger.in_flight and not self.ledger.waiting

    @property
    def snapshot_required(self) -> bool:
        """True while a rollback waits for its snapshot (no dispatch until then)."""
        return self._snapshot_required is not None

    def live_ranks(self) -> list[int]:
        """Every worker rank not lost (starting, idle, suspect, busy or parked), sorted."""
        return self._ranks.live()

    def live_rank_count(self) -> int:
        """How many worker ranks are not lost (O(1), where :meth:`live_ranks` lists them)."""
        return self._ranks.live_count()

    def parked_rank_count(self) -> int:
        """How many ranks are parked (O(1), where :meth:`parked_ranks` lists them)."""
        return self._ranks.count(RankState.PARKED)

    def idle_ranks(self) -> list[int]:
        """Idle ranks, sorted."""
        return self._ranks.idle()

    def starting_ranks(self) -> int:
        """How many ranks have not said their first READY yet (STARTING)."""
        return self._ranks.count(RankState.STARTING)

    def parked_ranks(self) -> dict[int, Token]:
        """Parked ranks and the exact token that releases each."""
        return self._ranks.parked()

    def rank_state(self, rank: int) -> RankState | None:
        """Where ``rank`` is (starting, idle, suspect, busy, parked, lost), or None for a rank
        never added."""
        return self._ranks.state(rank)

    def in_flight(self) -> dict[str, Token]:
        """Work ID -> token of every open transaction."""
        return {w: t for w, (t, _) in self.ledger.in_flight.items()}

    def in_flight_count(self) -> int:
        """How many work items are in flight (O(1), where :meth:`in_flight` maps them)."""
        return len(self.ledger.in_flight)

    def open_dispatches(self, now: float) -> list[InFlight]:
        """Every dispatch whose WORK send returned and whose RESULT has not come, as the drain
        before an allocation's end weighs it (:mod:`~durable_dispatch.core.drain`)."""
        out = []
        for tx in self._open.values():
            if tx.state is TxState.DISPATCHED and tx.sent_at is not None:
                left = None if tx.deadline is None else tx.deadline - now
                out.append(InFlight(now - tx.sent_at, len(tx.items), left))
        return out

    def transaction(self, token: Token) -> Transaction | None:
        """The open transaction with ``token`` (for inspection; do not mutate)."""
        return self._open.get(str(token))

    def lease_holder(self, table: str, key: str) -> Token | None:
        """The token holding side-table entry ``table[key]``, or None."""
        return self._leases.get((table, key))

    def committed(self) -> frozenset[str]:
        """Committed work IDs."""
        return frozenset(self.ledger.committed)

    def deferred(self) -> dict[str, WorkItem]:
        """Deferred work items by work ID."""
        return dict(self.ledger.deferred)

    def pending(self) -> list[str]:
        """Pending work IDs in frontier order."""
        return list(self.ledger.frontier)

    def attempts(self, work_id: str) -> int:
        """Failures charged to ``work_id`` so far."""
        return self.ledger.attempts.get(work_id, 0)

    def statistics(self) -> DispatchStats:
        """An immutable snapshot of every counter and gauge."""
        return DispatchStats(
            **self._n.values(),
            parked_ranks_now=self._ranks.count(RankState.PARKED),
            starting_ranks_now=self._ranks.count(RankState.STARTING),
            idle_ranks_now=self._ranks.count(RankState.IDLE),
            busy_ranks_now=self._ranks.count(RankState.BUSY),
            suspect_ranks_now=self._ranks.suspect_count(),
            in_flight_now=len(self.ledger.in_flight),
            pending_now=len(self.ledger.frontier),
            deferred_now=len(self.ledger.deferred),
            waiting_now=len(self.ledger.waiting),
            cancelled_now=len(self.ledger.cancelled),
            auto_batch_now=self.auto_batch(),
            watchdog_enabled=self.watchdog.enabled,
            watchdog_seconds=self.watchdog.seconds,
            watchdog_deadline_now=self.deadline_seconds() if self.watchdog.enabled else 0.0,
            config_corrections=len(self.watchdog.corrections),
            master_pauses=self.clock.pauses,
            master_paused_seconds=self.clock.paused_seconds,
        )

    def snapshot(self, committing: Iterable[str] = ()) -> dict[str, Any]:
        """The durable part of the state as a JSON-ready dict (deadlines are never saved):
        :meth:`Ledger.to_snapshot <durable_dispatch.core.ledger.Ledger.to_snapshot>`.

        In-flight dispatches are saved with their work so that :meth:`restore` can roll them back.
        """
        return self.ledger.to_snapshot(frozenset(committing))
