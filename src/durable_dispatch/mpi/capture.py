"""An isolated child's standard output and error: copied to the worker's own, and kept per item.

The worker's :class:`Relay` owns two pipes; every child it starts (and whatever the child starts)
writes its standard output and error into them, and two threads of the worker copy what arrives
to the worker's own file descriptors 1 and 2, as the job's log always showed it. So no child,
and nothing a child starts, holds the rank's own output: ``mpiexec`` ends once every rank's
output is closed, and a process an item left running, re-parented to init when its worker was
SIGKILLed, kept the whole job from ending (the torture harness found it). Such a process now
holds only these pipes, whose reader died with the worker.

The same threads keep the last :data:`TAIL_BYTES` of each stream per item. Which item a chunk
belongs to is read from a shared page (a ``memfd``) the child writes: before an item, its key
(:func:`item_key`); after it, once it flushed its streams (Python's and C's), the child waits
until the pipes are empty and no relay thread is between a read and its bookkeeping (a flag
per stream in the same page), then clears the key. So what an item wrote before it returned is
that item's, exactly, however the reads fell, and a crash loses nothing the child wrote: the
bytes wait in the pipe, which the worker drains (:meth:`Relay.settle`) before it takes the
item's tails. What a process an item left running writes after the item ended goes with the
item that runs when the worker reads it (or with none). The wait is bounded
(:data:`SETTLE_SECONDS`): when the worker's own output is blocked, what could not be read in
time goes with the next item, and the item is not held longer.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import select
import struct
import sys
import termios
import threading
import time
from typing import Any

__all__ = ["Relay", "ChildSide", "item_key", "output_entry", "TAIL_BYTES", "SETTLE_SECONDS"]

#: What is kept of each of an item's two streams: its last this many bytes.
TAIL_BYTES = 64 << 10
#: The longest a child waits after an item for the worker to have read what it wrote.
SETTLE_SECONDS = 0.5
_KEY = struct.Struct("=q")  # the page: the running item's key, then one busy flag per stream
_PAGE = 16
_FLAG = 8  # offset of stdout's flag (stderr's follows)


def item_key(job: int, index: int) -> int:
    """The key of the item ``index`` of job ``job`` (never 0, which means no item)."""
    return (job << 24) + index + 1


def _unread(fd: int) -> int:
    """Bytes waiting in the pipe ``fd`` is an end of (0 when it cannot say)."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]  # type: ignore[no-any-return]
    except OSError:
        return 0


