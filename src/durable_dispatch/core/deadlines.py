"""The deadline policy (pure, no clock): how long a dispatch may take, how far a heartbeat
pushes its deadline, how many items ``batch="auto"`` puts in one, and the adaptive watchdog
rule that fits the deadline of items without their own timeout to the measured task times.
The :class:`~durable_dispatch.core.dispatcher.Dispatcher` asks it, and tells it what each
successful dispatch took (:meth:`DeadlinePolicy.observe`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .batching import BatchSizer
from .config import ADAPTIVE_WINDOW, WatchdogConfig
from .decisions import WorkItem
from .watchdog import QuantileWindow

__all__ = ["DeadlinePolicy", "OBSERVED_SECONDS"]

#: Dispatches shorter than this are not measured for the drain before an allocation's end: so
#: short a task never matters to its margin (the close alone takes seconds), and a campaign of
#: fast tasks pays nothing for the measurement (a few microseconds each). Leaving them out
#: makes the expected times longer, never shorter: the drain begins earlier, not later.
OBSERVED_SECONDS = 0.01


class DeadlinePolicy:
    """Deadlines and batch sizes from a :class:`~durable_dispatch.core.config.WatchdogConfig`
    and the times measured so far (see the module docs)."""

    def __init__(self, watchdog: WatchdogConfig) -> None:
        self.watchdog = watchdog
        # the config is frozen: its derived flags are read once (every dispatch asks them)
        #: False when the watchdog is off (its ``seconds`` is 0)
        self.enabled: bool = watchdog.enabled
        self._enabled = self.enabled
        self._adaptive = watchdog.adaptive
        self._seconds = watchdog.seconds
        self._lease = watchdog.heartbeat_lease
        self._sizer = BatchSizer()
        self._task_times = QuantileWindow(ADAPTIVE_WINDOW)  # the adaptive rule's measurements
        #: the time per item of the last successful dispatches of :data:`OBSERVED_SECONDS` or
        #: longer, whatever their timeouts (what the drain before an allocation's end expects
        #: of the work in flight: ``allocation``)
        self.task_times = QuantileWindow(ADAPTIVE_WINDOW)

    def observe(self, items: Sequence[WorkItem], seconds: float) -> bool:
        """A dispatch of ``items`` succeeded after ``seconds``; True when the adaptive rule has
        just fitted its first deadline (the dispatcher then fits the open ones)."""
        self._sizer.observe(len(items), seconds)
        if seconds >= OBSERVED_SECONDS:
            self.task_times.add(seconds / len(items))
        # under the adaptive rule, the task times it governs: items without a timeout
        if self._adaptive and all(w.timeout is None for w in items):
            self._task_times.add(seconds / len(items))
            return len(self._task_times) == self.watchdog.min_samples
        return False

    def auto_batch(self) -> int:
        """How many items the next dispatch should carry under ``batch="auto"``: sized from the
        measured time per item so that a dispatch lasts about 50 ms and stays within a quarter
        of the watchdog's deadline, from 1 up to 64 (the rule: :mod:`~durable_dispatch.core.
        batching`)."""
        return self._sizer.size(self._seconds if self._enabled else None)

    def allowed_seconds(self, items: Sequence[WorkItem]) -> float:
        """A dispatch's time: its items' own timeouts added up, plus, if any item has none, the
        watchdog's seconds once (one item: its timeout, or the watchdog's seconds); under the
        adaptive rule, :meth:`deadline_seconds` for each item without one, at most the
        watchdog's seconds in all. The shell sends it with the WORK, so that an isolating worker
        kills the work at the same deadline."""
        if len(items) == 1:  # the usual dispatch: its timeout, or the deadline of one item
            own1 = items[0].timeout
            if own1 is not None:
                return own1
            return self.deadline_seconds() if self._adaptive else self._seconds
        own = [w.timeout for w in items if w.timeout is not None]
        rest = len(items) - len(own)
        if not rest:
            return sum(own)
        if self._adaptive:
            return sum(own) + min(self._seconds, rest * self.deadline_seconds())
        return sum(own) + self._seconds

    def deadline_seconds(self) -> float:
        """The deadline an item without its own timeout gets now: the watchdog's seconds, or
        under the adaptive rule (``WatchdogConfig.quantile``) ``multiple`` x the measured
        ``quantile`` of task time, within ``floor`` .. ``seconds``, once ``min_samples``
        dispatches succeeded."""
        wd = self.watchdog
        if not self._adaptive or len(self._task_times) < wd.min_samples:
            return self._seconds
        fitted = wd.multiple * self._task_times.quantile(wd.quantile or 1.0)
        return min(wd.seconds, max(wd.floor, fitted))

    def lease_seconds(self) -> float:
        """How far a HEARTBEAT pushes a deadline now: the configured lease, or the deadline an
        item gets now (:meth:`deadline_seconds`). The shell sends it with the WORK."""
        lease = self._lease
        return lease if lease is not None else self.deadline_seconds()

    def lease_for(self, items: Sequence[WorkItem]) -> float:
        """How far a HEARTBEAT pushes the deadline of a dispatch of ``items``: 0 when every
        item has its own timeout (that deadline is fixed on every path; a heartbeat never extends
        it), else :meth:`lease_seconds`. The shell sends it with the WORK."""
        if len(items) == 1:
            if items[0].timeout is not None:
                return 0.0
        elif all(w.timeout is not None for w in items):
            return 0.0
        lease = self._lease
        return lease if lease is not None else self.deadline_seconds()
