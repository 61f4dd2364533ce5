"""A campaign an operator steers while it runs (issue 52), run under mpiexec by
tests/test_control.py: slow items (each writes its child's pid, then sleeps) and quick ones.

Usage: mpiexec -n 4 python steer_campaign.py STATE_DIR MARKS N_QUICK
Items ``s0..s2`` sleep 120 s (1 s once the file MARKS/fast exists), ``p0..p<N_QUICK-1>`` 0.05 s.
Rank 0 prints ``REPORT <json>`` and exits 3 (resumable) unless the campaign finished.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def work(payload: dict[str, Any]) -> dict[str, Any]:
    marks = payload["marks"]
    if payload["slow"]:
        with open(os.path.join(marks, f"pid-{payload['name']}"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(1.0 if os.path.exists(os.path.join(marks, "fast")) else 120.0)
    else:
        time.sleep(0.05)
    return {"done": payload["name"]}


if __name__ == "__main__":
    import orjson
    from mpi4py import MPI

    from durable_dispatch import WatchdogConfig, WorkItem
    from durable_dispatch.mpi import run_master, run_worker

    state, marks, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if MPI.COMM_WORLD.Get_rank() == 0:
        items = [
            WorkItem(f"s{i}", {"name": f"s{i}", "slow": True, "marks": marks}) for i in range(3)
        ] + [WorkItem(f"p{i}", {"name": f"p{i}", "slow": False, "marks": marks}) for i in range(n)]
        report = run_master(items, state, watchdog=WatchdogConfig.build(600), drain_seconds=3.0)
        out = {"finished": report.finished, "reason": report.reason, "core": report.stats["core"]}
        out["view"] = report.view.as_dict() if report.view is not None else None
        print("REPORT", orjson.dumps(out).decode(), flush=True)
        sys.exit(0 if report.finished else 3)
    else:
        run_worker(work, isolate=True)
