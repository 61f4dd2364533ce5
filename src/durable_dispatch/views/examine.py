"""Examining a state directory's files, read-only: what ``durable-dispatch verify`` and
``inspect`` print, as values (:func:`examine`).

Nothing is changed or repaired: a journal is scanned (:func:`~.storage.scan.scan`, damage as
values), a snapshot decoded, and each file reported with its damage; a line is never held in
memory beyond :data:`RECORD_BOUND` (every reader is bounded). The command line prints what
this returns.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, BinaryIO, Protocol

from ..campaign.statedir import is_state_dir
from ..errors import UsageError
from ..storage import fs as _fs
from ..storage.scan import scan
from ..storage.snapshot import decode_snapshot, read_snapshot_file

__all__ = ["RECORD_BOUND", "Meter", "Progress", "examine", "kind_of"]

#: The longest line a reading command holds in memory: the default ``max_record_bytes`` of
#: ``Journal.open``. A longer line is reported as damage, never read whole.
RECORD_BOUND = 1 << 20


class Meter(Protocol):
    """What ``progress`` returns: called with the bytes read so far, then ``done()``."""

    def __call__(self, done: int, total: int | None = None) -> None:
        """The bytes read so far."""

    def done(self) -> None:
        """Reading ended."""


#: ``progress(file name, size)`` -> a :class:`Meter` for reading that file
Progress = Callable[[str, int], Meter]


class _Reading:
    """A file wrapper that tells its meter how far reading got."""

    def __init__(self, f: BinaryIO, meter: Meter | None) -> None:
        self._f = f
        self._meter = meter

    def read(self, n: int = -1) -> bytes:
        if self._meter is not None:
            self._meter(self._f.tell())
        return self._f.read(n)

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def tell(self) -> int:
        return self._f.tell()


def kind_of(path: str) -> str:
    """``"state-directory"``, ``"directory"``, ``"snapshot"`` or ``"journal"``.

    Raises:
        UsageError: a file that is none of them (by its name and first bytes).
    """
    if os.path.isdir(path):
        return "state-directory" if is_state_dir(path) else "directory"
    if path.endswith(".snap"):
        return "snapshot"
    if not path.endswith(".jsonl") and not _looks_like_a_journal(path):
        raise UsageError(f"{path}: not a journal (.jsonl), a snapshot (.snap) or a state directory")
    return "journal"


def _looks_like_a_journal(path: str) -> bool:
    """A file of another name is a journal when its first bytes start a journal header (so a
    ``.py`` file is a wrong argument, exit 2, not a damaged journal, exit 1)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return True  # let the reader report why it cannot be read
    return head.startswith(b'{"v":') or head == b""


def _examine_file(path: str, count_kinds: bool, progress: Progress | None) -> dict[str, Any]:
    """Read-only examination of one journal or snapshot file."""
    try:
        with _fs.open_read(path) as raw:
            size = os.fstat(raw.fileno()).st_size  # reading stops there, however the file grows
            if kind_of(path) == "snapshot":
                data = read_snapshot_file(raw)
                r = data if isinstance(data, str) else decode_snapshot(data)
                if isinstance(r, str):
                    return {
                        "path": path,
                        "kind": "snapshot",
                        "size": size,
                        "intact": False,
                        "damage": [{"offset": 0, "length": size, "reason": r}],
                    }
                return {
                    "path": path,
                    "kind": "snapshot",
                    "size": size,
                    "intact": True,
                    "format_version": 1,
                    "generation": r[0],
                    "damage": [],
                }
            meter = progress(os.path.basename(path), size) if progress is not None else None
            f = _Reading(raw, meter)
            try:
                res = scan(f, size, RECORD_BOUND, count_kinds=count_kinds)  # type: ignore[arg-type]
            except ValueError as e:
                return {
                    "path": path,
                    "kind": "journal",
                    "size": size,
                    "intact": False,
                    "damage": [
                        {
                            "offset": 0,
                            "length": size,
                            "reason": f"unsupported format version {e.args[1]!r}",
                        }
                    ],
                }
            finally:
                if meter is not None:
                    meter.done()
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from e
    torn = bool(res.damage) and res.tail_only
    out: dict[str, Any] = {
        "path": path,
        "kind": "journal",
        "format_version": 1 if res.header else None,
        "size": size,
        "records": res.records,
        "first_seq": res.first_seq,
        "last_seq": res.last_seq,
        "intact": not res.damage and size > 0,
        "torn_tail": torn,
        "torn_tail_bytes": size - res.damage[0].offset if torn else 0,
        "damage": [
            {"offset": d.offset, "length": d.length, "reason": d.reason} for d in res.damage
        ],
    }
    if size == 0:
        out["damage"] = [{"offset": 0, "length": 0, "reason": "empty file (no header)"}]
    if count_kinds:
        out["kinds"] = res.kinds
        out["first_ts"], out["last_ts"] = res.first_ts, res.last_ts
    return out


def _state_files(d: str) -> list[str]:
    return sorted(
        os.path.join(d, n)
        for n in os.listdir(d)
        if n.endswith((".jsonl", ".snap")) and not n.startswith(".") or n.endswith("deferred.jsonl")
    )


def examine(
    path: str, *, count_kinds: bool = False, progress: Progress | None = None
) -> dict[str, Any]:
    """Examine a journal (``.jsonl``), a snapshot (``.snap``) or a whole state directory,
    read-only, and return what was found as JSON-ready values: for a file its ``kind``,
    ``size``, ``intact``, ``damage`` (offset, length, reason), and for a journal its
    ``records``, ``first_seq``, ``last_seq`` and torn tail (with ``count_kinds`` also the
    records per ``event`` and the first and last ``ts``); for a directory ``files``, one such
    entry per file, and every damage with its path. ``progress(name, size)``, if given, returns
    a meter called with the bytes read so far while a journal is scanned, then ``done()``.

    Raises:
        UsageError: the path does not exist, is not one of those, or cannot be read.
    """
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file or directory")
    kind = kind_of(path)
    if kind == "directory":
        raise UsageError(f"{path} is a directory but not a durable-dispatch state directory")
    if kind != "state-directory":
        return _examine_file(path, count_kinds, progress)
    files = [_examine_file(p, count_kinds, progress) for p in _state_files(path)]
    for f in files:
        # In a state directory a journal of 0 bytes is one whose creation stopped before its
        # header (the disk was full, or the process was killed: the file exists from the moment
        # its writer locks it). It never held a record, and the next open writes the header,
        # as Journal.open does; the torture harness found verify calling it damage.
        if f["kind"] == "journal" and f["size"] == 0:
            f.update(
                intact=True, damage=[], note="empty: created, no header yet (an open writes it)"
            )
    out: dict[str, Any] = {
        "path": path,
        "kind": "state-directory",
        "intact": all(f["intact"] for f in files),
        "files": files,
    }
    damage = [dict(d, path=f["path"]) for f in files for d in f["damage"]]
    out["damage"] = damage
    return out
