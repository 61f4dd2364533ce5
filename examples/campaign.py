"""The README's campaign, master and workers: ``mpiexec -n 4 python examples/campaign.py``."""

import sys

from mpi4py import MPI

from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master, run_worker


def work(payload, ctx):  # at module level: an isolated child finds it by name
    return {"answer": payload["x"] * 2}


if __name__ == "__main__":  # with isolate=True the child imports this file again
    if MPI.COMM_WORLD.Get_rank() == 0:
        items = [WorkItem(f"w{i}", {"x": i}) for i in range(20)]  # stable work IDs
        report = run_master(items, "state", on_commit=lambda wid, result: print(wid, result))
        sys.exit(0 if report.finished else 3)  # 3: resumable, requeue the job
    else:
        run_worker(work, context=True, isolate=True)
