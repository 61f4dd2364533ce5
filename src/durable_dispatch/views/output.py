"""``durable-dispatch output STATE ID``: what an item wrote to its standard output and error, as
the outputs journal keeps it (:mod:`durable_dispatch.campaign.outputs`): with isolation, the last
64 KiB of each stream of the item's newest attempt that wrote anything. Read-only, safe beside a
running master.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass

from ..campaign.outputs import newest_output
from ..errors import NoOutputError, UsageError
from .joblog import read_joblog

__all__ = ["ItemOutput", "read_output"]


@dataclass(frozen=True)
class ItemOutput:
    """An item's kept output (see the module docs).

    Attributes:
        work_id: the item.
        token: the dispatch of the attempt that wrote it.
        ts: when the master kept it (wall-clock seconds), or None.
        stdout, stderr: the last bytes of each stream (at most 64 KiB each).
        stdout_dropped, stderr_dropped: how many bytes before them were not kept.
    """

    work_id: str
    token: str | None
    ts: float | None
    stdout: bytes
    stderr: bytes
    stdout_dropped: int
    stderr_dropped: int


def _bytes(rec: dict[str, object], name: str) -> bytes:
    text = rec.get(name)
    if isinstance(text, str):
        return text.encode("utf-8")
    coded = rec.get(name + "_b64")
    return base64.b64decode(coded) if isinstance(coded, str) else b""


def read_output(state_dir: str | os.PathLike[str], work_id: str) -> ItemOutput:
    """The kept output of ``work_id`` (its newest attempt that wrote anything).

    Raises:
        UsageError: not a state directory, or ``work_id`` is no item of its campaign.
        NoOutputError: the item has no kept output; the message says why.
        JournalCorruptError: damage in the outputs journal.
    """
    d = os.fspath(state_dir)
    rec = newest_output(d, work_id)
    if rec is not None:
        dropped = (rec.get("stdout_dropped"), rec.get("stderr_dropped"))
        return ItemOutput(
            work_id,
            rec.get("token"),
            rec.get("ts"),
            _bytes(rec, "stdout"),
            _bytes(rec, "stderr"),
            dropped[0] if type(dropped[0]) is int else 0,
            dropped[1] if type(dropped[1]) is int else 0,
        )
    row = next((r for r in read_joblog(d) if r.work_id == work_id), None)
    if row is None:
        raise UsageError(f"{work_id!r} is no work item of the campaign in {d}")
    if row.cost_measured == "in-process":
        why = (
            "it ran without isolation: its prints went to the worker's standard output (the "
            "job's log), which is not kept per item; run the workers with isolate=True to "
            "keep each item's output"
        )
    elif row.tries == 0 and row.status in ("pending", "waiting"):
        why = "it has not run yet"
    elif row.status == "cancelled" and row.cost_measured is None:
        why = "it was cancelled before it ran"
    elif row.cost_measured in ("child", "child-ended"):
        why = "its isolated runs wrote nothing to their standard output or error"
    else:
        why = (
            "none is kept for it: it ran without isolation, or under a version that kept no "
            "outputs, or the disk refused its record"
        )
    raise NoOutputError(f"no output kept for {work_id!r}: {why}", work_id=work_id, path=d)
