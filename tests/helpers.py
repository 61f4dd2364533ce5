"""Shared test helpers."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from durable_dispatch import Journal


def write_journal(path: Path | str, payloads: list[Any], sync: str = "always") -> list[int]:
    """Write ``payloads`` to a fresh journal; returns the sequence numbers."""
    with Journal.open(path, sync=sync) as j:
        seqs = [j.append(p).seq for p in payloads]
        j.sync_now()
    return seqs


def read_all(path: Path | str, **kw: Any) -> list[tuple[int, Any]]:
    """Open a journal (recovering it) and return ``[(seq, payload)]``."""
    with Journal.open(path, **kw) as j:
        return [(r.seq, r.payload) for r in j.records()]


def line_offsets(path: Path | str) -> list[int]:
    """Byte offsets at which each line of a file starts."""
    data = Path(path).read_bytes()
    offs, pos = [], 0
    for line in data.splitlines(keepends=True):
        offs.append(pos)
        pos += len(line)
    return offs


def sample_payloads(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Deterministic varied payloads (unicode, nesting, numbers)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        out.append(
            {
                "event": rnd.choice(["committed", "dispatched", "deferred"]),
                "work_id": f"w-{i}",
                "n": rnd.randint(-(2**40), 2**40),
                "text": "".join(rnd.choice('aé☃ "\\\n{}:,') for _ in range(rnd.randint(0, 30))),
                "nested": {"list": [rnd.random(), None, True, {"k": i}]},
            }
        )
    return out


def file_mode(path: Path | str) -> int:
    """Permission bits of a file."""
    return os.stat(path).st_mode & 0o777
