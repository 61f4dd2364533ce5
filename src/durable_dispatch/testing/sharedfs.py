"""A slow, shared-filesystem-like mount for tests: a FUSE passthrough with injected latency.

Theory of operation. :class:`SlowMount` starts a FUSE server in a process of its own session
(``python -m durable_dispatch.testing._sharedfs_server``), which passes every operation
through to a backing directory on the local disk and, on the way, makes it behave like a
cluster's NFS or Lustre mount:

* each ``fsync`` and directory ``fsync`` waits ``fsync_ms`` (the median) or, for a fraction
  ``tail_fraction`` of them, ``fsync_tail_ms`` (the tail) before the real ``fsync``;
* each metadata operation (lookup/stat, create, mkdir, rename, link, unlink, rmdir, chmod,
  truncate, utimens, readdir) waits ``metadata_ms``;
* :meth:`SlowMount.stall` makes every ``fsync`` started from then on (and every one still
  waiting) block until :meth:`SlowMount.resume` (a Lustre server that stops answering for
  minutes);
* with ``locks="none"``, ``flock`` and ``fcntl`` locks succeed without excluding anyone (Lustre
  mounted with ``localflock`` seen from two nodes, NFS without a lock daemon); with
  ``locks="local"`` (the default) the kernel keeps them, and they exclude as on a local disk.

The settings can change while the mount is up (:meth:`SlowMount.configure`): the test process
writes a small control file that the server reads every 20 ms. The server counts what it did
(:meth:`SlowMount.counters`) and, with ``trace=True``, logs each operation with its path and
outcome (:meth:`SlowMount.trace`): what a program does to a slow mount, one line per call the
kernel passes on (a profile of a state directory's open and close, say).

It lives in ``durable_dispatch.testing`` rather than the test tree because users want it too: a
campaign's own test suite can run its state directory on a mount that is as slow and as
forgetful of locks as the cluster's, on a laptop. It needs root (or ``fusermount3`` set up for
users), ``/dev/fuse``, Debian's ``fuse3`` (``libfuse3-3`` and ``fusermount3``) and the
``mfusepy`` package (``pip install 'durable-dispatch[fuse]'``): ``mfusepy`` is the maintained fork
of ``fusepy`` (ctypes over libfuse 2 or 3, no compiler, no async framework), where ``pyfuse3``
needs a C build against ``libfuse3-dev`` and runs its handlers under trio, which would make a
blocked ``fsync`` handler (a stall) block the whole server unless every handler is written
around it. :func:`unavailable` says why a mount cannot be made here, or None.

Cleanup: :meth:`SlowMount.close` (also on leaving the ``with`` block, whatever happened) resumes
a stall, unmounts (``fusermount3 -u``, then a lazy ``umount -l`` if busy), kills the server's
process group and waits for it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from types import TracebackType
from typing import Any

__all__ = ["SlowStorage", "SlowMount", "TracedOperation", "unavailable", "slow_mount"]

#: the control file's poll period in the server (seconds)
_POLL = 0.02


@dataclass(frozen=True)
class SlowStorage:
    """What the mount injects. Times are in milliseconds.

    Attributes:
        fsync_ms: the median cost of an ``fsync`` (files and directories).
        fsync_tail_ms: the cost of a tail ``fsync``.
        tail_fraction: the fraction of ``fsync`` calls that cost ``fsync_tail_ms`` (0 to 1).
        metadata_ms: the cost of each metadata operation.
        stalled: every ``fsync`` blocks until this is False again.
        seed: the tail's random seed.
        trace: log every operation the server receives (:meth:`SlowMount.trace`).
    """

    fsync_ms: float = 0.0
    fsync_tail_ms: float = 0.0
    tail_fraction: float = 0.0
    metadata_ms: float = 0.0
    stalled: bool = False
    seed: int = 0
    trace: bool = False


@dataclass(frozen=True)
class TracedOperation:
    """One operation the mount's server received (see :meth:`SlowMount.trace`).

    Attributes:
        op: the FUSE operation (``getattr`` is the kernel's lookup or stat of a name,
            ``create`` an ``open`` with ``O_CREAT`` of a missing file, ``fsync``, ``rename``,
            ``flock`` ...).
        path: the path inside the mount (``/`` its root).
        outcome: ``"ok"``, or the error's errno name (``"ENOENT"``).
        metadata: True when the mount counts it as a metadata operation (it costs
            ``metadata_ms``).
        other: the second path of a ``rename``, ``link`` or ``symlink`` ("" otherwise).
        at: when it returned (``time.time()`` in the server, on this host's clock).
    """

    op: str
    path: str
    outcome: str
    metadata: bool
    other: str = ""
    at: float = 0.0


def unavailable() -> str | None:
    """Why a :class:`SlowMount` cannot be made here (a sentence for ``pytest.skip``), or None."""
    if sys.platform != "linux":
        return "FUSE mounts are tested on Linux only"
    if os.geteuid() != 0:
        return "mounting a FUSE filesystem needs root here (CI runs as root)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse in this machine or container"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "no fusermount3: install Debian's fuse3 (.ci/install-fuse does)"
    try:
        import mfusepy  # type: ignore[import-untyped]  # noqa: F401
    except (ImportError, OSError) as e:
        return f"mfusepy cannot load libfuse ({e}): pip install 'durable-dispatch[fuse]'"
    return None


class SlowMount:
    """A FUSE passthrough of ``backing`` at ``mountpoint`` with injected latency and stalls.

    Use as a context manager (or call :meth:`start` and, in a ``finally``, :meth:`close`)::

        with SlowMount(tmp / "disk", tmp / "mnt", SlowStorage(fsync_ms=5, metadata_ms=1)) as m:
            run_campaign(m.path / "state")
            with m.stalled():
                ...   # every fsync blocks here

    Args:
        backing: the local directory that holds the files (created if missing).
        mountpoint: an empty directory to mount on (created if missing).
        storage: the initial :class:`SlowStorage` settings.
        locks: ``"local"`` (the kernel's locks: they exclude, as on one node) or ``"none"``
            (``flock`` and ``fcntl`` locks succeed and exclude no one).
        cache_seconds: how long the kernel may keep what a lookup or a stat of the mount
            returned (libfuse's ``entry_timeout`` and ``attr_timeout``; None: libfuse's
            default, 1 s; an NFS client caches for 3 to 60 s). 0 sends every lookup to the
            server, so its counts are what a program asks for, whatever the timing.
    """

    def __init__(
        self,
        backing: str | os.PathLike[str],
        mountpoint: str | os.PathLike[str],
        storage: SlowStorage | None = None,
        *,
        locks: str = "local",
        cache_seconds: float | None = None,
    ) -> None:
        if locks not in ("local", "none"):
            raise ValueError(f"locks must be 'local' or 'none', got {locks!r}")
        self.backing = os.path.abspath(os.fspath(backing))
        self.mountpoint = os.path.abspath(os.fspath(mountpoint))
        self.locks = locks
        self.cache_seconds = cache_seconds
        self.storage = storage or SlowStorage()
        self._work = tempfile.mkdtemp(prefix="slowmount-")
        self._control = os.path.join(self._work, "control.json")
        self._counters = os.path.join(self._work, "counters.json")
        self._log = os.path.join(self._work, "server.log")
        self._trace = os.path.join(self._work, "trace.tsv")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def path(self) -> str:
        """The mount point (where the test puts its files)."""
        return self.mountpoint

    def start(self, timeout: float = 20.0) -> SlowMount:
        """Mount; returns once the mount point is a mount. Raises RuntimeError if it is not
        within ``timeout`` seconds (the server's log is in the message)."""
        os.makedirs(self.backing, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        self._write_control()
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "durable_dispatch.testing._sharedfs_server",
                    self.backing,
                    self.mountpoint,
                    "--control",
                    self._control,
                    "--counters",
                    self._counters,
                    "--locks",
                    self.locks,
                    "--trace",
                    self._trace,
                    *(
                        ["--cache-seconds", repr(float(self.cache_seconds))]
                        if self.cache_seconds is not None
                        else []
                    ),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        end = time.monotonic() + timeout
        while not os.path.ismount(self.mountpoint):
            if self._proc.poll() is not None or time.monotonic() > end:
                text = self._server_log()
                self.close()
                raise RuntimeError(f"the FUSE mount did not come up: {text[-2000:]}")
            time.sleep(0.02)
        return self

    def configure(self, **changes: Any) -> None:
        """Change settings of the running mount (fields of :class:`SlowStorage`); the server
        applies them within about 20 ms, and this returns once it has."""
        self.storage = replace(self.storage, **changes)
        self._write_control()
        time.sleep(3 * _POLL)

    def stall(self) -> None:
        """Start an fsync stall: every fsync blocks until :meth:`resume`."""
        self.configure(stalled=True)

    def resume(self) -> None:
        """End a stall: the blocked fsyncs go on."""
        self.configure(stalled=False)

    @contextmanager
    def stalled(self) -> Iterator[None]:
        """A stall for the duration of a ``with`` block (ended whatever happens)."""
        self.stall()
        try:
            yield
        finally:
            self.resume()

    def counters(self) -> dict[str, Any]:
        """What the server did so far: ``fsyncs``, ``metadata_ops`` (and ``metadata_by_op``),
        ``stalled_fsyncs``,
        ``locks_granted``, ``longest_fsync_s``, ``waiting_fsyncs`` (blocked now), as of at
        most about 20 ms ago (this waits that long)."""
        time.sleep(3 * _POLL)
        try:
            with open(self._counters, "rb") as f:
                return dict(json.loads(f.read() or b"{}"))
        except (OSError, ValueError):
            return {}

    def trace(self, *, clear: bool = False) -> list[TracedOperation]:
        """The operations logged while ``trace`` was on (``configure(trace=True)``), oldest
        first, as of at most about 20 ms ago (this waits that long); ``clear`` empties the log
        after reading it. For a profile: which path each lookup, create and fsync was of."""
        time.sleep(3 * _POLL)
        try:
            with open(self._trace, "rb") as f:
                data = f.read()
            if clear:
                with open(self._trace, "r+b") as f:
                    f.truncate(0)
        except OSError:
            return []
        out = []
        for line in data.decode("utf-8", "replace").splitlines():
            parts = line.split("\t")
            if len(parts) == 6:
                op, path, outcome, meta, other, at = parts
                out.append(TracedOperation(op, path, outcome, meta == "1", other, float(at)))
        return out

    def close(self) -> None:
        """Resume a stall, unmount and stop the server (idempotent; never raises)."""
        if self.storage.stalled:
            try:
                self.storage = replace(self.storage, stalled=False)
                self._write_control()
            except OSError:
                pass
        proc, self._proc = self._proc, None
        if proc is not None:
            _unmount(self.mountpoint)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if os.path.ismount(self.mountpoint):
                _unmount(self.mountpoint)
        shutil.rmtree(self._work, ignore_errors=True)

    def _write_control(self) -> None:
        tmp = self._control + ".tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(self.storage), f)
        os.replace(tmp, self._control)

    def _server_log(self) -> str:
        try:
            with open(self._log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def __enter__(self) -> SlowMount:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextmanager
def slow_mount(
    base: str | os.PathLike[str],
    storage: SlowStorage | None = None,
    *,
    locks: str = "local",
    cache_seconds: float | None = None,
) -> Iterator[SlowMount]:
    """A :class:`SlowMount` of ``base/backing`` at ``base/mnt`` for a ``with`` block."""
    b = os.fspath(base)
    backing, mnt = os.path.join(b, "backing"), os.path.join(b, "mnt")
    with SlowMount(backing, mnt, storage, locks=locks, cache_seconds=cache_seconds) as m:
        yield m


def _unmount(mountpoint: str) -> None:
    for cmd in (
        ["fusermount3", "-u", mountpoint],
        ["fusermount", "-u", mountpoint],
        ["umount", "-l", mountpoint],
    ):
        if not os.path.ismount(mountpoint):
            return
        if shutil.which(cmd[0]) is None:
            continue
        try:
            subprocess.run(cmd, capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass
