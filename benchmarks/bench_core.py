"""Dispatch-core bookkeeping cost and watchdog sweep scaling, measured in one run.

Usage: ``python benchmarks/bench_core.py [--tasks N] [--in-flight N]``

Prints the per-task cost of the full bookkeeping cycle (reserve, mark_dispatched, current RESULT,
commit_done, READY) in microseconds, at 8 and at 10,000 ranks (target: within 1.3x), and the
cost of a sweep with nothing expired at 10 and at 100,000 transactions in flight, with their
ratio (target: at most 2x). Not a test.
"""

from __future__ import annotations

import argparse
import time

from durable_dispatch.core import Dispatcher, Send, WatchdogConfig, WorkItem


def per_task(n: int, ranks: int = 8) -> float:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(60), ranks=range(1, ranks + 1))
    d.submit(WorkItem(f"w{i}") for i in range(n))
    now = 0.0
    t = time.perf_counter()
    while True:
        s = d.reserve(now)
        if s is None:
            break
        assert isinstance(s, Send)
        d.mark_dispatched(s.token, now)
        tok = str(s.token)
        d.on_result(s.rank, tok, None, now)
        d.commit_done(s.token)
        d.on_ready(s.rank, tok, now)
        now += 0.001
    el = time.perf_counter() - t
    assert d.statistics().commits == n
    return el / n * 1e6


def sweep_cost(in_flight: int, reps: int = 20000) -> float:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(3600), ranks=range(in_flight))
    d.submit(WorkItem(f"w{i}") for i in range(in_flight))
    for i in range(in_flight):
        s = d.reserve(0.0)
        assert isinstance(s, Send)
        d.mark_dispatched(s.token, float(i) * 1e-6)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            d.sweep(100.0)
        best = min(best, (time.perf_counter() - t) / reps)
    assert d.statistics().in_flight_now == in_flight
    return best * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tasks", type=int, default=200_000)
    ap.add_argument("--in-flight", type=int, default=100_000)
    a = ap.parse_args()
    us = per_task(a.tasks)
    many = min(per_task(a.tasks // 4, 10_000) for _ in range(3))
    few = min(per_task(a.tasks // 4, 8) for _ in range(3))
    small = sweep_cost(10)
    large = sweep_cost(a.in_flight)
    print(
        f"per-task bookkeeping (reserve+dispatched+RESULT+commit+READY): {us:.2f} us "
        f"({1e6 / us:,.0f} tasks/s of core alone)"
    )
    print(
        f"per task at 10,000 ranks: {many:.2f} us, at 8 ranks: {few:.2f} us, "
        f"ratio {many / few:.2f}  (target <= 1.3)"
    )
    print(f"sweep, nothing expired, 10 in flight:        {small:.3f} us")
    print(f"sweep, nothing expired, {a.in_flight:,} in flight: {large:.3f} us")
    print(f"sweep ratio {a.in_flight:,} / 10 = {large / small:.2f}  (target <= 2)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
