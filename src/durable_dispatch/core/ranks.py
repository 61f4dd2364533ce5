"""Worker ranks and their states (pure, no I/O): one registry, one place that changes a state.

A rank is in exactly one :class:`RankState`::

    (added) --> STARTING --its first READY (no token)--> IDLE
    (added) --> IDLE --reserve--> BUSY --its dispatch ended--> IDLE
                                  BUSY --timeout or send failure--> PARKED --exact READY--> IDLE
                any state --the runtime reported it dead (ULFM)--> LOST

A BUSY rank runs one transaction (:meth:`Ranks.current`); when it stops running it, for any
reason, that transaction's token is *retired* for the rank, so a later message carrying it is
classified stale rather than unowned. A PARKED rank holds the exact retired token that releases
it (W6, W7). Every change goes through :meth:`Ranks._move`, which refuses a transition the
diagram does not have.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from enum import Enum
from typing import Generic, TypeVar

from ..errors import UsageError
from ..tokens import Token

__all__ = ["RankState", "Ranks"]

_RETIRED_KEEP = 64  # retired tokens remembered per rank, to tell stale from unowned

TX = TypeVar("TX")


class RankState(str, Enum):
    """Where a worker rank is in its life."""

    STARTING = "STARTING"
    IDLE = "IDLE"
    BUSY = "BUSY"
    PARKED = "PARKED"
    LOST = "LOST"

    def __repr__(self) -> str:
        return self.value


# from -> the states it may move to (None: a rank never added)
_MOVES: dict[RankState | None, frozenset[RankState]] = {
    None: frozenset({RankState.IDLE, RankState.STARTING}),
    RankState.STARTING: frozenset({RankState.IDLE, RankState.LOST}),
    RankState.IDLE: frozenset({RankState.BUSY, RankState.LOST}),
    RankState.BUSY: frozenset({RankState.IDLE, RankState.PARKED, RankState.LOST}),
    RankState.PARKED: frozenset({RankState.IDLE, RankState.LOST}),
    RankState.LOST: frozenset({RankState.IDLE, RankState.STARTING}),  # added again
}


class Ranks(Generic[TX]):
    """The worker ranks: each one's :class:`RankState`, the transaction a BUSY rank runs, the
    token a PARKED rank waits for, and the tokens each rank retired."""

    __slots__ = (
        "_state",
        "_idle",
        "_current",
        "_parked",
        "_retired",
        "_starting",
        "_lost",
        "_held",
    )

    def __init__(self) -> None:
        self._state: dict[int, RankState] = {}
        self._idle = _IdleRanks()
        self._current: dict[int, TX] = {}
        self._parked: dict[int, Token] = {}
        self._retired: dict[int, deque[Token]] = {}
        # how many are STARTING and LOST (the other states have their own containers), so
        # that every count is O(1): the master asks for them every turn (stop_reason)
        self._starting = 0
        self._lost = 0
        # ranks given no new work while they are suspect (their host lost a rank): an IDLE one
        # stays out of the idle set until :meth:`trust`
        self._held: set[int] = set()

    def _move(self, rank: int, to: RankState) -> None:
        """The one place a rank's state changes."""
        was = self._state.get(rank)
        if to not in _MOVES[was]:
            raise UsageError(f"rank {rank} is {was.value if was else 'unknown'}, not {to.value}")
        if was is RankState.IDLE:
            self._idle.discard(rank)
        elif was is RankState.BUSY:
            del self._current[rank]
        elif was is RankState.PARKED:
            del self._parked[rank]
        elif was is RankState.STARTING:
            self._starting -= 1
        elif was is RankState.LOST:
            self._lost -= 1
        self._state[rank] = to
        if to is RankState.IDLE:
            if rank not in self._held:
                self._idle.add(rank)
        elif to is RankState.STARTING:
            self._starting += 1
        elif to is RankState.LOST:
            self._lost += 1
            self._held.discard(rank)

    # ------------------------------------------------------------ transitions
    def add(self, rank: int, *, starting: bool = False) -> None:
        """A new worker rank (or one lost before, added again): IDLE, or STARTING until it
        announces itself (:meth:`announce`)."""
        self._move(rank, RankState.STARTING if starting else RankState.IDLE)

    def announce(self, rank: int) -> None:
        """STARTING -> IDLE: the worker said READY for the first time."""
        self._move(rank, RankState.IDLE)

    def start(self, rank: int, tx: TX) -> None:
        """IDLE -> BUSY running ``tx``."""
        self._move(rank, RankState.BUSY)
        self._current[rank] = tx

    def finish(self, rank: int, token: Token) -> None:
        """BUSY -> IDLE: the rank stopped running its transaction, ``token`` (retired)."""
        self._move(rank, RankState.IDLE)
        self._retire(rank, token)

    def park(self, rank: int, token: Token) -> None:
        """BUSY -> PARKED: its dispatch ``token`` was rolled back and retired; only a READY with
        exactly ``token`` releases the rank (W6, W7)."""
        self._move(rank, RankState.PARKED)
        self._retire(rank, token)
        self._parked[rank] = token

    def release(self, rank: int) -> Token:
        """PARKED -> IDLE; returns the token that released it."""
        token = self._parked[rank]
        self._move(rank, RankState.IDLE)
        return token

    def lose(self, rank: int) -> None:
        """Any state -> LOST (the runtime reported the process dead)."""
        self._move(rank, RankState.LOST)

    def withhold(self, rank: int) -> None:
        """Give ``rank`` no new work until :meth:`trust` (it is suspect); its state is
        unchanged (a BUSY one runs on; an IDLE one is not chosen by :meth:`lowest_idle`)."""
        if self.is_live(rank):
            self._held.add(rank)
            self._idle.discard(rank)

    def trust(self, rank: int) -> None:
        """``rank`` may get work again (an IDLE one is idle again)."""
        if rank in self._held:
            self._held.discard(rank)
            if self._state.get(rank) is RankState.IDLE:
                self._idle.add(rank)

    def _retire(self, rank: int, token: Token) -> None:
        kept = self._retired.get(rank)
        if kept is None:
            kept = self._retired[rank] = deque(maxlen=_RETIRED_KEEP)
        kept.append(token)

    # ---------------------------------------------------------------- queries
    def state(self, rank: int) -> RankState | None:
        """The rank's state, or None for a rank never added."""
        return self._state.get(rank)

    def is_live(self, rank: int) -> bool:
        """True for a rank added and not lost (starting, idle, busy or parked)."""
        s = self._state.get(rank)
        return s is not None and s is not RankState.LOST

    def current(self, rank: int) -> TX | None:
        """The transaction a BUSY rank runs, else None."""
        return self._current.get(rank)

    def busy(self) -> dict[int, TX]:
        """BUSY rank -> its transaction (a view: do not change it)."""
        return self._current

    def parked_token(self, rank: int) -> Token | None:
        """The token that releases a PARKED rank, else None."""
        return self._parked.get(rank)

    def parked(self) -> dict[int, Token]:
        """PARKED rank -> the token that releases it (a copy)."""
        return dict(self._parked)

    def retired(self, rank: int, token: Token) -> bool:
        """True when ``rank`` ran ``token`` once (among its last 64 dispatches)."""
        return token in self._retired.get(rank, ())

    def lowest_idle(self) -> int | None:
        """The lowest IDLE rank (O(log n)), or None."""
        return self._idle.lowest()

    def live(self) -> list[int]:
        """Every rank not lost, sorted."""
        return sorted(r for r, s in self._state.items() if s is not RankState.LOST)

    def idle(self) -> list[int]:
        """IDLE ranks, sorted."""
        return sorted(self._idle)

    def count(self, state: RankState) -> int:
        """How many ranks are in ``state`` (O(1))."""
        if state is RankState.IDLE:
            return len(self._idle)
        if state is RankState.BUSY:
            return len(self._current)
        if state is RankState.PARKED:
            return len(self._parked)
        return self._starting if state is RankState.STARTING else self._lost

    def live_count(self) -> int:
        """How many ranks are not lost (O(1))."""
        return len(self._state) - self._lost


class _IdleRanks:
    """The idle ranks, lowest first in O(log n): a set, and a heap with lazy deletion (a rank
    discarded from the set stays in the heap until it reaches the top). ``reserve`` used to take
    ``min()`` of a set: O(ranks) per dispatch, 5.3x slower at 10,000 ranks than at 8."""

    __slots__ = ("_set", "_heap")

    def __init__(self) -> None:
        self._set: set[int] = set()
        self._heap: list[int] = []

    def add(self, rank: int) -> None:
        if rank not in self._set:
            self._set.add(rank)
            heapq.heappush(self._heap, rank)

    def discard(self, rank: int) -> None:
        self._set.discard(rank)

    def lowest(self) -> int | None:
        """The lowest idle rank, or None (stale heap entries are dropped on the way)."""
        heap = self._heap
        while heap:
            rank = heap[0]
            if rank in self._set:
                return rank
            heapq.heappop(heap)
        return None

    def __len__(self) -> int:
        return len(self._set)

    def __iter__(self) -> Iterator[int]:
        return iter(self._set)
