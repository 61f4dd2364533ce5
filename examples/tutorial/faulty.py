import ctypes
import logging
import sys
import time

from mpi4py import MPI

from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master, run_worker


def work(payload, ctx):
    x = payload["x"]
    if x == 7:
        time.sleep(3600)  # a hang: its child is killed at the item's timeout
    if x == 13 and ctx.attempt == 0:
        ctypes.string_at(0)  # a segfault, on the first attempt only
    return {"answer": x * 2}


if __name__ == "__main__":
    if MPI.COMM_WORLD.Get_rank() == 0:
        logging.basicConfig(format="%(levelname)s %(message)s")  # the library's warnings
        items = [WorkItem(f"w{i}", {"x": i}, timeout=5) for i in range(20)]
        state = "state-faulty"  # a campaign of its own: its own state directory
        report = run_master(items, state, on_commit=lambda wid, result: print(wid, result))
        print("finished" if report.finished else f"stopped: {report.reason}")
        sys.exit(0 if report.finished else 3)
    else:
        run_worker(work, context=True, isolate=True)
