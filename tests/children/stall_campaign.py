"""A campaign under mpiexec whose state directory may stall (test_sharedfs_campaigns.py).

    mpiexec -n 4 python -m tests.children.stall_campaign STATE OUT N TASK_SECONDS WATCHDOG

Rank 0 runs N items with a WATCHDOG-second watchdog, appends each delivered work ID to
OUT.commits (outside the state directory) and writes OUT (JSON: the report) at the end; the
other ranks run the work function (sleep TASK_SECONDS, note the time in OUT.runs, return the
payload).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    from mpi4py import MPI

    from durable_dispatch import WorkItem
    from durable_dispatch.core import WatchdogConfig
    from durable_dispatch.mpi import run_master, run_worker
    from durable_dispatch.mpi.master import finish

    state, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    task, watchdog = float(sys.argv[4]), float(sys.argv[5])
    comm = MPI.COMM_WORLD

    def fn(payload: object) -> object:
        time.sleep(task)
        with open(out + ".runs", "a") as f:  # when work ran (outside the state directory)
            f.write(f"{time.time()}\n")
        return payload

    if comm.Get_rank() != 0:
        run_worker(fn, comm=comm)
        finish(comm)
        return
    commits = open(out + ".commits", "a")

    def on_commit(work_id: str, result: object) -> None:
        commits.write(work_id + "\n")
        commits.flush()

    items = [WorkItem(f"w{i:04d}", i) for i in range(n)]
    report = run_master(
        items, state, on_commit, comm=comm, watchdog=WatchdogConfig(watchdog), linger=0
    )
    with open(out + ".tmp", "w") as f:
        json.dump(
            {"finished": report.finished, "stats": report.stats, "seconds": report.seconds}, f
        )
    os.replace(out + ".tmp", out)
    finish(comm)


if __name__ == "__main__":
    main()
