"""A dispatch's reservation transaction and its states: ``PREPARING -> DISPATCHED ->
COMMITTING -> CLOSED`` (or ``ROLLED_BACK``). The table ``_TX_TRANSITIONS`` is the whole life of
a transaction, and :func:`advance` the only code that changes its state; where a work ID is
(:class:`WorkStatus`) is read off the ledger and the open transactions.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..errors import UsageError
from ..tokens import Token
from .decisions import ItemFailure, WorkItem

__all__ = ["TxState", "TxEvent", "Transaction", "WorkStatus", "advance"]


# ---------------------------------------------------------------------------------- states
class TxState(str, Enum):
    """The life of one reservation transaction (see ``_TX_TRANSITIONS``)."""

    PREPARING = "PREPARING"
    DISPATCHED = "DISPATCHED"
    COMMITTING = "COMMITTING"
    CLOSED = "CLOSED"
    ROLLED_BACK = "ROLLED_BACK"

    def __repr__(self) -> str:
        return self.value


class TxEvent(str, Enum):
    """What happens to a transaction."""

    SENT = "SENT"  # the WORK send returned (mark_dispatched)
    READY = "READY"  # a current READY came before the send was reported
    RESULT = "RESULT"  # a current, valid RESULT: its good items are being journaled
    COMMITTED = "COMMITTED"  # the shell journaled its commits (commit_done)
    EMPTIED = "EMPTIED"  # every item left it (failed, refused or already committed)
    ROLLED_BACK = "ROLLED_BACK"  # timeout, send failure, invalid result or lost rank (W4)

    def __repr__(self) -> str:
        return self.value


#: (state, event) -> next state; any other pair is illegal. A transaction is open in PREPARING,
#: DISPATCHED and COMMITTING; CLOSED and ROLLED_BACK are final.
_TX_TRANSITIONS: dict[tuple[TxState, TxEvent], TxState] = {
    (TxState.PREPARING, TxEvent.SENT): TxState.DISPATCHED,
    (TxState.PREPARING, TxEvent.READY): TxState.DISPATCHED,  # the send evidently completed
    (TxState.PREPARING, TxEvent.RESULT): TxState.COMMITTING,
    (TxState.DISPATCHED, TxEvent.RESULT): TxState.COMMITTING,
    (TxState.COMMITTING, TxEvent.COMMITTED): TxState.CLOSED,
    (TxState.COMMITTING, TxEvent.EMPTIED): TxState.CLOSED,
    (TxState.PREPARING, TxEvent.ROLLED_BACK): TxState.ROLLED_BACK,
    (TxState.DISPATCHED, TxEvent.ROLLED_BACK): TxState.ROLLED_BACK,
}


def advance(tx: Transaction, event: TxEvent) -> None:
    """The one place a transaction's state changes.

    Raises:
        UsageError: ``event`` is not allowed in ``tx``'s state (the shell reported something
            out of order, such as ``commit_done`` for a dispatch that is not committing).
    """
    to = _TX_TRANSITIONS.get((tx.state, event))
    if to is None:
        allowed = " or ".join(s.value for s, e in _TX_TRANSITIONS if e is event)
        raise UsageError(f"{tx.token} is {tx.state.value}, not {allowed} ({event.value})")
    tx.state = to


class WorkStatus(str, Enum):
    """Where a work ID is: every known work ID is in exactly one of these."""

    PENDING = "PENDING"
    IN_FLIGHT = "IN_FLIGHT"
    COMMITTED = "COMMITTED"
    DEFERRED = "DEFERRED"
    #: waiting for a dependency's commit (``WorkItem.after``)
    WAITING = "WAITING"
    CANCELLED = "CANCELLED"

    def __repr__(self) -> str:
        return self.value


@dataclass(slots=True)
class Transaction:
    """One dispatch of one or more work items to one rank (mutable, owned by the core).

    ``items`` are the items still owned by the dispatch: an item whose RESULT entry reported an
    error leaves it at once (it is requeued or deferred), the others commit together.
    """

    token: Token
    rank: int
    items: tuple[WorkItem, ...]
    state: TxState = TxState.PREPARING
    deadline: float | None = None
    ready_seen: bool = False
    failure: ItemFailure | None = None  # why its RESULT failed; the READY then rolls it back
    sent_at: float | None = None  # when its send returned (for batch="auto")
    seconds: float | None = None  # its deadline from the send, as the WORK told the worker
    beaten: bool = False  # a current HEARTBEAT extended its deadline
    wire: str = ""  # str(token): the key of the open transactions, made once at reserve
    ahead: tuple[WorkItem, ...] = ()  # items the worker sent ahead of the RESULT (on_part)
