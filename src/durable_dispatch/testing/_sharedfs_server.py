"""The server of :class:`~durable_dispatch.testing.sharedfs.SlowMount`: a FUSE passthrough that
waits before each fsync and metadata operation, stalls on request, counts and traces what it did,
and, with ``locks="none"``, grants locks that exclude nobody. It runs in a process of its own
session (``python -m durable_dispatch.testing._sharedfs_server``), started and stopped by
``SlowMount``; it reads its settings from a control file every 20 ms.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import threading
import time
from collections.abc import Mapping
from typing import Any

from .sharedfs import _POLL, SlowStorage


class _Knobs:
    """The server's settings, re-read from the control file, and its counters."""

    def __init__(self, control: str, counters: str, trace: str | None = None) -> None:
        self.control, self.counters_path, self.trace_path = control, counters, trace
        self.s = SlowStorage()
        self.rng = random.Random(0)
        self.cond = threading.Condition()
        self.mtime = 0
        self.counts: dict[str, Any] = {
            "fsyncs": 0,
            "metadata_ops": 0,
            "stalled_fsyncs": 0,
            "locks_granted": 0,
            "longest_fsync_s": 0.0,
            "waiting_fsyncs": 0,
        }
        self.dirty = True
        self.reload()

    def reload(self) -> None:
        try:
            m = os.stat(self.control).st_mtime_ns
            if m == self.mtime:
                return
            with open(self.control, "rb") as f:
                values: Mapping[str, Any] = json.loads(f.read())
        except (OSError, ValueError):
            return
        with self.cond:
            seed_changed = values.get("seed", 0) != self.s.seed
            self.s = SlowStorage(**{k: v for k, v in values.items() if k in _FIELDS})
            if seed_changed or not self.mtime:
                self.rng = random.Random(self.s.seed)
            self.mtime = m
            self.cond.notify_all()

    def watch(self) -> None:
        while True:
            self.reload()
            if self.dirty:
                self.dirty = False
                with self.cond:
                    data = json.dumps(self.counts)
                tmp = self.counters_path + ".tmp"
                try:
                    with open(tmp, "w") as f:
                        f.write(data)
                    os.replace(tmp, self.counters_path)
                except OSError:
                    pass
            time.sleep(_POLL)

    def trace(self, op: str, path: str, outcome: str, other: str = "") -> None:
        """Log one operation (while ``trace`` is on): its name, path, outcome, whether it was
        counted as metadata, and its second path."""
        if not self.s.trace or not self.trace_path:
            return
        meta = "1" if op in _METADATA_OPS else "0"
        line = f"{op}\t{path}\t{outcome}\t{meta}\t{other}\t{time.time():.6f}\n".encode()
        with self.cond:
            try:
                with open(self.trace_path, "ab") as f:
                    f.write(line)
            except OSError:
                pass

    def count(self, key: str, n: int = 1) -> None:
        with self.cond:
            self.counts[key] += n
            self.dirty = True

    def metadata(self, op: str = "other") -> None:
        with self.cond:
            self.counts["metadata_ops"] += 1
            by = self.counts.setdefault("metadata_by_op", {})
            by[op] = by.get(op, 0) + 1
            self.dirty = True
        ms = self.s.metadata_ms
        if ms > 0:
            time.sleep(ms / 1000)

    def fsync_wait(self) -> None:
        t0 = time.monotonic()
        with self.cond:
            s = self.s
            tail = s.tail_fraction > 0 and self.rng.random() < s.tail_fraction
            self.counts["fsyncs"] += 1
            self.dirty = True
        ms = s.fsync_tail_ms if tail else s.fsync_ms
        if ms > 0:
            time.sleep(ms / 1000)
        with self.cond:
            if self.s.stalled:
                self.counts["stalled_fsyncs"] += 1
                self.counts["waiting_fsyncs"] += 1
                self.dirty = True  # published while it waits, not only once it returned
                while self.s.stalled:
                    self.cond.wait(0.5)
                self.counts["waiting_fsyncs"] -= 1
            took = time.monotonic() - t0
            self.counts["longest_fsync_s"] = max(self.counts["longest_fsync_s"], took)
            self.dirty = True


_FIELDS = frozenset(SlowStorage.__dataclass_fields__)
#: the operations the server counts as metadata (each costs ``metadata_ms``)
_METADATA_OPS = frozenset(
    "getattr readdir mkdir rmdir unlink symlink link rename chmod chown truncate utimens "
    "create".split()
)


