"""Campaigns at the job's edges, run under mpiexec by tests/test_mpi_edges.py.

Usage: mpiexec -n 4 python edge_campaign.py STATE_DIR MODE [N]
MODE ``steady`` (N items of 0.25 s, ``WatchdogConfig(3.0)``, in-process workers) and
``steady-isolated`` (the same with ``isolate=True``) are the campaigns a test pauses (SIGSTOP and
SIGCONT of the master, a worker or an isolated child). ``timeouts`` is the issue-29 isolation
campaign: 42 items with ``timeout=2.0`` of which 6 hang, 3 segfault and 3 leave a ``sleep``
behind, ``RetryPolicy(1)``. Rank 0 prints ``REPORT <json>``; every rank that runs an item
writes its PID to ``STATE_DIR.pids`` first, so a test can find the isolated children.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def work(payload: dict[str, object], ctx: object) -> object:
    """The work function (module level: an isolated child finds it by name)."""
    what = payload["do"]
    pids = payload.get("pids")
    if isinstance(pids, str):
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
    if what == "hang":
        while True:
            time.sleep(3600)
    if what == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if what == "children":
        subprocess.Popen(["sleep", "303.5"])
        return "left a sleep behind"
    time.sleep(float(payload.get("seconds", 0.0)))  # type: ignore[arg-type]
    return {"x2": 2 * int(payload["x"])}  # type: ignore[call-overload]


def plan(mode: str, n: int, pids: str) -> list[object]:
    from durable_dispatch import WorkItem

    if mode.startswith("steady"):
        return [
            WorkItem(f"w{i:03d}", {"do": "ok", "x": i, "seconds": 0.25, "pids": pids})
            for i in range(n)
        ]
    items = []
    for i in range(42):
        do = (
            "hang"
            if i % 7 == 1
            else "segfault"
            if i % 14 == 3
            else "children"
            if i % 14 == 5
            else "ok"
        )
        items.append(WorkItem(f"t{i:02d}", {"do": do, "x": i, "seconds": 0.05}, timeout=2.0))
    return items


if __name__ == "__main__":
    import orjson
    from mpi4py import MPI

    from durable_dispatch import RetryPolicy, WatchdogConfig
    from durable_dispatch.mpi import run_master, run_worker

    state_dir, mode = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    isolate = mode != "steady"
    if MPI.COMM_WORLD.Get_rank() == 0:
        report = run_master(
            plan(mode, n, state_dir + ".pids"),
            state_dir,
            watchdog=WatchdogConfig.build(3.0) if mode.startswith("steady") else None,
            retry=RetryPolicy(1),
            stop_timeout=5,
            linger=10.0,
            max_seconds=90,
        )
        out = {
            "finished": report.finished,
            "reason": report.reason,
            "seconds": report.seconds,
            "core": report.stats["core"],
        }
        print("REPORT", orjson.dumps(out).decode(), flush=True)
    else:
        run_worker(work, context=True, isolate=isolate)
