import sys
import time

from mpi4py import MPI

from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master, run_worker


def work(payload):
    time.sleep(0.5)  # pretend this is a simulation
    return {"answer": payload["x"] * 2}


if __name__ == "__main__":
    if MPI.COMM_WORLD.Get_rank() == 0:
        items = [WorkItem(f"w{i}", {"x": i}) for i in range(40)]
        report = run_master(items, "state", on_commit=lambda wid, result: print(wid, result))
        print("finished" if report.finished else f"stopped: {report.reason}")
        sys.exit(0 if report.finished else 3)
    else:
        run_worker(work, isolate=True)
