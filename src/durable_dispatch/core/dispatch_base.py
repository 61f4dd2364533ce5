"""The dispatcher's fields and the helpers every part of it uses (pure, no I/O).

:class:`~durable_dispatch.core.dispatcher.Dispatcher` is built in parts, one job each, over this
base: :mod:`rollback <durable_dispatch.core.rollback>` (the paths every failure takes, the
sweep and the restart), :mod:`queries <durable_dispatch.core.queries>` (what it shows: queries,
statistics, the snapshot) and the dispatcher itself (dispatch, messages, commits). The base
holds what they share: the ledger, the ranks, the open transactions, the leases, the deadlines
and counters, and the one place a decision's event is applied to the ledger (:meth:`_record`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from ..errors import UsageError
from ..tokens import Token
from .config import RetryPolicy, WatchdogConfig
from .deadlines import DeadlinePolicy
from .decisions import (
    Classification,
    Decision,
    PersistSnapshot,
    Quarantine,
    WorkItem,
)
from .domains import FailureDomains
from .events import Event, of_decision
from .ledger import Ledger
from .ranks import Ranks
from .stats import Counters
from .transactions import Transaction, TxState
from .watchdog import DeadlineHeap, ObservedClock

__all__ = ["DispatcherBase"]

_D = TypeVar("_D", bound=Decision)


#: How many entries the deadline heap may hold beyond twice the open dispatches before it is
#: rebuilt from them (:meth:`DispatcherBase._push_deadline`).
HEAP_SLACK = 1024


class DispatcherBase:
    """The state and shared helpers of a :class:`~durable_dispatch.core.dispatcher.Dispatcher`
    (its constructor's arguments are documented there)."""

    def __init__(
        self,
        epoch: int = 1,
        watchdog: WatchdogConfig | None = None,
        retry: RetryPolicy | None = None,
        ranks: Iterable[int] = (),
        *,
        starting: bool = False,
    ) -> None:
        if not isinstance(epoch, int) or epoch < 0:
            raise UsageError(f"epoch must be an integer >= 0, got {epoch!r}")
        for name, value, want in (
            ("watchdog", watchdog, WatchdogConfig),
            ("retry", retry, RetryPolicy),
        ):
            if value is not None and not isinstance(value, want):
                raise UsageError(
                    f"{name} must be a {want.__name__} (or None), got {type(value).__name__}"
                )
        self.watchdog = watchdog or WatchdogConfig()
        self.retry = retry or RetryPolicy()
        #: the durable facts (frontier, in flight, committed, deferred, failures, solo marks)
        self.ledger = Ledger(epoch)
        self._ranks: Ranks[Transaction] = Ranks()
        self._open: dict[str, Transaction] = {}  # wire form of the token -> open transaction
        # the open transactions whose current READY came before a valid RESULT (W3 step 4
        # looks only at these, not at every busy rank: a turn stays O(1) at 10,000 ranks)
        self._joinable: dict[str, Transaction] = {}
        self._leases: dict[tuple[str, str], Token] = {}
        self._deadlines = DeadlineHeap()
        #: the shell reads its monotonic clock through this (a master pause is not held
        #: against the workers); the core never reads a clock itself
        self.clock = ObservedClock()
        self._snapshot_required: str | None = None
        self._n = Counters()
        #: the deadline policy: a dispatch's time, the heartbeat lease, the adaptive rule
        self.policy = DeadlinePolicy(self.watchdog)
        #: the hosts of the ranks: a node is a failure domain (see :mod:`.domains`)
        self.domains = FailureDomains(self._ranks)
        # the item of a rank lost alone while its host's other ranks are suspect: its charge
        # waits until the host is known to live (they answered, or the window passed: charged
        # lost-rank) or to have died (another rank of it lost: requeued uncharged). It stays
        # in flight in the ledger meanwhile. work ID -> (item, token, host, error)
        self._held_lost: dict[str, tuple[WorkItem, Token, str, str]] = {}
        for r in ranks:
            self.add_rank(r, starting=starting)

    @property
    def epoch(self) -> int:
        """This master run's epoch."""
        return self.ledger.epoch

    def add_rank(self, rank: int, *, starting: bool = False) -> None:
        """Make ``rank`` a worker that starts idle, or STARTING (``starting``: it gets work
        once its first READY without a token arrives)."""
        if not isinstance(rank, int) or rank < 0:
            raise UsageError(f"rank must be an integer >= 0, got {rank!r}")
        if self._ranks.is_live(rank):
            raise UsageError(f"rank {rank} was already added")
        self._ranks.add(rank, starting=starting)

    def note_host(self, rank: int, host: str) -> None:
        """Worker ``rank`` runs on ``host`` (its first READY said so): its failure domain."""
        self.domains.note_host(rank, host)

    def auto_batch(self) -> int:
        """How many items the next dispatch carries under ``batch="auto"``
        (:meth:`DeadlinePolicy.auto_batch`)."""
        return self.policy.auto_batch()

    def allowed_seconds(self, items: Sequence[WorkItem]) -> float:
        """A dispatch's time (:meth:`DeadlinePolicy.allowed_seconds`); the shell sends it with
        the WORK."""
        return self.policy.allowed_seconds(items)

    def deadline_seconds(self) -> float:
        """The deadline an item without its own timeout gets now
        (:meth:`DeadlinePolicy.deadline_seconds`)."""
        return self.policy.deadline_seconds()

    def lease_seconds(self) -> float:
        """How far a HEARTBEAT pushes a deadline now (:meth:`DeadlinePolicy.lease_seconds`)."""
        return self.policy.lease_seconds()

    def lease_for(self, items: Sequence[WorkItem]) -> float:
        """How far a HEARTBEAT pushes the deadline of a dispatch of ``items``
        (:meth:`DeadlinePolicy.lease_for`); the shell sends it with the WORK."""
        return self.policy.lease_for(items)

    def _unlease(self, item: WorkItem, token: Token) -> None:
        """``item`` no longer holds its leases (its ledger entry moves with its event)."""
        for k, v in item.leases.items():
            if self._leases.get((k, v)) == token:
                del self._leases[(k, v)]

    def _require_snapshot(self, reason: str) -> PersistSnapshot:
        """No dispatch until the shell persisted a snapshot (S8)."""
        self._snapshot_required = reason
        return PersistSnapshot(reason)

    # ----------------------------------------------------------- internals
    def _record(self, d: _D) -> _D:
        """Apply the durable event of decision ``d`` to the ledger (the shell journals the same
        event); returns ``d``."""
        ev = of_decision(d)
        assert ev is not None, d
        self.ledger.apply(ev)
        return d

    def _apply(self, ev: Event) -> None:
        self.ledger.apply(ev)

    def _push_deadline(self, deadline: float, token: Token) -> None:
        """Push a dispatch's new deadline onto the heap (every change of a ``tx.deadline`` comes
        with one); rebuild the heap from the open dispatches once it holds more than twice as
        many entries as there are open dispatches, plus :data:`HEAP_SLACK`.

        An entry stays in the heap when its dispatch ends or its deadline moves (lazy deletion),
        so without the rebuild the heap kept one entry per deadline of the last watchdog period:
        4.8 million at 40,000 dispatches a second under the default 120 s. A rebuild costs
        O(open dispatches) and comes after at least as many pushes: amortized O(1) a push, and
        the heap never holds more than ``2 * open + HEAP_SLACK + 1`` entries."""
        if self._deadlines.push(deadline, token) > 2 * len(self._open) + HEAP_SLACK:
            self._deadlines.rebuild(
                (tx.deadline, tx.token)
                for tx in self._open.values()
                if tx.state is TxState.DISPATCHED and tx.deadline is not None
            )

    def _deadline_stands(self, token: Token, deadline: float) -> bool:
        """Whether a heap entry is its dispatch's current deadline (open, DISPATCHED, and this
        deadline): the others are stale."""
        tx = self._open.get(str(token))
        return tx is not None and tx.state is TxState.DISPATCHED and tx.deadline == deadline

    def _open_tx(self, token: Token) -> Transaction:
        tx = self._open.get(str(token))
        if tx is None:
            raise UsageError(f"no open transaction has token {token}")
        return tx

    def _quarantine(
        self, rank: int, message: str, cls: Classification, reason: str
    ) -> list[Decision]:
        self._n.by_class(cls)[message] += 1
        return [Quarantine(rank, message, cls, reason)]

    def _classify_not_current(self, rank: int, t: Token, message: str) -> list[Decision]:
        """A well-formed token that names no current transaction of ``rank``: stale when it is
        older (an earlier epoch, or retired by the rank), else unowned."""
        if t.epoch < self.epoch or self._ranks.retired(rank, t):
            return self._quarantine(rank, message, Classification.STALE, "older token")
        return self._quarantine(rank, message, Classification.UNOWNED, "no transaction owns it")

    def _free_rank_if_done(self, tx: Transaction) -> list[Decision]:
        """A generation whose READY was seen frees its rank as soon as its result was accepted.

        The endpoint is free even while the commit is still being made durable (``COMMITTING``):
        the work ID stays leased to the transaction until ``commit_done``, but the rank may take
        new work, so a group commit never stalls the workers.
        """
        if not tx.ready_seen or tx.state not in (TxState.COMMITTING, TxState.CLOSED):
            return []
        if self._ranks.current(tx.rank) is tx:
            self._ranks.finish(tx.rank, tx.token)
        if tx.state is TxState.CLOSED:
            self._open.pop(tx.wire, None)
        return []
