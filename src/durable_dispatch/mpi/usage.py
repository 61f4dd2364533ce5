"""What an item cost: the CPU seconds and the peak memory of the process that ran it.

A cost travels with an item's outcome to the master, which keeps it with the attempt (the
``cost`` member of the state journal's ``committed``, ``requeued`` and ``deferred`` records; the
joblog and the report show it). It is a :class:`~durable_dispatch.cost.Cost`, ``{"cpu":
seconds, "rss": bytes or null, "by": how}`` (its forms: :mod:`durable_dispatch.cost`):

- ``"child"``: measured in the isolated child around the item: the CPU time (user + system) of
  the child's threads and of the processes the item started and waited for, and the child's peak
  resident memory during the item. The child runs many items, so the kernel's own peak
  (``ru_maxrss``) would be a high-water mark over all of them, and it even starts at the worker's
  size (Linux carries it over through ``exec``): instead the peak is reset before each item
  (``/proc/self/clear_refs``) and read after it (``VmHWM``). Where that cannot be done (not
  Linux) the peak is null.
- ``"child-ended"``: the child died or was killed during the item (a crash, a timeout): its CPU
  time is what ``wait4`` reports for the whole child less what it had used when the item
  started; its peak is read just before a timeout's kill, and for a crash it is ``wait4``'s
  high-water mark of the child's life when that is above what the kernel carried over from the
  worker, else null.
- ``"in-process"``: measured in the worker's own process (``isolate=False``), with one
  reading of the process's CPU clock between two items (``time.process_time_ns``, one
  ``clock_gettime``: the worker's loop pays it per item). An item's CPU time is the process's
  from the end of the item before it (the dispatch's arrival for the first) to its own end,
  other threads included (the worker's own loop, a library's threads), plus that of the
  children the process waited for meanwhile (``RUSAGE_CHILDREN``). The children's figure is
  read after an item that took at least :data:`CHILDREN_AFTER_NS` of wall time (no process
  can be started and waited for in less: a ``fork`` of this interpreter alone takes longer)
  and at the dispatch's end, so a child reaped during a shorter item (one an earlier item
  started) is charged to the next item that is read, at the latest the dispatch's last.
  Its peak is the worker's high-water mark of resident memory (``ru_maxrss``) when its
  dispatch ended, or when the part that carried it was sent ahead: read once per dispatch
  (or part), a high-water mark of the whole worker since it started, not of the item.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

from ..cost import cost

__all__ = ["InProcessMeter", "Meter", "cost", "peak_of", "CHILDREN_AFTER_NS"]

#: An in-process item's children's CPU time is read after it when it took at least this long
#: (nanoseconds of wall time; see the module docs).
CHILDREN_AFTER_NS = 50_000

_HWM = b"VmHWM:"
_getrusage, _SELF, _CHILDREN = resource.getrusage, resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN


def _usage() -> tuple[float, Any]:
    """This process's CPU time (user + system) with that of the children it waited for, and
    its own ``getrusage`` (its page faults, its peak)."""
    s, c = _getrusage(_SELF), _getrusage(_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime, s


def _hwm(status: bytes) -> int | None:
    at = status.find(_HWM)
    if at < 0:
        return None
    end = status.find(b"kB", at)
    try:
        return int(status[at + len(_HWM) : end]) * 1024
    except ValueError:
        return None


def peak_of(pid: int) -> int | None:
    """The peak resident memory of process ``pid`` in bytes since it last reset it, or None."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return _hwm(f.read())
    except OSError:
        return None


def cpu_seconds() -> float:
    """This process's CPU time (user + system) and that of the children it waited for."""
    return _usage()[0]


_RSS = b"VmRSS:"


