"""A crash simulator for the fs seam: every file operation of a workload is a crash point.

Theory of operation. A workload runs on real files while :func:`record` captures, through the fs
seam's recorder hook, every operation in order: opens (and whether they created a file), each
write's bytes, fsyncs, directory fsyncs, renames, truncations and unlinks. :class:`Model` replays a
prefix of that log the way a power-loss model sees it: per file (inode) the bytes made durable by
its last fsync and the volatile bytes written since; per directory the names as of its last
directory fsync (durable) and the names now (volatile). :func:`crash_states` turns the model after
operation k into on-disk states: only synced data; synced data plus a random prefix of the unsynced
bytes (a torn tail); synced data plus a garbage block in the unsynced region; and, when a rename or
creation was not followed by a directory fsync, both the durable and the volatile namespace.

What it does not model: reordering of writes inside one file beyond "a prefix survives", lying disk
firmware, partial sector writes inside already synced data, and metadata other than names and sizes.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from durable_dispatch.storage import fs

Op = tuple[str, str, object]


@contextmanager
def record() -> Iterator[list[Op]]:
    """Record every successful fs-seam operation into a list (thread-safe)."""
    ops: list[Op] = []
    lock = threading.Lock()

    def rec(op: str, path: str, detail: object) -> None:
        with lock:
            ops.append((op, path, detail))

    prev = fs.set_recorder(rec)
    try:
        yield ops
    finally:
        fs.set_recorder(prev)


@dataclass
class Inode:
    content: bytearray = field(default_factory=bytearray)
    durable: bytes = b""


class Model:
    """The file system as a power loss would leave it, after some prefix of the ops."""

    def __init__(self, root: str, initial: dict[str, bytes] | None = None) -> None:
        self.root = root
        self.names: dict[str, Inode] = {}
        self.handles: dict[str, Inode] = {}  # the path a descriptor was opened with -> inode
        for path, data in (initial or {}).items():  # files present (and durable) at the start
            self.names[path] = Inode(bytearray(data), data)
        self.durable_names: dict[str, Inode] = dict(self.names)

    def apply(self, op: str, path: str, detail: object) -> None:
        if not path.startswith(self.root):
            return
        if op == "open":
            if detail or path not in self.names:
                ino = Inode()
                self.names[path] = ino
            self.handles[path] = self.names[path]
        elif op == "write":
            assert isinstance(detail, bytes)
            self.handles[path].content += detail
        elif op == "fsync":
            ino = self.handles[path]
            ino.durable = bytes(ino.content)
        elif op == "dir-fsync":
            d = os.path.abspath(path)
            for name in [n for n in self.durable_names if os.path.dirname(n) == d]:
                del self.durable_names[name]
            for name, ino in self.names.items():
                if os.path.dirname(name) == d:
                    self.durable_names[name] = ino
        elif op == "replace":
            assert isinstance(detail, str)
            self.names[detail] = self.names.pop(path)
        elif op == "truncate":
            assert isinstance(detail, int)
            ino = self.names[path]
            del ino.content[detail:]
            ino.durable = bytes(ino.content)
        elif op == "unlink":
            self.names.pop(path, None)


@dataclass
class CrashState:
    """One on-disk state after a crash: file path (under the recorded root) -> bytes."""

    k: int
    variant: str
    files: dict[str, bytes]

    def materialize(self, root: str, target: Path) -> None:
        """Write the files under ``target`` (in place of ``root``)."""
        target.mkdir(parents=True, exist_ok=True)
        for path, data in self.files.items():
            rel = os.path.relpath(path, root)
            dst = target / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(data)


def _content(ino: Inode, variant: str, rnd: random.Random) -> bytes:
    cur = bytes(ino.content)
    dur = ino.durable
    if not cur.startswith(dur):  # a truncation since: the durable image is all we know
        return dur
    tail = cur[len(dur) :]
    if variant == "synced" or not tail:
        return dur
    if variant == "torn":
        return dur + tail[: rnd.randint(0, len(tail))]
    # garbage: a block of the unsynced region replaced by junk (zeros or random bytes)
    cut = rnd.randint(0, len(tail))
    n = rnd.randint(1, max(1, len(tail) - cut))
    junk = bytes(n) if rnd.random() < 0.5 else rnd.randbytes(n)
    return dur + tail[:cut] + junk + tail[cut + n :]


def snapshot_tree(root: str) -> dict[str, bytes]:
    """Every regular file under ``root`` (the state a recorded workload starts from)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            out[p] = Path(p).read_bytes()
    return out


def crash_states(
    ops: list[Op],
    root: str,
    rnd: random.Random,
    every: int = 1,
    initial: dict[str, bytes] | None = None,
    draws: int = 1,
) -> Iterator[CrashState]:
    """Every crash state after each ``every``-th operation (and after the last).

    ``draws`` random torn and garbage variants are made per operation and namespace.
    """
    model = Model(root, initial)
    n = len(ops)
    for k in range(n + 1):
        if k > 0:
            model.apply(*ops[k - 1])
        if k % every and k != n:
            continue
        spaces = [("durable", model.durable_names)]
        if model.names != model.durable_names:
            spaces.append(("volatile", model.names))
        for space_name, names in spaces:
            for variant in ("synced", *(("torn", "garbage") * draws)):
                files = {p: _content(ino, variant, rnd) for p, ino in names.items()}
                yield CrashState(k, f"{space_name}/{variant}", files)
