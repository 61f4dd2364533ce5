"""Isolation, timeouts and retry budgets (docs/how-to/isolation-and-timeouts.md).

durable-dispatch run -n 4 python timeouts.py
"""

import sys
import time

from mpi4py import MPI

from durable_dispatch import RetryPolicy, WorkItem
from durable_dispatch.mpi import run_master, run_worker


def work(payload, ctx):  # ctx: the work ID, the attempt, the deadline, beat()
    for _ in range(payload["steps"]):
        time.sleep(0.1)  # one step of a long computation
        ctx.beat()  # a heartbeat: "still working", seen by the master
    return {"steps": payload["steps"], "attempt": ctx.attempt}


if __name__ == "__main__":
    if MPI.COMM_WORLD.Get_rank() == 0:
        items = [WorkItem(f"w{i}", {"steps": 3}, timeout=30) for i in range(9)]  # 30 s each
        items.append(WorkItem("big", {"steps": 10}, timeout=120))  # a known slow one
        retry = RetryPolicy(retries=2, per_kind={"crash": 0})  # a crash is not retried
        report = run_master(items, "state-timeouts", retry=retry)
        print("finished" if report.finished else f"stopped: {report.reason}")
        sys.exit(0 if report.finished else 3)
    else:
        # isolate: each item in a child process, killed with its process tree at its deadline;
        # memory_limit: that child's address space, 2 GiB here
        run_worker(work, context=True, isolate=True, memory_limit=2 << 30)
