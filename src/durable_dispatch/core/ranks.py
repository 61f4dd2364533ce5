"""Worker ranks and their states (pure, no I/O): one registry, one place that changes a state.

A rank is in exactly one :class:`RankState`::

    (added) --> STARTING --its first READY (no token)--> IDLE
    (added) --> IDLE --reserve--> BUSY --its dispatch ended--> IDLE
                                  BUSY --timeout or send failure--> PARKED --exact READY--> IDLE
                IDLE --suspected--> SUSPECT --it answered, or its window passed--> IDLE
                any state --the runtime reported it dead (ULFM)--> LOST

A BUSY rank runs one transaction (:meth:`Ranks.current`); when it stops running it, for any
reason, that transaction's token is *retired* for the rank, so a later message carrying it is
classified stale rather than unowned. A PARKED rank holds the exact retired token that releases
it: only a READY carrying that token proves its old dispatch over.

A live rank is *suspected* when its host lost a rank (:mod:`.domains` says which): it gets no
new work until it answers (:meth:`Ranks.heard`) or its window passes (:meth:`Ranks.expire`). An
IDLE one moves to SUSPECT; a STARTING, BUSY or PARKED one keeps its state and is marked suspect,
and lands in SUSPECT instead of IDLE while the mark lasts (a busy rank whose dispatch ended, say).
:attr:`Ranks.suspect_until` is the one record of who is suspect and until when; a lost rank is
suspect no more. Every change of state goes through :meth:`Ranks._move`, which refuses a
transition the diagram does not have.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
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
    #: idle, but suspect (its host lost a rank): no new work until it answers or its window passes
    SUSPECT = "SUSPECT"
    BUSY = "BUSY"
    PARKED = "PARKED"
    LOST = "LOST"

    def __repr__(self) -> str:
        return self.value


# from -> the states it may move to (None: a rank never added). A rank that would become IDLE
# while it is suspect becomes SUSPECT instead; a rank added (again) is never suspect.
_MOVES: dict[RankState | None, frozenset[RankState]] = {
    None: frozenset({RankState.IDLE, RankState.STARTING}),
    RankState.STARTING: frozenset({RankState.IDLE, RankState.SUSPECT, RankState.LOST}),
    RankState.IDLE: frozenset({RankState.BUSY, RankState.SUSPECT, RankState.LOST}),
    RankState.SUSPECT: frozenset({RankState.IDLE, RankState.LOST}),  # answered, or window passed
    RankState.BUSY: frozenset(
        {RankState.IDLE, RankState.SUSPECT, RankState.PARKED, RankState.LOST}
    ),
    RankState.PARKED: frozenset({RankState.IDLE, RankState.SUSPECT, RankState.LOST}),
    RankState.LOST: frozenset({RankState.IDLE, RankState.STARTING}),  # added again
}


class Ranks(Generic[TX]):
    """The worker ranks: each one's :class:`RankState`, the transaction a BUSY rank runs, the
    token a PARKED rank waits for, the tokens each rank retired, and the suspect ranks."""

    __slots__ = (
        "_state",
        "_idle",
        "_current",
        "_parked",
        "_retired",
        "_starting",
        "_withheld",
        "_lost",
        "suspect_until",
    )

    def __init__(self) -> None:
        self._state: dict[int, RankState] = {}
        self._idle = _IdleRanks()
        self._current: dict[int, TX] = {}
        self._parked: dict[int, Token] = {}
        self._retired: dict[int, deque[Token]] = {}
        # how many are STARTING, SUSPECT and LOST (the other states have their own containers),
        # so that every count is O(1): the master asks for them every turn (stop_reason)
        self._starting = 0
        self._withheld = 0
        self._lost = 0
        #: suspect rank -> until when it gets no new work unless it answers first (the one
        #: record of suspicion). The dispatcher's hot paths read it (a truth test, no call):
        #: do not change it
        self.suspect_until: dict[int, float] = {}

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
        elif was is RankState.SUSPECT:
            self._withheld -= 1
        elif was is RankState.LOST:
            self._lost -= 1
        self._state[rank] = to
        if to is RankState.IDLE:
            self._idle.add(rank)
        elif to is RankState.STARTING:
            self._starting += 1
        elif to is RankState.SUSPECT:
            self._withheld += 1
        elif to is RankState.LOST:
            self._lost += 1
            self.suspect_until.pop(rank, None)  # a lost rank is suspect no more

    def _rest(self, rank: int) -> RankState:
        """Where ``rank`` goes when it has nothing to run: IDLE, or SUSPECT while suspect."""
        suspect = self.suspect_until
        return RankState.SUSPECT if suspect and rank in suspect else RankState.IDLE

    # ------------------------------------------------------------ transitions
    def add(self, rank: int, *, starting: bool = False) -> None:
        """A new worker rank (or one lost before, added again): IDLE (SUSPECT while suspect),
        or STARTING until it announces itself (:meth:`announce`)."""
        self._move(rank, RankState.STARTING if starting else self._rest(rank))

    def announce(self, rank: int) -> None:
        """STARTING -> IDLE (SUSPECT while suspect): the worker said READY for the first time."""
        self._move(rank, self._rest(rank))

    def start(self, rank: int, tx: TX) -> None:
        """IDLE -> BUSY running ``tx``."""
        self._move(rank, RankState.BUSY)
        self._current[rank] = tx

    def finish(self, rank: int, token: Token) -> None:
        """BUSY -> IDLE (SUSPECT while suspect): the rank stopped running its transaction,
        ``token`` (retired)."""
        self._move(rank, self._rest(rank))
        self._retire(rank, token)

    def park(self, rank: int, token: Token) -> None:
        """BUSY -> PARKED: its dispatch ``token`` was rolled back and retired; only a READY with
        exactly ``token`` releases the rank (any other READY may come from the old dispatch)."""
        self._move(rank, RankState.PARKED)
        self._retire(rank, token)
        self._parked[rank] = token

    def release(self, rank: int) -> Token:
        """PARKED -> IDLE (SUSPECT while suspect); returns the token that released it."""
        token = self._parked[rank]
        self._move(rank, self._rest(rank))
        return token

    def lose(self, rank: int) -> None:
        """Any state -> LOST (the runtime reported the process dead)."""
        self._move(rank, RankState.LOST)

    def suspect(self, ranks: Iterable[int], until: float) -> None:
        """Each live rank of ``ranks`` gets no new work until ``until`` (a rank suspect already:
        until then from now on), or until it answers (:meth:`heard`). An IDLE one moves to
        SUSPECT; a STARTING, BUSY or PARKED one keeps its state (a busy one runs on)."""
        suspect = self.suspect_until
        for rank in ranks:
            state = self._state.get(rank)
            if state is None or state is RankState.LOST:
                continue
            suspect[rank] = until
            if state is RankState.IDLE:
                self._move(rank, RankState.SUSPECT)

    def heard(self, rank: int) -> bool:
        """A message came from ``rank``: it is alive, no longer suspect (a SUSPECT one is IDLE
        again). True if it was suspect."""
        if self.suspect_until.pop(rank, None) is None:
            return False
        if self._state[rank] is RankState.SUSPECT:
            self._move(rank, RankState.IDLE)
        return True

    def expire_due(self, now: float) -> bool:
        """True when :meth:`expire` has something to do (O(1) when no rank is suspect)."""
        suspect = self.suspect_until
        return bool(suspect) and min(suspect.values()) <= now

    def expire(self, now: float) -> list[int]:
        """The suspect ranks whose window passed by ``now`` are suspect no more (a SUSPECT one
        is IDLE again). Returns them, sorted. O(1) when no rank is suspect."""
        suspect = self.suspect_until
        if not suspect:
            return []
        done = sorted(r for r, until in suspect.items() if until <= now)
        for rank in done:
            self.heard(rank)
        return done

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

    def is_suspect(self, rank: int) -> bool:
        """True while ``rank`` is suspect (whatever its state)."""
        return rank in self.suspect_until

    def suspects(self) -> list[int]:
        """The suspect ranks (in any state), sorted."""
        return sorted(self.suspect_until)

    def suspect_count(self) -> int:
        """How many ranks are suspect, in any state (O(1))."""
        return len(self.suspect_until)

    def lowest_idle(self) -> int | None:
        """The lowest IDLE rank (O(log n)), or None."""
        return self._idle.lowest()

    def live(self) -> list[int]:
        """Every rank not lost, sorted."""
        return sorted(r for r, s in self._state.items() if s is not RankState.LOST)

    def idle(self) -> list[int]:
        """IDLE ranks (not SUSPECT ones), sorted."""
        return sorted(self._idle)

    def count(self, state: RankState) -> int:
        """How many ranks are in ``state`` (O(1))."""
        if state is RankState.IDLE:
            return len(self._idle)
        if state is RankState.BUSY:
            return len(self._current)
        if state is RankState.PARKED:
            return len(self._parked)
        if state is RankState.SUSPECT:
            return self._withheld
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
