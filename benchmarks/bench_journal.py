"""Journal throughput against raw write+fsync and SQLite, measured in one run on one directory.

Usage: ``python benchmarks/bench_journal.py [--dir DIR] [--fsync-records N] [--batch-records N]``

Prints records/s for a ~150-byte record:
  raw os.write+os.fsync per record | our "always" | SQLite WAL synchronous=FULL, one commit each
  raw buffered writes + one fsync  | our "batch" (durable records/s, one thread)
  replay: our verifying reader vs plain orjson.loads over the same lines
and the ratios the targets are stated in (docs/performance.md). Not a test: no thresholds here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

from durable_dispatch import Journal

PAYLOAD = {
    "event": "committed",
    "work_id": "w-000000",
    "rank": 3,
    "token": "e1-000000",
    "result": {"ok": True, "n": 12345},
    "pad": "x" * 40,
}


def payload(i: int) -> dict[str, object]:
    p = dict(PAYLOAD)
    p["work_id"] = f"w-{i:06d}"
    p["token"] = f"e1-{i:06d}"
    return p


def line_size() -> int:
    return len(orjson.dumps(payload(0)))


def interleaved_fsync_bound(d: Path, n: int) -> tuple[float, float, float]:
    """Records/s of raw write+fsync, our ``always`` and SQLite WAL FULL, one record of each in turn.

    The shared disk's speed drifts by tens of percent over seconds; timing the three side by side,
    record by record, exposes all three to the same drift.
    """
    lines = [orjson.dumps(payload(i)) + b"\n" for i in range(n)]
    rows = [orjson.dumps(payload(i)) for i in range(n)]
    fd = os.open(d / "raw.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    con = sqlite3.connect(d / "bench.sqlite", isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute("CREATE TABLE j (seq INTEGER PRIMARY KEY, payload BLOB)")
    t_raw = t_ours = t_sql = 0.0
    clock = time.perf_counter
    with Journal.open(d / "ours-always.jsonl", sync="always") as j:
        for i in range(n):
            t0 = clock()
            os.write(fd, lines[i])
            os.fsync(fd)
            t1 = clock()
            j.append(payload(i))
            t2 = clock()
            con.execute("BEGIN")
            con.execute("INSERT INTO j VALUES (?, ?)", (i, rows[i]))
            con.execute("COMMIT")
            t3 = clock()
            t_raw += t1 - t0
            t_ours += t2 - t1
            t_sql += t3 - t2
    os.close(fd)
    con.close()
    return n / t_raw, n / t_ours, n / t_sql


def ours(d: Path, n: int, sync: str) -> float:
    path = d / f"ours-{sync}.jsonl"
    with Journal.open(path, sync=sync) as j:
        t = time.perf_counter()
        for i in range(n):
            r = j.append(payload(i))
        j.wait_durable(r.seq)
        el = time.perf_counter() - t
    return n / el


def raw_buffered(d: Path, n: int) -> float:
    lines = [orjson.dumps(payload(i)) + b"\n" for i in range(n)]
    t = time.perf_counter()
    with open(d / "buffered.jsonl", "wb") as f:
        for line in lines:
            f.write(line)
        f.flush()
        os.fsync(f.fileno())
    return n / (time.perf_counter() - t)


def replay(d: Path, rounds: int) -> tuple[float, float, int]:
    """Median records/s of our verifying reader and of plain orjson.loads, in alternating rounds.

    Both read the same file from the page cache: ours with ``Journal.records()`` (every checksum
    and sequence number checked, every payload decoded), the baseline with ``for line in f:
    orjson.loads(line)``.
    """
    path = d / "ours-batch.jsonl"
    loads = orjson.loads
    mine, base = [], []
    n = 0
    with Journal.open(path) as j:
        for _ in range(rounds):
            t = time.perf_counter()
            n = sum(1 for _ in j.records())
            mine.append(n / (time.perf_counter() - t))
            t = time.perf_counter()
            with open(path, "rb") as f:
                f.readline()
                m = 0
                for line in f:
                    loads(line)
                    m += 1
            base.append(m / (time.perf_counter() - t))
    return statistics.median(mine), statistics.median(base), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", help="directory on the disk to measure (default: a temp dir)")
    ap.add_argument("--fsync-records", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5, help="replay rounds (median)")
    ap.add_argument("--batch-records", type=int, default=500_000)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dd-bench-", dir=a.dir))
    try:
        n1, n2 = a.fsync_records, a.batch_records
        print(f"directory {base}; record payload {line_size()} bytes (line ~{line_size() + 45})")
        r_raw, r_always, r_sql = interleaved_fsync_bound(base, n1)
        r_buf = raw_buffered(base, n2)
        r_batch = ours(base, n2, "batch")
        rp_ours, rp_plain, n_rp = replay(base, a.rounds)
        rows = [
            ("raw os.write+os.fsync per record", r_raw),
            ("ours sync=always", r_always),
            ("SQLite WAL synchronous=FULL, commit per record", r_sql),
            ("raw buffered writes + one fsync", r_buf),
            ("ours sync=batch (durable, one thread)", r_batch),
            (f"replay: ours records() over {n_rp} records", rp_ours),
            ("replay: plain orjson.loads per line", rp_plain),
        ]
        for name, rate in rows:
            print(f"{name:<50} {rate:>12,.0f} records/s")
        print()
        print(f"always / raw write+fsync      = {r_always / r_raw:5.2f}  (target >= 0.85)")
        print(f"always / SQLite WAL FULL      = {r_always / r_sql:5.2f}  (target >= 1.2)")
        print(f"batch durable records/s       = {r_batch:,.0f}  (target >= 150,000)")
        print(f"batch / raw buffered+fsync    = {r_batch / r_buf:5.2f}")
        print(f"replay / orjson.loads         = {rp_ours / rp_plain:5.2f}  (target >= 0.5)")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
