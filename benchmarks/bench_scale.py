"""The master at scale (issue 17), measured in one run: no MPI, CampaignState + core with
instant in-process workers, exactly as run_master drives them.

Usage: ``python benchmarks/bench_scale.py [--items 1000000] [--quick]``

Prints, each as a ratio against its small case (the targets in parentheses):
  per-task cost at 8, 1,000 and 10,000 ranks, batch 1 and batch 64   (10,000 within 1.3x of 8)
  one rollback (a timeout: requeue + the S8 snapshot before the next dispatch) with 10k, 100k
  and --items queued items                                            (1M within 2x of 10k)
  bytes of memory per queued item after a reopen (beyond its payload) (about 500 at most)
  reopen (replay) and submit time per item                            (1M in at most 3 s each)
Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import tempfile
import time
from typing import Any

from durable_dispatch import CampaignState, RetryPolicy, WatchdogConfig, WorkItem
from durable_dispatch.core import Send


def _open(d: str, ranks: int) -> CampaignState:
    return CampaignState.open(
        d,
        sync="batch",
        watchdog=WatchdogConfig(600),
        retry=RetryPolicy(5),
        ranks=range(1, ranks + 1),
    )


def per_task_us(ranks: int, batch: int, tasks: int) -> float:
    """Microseconds of master bookkeeping per task, every worker answering at once."""
    d = tempfile.mkdtemp(prefix="dd-scale-")
    try:
        st = _open(d, ranks)
        core = st.core
        st.submit(WorkItem(f"t{i}", {"i": i}) for i in range(tasks))
        t = time.perf_counter()
        while not core.done:
            now = time.monotonic()
            sends = []
            while (s := st.next_send(now, batch)) is not None:
                st.sent(s.token, now)
                sends.append(s)
                if len(sends) >= 8:  # the same 8 dispatches a turn at every rank count
                    break
            for s in sends:
                st.on_results(s.rank, str(s.token), [w.payload for w in s.items], now)
            st.complete_commits(wait=True)
            for s in sends:
                st.on_ready(s.rank, str(s.token), now)
            st.tick(now)
        el = time.perf_counter() - t
        st.close()
        return el / tasks * 1e6
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _payload(i: int) -> dict[str, Any]:
    return {"seed": f"seed-{i:012d}", "rounds": 2000 + i % 97, "input": "x" * 16}  # ~60 bytes


def scale_case(items: int) -> dict[str, float]:
    """Submit, one rollback, reopen and memory for a campaign of ``items`` queued items."""
    d = tempfile.mkdtemp(prefix="dd-scale-")
    try:
        st = _open(d, 4)
        t = time.perf_counter()
        st.submit(WorkItem(f"w{i:09d}", _payload(i)) for i in range(items))
        submit = time.perf_counter() - t
        now = time.monotonic()
        s = st.next_send(now)
        assert isinstance(s, Send)
        st.sent(s.token, now)
        t = time.perf_counter()
        st.tick(now + 10_000)  # the deadline passed: requeue and park (the S8 snapshot is due)
        s2 = st.next_send(now + 10_000)  # the snapshot is written before the next dispatch
        rollback = time.perf_counter() - t
        assert s2 is not None
        st.close()
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        gc.collect()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        st = _open(d, 4)
        reopen = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        st.close()
        return {
            "submit_s": submit,
            "rollback_s": rollback,
            "reopen_s": reopen,
            "peak_growth_bytes_per_item": max(0, after - before) * 1024 / items,
            "dir_bytes": size,
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--items", type=int, default=1_000_000, help="the largest campaign")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a look in seconds")
    a = ap.parse_args()
    tasks = 2_000 if a.quick else 20_000
    sizes = [10_000, 100_000, a.items] if not a.quick else [2_000, 20_000, 100_000]
    print("per-task master cost (us), instant workers:")
    per_task_us(8, 1, tasks // 4)  # warm up (imports, caches)
    for batch in (1, 64):
        base = per_task_us(8, batch, tasks)
        row = [f"8 ranks {base:7.1f}"]
        for ranks in (1_000, 10_000):
            us = per_task_us(ranks, batch, tasks)
            row.append(f"{ranks:,} ranks {us:7.1f} ({us / base:4.2f}x)")
        print(f"  batch {batch:<3} " + "   ".join(row) + "   (target: 10,000 within 1.3x)")
    print("campaign size (one rollback = requeue + the S8 snapshot before the next dispatch):")
    first = None
    for n in sizes:  # the largest last: the peak RSS figure only grows
        r = scale_case(n)
        first = first or r
        print(
            f"  {n:>9,} items: rollback {r['rollback_s'] * 1e3:8.1f} ms "
            f"({r['rollback_s'] / first['rollback_s']:6.1f}x)  submit {r['submit_s']:6.2f} s "
            f"({r['submit_s'] / n * 1e6:5.2f} us/item)  reopen {r['reopen_s']:6.2f} s "
            f"({r['reopen_s'] / n * 1e6:5.2f} us/item)  "
            f"memory {r['peak_growth_bytes_per_item']:6.0f} B/item  "
            f"directory {r['dir_bytes'] / n:5.0f} B/item"
        )
    print(
        "targets: rollback at 1M within 2x of 10k; <= ~500 B/item; reopen and submit of 1M <= 3 s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
