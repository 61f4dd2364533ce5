"""A campaign with batch="auto" under mpiexec (issue 17): 40 slow items (80 ms), then trivial
ones, so that the slow ones go alone and the trivial ones many per dispatch.

Usage: mpiexec -n 16 python auto_batch_campaign.py STATE_DIR N
"""

from __future__ import annotations

import json
import sys
import time


def work(payload: dict[str, int]) -> dict[str, int]:
    if payload["slow"]:
        time.sleep(0.08)  # longer than a dispatch's 50 ms target: alone
    return {"y": payload["x"] * 2}


if __name__ == "__main__":
    from mpi4py import MPI

    from durable_dispatch import WatchdogConfig, WorkItem
    from durable_dispatch.mpi import run_master, run_worker

    state, n = sys.argv[1], int(sys.argv[2])
    if MPI.COMM_WORLD.Get_rank() == 0:
        got: dict[str, int] = {}

        def on_commit(work_id: str, result: dict[str, int]) -> None:
            got[work_id] = result["y"]

        # the first 40 items are slow, the n after them trivial
        items = [WorkItem(f"w{i:05d}", {"x": i, "slow": int(i < 40)}) for i in range(n + 40)]
        report = run_master(items, state, on_commit, watchdog=WatchdogConfig(60), batch="auto")
        core = report.stats["core"]
        ok = got == {f"w{i:05d}": 2 * i for i in range(n + 40)}
        print("REPORT", json.dumps({"finished": report.finished, "right": ok, **core}), flush=True)
    else:
        run_worker(work)
