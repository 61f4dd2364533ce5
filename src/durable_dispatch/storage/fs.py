"""The fs seam: the only module of durable-dispatch that writes, syncs, renames or removes files.

Theory of operation: every durable-storage step goes through one small function here, named
after the operation that can fail (``open``, ``write``, ``fsync``, ``dir-fsync``, ``replace``,
``close``, ``truncate``, ``unlink``, ``read``). Before doing the real call each function asks
the installed fault hook (see :mod:`durable_dispatch.testing`) whether this operation on this
path should fail, so tests can make any single step fail with any errno, on real files or under
pyfakefs.

Durability contract of the helpers:

* :func:`write_all` hands bytes to the kernel (they survive a *process* crash, not a power loss);
* :func:`fsync` makes a file's data and size durable (survives power loss) once it returns;
* :func:`fsync_dir` makes directory entries (creations, renames) durable once it returns;
* :func:`replace` is atomic for readers but is durable only after :func:`fsync_dir` of the parent.

Files are created with owner-only permissions (``0o600``) unless told otherwise; exclusive
creation never follows a symlink (``O_EXCL | O_NOFOLLOW``).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import BinaryIO

__all__ = [
    "OPERATIONS",
    "FaultHook",
    "set_fault_hook",
    "set_recorder",
    "get_fault_hook",
    "open_append",
    "open_read",
    "lock_file",
    "flock_holder",
    "check_fault",
    "create_exclusive",
    "write_all",
    "fsync",
    "fsync_dir",
    "fsync_path",
    "replace",
    "link",
    "close",
    "truncate",
    "unlink",
    "path_of",
    "makedirs",
    "DEGRADABLE_ERRNOS",
    "is_degradable",
    "filesystem",
    "reaches",
    "comes_back",
    "forget",
    "let_go",
    "REAL_FILESYSTEM",
    "STALL_SECONDS",
    "stall_report",
]

#: The operation names a fault can target.
OPERATIONS = (
    "open",
    "write",
    "fsync",
    "dir-fsync",
    "replace",
    "close",
    "truncate",
    "unlink",
    "read",
)

#: A fault hook receives ``(op, path)`` and raises ``OSError`` to make the operation fail.
FaultHook = Callable[[str, str], None]

#: Errors that mean "the disk said no" (as opposed to a bug or a misconfiguration): on these the
#: storage layer falls back to memory instead of raising.
DEGRADABLE_ERRNOS = frozenset(
    e
    for e in (errno.EIO, errno.ENOSPC, getattr(errno, "EDQUOT", None), errno.EROFS)
    if e is not None
)


def is_degradable(err: BaseException) -> bool:
    """True for an ``OSError`` whose errno is in :data:`DEGRADABLE_ERRNOS`."""
    return isinstance(err, OSError) and err.errno in DEGRADABLE_ERRNOS


_hook: FaultHook | None = None
#: A recorder receives ``(op, path, detail)`` after each operation succeeded (crash harness).
Recorder = Callable[[str, str, object], None]
_recorder: Recorder | None = None
_paths: dict[int, str] = {}
_paths_lock = threading.Lock()
#: A temporary file written to replace another whole (``rewrite.replace_file``) -> that file.
_becomes: dict[str, str] = {}

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def set_fault_hook(hook: FaultHook | None) -> FaultHook | None:
    """Install ``hook`` (or remove it with None); returns the previous hook."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def set_recorder(recorder: Recorder | None) -> Recorder | None:
    """Install a recorder of successful operations (or remove it); returns the previous one.

    The crash-consistency harness uses it to learn every byte written and every fsync, rename
    and directory fsync, in order. ``detail`` is the data for ``write``, the new path for
    ``replace``, the length for ``truncate``, whether the file was created for ``open``.
    """
    global _recorder
    previous, _recorder = _recorder, recorder
    return previous


def _record(op: str, path: str, detail: object = None) -> None:
    rec = _recorder
    if rec is not None:
        rec(op, path, detail)


def get_fault_hook() -> FaultHook | None:
    """The installed fault hook, or None."""
    return _hook


class _RealFilesystem:
    """The value of :data:`REAL_FILESYSTEM` (the real ``os`` module is kept out of reach of a
    patcher: pyfakefs rebinds every module-level name bound to ``os``, whatever its name)."""

    def __repr__(self) -> str:
        return "<the real filesystem>"


#: What :func:`filesystem` returns while calls reach the real ``os`` module.
REAL_FILESYSTEM: object = _RealFilesystem()
_REAL_OS = (os,)  # a tuple's item is never rebound by a patcher


