"""Priorities under mpiexec (G2, issue 31), run by tests/test_mpi_growth.py.

Usage: mpiexec -n 4 python priority_campaign.py STATE_DIR BATCH
A backlog of 120 low-priority items; the commit of ``low-010`` returns 6 urgent children of
priority 10, which must be dispatched before every low item still pending then. Rank 0 prints
``REPORT <finished>``.
"""

from __future__ import annotations

import sys
import time

URGENT = [f"urgent-{i}" for i in range(6)]


def work(payload: int) -> int:
    time.sleep(0.005)
    return payload


if __name__ == "__main__":
    from mpi4py import MPI

    from durable_dispatch import WorkItem
    from durable_dispatch.mpi import run_master, run_worker

    state, batch = sys.argv[1], sys.argv[2]
    if MPI.COMM_WORLD.Get_rank() == 0:

        def on_commit(work_id: str, result: int) -> list[WorkItem]:
            if work_id != "low-010":
                return []
            return [WorkItem(w, i, priority=10) for i, w in enumerate(URGENT)]

        report = run_master(
            (WorkItem(f"low-{i:03d}", i) for i in range(120)),
            state,
            on_commit,
            batch=batch if batch == "auto" else int(batch),
        )
        print("REPORT", report.finished, flush=True)
    else:
        run_worker(work)
