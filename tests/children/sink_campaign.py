"""A user campaign whose on_commit appends each result to a file, run under mpiexec by
tests/test_mpi_master.py to SIGKILL its master (issue 16).

Usage: mpiexec -n 4 python sink_campaign.py STATE_DIR SINK N KILL
KILL is ``none``, ``after:<seconds>`` (a timer SIGKILLs rank 0) or ``callback:<k>`` (rank 0
SIGKILLs itself inside the k-th callback of this run, before it wrote the result).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time


def work(payload: dict[str, int]) -> dict[str, int]:
    time.sleep(0.03)
    return {"y": payload["x"] * 2}


if __name__ == "__main__":
    from mpi4py import MPI

    from durable_dispatch import WatchdogConfig, WorkItem
    from durable_dispatch.mpi import run_master, run_worker

    state, sink_path, n, kill = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if MPI.COMM_WORLD.Get_rank() == 0:
        how, _, arg = kill.partition(":")
        if how == "after":
            threading.Timer(float(arg), lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        calls = [0]
        sink = open(sink_path, "a")

        def on_commit(work_id: str, result: dict[str, int]) -> None:
            calls[0] += 1
            if how == "callback" and calls[0] == int(arg):
                os.kill(os.getpid(), signal.SIGKILL)
            sink.write(f"{work_id} {result['y']}\n")
            sink.flush()

        items = [WorkItem(f"w{i:03d}", {"x": i}) for i in range(n)]
        report = run_master(items, state, on_commit, watchdog=WatchdogConfig.build(30))
        print("REPORT", report.finished, flush=True)
    else:
        run_worker(work)