def _operations(root: str, knobs: _Knobs, locks: str) -> Any:
    import mfusepy

    def full(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    def oserr(fn: Any) -> Any:
        name = fn.__name__
        two = name in ("rename", "link", "symlink")

        def wrapped(*a: Any, **k: Any) -> Any:
            try:
                out = fn(*a, **k)
            except OSError as e:
                if knobs.s.trace:
                    code = e.errno or errno.EIO
                    other = str(a[2]) if two and len(a) > 2 else ""
                    knobs.trace(name, str(a[1]), errno.errorcode.get(code, str(code)), other)
                raise mfusepy.FuseOSError(e.errno or errno.EIO) from None
            if knobs.s.trace:
                knobs.trace(name, str(a[1]), "ok", str(a[2]) if two and len(a) > 2 else "")
            return out

        wrapped.__name__ = fn.__name__
        return wrapped

    class Passthrough(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        @oserr
        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            knobs.metadata("getattr")
            st = os.fstat(fh) if fh is not None else os.lstat(full(path))
            d = {
                k: getattr(st, k)
                for k in (
                    "st_mode",
                    "st_ino",
                    "st_nlink",
                    "st_uid",
                    "st_gid",
                    "st_size",
                    "st_blocks",
                    "st_blksize",
                )
            }
            d.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            return d

        @oserr
        def access(self, path: str, amode: int) -> int:
            if not os.access(full(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        @oserr
        def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
            # Real inode numbers (use_ino): glibc's readdir skips an entry whose d_ino is 0.
            knobs.metadata("readdir")
            here = os.lstat(full(path))
            out = [(".", {"st_ino": here.st_ino, "st_mode": here.st_mode}, 0)]
            out.append(("..", {"st_ino": 1, "st_mode": here.st_mode}, 0))
            with os.scandir(full(path)) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
                    out.append((e.name, {"st_ino": st.st_ino, "st_mode": st.st_mode}, 0))
            return out

        @oserr
        def readlink(self, path: str) -> str:
            return os.readlink(full(path))

        @oserr
        def mkdir(self, path: str, mode: int) -> int:
            knobs.metadata("mkdir")
            os.mkdir(full(path), mode)
            return 0

        @oserr
        def rmdir(self, path: str) -> int:
            knobs.metadata("rmdir")
            os.rmdir(full(path))
            return 0

        @oserr
        def unlink(self, path: str) -> int:
            knobs.metadata("unlink")
            os.unlink(full(path))
            return 0

        @oserr
        def symlink(self, target: str, source: str) -> int:
            knobs.metadata("symlink")
            os.symlink(source, full(target))
            return 0

        @oserr
        def link(self, target: str, source: str) -> int:
            knobs.metadata("link")
            os.link(full(source), full(target))
            return 0

        @oserr
        def rename(self, old: str, new: str) -> int:
            knobs.metadata("rename")
            os.rename(full(old), full(new))
            return 0

        @oserr
        def chmod(self, path: str, mode: int) -> int:
            knobs.metadata("chmod")
            os.chmod(full(path), mode)
            return 0

        @oserr
        def chown(self, path: str, uid: int, gid: int) -> int:
            knobs.metadata("chown")
            os.chown(full(path), uid, gid)
            return 0

        @oserr
        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            knobs.metadata("truncate")
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(full(path), length)
            return 0

        @oserr
        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            knobs.metadata("utimens")
            if times is None:
                os.utime(full(path))
            else:
                os.utime(full(path), ns=times)
            return 0

        @oserr
        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(full(path))
            return {
                k: getattr(sv, k)
                for k in (
                    "f_bavail",
                    "f_bfree",
                    "f_blocks",
                    "f_bsize",
                    "f_favail",
                    "f_ffree",
                    "f_files",
                    "f_flag",
                    "f_frsize",
                    "f_namemax",
                )
            }

        @oserr
        def open(self, path: str, flags: int) -> int:
            return os.open(full(path), flags & ~os.O_CREAT)

        @oserr
        def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
            knobs.metadata("create")
            return os.open(full(path), flags | os.O_CREAT, mode)

        @oserr
        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        @oserr
        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            return os.pwrite(fh, data, offset)

        @oserr
        def flush(self, path: str, fh: int) -> int:
            return 0

        @oserr
        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        @oserr
        def fsync(self, path: str, datasync: int, fh: int) -> int:
            knobs.fsync_wait()
            if datasync:
                os.fdatasync(fh)
            else:
                os.fsync(fh)
            return 0

        @oserr
        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            knobs.fsync_wait()
            fd = os.open(full(path), os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return 0

    if locks == "none":

        class NonExcluding(Passthrough):
            """Locks that every caller gets: the kernel asks us, and we always say yes."""

            def lock(self, path: str, fh: int, cmd: int, lock: Any) -> int:
                import fcntl

                knobs.trace("lock", path, "ok")
                if cmd == fcntl.F_GETLK and lock:
                    lock.contents.l_type = fcntl.F_UNLCK  # nobody holds anything
                else:
                    knobs.count("locks_granted")
                return 0

            def flock(self, path: str, fh: int, op: int) -> int:
                knobs.trace("flock", path, "ok")
                knobs.count("locks_granted")
                return 0

        return NonExcluding()
    return Passthrough()


def _serve(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m durable_dispatch.testing._sharedfs_server")
    p.add_argument("backing")
    p.add_argument("mountpoint")
    p.add_argument("--control", required=True)
    p.add_argument("--counters", required=True)
    p.add_argument("--locks", choices=("local", "none"), default="local")
    p.add_argument("--trace", help="the file operations are logged to while tracing is on")
    p.add_argument("--cache-seconds", type=float, help="the kernel's entry and attribute timeout")
    a = p.parse_args(argv)
    import warnings

    import mfusepy

    knobs = _Knobs(a.control, a.counters, a.trace)
    threading.Thread(target=knobs.watch, daemon=True, name="control").start()
    ops = _operations(os.path.abspath(a.backing), knobs, a.locks)
    cache: dict[str, float] = {}
    if a.cache_seconds is not None:
        cache = {"entry_timeout": a.cache_seconds, "attr_timeout": a.cache_seconds}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mfusepy.FUSE(
            ops,
            a.mountpoint,
            foreground=True,
            nothreads=False,
            use_ino=True,
            fsname="slowmount",
            **cache,
        )


if __name__ == "__main__":
    _serve()
