"""What a work function is told about its item, and how a dispatch's calls become outcomes.

Shared by the worker's in-process runner and the isolated child (:mod:`.isolation`), so both
turn a return value, an exception or an oversized result into the same RESULT entry. No MPI here:
the isolated child imports this module with MPI left uninitialised.

A dispatch travels as columns (:class:`Batch`: its work IDs, its payloads, the rest sparse, as
the WORK message carries them) and its outcomes are kept as columns (:class:`Outcomes`: one
result, one CPU time, one peak per item, the failures and the outputs by index, as the RESULT
carries them). :func:`run_items` runs a dispatch's items in one plain loop that pays per item
only what an item needs: the call, the check that its result is stored exactly (one
``orjson`` round trip, in C; the walk of :mod:`durable_dispatch.values` only for a result that
is not plain JSON) and one reading of the CPU clock (see :mod:`.usage`); a
:class:`WorkContext` is made only for ``fn(payload, ctx)``.
"""

from __future__ import annotations

import time
import traceback as _tb
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..values import TAG, Refused, restore, stored_raw

__all__ = [
    "WorkContext",
    "ItemOutcome",
    "Batch",
    "Outcomes",
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


class Batch:
    """A dispatch's items as columns, as the WORK message carries them (see :mod:`.protocol`).

    Attributes:
        ids: the items' work IDs, in order.
        payloads: their payloads, in the stored form of :mod:`durable_dispatch.values`.
        attempts: each item's failed attempts so far, or None when every one has none.
        timeouts: by work ID, the own timeout (seconds) of an item of several that has one
            (an isolating worker applies it to that item alone), or None.
        dependencies: by work ID, the committed results of an item's ``after`` IDs (its
            ``ctx.dependencies``, in stored form), or None.
        tagged: some payload or dependency may be in a stored form that :func:`restore` turns
            back (the message that carried them holds the stored form's tag); False when each
            is the user's value as it is (no restore per item).
    """

    __slots__ = ("ids", "payloads", "attempts", "timeouts", "dependencies", "tagged")

    def __init__(
        self,
        ids: list[Any],
        payloads: list[Any],
        attempts: list[int] | None = None,
        timeouts: dict[str, float] | None = None,
        dependencies: dict[str, Any] | None = None,
        tagged: bool = True,
    ) -> None:
        self.ids, self.payloads, self.attempts = ids, payloads, attempts
        self.timeouts, self.dependencies, self.tagged = timeouts, dependencies, tagged

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Batch(ids={self.ids!r}, attempts={self.attempts!r})"

    def timeout(self, index: int) -> float | None:
        """The own timeout of item ``index``, or None."""
        return None if self.timeouts is None else self.timeouts.get(self.ids[index])

    def select(self, indices: list[int]) -> Batch:
        """The items at ``indices``, in that order (the sparse members are kept whole)."""
        ids, payloads, attempts = self.ids, self.payloads, self.attempts
        return Batch(
            [ids[i] for i in indices],
            [payloads[i] for i in indices],
            None if attempts is None else [attempts[i] for i in indices],
            self.timeouts,
            self.dependencies,
            self.tagged,
        )

    def to_json(self) -> dict[str, Any]:
        """The columns as a JSON object (the members of a WORK message; sparse ones only when
        present)."""
        out: dict[str, Any] = {"ids": self.ids, "payloads": self.payloads}
        if self.attempts is not None:
            out["attempts"] = self.attempts
        if self.timeouts:
            out["timeouts"] = self.timeouts
        if self.dependencies:
            out["dependencies"] = self.dependencies
        return out


class Outcomes:
    """A dispatch's outcomes as columns, one entry per item by index, as the RESULT carries
    them (see :func:`.protocol.result_message`).

    Attributes:
        raw: each item's result JSON (stored form), or None for an item that failed or has not
            ended.
        errors: the failure of each item that failed, by index (its ``kind``, ``reason``,
            ``final`` and ``traceback``).
        cpu: each item's CPU seconds, or None.
        rss: each item's peak resident bytes, or None (see :mod:`.usage` for what a peak is).
        by: how each item's cost was measured, or None for an item without one.
        outputs: with isolation, the tails of what an item wrote, by index.
        done: how many items have ended, in order (the in-process runner's thread moves it
            after each item's columns are written: a reader in another thread reads the
            items below it).
    """

    __slots__ = ("raw", "errors", "cpu", "rss", "by", "outputs", "done")

    def __init__(self, n: int, by: str | None = None) -> None:
        self.raw: list[bytes | None] = [None] * n
        self.errors: dict[int, ItemOutcome] = {}
        self.cpu: list[float | None] = [None] * n
        self.rss: list[int | None] = [None] * n
        self.by: list[str | None] = [by] * n
        self.outputs: dict[int, dict[str, Any]] = {}
        self.done = 0

    def __len__(self) -> int:
        return len(self.raw)

    def put(self, index: int, o: ItemOutcome) -> None:
        """Keep ``o`` as item ``index``'s outcome (its result or failure, cost and output)."""
        self.raw[index] = o.raw
        if o.raw is None:
            self.errors[index] = o
        else:
            self.errors.pop(index, None)
        c = o.cost
        self.cpu[index], self.rss[index] = (None, None) if c is None else (c["cpu"], c["rss"])
        self.by[index] = None if c is None else c["by"]
        if o.output is not None:
            self.outputs[index] = o.output

    def item(self, index: int) -> ItemOutcome:
        """Item ``index``'s outcome as one :class:`ItemOutcome`."""
        failed = self.errors.get(index)
        by = self.by[index]
        c = None if by is None else {"cpu": self.cpu[index], "rss": self.rss[index], "by": by}
        o = (
            ItemOutcome(self.raw[index])
            if failed is None
            else ItemOutcome(None, failed.kind, failed.reason, failed.final, failed.traceback)
        )
        o.cost, o.output = c, self.outputs.get(index)
        return o

    @classmethod
    def of(cls, outcomes: Iterable[ItemOutcome]) -> Outcomes:
        """The columns of ``outcomes``, in order."""
        listed = list(outcomes)
        out = cls(len(listed))
        for i, o in enumerate(listed):
            out.put(i, o)
        out.done = len(listed)
        return out

    def select(self, indices: list[int]) -> Outcomes:
        """The outcomes of the items at ``indices``, in that order."""
        out = Outcomes(0)
        raw, cpu, rss, by = self.raw, self.cpu, self.rss, self.by
        out.raw = [raw[i] for i in indices]
        out.cpu = [cpu[i] for i in indices]
        out.rss = [rss[i] for i in indices]
        out.by = [by[i] for i in indices]
        errors, outputs = self.errors, self.outputs
        if errors:
            out.errors = {j: errors[i] for j, i in enumerate(indices) if i in errors}
        if outputs:
            out.outputs = {j: outputs[i] for j, i in enumerate(indices) if i in outputs}
        out.done = len(indices)
        return out


def _raised(e: BaseException) -> ItemOutcome:
    """The failure of a function that raised ``e`` (kind ``error``)."""
    return ItemOutcome(None, "error", f"{type(e).__name__}: {e}", traceback=traceback_text(e))


def _stored(value: Any, max_result: int) -> bytes | ItemOutcome:
    """``value``'s result JSON in stored form, or the failure of a value that cannot be stored
    as given (``malformed-result``, final: it would fail again) or of one over ``max_result``
    bytes (``result-too-large``)."""
    try:
        raw = stored_raw(value)
    except Refused as e:
        return ItemOutcome(None, "malformed-result", f"the result {e}", True)
    if len(raw) > max_result:
        return ItemOutcome(
            None, "result-too-large", f"result of {len(raw)} bytes is over {max_result}"
        )
    return raw


def call_work_function(
    fn: Callable[..., Any], mode: str, payload: Any, ctx: WorkContext, max_result: int
) -> ItemOutcome:
    """Run ``fn`` on one payload: its result JSON, or the failure of a function that raised
    (``error``), of a value that cannot be stored as given (``malformed-result``, final: it
    would fail again; see :mod:`durable_dispatch.values`) or of one over ``max_result`` bytes
    (``result-too-large``), as :func:`run_items` makes them. Never raises."""
    try:
        if mode == "context":
            value = fn(payload, ctx)
        elif mode == "beat":
            value = fn(payload, ctx.beat)
        else:
            value = fn(payload)
    except BaseException as e:  # noqa: BLE001 - the master learns of it as this item's error
        return _raised(e)
    done = _stored(value, max_result)
    return ItemOutcome(done) if type(done) is bytes else done  # type: ignore[return-value]


_dumps, _loads, _JSONError = orjson.dumps, orjson.loads, orjson.JSONDecodeError


def run_items(
    fn: Callable[..., Any],
    mode: str,
    batch: Batch,
    deadline: float | None,
    lease: float,
    beat: Callable[[], None],
    max_result: int,
    out: Outcomes,
    started: Callable[[int], None] | None = None,
    ended: Callable[[int], None] | None = None,
    meter: Any = None,
) -> None:
    """Run a dispatch's items in order into ``out`` (one entry each, as
    :func:`call_work_function` makes it; ``out.done`` moves after each). The items share the
    dispatch's deadline, which each one's heartbeats push for the next (``ctx.deadline``).

    Args:
        fn: the work function; ``mode`` says how it is called (:data:`CALL_MODES`).
        batch: the items; their payloads (and dependencies) are restored from their stored
            form once, here, when the batch is ``tagged``.
        deadline: the dispatch's deadline (``time.monotonic()``), or None.
        lease: how far a heartbeat pushes it.
        beat: sends a HEARTBEAT (``beat`` mode passes it to ``fn`` as it is).
        max_result: a result's bound in bytes.
        out: where the outcomes go (as many entries as ``batch`` has items).
        started: called with each item's index before it runs.
        ended: called with each item's index once its outcome is in ``out``.
        meter: writes each item's cost into ``out`` (:class:`~.usage.Meter`,
            :class:`~.usage.InProcessMeter`; its ``rebase`` is the caller's, once per dispatch).
    """
    payloads = batch.payloads
    if batch.tagged:
        payloads = [restore(p) for p in payloads]
    context, beating = mode == "context", mode == "beat"
    ids, attempts, dependencies = batch.ids, batch.attempts, batch.dependencies
    raws, errors = out.raw, out.errors
    start = None if meter is None else meter.start
    stop = None if meter is None else meter.stop
    dumps, loads = _dumps, _loads
    for i, payload in enumerate(payloads):
        if start is not None:
            start()
        if started is not None:
            started(i)
        try:
            if context:
                ctx = WorkContext(
                    str(ids[i]), 0 if attempts is None else attempts[i], deadline, lease, beat
                )
                deps = None if dependencies is None else dependencies.get(ids[i])
                if type(deps) is dict:
                    ctx.dependencies = {k: restore(v) for k, v in deps.items()}
                value = fn(payload, ctx)
                deadline = ctx.deadline
            elif beating:
                value = fn(payload, beat)
            else:
                value = fn(payload)
        except BaseException as e:  # noqa: BLE001 - the master learns of it as this item's error
            raw = None
            errors[i] = _raised(e)
        else:
            # the exact check of values.stored_raw, inline (a call an item less): plain JSON
            # comes back equal from one orjson round trip; anything else takes the walk
            try:
                raw = dumps(value)
                if loads(raw) != value or (type(value) is dict and TAG in value):
                    raw = None
            except (TypeError, _JSONError):
                raw = None
            if raw is None or len(raw) > max_result:
                done = _stored(value, max_result)
                if type(done) is bytes:
                    raw = done
                else:
                    raw = None
                    errors[i] = done  # type: ignore[assignment]
        if stop is not None:
            stop(out, i)
        raws[i] = raw
        out.done = i + 1
        if ended is not None:
            ended(i)