def output_entry(said: dict[str, Any]) -> dict[str, Any] | None:
    """An item's tails (:meth:`Relay.take`) as a RESULT carries them and the outputs journal
    keeps them: for each stream, ``stdout`` (text) or, when it is not UTF-8, ``stdout_b64``
    (its bytes in base64), and ``stdout_dropped`` (the bytes before the tail that were not
    kept); likewise ``stderr``. None when the item wrote nothing."""
    if not said["stdout"] and not said["stderr"]:
        return None
    out: dict[str, Any] = {}
    for name, dropped in zip(("stdout", "stderr"), said["dropped"], strict=True):
        data: bytes = said[name]
        if dropped:  # the tail may start inside a character: from the next one
            skip = 0
            while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
                skip += 1
            data, dropped = data[skip:], dropped + skip
        try:
            out[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            import base64

            out[name + "_b64"] = base64.b64encode(data).decode("ascii")
        out[name + "_dropped"] = dropped
    return out


def _waiting(fd: int, n: bytearray) -> bool:
    """True when bytes wait in the pipe ``fd`` is an end of (``n``: a 4-byte scratch)."""
    try:
        fcntl.ioctl(fd, termios.FIONREAD, n, True)
    except OSError:
        return False
    return n != b"\0\0\0\0"


class _Tail:
    """The last :data:`TAIL_BYTES` of a stream, and how many bytes before them were dropped."""

    __slots__ = ("buf", "dropped")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        self.buf += chunk
        if len(self.buf) > 2 * TAIL_BYTES:  # (cut in steps: not a copy per chunk)
            self.cut()

    def cut(self) -> None:
        """Keep only the last :data:`TAIL_BYTES`, counting the bytes dropped before them."""
        over = len(self.buf) - TAIL_BYTES
        if over > 0:
            del self.buf[:over]
            self.dropped += over


class Relay:
    """The worker's side (see the module docs): the pipes its children write to, the two
    threads that copy them to the worker's own output, and each item's tails."""

    def __init__(self) -> None:
        self.fds: list[int] = []  # the write ends the children get
        self._reads: list[int] = []
        self._threads: list[threading.Thread] = []
        self.page_fd = os.memfd_create("durable-dispatch-output")
        with os.fdopen(self.page_fd, "r+b", closefd=False) as page:  # memory, not storage
            page.truncate(_PAGE)
        self.page = mmap.mmap(self.page_fd, _PAGE)
        self._lock = threading.Lock()
        self._tails: dict[int, tuple[_Tail, _Tail]] = {}
        for stream, target in enumerate((1, 2)):
            r, w = os.pipe()
            self.fds.append(w)
            self._reads.append(r)
            t = threading.Thread(
                target=self._copy, args=(r, target, stream), name="child-output", daemon=True
            )
            t.start()
            self._threads.append(t)

    def _copy(self, source: int, target: int, stream: int) -> None:
        out = open(target, "wb", buffering=0, closefd=False)  # noqa: SIM115 - the rank's own
        flag = _FLAG + stream
        poller = select.poll()
        poller.register(source, select.POLLIN)
        try:
            while True:
                poller.poll()
                self.page[flag] = 1  # (before the read: the child waits while it is set)
                try:
                    chunk = os.read(source, 65536)
                    key = _KEY.unpack_from(self.page, 0)[0]
                    if chunk and key:
                        with self._lock:
                            tails = self._tails.get(key)
                            if tails is None:
                                tails = self._tails[key] = (_Tail(), _Tail())
                            tails[stream].add(chunk)
                finally:
                    self.page[flag] = 0
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    try:
                        view = view[out.write(view) or 0 :]
                    except OSError:  # nobody reads the rank's output, or its file is full or
                        view = view[:0]  # failing: drop this chunk, keep relaying (and keeping)
        except (OSError, ValueError):
            pass
        finally:
            os.close(source)
            out.close()

    @property
    def holds(self) -> bool:
        """True when some item's tails are kept (read without the lock: a hint)."""
        return bool(self._tails)

    def take(self, key: int) -> dict[str, Any] | None:
        """The tails of item ``key`` (forgotten here): ``{"stdout": bytes, "stderr": bytes,
        "dropped": [stdout's, stderr's]}``, or None when it wrote nothing."""
        if not self._tails:  # (the usual item: nothing written, no lock taken)
            return None
        with self._lock:
            tails = self._tails.pop(key, None)
        if tails is None:
            return None
        for t in tails:
            t.cut()
        return {
            "stdout": bytes(tails[0].buf),
            "stderr": bytes(tails[1].buf),
            "dropped": [tails[0].dropped, tails[1].dropped],
        }

    def forget(self) -> None:
        """Drop every item's tails (a new dispatch: what the last one left is nobody's)."""
        with self._lock:
            self._tails.clear()

    def settle(self, timeout: float = SETTLE_SECONDS) -> None:
        """Wait (at most ``timeout``) until the pipes are empty and the threads have kept what
        they read: after a child died, so that the tails of its last item are whole."""
        end = time.monotonic() + timeout
        while (
            any(map(_unread, self._reads)) or self.page[_FLAG] or self.page[_FLAG + 1]
        ) and time.monotonic() < end:
            time.sleep(0.001)

    def close(self, timeout: float = 1.0) -> None:
        """Close the write ends; wait (at most ``timeout``) for what was written to be copied
        (a process that still holds a write end keeps its thread alive, which is a daemon)."""
        for fd in [*self.fds, self.page_fd]:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
        self.page_fd = -1
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))


class ChildSide:
    """The child's side (see the module docs): it marks each item in the shared page, and after
    the item flushes its streams and waits until the worker has read them."""

    def __init__(self, page_fd: int) -> None:
        self.page = mmap.mmap(page_fd, _PAGE)
        os.close(page_fd)
        self._watch = (os.dup(1), os.dup(2))  # (the relay's pipes, whatever fd 1 becomes)
        self._count = bytearray(4)  # (FIONREAD's answer, written in place)
        try:
            import ctypes

            self._fflush: Any = ctypes.CDLL(None).fflush
        except (OSError, AttributeError):
            self._fflush = None

    def start(self, key: int) -> None:
        """Item ``key`` starts: what this process writes from now on is its."""
        _KEY.pack_into(self.page, 0, key)

    def end(self) -> None:
        """The item ended: flush its streams, wait (bounded) until the worker has read them."""
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except Exception:  # noqa: BLE001 - a user's stream (no flush, a closed file): the
                pass  # item's outcome is what counts
        if self._fflush is not None:
            self._fflush(None)  # what C code wrote with stdio
        page, (out, err), n = self.page, self._watch, self._count
        end = 0.0
        while (
            _waiting(out, n) or page[_FLAG] or _waiting(err, n) or page[_FLAG + 1]
        ):  # (the relay still has bytes to read, or is between a read and its bookkeeping)
            now = time.monotonic()
            if not end:
                end = now + SETTLE_SECONDS
            elif now >= end:
                break
            time.sleep(0.0002)
        _KEY.pack_into(self.page, 0, 0)