def filesystem() -> object:
    """The filesystem this seam calls into now: :data:`REAL_FILESYSTEM`, or pyfakefs's fake ``os``.

    A storage object keeps the value it saw at open and compares it (``is``) before it touches a
    descriptor: a descriptor opened on a fake filesystem that has since been torn down names an
    unrelated *real* descriptor of the process, which must never be written, synced or closed.
    """
    current = os
    return REAL_FILESYSTEM if current is _REAL_OS[0] else current


def reaches(filesystem_: object) -> bool:
    """True when a call through this seam reaches ``filesystem_`` (a value of :func:`filesystem`).

    False when another filesystem is installed now, and also while pyfakefs routes every call to
    the real ``os`` for a moment (its ``use_original_os()``): a descriptor of the fake filesystem
    must not be used then either.
    """
    current = filesystem()
    if current is not REAL_FILESYSTEM and getattr(current, "use_original", False) is True:
        current = REAL_FILESYSTEM
    return current is filesystem_


def comes_back(filesystem_: object) -> bool:
    """True when calls do not reach ``filesystem_`` now but may again later.

    The real filesystem always comes back. A fake one does while it is installed (routing calls
    to the real ``os`` for a moment) or while its pyfakefs patcher is alive but paused (pyfakefs
    pauses patching while pytest writes a test's report). A fake filesystem whose patcher was torn
    down is gone for good.
    """
    if filesystem_ is REAL_FILESYSTEM or filesystem() is filesystem_:
        return True
    unittest = sys.modules.get("pyfakefs.fake_filesystem_unittest")
    patcher = getattr(getattr(unittest, "Patcher", None), "PATCHER", None)
    fakes = getattr(patcher, "fake_modules", None)
    return isinstance(fakes, dict) and fakes.get("os") is filesystem_


def check_fault(op: str, path: str) -> None:
    """Ask the fault hook about an operation done outside this module (filelock's open of a
    lock file), so a test can make that step fail too."""
    _check(op, path)


def _check(op: str, path: str) -> None:
    hook = _hook
    if hook is not None:
        hook(op, path)


def _remember(fd: int, path: str) -> int:
    with _paths_lock:
        _paths[fd] = path
    return fd


def path_of(fd: int) -> str:
    """The path of a descriptor opened by this module ("" if unknown): the one it was opened
    with, or the one :func:`replace` renamed that file to since."""
    return _paths.get(fd, "")


def will_become(tmp: str, target: str | None) -> None:
    """``tmp`` is written to replace ``target`` whole (None: no longer), so that a fault hook
    can treat it as that file (:func:`becomes`): a test's rule "every fsync of the journal
    fails" holds for the copy a restore writes too."""
    with _paths_lock:
        if target is None:
            _becomes.pop(tmp, None)
        else:
            _becomes[tmp] = target


def becomes(path: str) -> str | None:
    """The file the temporary file ``path`` is written to replace (:func:`will_become`)."""
    return _becomes.get(path)


def open_append(path: str, mode: int = 0o600) -> int:
    """Open (creating if missing) ``path`` for appending; returns the descriptor."""
    _check("open", path)
    existed = _recorder is not None and os.path.lexists(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC, mode)
    _record("open", path, not existed)
    return _remember(fd, path)


