"""The drain before an allocation's end (pure: every time is an argument).

A batch job's allocation ends at a known time (the batch system's end time, or ``ends_at``). The
master begins its drain (the one a SIGUSR1 begins) at ``end - margin``, where the margin covers
what must happen before the end:

* the work in flight: for each dispatch, what it is expected to need still, from the task times
  observed so far (``DeadlinePolicy.task_times``, dispatches of 10 ms or more): the
  :data:`EXPECT_QUANTILE` quantile of the observed times longer than what it has run already,
  minus what it has run (as long again as it ran, when it ran longer than every task seen); at
  most the time to its own deadline (it is rolled back there anyway); then the master's close
  (:attr:`DrainPlan.close_seconds`) after it;
* the close alone, when nothing is in flight;
* a floor (:data:`DRAIN_MARGIN`, ``drain_margin=``), itself at most :data:`FLOOR_SHARE` of the
  allocation's length as the master saw it at its start, so a short allocation still gets work
  done (a 60 s floor in a one-minute job would drain at once, every time).

Before the drain, a dispatch is sent only when it fits: its expected time (that quantile, times
its items) and the close end before the allocation does. Nothing is known of a task before one
finished: until then the floor alone covers the work in flight.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .watchdog import QuantileWindow

__all__ = [
    "DRAIN_MARGIN",
    "EXPECT_QUANTILE",
    "FLOOR_SHARE",
    "DrainPlan",
    "InFlight",
    "remaining_seconds",
    "allocations_needed",
]

#: The default floor of the margin, in seconds (``run_master(drain_margin=)``).
DRAIN_MARGIN = 60.0
#: The share of observed task times an expectation covers.
EXPECT_QUANTILE = 0.9
#: The floor is at most this share of the allocation's length (from the master's start).
FLOOR_SHARE = 0.25


@dataclass(frozen=True)
class InFlight:
    """One dispatch in flight, as the margin sees it.

    Attributes:
        elapsed: seconds since its WORK send returned.
        items: its work items.
        deadline_left: seconds until its deadline (None when the watchdog is off).
    """

    elapsed: float
    items: int = 1
    deadline_left: float | None = None


def remaining_seconds(d: InFlight, times: QuantileWindow, q: float = EXPECT_QUANTILE) -> float:
    """What dispatch ``d`` is expected to need still (see the module docs): 0 before any task
    time was observed; as long again as it ran when it has run longer than every observed
    task; never longer than the time to its deadline."""
    if not len(times):
        return 0.0
    n = max(1, d.items)
    per_item = times.quantile_above(q, d.elapsed / n)
    if per_item is not None:
        left = n * per_item - d.elapsed
    else:  # longer than every task seen: expect as long again (at most to its deadline)
        left = d.elapsed
    if d.deadline_left is not None:
        left = min(left, d.deadline_left)
    return max(0.0, left)


@dataclass(frozen=True)
class DrainPlan:
    """When to drain before the allocation's end, and what still fits (see the module docs).

    Attributes:
        floor: the margin's floor in seconds (:data:`DRAIN_MARGIN` by default).
        close_seconds: what the master's close costs (journal, snapshot, stopping the workers).
        started: when the master started (the clock of the ``now`` and ``ends_at`` passed).
        step: how often the shell weighs the drain (seconds): the drain may begin that much
            late, so the work in flight's margin includes it.
    """

    floor: float = DRAIN_MARGIN
    close_seconds: float = 5.0
    started: float = 0.0
    step: float = 0.0

    def floor_at(self, ends_at: float) -> float:
        """The floor for an allocation that ends at ``ends_at``: :attr:`floor`, at most
        :data:`FLOOR_SHARE` of the time from the master's start to the end."""
        return max(0.0, min(self.floor, FLOOR_SHARE * (ends_at - self.started)))

    def margin(self, ends_at: float, in_flight: Iterable[InFlight], times: QuantileWindow) -> float:
        """Seconds before ``ends_at`` at which the drain begins: the longest expected remainder
        of the work in flight plus the close (and one :attr:`step`), or the floor, whichever is
        longer."""
        work = max((remaining_seconds(d, times) for d in in_flight), default=0.0)
        return max(work + self.close_seconds + self.step, self.floor_at(ends_at))

    def drain_now(
        self,
        now: float,
        ends_at: float,
        in_flight: Sequence[InFlight],
        times: QuantileWindow,
        next_items: int = 0,
    ) -> bool:
        """True when the drain must begin at ``now``: the margin is reached, or nothing is in
        flight and the next dispatch (``next_items``, 0 when nothing is pending) does not fit,
        so waiting longer would do nothing."""
        if now >= ends_at - self.margin(ends_at, in_flight, times):
            return True
        return not in_flight and next_items > 0 and not self.fits(now, ends_at, next_items, times)

    def drain_until(self, now: float, ends_at: float) -> float:
        """How long a drain begun at ``now`` waits for the work in flight: until the close must
        begin (``ends_at - close_seconds``), and never before ``now``."""
        return max(now, ends_at - self.close_seconds)

    def fits(self, now: float, ends_at: float, items: int, times: QuantileWindow) -> bool:
        """True when a dispatch of ``items`` sent at ``now`` is expected to finish, and the
        close after it, before ``ends_at`` (unknown before any task finished: True). One that
        does not fit would move the drain to ``now``: it is not sent."""
        if not len(times):
            return True
        expected = max(1, items) * times.quantile(EXPECT_QUANTILE)
        return now + expected + self.close_seconds <= ends_at


def allocations_needed(eta: float | None, time_left: float | None, length: float | None) -> int:
    """How many more allocations of ``length`` seconds a campaign needs whose ETA is ``eta``
    seconds with ``time_left`` seconds of this one left: 0 when it ends within this one (or
    something is unknown)."""
    if eta is None or time_left is None or length is None or length <= 0 or eta <= time_left:
        return 0
    return math.ceil((eta - max(0.0, time_left)) / length)
