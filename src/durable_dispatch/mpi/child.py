"""The isolated child's side of worker isolation (:mod:`.isolation` is the worker's side).

The worker starts the child as ``python -c _BOOTSTRAP``, which runs :mod:`.isolation` as
``__main__``, which calls :func:`child_main`: it loads the work function as ``multiprocessing``'s
spawn does, then answers the worker's jobs until the worker closes the pipe. The frames on the two
pipes are described in :mod:`.isolation`; :func:`pack` and :func:`unpack` are the two halves of an
entry, and :data:`PROGRESS` the layout of the shared page through which the child says which item
it runs.
"""

from __future__ import annotations

import functools
import mmap
import os
import pickle
import signal
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import orjson

from .. import processes
from ..values import TAG
from .capture import ChildSide, item_key
from .context import Batch, Outcomes, run_items
from .usage import Meter

__all__ = ["child_main", "pack", "unpack", "PROGRESS", "COST", "FLUSH_SECONDS"]

#: The shared page's layout: the job number and the index of the item the child runs, and the
#: child's CPU seconds when that item started (so the worker can tell what an item that died
#: cost from ``wait4``'s figure for the whole child).
PROGRESS = struct.Struct("=qqd")
#: A ``C`` entry's body: an item's CPU seconds and its peak resident bytes (-1: not measured).
COST = struct.Struct("=dq")
#: The child sends what it has at least this often, and after each job.
FLUSH_SECONDS = 0.02


def child_main(argv: list[str]) -> int:
    """The child: load the function, then answer items until the worker closes the pipe."""
    rfd, wfd, progress_fd, limit, parent, page_fd = (int(a) for a in argv)
    if not processes.die_with_parent(parent) and os.getppid() != parent:
        return 1  # the worker is gone already
    # The batch system's signals are the worker's to handle: it finishes or kills this item.
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(s, lambda *_: None)  # a handler, not SIG_IGN: programs run get defaults
    inbox, out = Connection(rfd, writable=False), Connection(wfd, readable=False)
    lock = threading.Lock()

    def send(data: bytes) -> None:
        with lock:
            out.send_bytes(data)

    try:
        setup = pickle.loads(inbox.recv_bytes())
        if not setup.get("mpi"):
            import mpi4py

            mpi4py.rc.initialize = False  # a script that touches MPI at import fails fast
            mpi4py.rc.finalize = False
        import multiprocessing.spawn

        multiprocessing.spawn.prepare(setup["prepare"])
        fn = pickle.loads(setup["fn"])
    except BaseException as e:  # noqa: BLE001 - reported to the worker, which raises it
        send(b"X" + f"loading it failed with {type(e).__name__}: {e}".encode())
        return 1
    held = _Held(send)  # (its thread's stack is mapped before the memory limit applies)
    if limit > 0:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    mode, max_result = setup["mode"], setup["max"]
    progress = mmap.mmap(progress_fd, PROGRESS.size)
    meter = Meter("child")
    capture = ChildSide(page_fd)
    send(b"S")
    while True:
        try:
            frame = inbox.recv_bytes()
        except EOFError:
            return 0
        job = orjson.loads(frame)
        batch = Batch(
            job["ids"],
            job["payloads"],
            job.get("attempts"),
            None,
            job.get("dependencies"),
            _TAG_BYTES in frame,  # (no stored form in it: nothing to restore item by item)
        )
        done = Outcomes(len(batch))

        def started(index: int, number: int = job["job"]) -> None:
            progress[: PROGRESS.size] = PROGRESS.pack(number, index, meter.cpu0)
            capture.start(item_key(number, index))

        def ended(index: int, done: Outcomes = done) -> None:
            capture.end()  # (what it wrote is read by the worker before its outcome arrives)
            rss = done.rss[index]  # (its cost before its outcome; -1: no peak)
            cost = pack(b"C", COST.pack(done.cpu[index] or 0.0, -1 if rss is None else rss))
            raw = done.raw[index]
            if raw is not None:
                held.add(cost + pack(b"R", raw))
            else:
                o = done.errors[index]
                failed = {"kind": o.kind, "reason": o.reason, "final": o.final}
                if o.traceback:
                    failed["traceback"] = o.traceback
                held.add(cost + pack(b"E", orjson.dumps(failed)))

        beat = functools.partial(send, b"B")
        lease = float(job["lease"])
        meter.rebase()
        run_items(
            fn, mode, batch, job["deadline"], lease, beat, max_result, done, started, ended, meter
        )
        held.flush()


_TAG_BYTES = b'"' + TAG.encode() + b'"'


class _Held:
    """The outcomes the child has not sent yet: sent together after the last item of a job,
    once they are :data:`FLUSH_SECONDS` old after an item, and by a thread of their own once
    they are that old while the next item still runs (so an outcome never waits for a slow
    item after it)."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._entries: list[bytes] = []
        self._since = 0.0  # when the oldest entry was added
        threading.Thread(target=self._watch, name="outcomes", daemon=True).start()

    def add(self, entry: bytes) -> None:
        with self._lock:
            if not self._entries:
                self._since = time.monotonic()
            self._entries.append(entry)
            if time.monotonic() - self._since >= FLUSH_SECONDS:
                self._flush()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if self._entries:
            self._send(b"".join(self._entries))
            self._entries.clear()

    def _watch(self) -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            with self._lock:
                if self._entries and time.monotonic() - self._since >= FLUSH_SECONDS:
                    self._flush()


def pack(tag: bytes, body: bytes) -> bytes:
    """One entry of a frame: its tag, its length, its body."""
    return tag + len(body).to_bytes(4, "little") + body


def unpack(frame: bytes) -> list[tuple[bytes, bytes]]:
    """The entries of a frame the child sent (a heartbeat is the bare frame ``B``)."""
    if frame == b"B":
        return [(b"B", b"")]
    out, at = [], 0
    while at < len(frame):
        n = int.from_bytes(frame[at + 1 : at + 5], "little")
        out.append((frame[at : at + 1], frame[at + 5 : at + 5 + n]))
        at += 5 + n
    return out
