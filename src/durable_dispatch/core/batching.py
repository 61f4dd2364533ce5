"""``batch="auto"``: how many items a dispatch carries, from measured item durations (pure).

The rule. Every dispatch has a cost of its own (a WORK message, a RESULT, a journal record each
way: about 100 us of master time here) that a multi-item dispatch pays once for its k items. The
sizer estimates the time per item from each successful dispatch, measured from the WORK send to
its RESULT (``seconds / items``, so the messaging is in it): a slower measurement replaces the
estimate at once, a faster one moves it by a fifth (so it shrinks dispatches at the first sign
of slow tasks and grows them only on evidence). The next dispatch is sized to last about
:data:`TARGET_SECONDS`::

    k = clamp(floor(TARGET_SECONDS / per_item), 1, MAX_ITEMS)

further bounded so that a dispatch stays well inside its deadline (a multi-item dispatch of
items without their own timeout gets the watchdog's seconds once, not k times)::

    k <= floor(DEADLINE_SHARE * watchdog_seconds / per_item)

and grown gently (slow start): at most twice the largest dispatch measured so far, so a campaign
starts with single items and a task of unknown length is never sent 64 at a time. Trivial tasks
(microseconds) reach ``MAX_ITEMS``; tasks of 50 ms or more stay one per dispatch.

Its limit: the sizer knows durations only after the fact. When trivial tasks are followed by slow
ones, the dispatches already sized for the trivial ones (up to 64 items each) may carry slow
ones; if such a dispatch outlives its deadline, its items are retried alone and uncharged, as
any failed multi-item dispatch's are. Give slow items their own ``timeout`` to be safe.
"""

from __future__ import annotations

__all__ = ["BatchSizer", "TARGET_SECONDS", "MAX_ITEMS", "DEADLINE_SHARE"]

#: a dispatch should last about this long (its fixed cost is then a small share of it)
TARGET_SECONDS = 0.05
#: the largest dispatch ``batch="auto"`` sends
MAX_ITEMS = 64
#: a dispatch may use at most this share of its deadline
DEADLINE_SHARE = 0.25
_ALPHA = 0.2  # weight of the newest measurement in the moving average


class BatchSizer:
    """The dispatch size ``batch="auto"`` uses (see the module docs for the rule)."""

    __slots__ = ("per_item", "largest", "observed")

    def __init__(self) -> None:
        self.per_item: float | None = None  # moving average of seconds per item
        self.largest = 0  # the largest dispatch measured so far
        self.observed = 0  # dispatches measured

    def observe(self, items: int, seconds: float) -> None:
        """A dispatch of ``items`` items took ``seconds`` from its send to its RESULT."""
        if items < 1 or not seconds >= 0.0:
            return
        each = seconds / items
        if self.per_item is None or each > self.per_item:
            self.per_item = each  # slower: believed at once, the next dispatch shrinks
        else:
            self.per_item = _ALPHA * each + (1 - _ALPHA) * self.per_item  # faster: by degrees
        self.largest = max(self.largest, items)
        self.observed += 1

    def size(self, deadline_seconds: float | None) -> int:
        """Items for the next dispatch; ``deadline_seconds`` is the deadline a dispatch of items
        without their own timeout gets (None: the watchdog is off)."""
        if self.per_item is None:
            return 1
        per = max(self.per_item, 1e-9)
        k = int(TARGET_SECONDS / per + 1e-6)  # (+1e-6: 0.05 / 0.001 is 50, not 49.99...)
        if deadline_seconds is not None and deadline_seconds > 0:
            k = min(k, int(DEADLINE_SHARE * deadline_seconds / per + 1e-6))
        k = min(k, 2 * self.largest, MAX_ITEMS)
        return max(1, k)