class Meter:
    """Measures the isolated child around each item: :meth:`rebase` when a dispatch arrives,
    :meth:`start` before each item, :meth:`stop` after it (which writes the item's cost into
    the dispatch's :class:`~.context.Outcomes`). Two ``getrusage`` calls an item: an
    item's figures start where the one before it ended, so they include the library's own
    bookkeeping between the two (microseconds); the first item of a dispatch starts at
    :meth:`rebase`.

    The peak is the item's own: reset before it (a write to ``/proc/self/clear_refs``), read
    after it (``VmHWM``). Both (a few microseconds) are skipped for an item that touched no new
    page (no page fault, ``getrusage``'s counts) when none was touched since the last read
    either and the peak then was the size then: the process cannot have grown, and the item's
    peak is that size (``VmRSS`` at the last read: an upper bound, exact unless it shrank).
    The worker's own process is measured by :class:`InProcessMeter`."""

    def __init__(self, by: str) -> None:
        self.by = by
        self.cpu0 = 0.0  # the CPU time when the item started
        self._clear: int | None = None
        self._status: int | None = None
        self._faults0 = -1  # page faults when the item started
        self._read_at = -2  # page faults when the status was last read
        self._rss: int | None = None  # the resident size at that read
        self._reset = True  # the peak must be reset before the next item
        self._cpu_at = 0.0  # the CPU time and page faults at the last rebase or stop
        self._faults_at = -1
        self.rebase()
        try:
            self._clear = os.open("/proc/self/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
            self._status = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.close()

    def start(self) -> None:
        """An item starts: reset the peak if it may be above the size now (see the class)."""
        self.cpu0 = self._cpu_at
        self._faults0 = faults = self._faults_at
        if self._clear is not None and (self._reset or faults != self._read_at):
            try:
                os.write(self._clear, b"5")  # the peak resident size restarts from now
            except OSError:
                self.close()

    def rebase(self) -> None:
        """A dispatch arrived: its first item's figures start now."""
        self._cpu_at, s = _usage()
        self._faults_at = s.ru_minflt + s.ru_majflt

    def stop(self, out: Any, index: int) -> None:
        """Item ``index`` ended: write its cost into ``out`` (a :class:`~.context.Outcomes`)."""
        cpu, rss = self._stop()
        out.cpu[index] = round(cpu, 6) if cpu > 0 else 0.0
        out.rss[index] = rss
        out.by[index] = self.by

    def _stop(self) -> tuple[float, int | None]:
        now, s = _usage()
        cpu = now - self.cpu0
        self._cpu_at = now
        self._faults_at = faults = s.ru_minflt + s.ru_majflt
        if self._status is None:
            return cpu, None
        if faults == self._faults0 == self._read_at and self._rss is not None:
            return cpu, self._rss  # (no page touched since the last read)
        try:
            status = os.pread(self._status, 4096, 0)
        except OSError:
            return cpu, None
        rss, at = None, status.find(_RSS)
        if at >= 0:
            try:
                rss = int(status[at + len(_RSS) : status.find(b"kB", at)]) * 1024
            except ValueError:
                rss = None
        hwm = _hwm(status)
        self._rss = rss
        self._read_at = faults
        self._reset = hwm != rss  # (it grew and shrank: the next item starts from a reset)
        return cpu, hwm

    def close(self) -> None:
        """Stop measuring the peak (the CPU time is still measured)."""
        for fd in (self._clear, self._status):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._clear = self._status = None


_cpu_ns, _wall_ns = time.process_time_ns, time.monotonic_ns


def _children_ns() -> int:
    c = _getrusage(_CHILDREN)
    return int((c.ru_utime + c.ru_stime) * 1e9)


class InProcessMeter:
    """Measures the worker's own process, item by item (``isolate=False``, ``by``
    ``"in-process"``; see the module docs for what a figure means): :meth:`rebase` when a
    dispatch arrives, :meth:`stop` after each item (one reading of the CPU clock and one of
    the monotonic clock; the children's figure only after a long item), :meth:`settle` when
    the dispatch ends (the children's figure, and the peak of every item). It resets nothing
    before an item (``start`` is None)."""

    __slots__ = ("by", "_cpu", "_wall", "_kids")
    start = None  # (nothing to do before an item: run_items skips the call)

    def __init__(self, by: str = "in-process") -> None:
        self.by = by
        self._cpu = self._wall = self._kids = 0  # at the last reading, in nanoseconds
        self.rebase()

    def rebase(self) -> None:
        """A dispatch arrived: its first item's figures start now."""
        self._cpu, self._wall, self._kids = _cpu_ns(), _wall_ns(), _children_ns()

    def stop(self, out: Any, index: int) -> None:
        """Item ``index`` ended: write its CPU seconds into ``out`` (its peak waits for
        :meth:`settle` or :meth:`peak`)."""
        cpu, wall = _cpu_ns(), _wall_ns()
        spent = cpu - self._cpu
        if wall - self._wall >= CHILDREN_AFTER_NS:
            kids = _children_ns()
            spent += kids - self._kids
            self._kids = kids
        self._cpu, self._wall = cpu, wall
        out.cpu[index] = (spent + 500) // 1000 / 1e6 if spent > 0 else 0.0
        out.by[index] = self.by

    def settle(self, out: Any) -> None:
        """The dispatch ended: charge its last item what its children used since the last
        reading, and give every item the peak now."""
        n = out.done
        kids = _children_ns()
        if kids != self._kids and n:
            out.cpu[n - 1] = round((out.cpu[n - 1] or 0.0) + (kids - self._kids) / 1e9, 6)
        self._kids = kids
        out.rss[:] = [self.peak()] * len(out.rss)

    @staticmethod
    def peak() -> int:
        """The worker's high-water mark of resident memory, in bytes (``ru_maxrss``)."""
        return int(_getrusage(_SELF).ru_maxrss) * 1024
