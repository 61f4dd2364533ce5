"""The watchdog's deadlines: a heap of ``(deadline, token)``, earliest first (pure, no clock);
the window of measured task times the adaptive rule takes its quantile from; and the observed
clock that keeps a master pause from counting against the workers.

A dispatch's deadline is pushed when its send returned and again when a HEARTBEAT extends
it; an entry is not removed when its dispatch ends or its deadline moves. Instead the owner
says, for each entry that comes due, whether it is still current (lazy deletion), so a sweep
with nothing due costs O(1) at any number of dispatches in flight, and k due entries cost
O(k log n). The owner rebuilds the heap from the open dispatches when stale entries outnumber
them, so it holds O(dispatches in flight) entries, not one per deadline of the last watchdog
period.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable, Iterable

from ..tokens import Token

__all__ = ["DeadlineHeap", "QuantileWindow", "ObservedClock", "MAX_TURN_SECONDS"]

#: The longest gap between two readings of the master's clock that still counts as observed
#: time. A turn of the master loop takes milliseconds; a longer gap means the master could not
#: look at its messages (it was stopped, its VM or container paused, it swapped, a callback or
#: an fsync blocked it), and the excess over this is not counted against the workers.
MAX_TURN_SECONDS = 0.25


class DeadlineHeap:
    """Deadlines by token, earliest first; stale entries are skipped when they come due."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[float, Token]] = []

    def push(self, deadline: float, token: Token) -> int:
        """``token``'s dispatch must end by ``deadline`` (a later push for the same token
        supersedes an earlier one once ``current`` says so); returns how many entries the heap
        holds now."""
        heap = self._heap
        heapq.heappush(heap, (deadline, token))
        return len(heap)

    def due(self, now: float, current: Callable[[Token, float], bool]) -> list[Token]:
        """The tokens whose current deadline is at or before ``now``, earliest first.

        ``current(token, deadline)`` says whether an entry still stands (its dispatch is open
        and this is its deadline); entries that do not are dropped. Entries that do stay in the
        heap: this is a query, and the owner ends those dispatches (which makes them stale).
        """
        heap = self._heap
        popped: list[tuple[float, Token]] = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if not current(entry[1], entry[0]):
                continue  # a stale entry: closed, rolled back, or extended by a heartbeat
            if popped and popped[-1] == entry:
                continue  # the same entry twice (equal entries pop next to each other)
            popped.append(entry)
        for entry in popped:
            heapq.heappush(heap, entry)
        return [token for _, token in popped]

    def rebuild(self, current: Iterable[tuple[float, Token]]) -> None:
        """Start over from ``current``, every dispatch's current ``(deadline, token)`` (the owner
        knows them): the stale entries go, in O(len(current)) however many there were. Stale
        entries otherwise leave only when they come due; the owner rebuilds the heap when they
        pile up (``DispatcherBase._push_deadline``)."""
        heap = list(current)
        heapq.heapify(heap)
        self._heap = heap

    def __len__(self) -> int:
        return len(self._heap)


class QuantileWindow:
    """The last ``size`` measurements, also kept sorted, so that a quantile costs O(1) and a new
    measurement O(size) in memory moves (a few microseconds at the default 1,000), at any
    campaign size and any number of ranks."""

    __slots__ = ("_order", "_sorted", "size")

    def __init__(self, size: int = 1000) -> None:
        if type(size) is not int or size < 1:
            raise ValueError(f"size must be an integer >= 1, got {size!r}")
        self.size = size
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def add(self, value: float) -> None:
        """Measure ``value`` (the oldest measurement leaves a full window); NaN is ignored."""
        if math.isnan(value):
            return
        if len(self._order) == self.size:
            old = self._order.popleft()
            del self._sorted[bisect_left(self._sorted, old)]
        self._order.append(value)
        insort(self._sorted, value)

    def quantile(self, q: float) -> float:
        """The nearest-rank ``q`` quantile: the smallest measurement with at least a share ``q``
        of the window at or below it (so 0.99 of 20 measurements is the largest).

        Raises:
            ValueError: the window is empty, or ``q`` is not within (0, 1].
        """
        if not self._sorted:
            raise ValueError("no measurements yet")
        if not 0 < q <= 1:
            raise ValueError(f"q must be within (0, 1], got {q!r}")
        return self._sorted[max(0, math.ceil(q * len(self._sorted)) - 1)]

    def quantile_above(self, q: float, least: float) -> float | None:
        """The nearest-rank ``q`` quantile of the measurements greater than ``least`` (what a
        task that has run ``least`` seconds takes, as far as the window knows); None when none
        is greater.

        Raises:
            ValueError: ``q`` is not within (0, 1].
        """
        if not 0 < q <= 1:
            raise ValueError(f"q must be within (0, 1], got {q!r}")
        s = self._sorted
        first = bisect_right(s, least)
        above = len(s) - first
        if not above:
            return None
        return s[first + max(0, math.ceil(q * above) - 1)]

    def __len__(self) -> int:
        return len(self._order)


class ObservedClock:
    """The master's clock as far as it could observe its workers (pure: it is given the raw
    monotonic readings).

    Deadlines are measured on this clock. Between two readings it advances as the raw clock
    does, but by at most ``max_step``: a gap longer than that (the master was paused) is credited,
    not counted, so a RESULT that waited in the master's inbox during a pause is never judged
    late. After such a gap it *holds* sweeps until the shell reports, with :meth:`drained`, a
    receive that found everything that had arrived (fewer messages than its limit): the backlog
    of the pause is read before any deadline is judged.

    A paused *worker* still times out: its deadline passes in observed time while the master
    watches for its RESULT.

    Args:
        max_step: the longest gap counted in full (:data:`MAX_TURN_SECONDS`).
    """

    __slots__ = ("max_step", "_last", "_offset", "hold", "pauses", "paused_seconds")

    def __init__(self, max_step: float = MAX_TURN_SECONDS) -> None:
        if not max_step > 0:
            raise ValueError(f"max_step must be > 0, got {max_step!r}")
        self.max_step = float(max_step)
        self._last: float | None = None
        self._offset = 0.0
        #: True from a credited gap until the shell reports a complete drain
        self.hold = False
        #: how many gaps were credited, and their length beyond ``max_step`` in all
        self.pauses = 0
        self.paused_seconds = 0.0

    def observe(self, raw: float) -> float:
        """The observed time at the raw monotonic reading ``raw`` (readings never go back:
        an earlier one is taken as the last)."""
        last = self._last
        if last is not None:
            step = raw - last
            if step > self.max_step:
                gap = step - self.max_step
                self._offset += gap
                self.pauses += 1
                self.paused_seconds += gap
                self.hold = True
            elif step < 0:
                raw = last
        self._last = raw
        return raw - self._offset

    def drained(self) -> None:
        """The shell received every message that had arrived: sweeps may judge deadlines."""
        self.hold = False