def lock_file(path: str, mode: int = 0o600, *, exists: bool | None = None) -> int:
    """Take an exclusive, non-blocking ``flock`` on the file at ``path`` itself, so that one
    writer holds even when its lock file is deleted.

    Opens ``path`` read-only (creating it if missing, never through a symlink) and locks the open
    file: the lock is on the inode, so it holds whatever happens to lock files beside it. Retries
    when the path was renamed over between the open and the lock, so the returned descriptor's
    inode is the one the path names. The lock lasts until the descriptor is closed.

    ``exists``: whether the caller saw a file at ``path`` a moment ago (None: unknown, look);
    it spares the lookup that tells a creation from an open on a slow mount. True: a file that
    went since is looked for again. False: the file is created exclusively, and anything at the
    path now raises ``FileExistsError`` (the caller checks what it is, then calls again).

    Raises:
        BlockingIOError: another open file holds the lock (another writer).
        FileExistsError: ``exists=False`` and something is at the path.
    """
    hint = exists
    for _attempt in range(8):
        existed = os.path.lexists(path) if exists is None else exists
        exists = None  # the hint serves the first attempt only
        if existed:
            try:
                # (O_NONBLOCK: a FIFO planted at the path does not block the open)
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
            except FileNotFoundError:
                continue  # removed since: look again
        else:
            _check("open", path)  # it creates the file; opening an existing one writes nothing
            flags = os.O_RDONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
            try:
                fd = os.open(path, flags, mode)
            except FileExistsError:
                if hint is False:
                    raise
                continue  # created since: look again
            _record("open", path, True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            same = os.path.samestat(os.fstat(fd), os.lstat(path))
        except FileNotFoundError:
            same = False  # removed between the open and the check: open what is there now
        except BaseException:
            os.close(fd)
            raise
        if same:
            return _remember(fd, path)
        os.close(fd)
    raise OSError(errno.EAGAIN, "the file kept being replaced while it was locked", path)


def flock_holder(path: str) -> int | None:
    """The pid of a process on this host that holds a ``flock`` on the file at ``path``, from
    ``/proc/locks`` (None when none is found, or on a system without it). Reads only."""
    try:
        st = os.stat(path)
        with open("/proc/locks", "rb") as f:
            lines = f.read(1 << 20).decode("ascii", "replace").splitlines()
    except OSError:
        return None
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        parts = line.split()
        if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == dev and parts[4].isdigit():
            pid = int(parts[4])
            if pid > 0:
                return pid
    return None


def create_exclusive(path: str, mode: int = 0o600) -> int:
    """Create a new file for writing; fails if anything (even a symlink) is already there."""
    _check("open", path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    fd = os.open(path, flags, mode)
    _record("open", path, True)
    return _remember(fd, path)


def open_read(path: str) -> BinaryIO:
    """Open ``path`` for buffered binary reading, only if it is a regular file (no FIFO,
    device, socket or link).

    Never follows a symbolic link (``ELOOP``) and never blocks: a FIFO, device, socket or
    directory at the path is refused with a :class:`~durable_dispatch.errors.StorageError`
    before anything is read from it (a reader would block forever, or read ``/dev/zero`` until
    memory runs out). A fault on ``read`` fires here.
    """
    from ..errors import StorageError

    _check("read", path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StorageError(
                "refusing to read it: the path is a symbolic link, which is never followed",
                path=path,
                op="read",
                errno=errno.ELOOP,
            ) from e
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StorageError(
                "refusing to read it: not a regular file (a FIFO, device, socket or directory)",
                path=path,
                op="read",
                errno=errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL,
            )
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, looping over short writes.

    One ``os.write`` call carries the whole buffer unless the kernel returns short, so a record
    written alone is one ``write()`` of the whole line.
    """
    if _hook is not None:
        _hook("write", path_of(fd))
    n = os.write(fd, data)
    if n < len(data):
        view = memoryview(data)[n:]
        while view:
            n = os.write(fd, view)
            view = view[n:]
    if _recorder is not None:
        _record("write", path_of(fd), bytes(data))


#: An fsync that takes longer than this many seconds is a *stall*: it is logged (a warning when
#: it ends, and one while it lasts, from :func:`stall_report`) and counted in the campaign's
#: statistics (``storage_stalls``). Shared filesystems stall for seconds to minutes (a Lustre
#: server recovering); a stall is not a failure, it is reported.
STALL_SECONDS = 5.0
_log = logging.getLogger("durable_dispatch.storage")


class _Stalls:
    """The fsyncs in progress and the stalls seen (guarded by ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.syncing: dict[int, tuple[float, str]] = {}  # token -> (start, path)
        self.tokens = iter(range(1, 1 << 62))
        self.count = 0
        self.longest = 0.0
        self.last_path: str | None = None
        self.last_seconds = 0.0
        self.logged: set[int] = set()  # ongoing stalls already logged

    def start(self, path: str) -> int:
        with self.lock:
            token = next(self.tokens)
            self.syncing[token] = (time.monotonic(), path)
        return token

    def end(self, token: int, path: str) -> None:
        with self.lock:
            start, _p = self.syncing.pop(token, (time.monotonic(), path))
            took = time.monotonic() - start
            self.logged.discard(token)
            if took > STALL_SECONDS:
                self.count += 1
                self.longest = max(self.longest, took)
                self.last_path, self.last_seconds = path, took
        if took > STALL_SECONDS:
            _log.warning(
                "storage stalled: an fsync of %s took %.1fs (bound %gs)", path, took, STALL_SECONDS
            )


_stalls = _Stalls()


def stall_report() -> dict[str, object]:
    """The fsync stalls of this process: ``count`` (ended stalls), ``longest_seconds``,
    ``last_path``, ``last_seconds``, ``ongoing_seconds`` (the oldest fsync still waiting, 0 if
    none), ``ongoing_path`` and ``bound_seconds``. An ongoing stall past the bound is logged
    once, here (so a caller that reports statistics logs it while it lasts)."""
    st = _stalls
    now = time.monotonic()
    with st.lock:
        oldest = min(st.syncing.items(), key=lambda kv: kv[1][0], default=None)
        out: dict[str, object] = {
            "count": st.count,
            "longest_seconds": round(st.longest, 3),
            "last_path": st.last_path,
            "last_seconds": round(st.last_seconds, 3),
            "ongoing_seconds": round(now - oldest[1][0], 3) if oldest else 0.0,
            "ongoing_path": oldest[1][1] if oldest else None,
            "bound_seconds": STALL_SECONDS,
        }
        first = oldest is not None and now - oldest[1][0] > STALL_SECONDS
        if first and oldest is not None:
            first = oldest[0] not in st.logged
            st.logged.add(oldest[0])
    if first and oldest is not None:
        _log.warning(
            "storage stalled: an fsync of %s has been waiting %.1fs (bound %gs); the campaign "
            "goes on where it need not wait for it",
            oldest[1][1],
            now - oldest[1][0],
            STALL_SECONDS,
        )
    return out


def fsync(fd: int) -> None:
    """``fsync`` a file descriptor: its data is durable once this returns."""
    path = path_of(fd)
    if _hook is not None:
        _hook("fsync", path)
    token = _stalls.start(path)
    try:
        os.fsync(fd)
    finally:
        _stalls.end(token, path)
    if _recorder is not None:
        _record("fsync", path)


def fsync_path(path: str) -> None:
    """``fsync`` the regular file at ``path`` through a descriptor of its own (read-only, never
    following a link), closed again: whatever any process wrote to the file before the call is
    durable once this returns (an earlier run's unsynced tail, fsynced beside the open that
    reads it). A fault on ``fsync`` of ``path`` fires here."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC)
    _remember(fd, path)
    _record("open", path, False)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        fsync(fd)
    finally:
        with _paths_lock:
            _paths.pop(fd, None)
        os.close(fd)


def fsync_dir(directory: str) -> None:
    """``fsync`` a directory so that entries created or renamed in it are durable."""
    _check("dir-fsync", directory)
    fd = os.open(directory or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    token = _stalls.start(directory)
    try:
        os.fsync(fd)
    finally:
        _stalls.end(token, directory)
        os.close(fd)
    _record("dir-fsync", directory)


def replace(src: str, dst: str) -> None:
    """Atomically rename ``src`` over ``dst`` (durable only after ``fsync_dir``)."""
    _check("replace", dst)
    os.replace(src, dst)
    with _paths_lock:  # a descriptor open on ``src`` names its file by its new name
        _becomes.pop(src, None)
        for fd in [fd for fd, p in _paths.items() if p == src]:
            _paths[fd] = dst
    _record("replace", src, dst)


def link(src: str, dst: str) -> None:
    """Make ``dst`` a new hard link to ``src``; fails with ``FileExistsError`` if anything is at
    ``dst`` (atomic and exclusive on local disks, NFS and Lustre: how an owner record is
    claimed). A fault on ``open`` of ``dst`` fires here."""
    _check("open", dst)
    os.link(src, dst, follow_symlinks=False)
    _record("link", src, dst)


def forget(fd: int) -> None:
    """Drop what this module knows of ``fd`` without closing it (its filesystem is gone)."""
    with _paths_lock:
        _paths.pop(fd, None)


def let_go(fds: Iterable[int], filesystem_: object) -> None:
    """Close descriptors opened on ``filesystem_`` (a value of :func:`filesystem`), ignoring
    errors; when a call no longer reaches it (:func:`reaches`: that filesystem is gone), only
    forget them: their numbers name other (real) descriptors now, never closed from here."""
    if not reaches(filesystem_):
        for fd in fds:
            forget(fd)
        return
    for fd in fds:
        try:
            close(fd)
        except OSError:
            pass


def close(fd: int) -> None:
    """Close a descriptor opened by this module."""
    with _paths_lock:
        path = _paths.pop(fd, "")
    try:
        _check("close", path)
    finally:
        os.close(fd)


def truncate(path: str, length: int) -> None:
    """Cut ``path`` to ``length`` bytes and fsync it."""
    _check("truncate", path)
    fd = os.open(path, os.O_WRONLY | _NOFOLLOW | _CLOEXEC)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)
    _record("truncate", path, length)


def unlink(path: str) -> None:
    """Remove a file."""
    _check("unlink", path)
    os.unlink(path)
    _record("unlink", path)


def makedirs(directory: str, mode: int = 0o700, *, sync_parent: bool = True) -> bool:
    """Create ``directory`` and missing parents (owner-only), then fsync the parent of each.

    Args:
        sync_parent: False leaves the fsync of ``directory``'s own parent (the one that makes
            ``directory`` itself durable) to the caller, when this call created it; the
            parents of the missing parents are fsynced in any case, in order.

    Returns:
        True when this call created ``directory`` itself (False: it was there).
    """
    missing = []
    d = os.path.abspath(directory)
    while d and not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    if not missing:
        return False
    _check("open", directory)
    created = False
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue
        created = d == missing[0]
        _record("mkdir", d)
        if sync_parent or not created:
            fsync_dir(os.path.dirname(d))
    return created
