"""The one way a file of the state directory is replaced whole: write a fresh temporary file
beside it, fsync it, rename it over the target, fsync the directory. At every instant either the
old or the new file is at the path. Journal recovery, restore and compaction, snapshots and the
futures side store all use it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import NamedTuple

from . import fs

__all__ = ["Replaced", "replace_file"]


class Replaced(NamedTuple):
    """What :func:`replace_file` wrote: the new file's descriptor and the descriptor that holds
    its inode lock (when asked to keep them open, else None), and its size."""

    fd: int | None
    inode_lock: int | None
    size: int


def replace_file(
    target: str,
    tmp: str,
    chunks: Iterable[bytes],
    mode: int = 0o600,
    *,
    keep_open: bool = False,
    lock: bool = False,
    sync_dir: bool = True,
    sync: bool = True,
    before_rename: Callable[[], object] | None = None,
) -> Replaced:
    """Write ``chunks`` to the new file ``tmp`` (it must not exist), fsync it and rename it over
    ``target``, then fsync the directory (unless ``sync_dir`` is False: the caller does, after it
    switched to the new file). ``sync`` False: no fsync at all (neither the file nor the
    directory): the replacement is atomic for readers and survives a crash of the process, not
    a power loss (for files that are only a display, such as the master's statistics).

    ``lock`` takes the new file's inode lock (:func:`fs.lock_file`) before it is renamed
    into place; ``keep_open`` returns its descriptors open (the caller owns them), else they are
    closed. ``before_rename`` is called once the new file is written and fsynced, just before
    the rename: what must be true before the new file is seen (a journal fsync the file's
    content depends on) can finish meanwhile. On any failure before the rename the temporary
    file is removed, the target is untouched and the error propagates.
    """
    fs.will_become(tmp, target)  # (a fault rule about the target holds for it)
    try:
        new = fs.create_exclusive(tmp, mode)
    except BaseException:
        fs.will_become(tmp, None)
        raise
    fd: int | None = new
    inode_lock: int | None = None
    size = 0
    try:
        if lock:
            inode_lock = fs.lock_file(tmp, mode)  # locked before it is the target
        for data in chunks:
            fs.write_all(new, data)
            size += len(data)
        if sync:
            fs.fsync(new)
        if not keep_open:  # a close that fails (NFS reports write errors there) fails it
            _close(inode_lock)
            fd = inode_lock = None
            fs.close(new)
        if before_rename is not None:
            before_rename()
        fs.replace(tmp, target)
    except BaseException:
        _close(fd, inode_lock)
        try:
            fs.unlink(tmp)
        except OSError:
            pass
        fs.will_become(tmp, None)
        raise
    if sync_dir and sync:
        try:
            fs.fsync_dir(os.path.dirname(target) or ".")
        except BaseException:
            if keep_open:
                _close(fd, inode_lock)
            raise
    return Replaced(fd, inode_lock, size)


def _close(*fds: int | None) -> None:
    for held in fds:
        if held is not None:
            try:
                fs.close(held)
            except OSError:
                pass
