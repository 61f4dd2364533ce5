"""Opening a journal: what to do with what the scan found (a pure plan), and the side file that
keeps every byte a plan drops (fsynced before anything is cut).

:func:`plan_recovery` takes the :class:`~.format.ScanResult` of a journal file and a recovery
mode (``RECOVERY_MODES``) and decides, without touching anything: create a new file, keep the file
as it is, cut a torn tail, start over after a torn header, salvage the intact records, or refuse
with a :class:`JournalCorruptError`. :class:`~.journal.Journal` applies the plan; every byte a
plan drops is first copied by :func:`save_side`.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from ..errors import JournalCorruptError, StorageError
from . import fs
from .scan import ScanResult

__all__ = [
    "RECOVERY_MODES",
    "Plan",
    "nothing_to_lose",
    "plan_recovery",
    "refuse_unsafe_path",
    "save_side",
]

RECOVERY_MODES = ("tolerate-torn-tail", "absolute", "point-in-time", "skip-corrupted")

#: The plan's actions.
CREATE, KEEP, CUT, RESTART, SALVAGE = "create", "keep", "cut", "restart", "salvage"


@dataclass(frozen=True, slots=True)
class Plan:
    """What opening does: ``create`` (no file, or an empty one), ``keep``, ``cut`` the bytes
    from ``offset`` on (a torn tail), ``restart`` (a torn header: every byte goes to the side
    file and a new file starts), or ``salvage`` (rewrite with the intact records only)."""

    action: str
    offset: int = 0


def plan_recovery(res: ScanResult | None, mode: str, path: str) -> Plan:
    """The plan for a journal file whose scan is ``res`` (None: no bytes at all).

    Raises:
        JournalCorruptError: ``mode`` does not allow dropping the damage found.
    """
    if res is None:
        return Plan(CREATE)
    first = res.damage[0] if res.damage else None
    if res.header is None:  # without a valid header no record can be verified
        assert first is not None
        if mode == "absolute" or not res.tail_only:
            raise JournalCorruptError(
                f"journal header is damaged: {first.reason}",
                path=path,
                offset=0,
                reason=first.reason,
            )
        return Plan(RESTART)
    if first is None:
        return Plan(KEEP)
    if mode == "skip-corrupted" and res.after_damage:
        return Plan(SALVAGE)
    if mode == "point-in-time" or (
        mode in ("tolerate-torn-tail", "skip-corrupted") and res.tail_only
    ):
        return Plan(CUT, first.offset)
    why = (
        "a later record proves it was durable"
        if mode == "tolerate-torn-tail"
        else "recovery mode is absolute"
    )
    raise JournalCorruptError(
        f"journal damaged at offset {first.offset}: {first.reason} ({why})",
        path=path,
        offset=first.offset,
        reason=first.reason,
    )


def save_side(path: str, offset: int, size: int, mode: int) -> str:
    """Copy bytes ``[offset, size)`` of ``path`` to a new side file beside it; its path.

    Raises:
        StorageError: the copy is not whole (a full disk, EIO): nothing may be cut then;
            the partial copy is removed.
    """
    base = f"{path}.damaged-{offset}"
    side, n = base, 0
    while os.path.lexists(side):
        n += 1
        side = f"{base}.{n}"
    fd: int | None = None
    try:
        fd = fs.create_exclusive(side, mode)
        try:
            with fs.open_read(path) as f:
                f.seek(offset)
                left = size - offset  # the span measured, however the file changes
                while left > 0 and (chunk := f.read(min(1 << 20, left))):
                    fs.write_all(fd, chunk)
                    left -= len(chunk)
            fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.fsync_dir(os.path.dirname(path) or ".")
    except BaseException as e:
        if fd is not None:
            try:
                fs.unlink(side)
            except OSError:
                pass
        if isinstance(e, OSError):
            raise StorageError(
                f"cannot save damaged bytes [{offset}, {size}) to a side file before cutting "
                f"them: {e.strerror or e}; nothing was cut",
                path=side,
                op="save-damaged",
                errno=e.errno,
            ) from e
        raise
    return side


def refuse_unsafe_path(path: str) -> bool:
    """Refuse, before anything is read or written, a journal path that is not a plain file.

    A symbolic link (its target would be read, copied and written), a FIFO, device, socket or
    directory (a reader would block or read forever), or a file with more than one hard link
    (writing it would change the file under its other names too).

    Returns:
        Whether a file is at the path (False: nothing is there).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    why, code = "", errno.EINVAL
    if stat.S_ISLNK(st.st_mode):
        why, code = "is a symbolic link; a journal path is never followed", errno.ELOOP
    elif not stat.S_ISREG(st.st_mode):
        why = "is not a regular file (a FIFO, device, socket or directory)"
    elif st.st_nlink > 1:
        why = (
            f"has {st.st_nlink} hard links; writing it would change the same file under "
            f"its other names"
        )
    if why:
        raise StorageError(
            f"refusing to open the journal: its path {why}",
            path=path,
            op="open",
            errno=code,
        )
    return True


def nothing_to_lose(path: str) -> bool:
    """True when no journal file (or only an empty one) is at the path."""
    try:
        return os.lstat(path).st_size == 0
    except FileNotFoundError:
        return True
    except OSError:
        return False
