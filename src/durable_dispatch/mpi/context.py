"""What a work function is told about its item, and how one call of it becomes an outcome.

Shared by the worker's in-process runner and the isolated child (:mod:`.isolation`), so both
turn a return value, an exception or an oversized result into the same RESULT entry. No MPI here:
the isolated child imports this module with MPI left uninitialised.
"""

from __future__ import annotations

import time
import traceback as _tb
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..values import Refused, restore, stored_raw

__all__ = [
    "WorkContext",
    "ItemOutcome",
    "CALL_MODES",
    "call_work_function",
    "run_items",
    "MAX_RESULT_BYTES",
    "CHILD_MARKER",
    "TRACEBACK_LINES",
]

#: How many lines of a failed call's traceback the worker keeps (its last ones: the frame that
#: raised and the exception).
TRACEBACK_LINES = 50

#: Set in an isolated child's environment; ``run_master`` and ``run_worker`` refuse to run there.
CHILD_MARKER = "DURABLE_DISPATCH_ISOLATED_CHILD"

#: How the worker calls the function: ``fn(payload)``, ``fn(payload, beat)`` (``heartbeat=True``)
#: or ``fn(payload, ctx)`` (``context=True``).
CALL_MODES = ("payload", "beat", "context")
#: A result's bound by default: one journal record (``Journal.open(max_record_bytes=)``).
MAX_RESULT_BYTES = 1 << 20


@dataclass(slots=True)
class WorkContext:
    """What ``fn(payload, ctx)`` is told about the item it runs (``run_worker(context=True)``).

    Attributes:
        work_id: the item's stable work ID.
        attempt: how many failed attempts it had before this one (0 on the first).
        deadline: ``time.monotonic()`` at which the master's watchdog takes the item back (an
            isolating worker kills the function then), or None when there is no deadline. Each
            :meth:`beat` pushes it to at least ``now + lease``.
        lease: how far a heartbeat pushes the deadline, in seconds.
        dependencies: the committed result of each work ID the item names in
            ``WorkItem.after``, by work ID; empty for an item without dependencies.
    """

    work_id: str
    attempt: int
    deadline: float | None
    lease: float
    _send_beat: Callable[[], None] = field(repr=False, default=lambda: None)
    dependencies: Mapping[str, Any] = field(default_factory=dict)

    def seconds_left(self) -> float | None:
        """Seconds until :attr:`deadline` (never negative), or None without a deadline."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def beat(self) -> None:
        """Send a HEARTBEAT: the master (and an isolating worker) push the deadline to
        ``now + lease``. Call it from a long task that is making progress; a hung one never does,
        so the watchdog still recovers it."""
        if self.deadline is not None:
            self.deadline = max(self.deadline, time.monotonic() + self.lease)
        self._send_beat()


@dataclass(slots=True)
class ItemOutcome:
    """One item's outcome: its result as JSON (``raw``, in the stored form of
    :mod:`durable_dispatch.values`), or a failure ``kind`` and ``reason``; ``final``: the
    failure is deterministic (a result that cannot be stored as given), so the master does not
    retry it; ``traceback``: the last :data:`TRACEBACK_LINES` lines of the traceback of a
    function that raised; ``cost``: what the item cost (see :mod:`.usage`), or None;
    ``output``: with isolation, the tails of what the item wrote to its standard output and
    error (see :mod:`.capture`), or None; ``about``: for the failure of a whole dispatch, the
    work ID of the item it happened in (its ``cost`` and ``output`` are that item's)."""

    raw: bytes | None
    kind: str | None = None
    reason: str | None = None
    final: bool = False
    traceback: str | None = None
    cost: dict[str, Any] | None = None
    output: dict[str, Any] | None = None
    about: str | None = None


def traceback_text(e: BaseException) -> str:
    """The traceback of ``e`` as Python prints it, without the library's own calling frame,
    cut to its last :data:`TRACEBACK_LINES` lines."""
    tb = e.__traceback__
    lines = "".join(_tb.format_exception(type(e), e, tb.tb_next if tb else None)).splitlines()
    if len(lines) > TRACEBACK_LINES:
        cut = len(lines) - TRACEBACK_LINES + 1
        lines = [f"... ({cut} earlier lines cut)", *lines[cut:]]
    return "\n".join(lines)


def call_work_function(
    fn: Callable[..., Any], mode: str, payload: Any, ctx: WorkContext, max_result: int
) -> ItemOutcome:
    """Run ``fn`` on one payload: its result JSON, or the failure of a function that raised
    (``error``), of a value that cannot be stored as given (``malformed-result``, final: it
    would fail again; see :mod:`durable_dispatch.values`) or of one over ``max_result`` bytes
    (``result-too-large``). Never raises."""
    try:
        if mode == "context":
            value = fn(payload, ctx)
        elif mode == "beat":
            value = fn(payload, ctx.beat)
        else:
            value = fn(payload)
    except BaseException as e:  # noqa: BLE001 - the master learns of it as this item's error
        return ItemOutcome(None, "error", f"{type(e).__name__}: {e}", traceback=traceback_text(e))
    try:
        raw = stored_raw(value)
    except Refused as e:
        return ItemOutcome(None, "malformed-result", f"the result {e}", True)
    if len(raw) > max_result:
        return ItemOutcome(
            None, "result-too-large", f"result of {len(raw)} bytes is over {max_result}"
        )
    return ItemOutcome(raw)


def run_items(
    fn: Callable[..., Any],
    mode: str,
    items: list[dict[str, Any]],
    deadline: float | None,
    lease: float,
    beat: Callable[[], None],
    max_result: int,
    started: Callable[[int], None] | None = None,
    meter: Any = None,
) -> Iterator[ItemOutcome]:
    """Run a dispatch's items in order (see :func:`call_work_function`), yielding each outcome;
    the items share the dispatch's deadline, which each one's heartbeats push for the next.
    ``started(index)`` is called before each item; ``meter`` (a :class:`~.usage.Meter`)
    measures each item's cost, kept in its outcome."""
    for index, item in enumerate(items):
        if meter is not None:
            meter.start()
        if started is not None:
            started(index)
        ctx = WorkContext(
            str(item.get("work_id")), int(item.get("attempt", 0)), deadline, lease, beat
        )
        deps = item.get("dependencies")
        if type(deps) is dict:
            ctx.dependencies = {k: restore(v) for k, v in deps.items()}
        o = call_work_function(fn, mode, restore(item.get("payload")), ctx, max_result)
        if meter is not None:
            o.cost = meter.stop()
        yield o
        deadline = ctx.deadline
