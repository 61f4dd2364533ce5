"""The campaign the cluster tests run as ``campaign.py`` (tests/test_cluster.py), in a directory
on the shared filesystem: DD_TEST_ITEMS items of DD_TEST_SECONDS each (a sleep), the watchdog at
DD_TEST_WATCHDOG seconds, state in ./state; the master exits 0 when the campaign finished, 3 when
it stopped resumably, as examples/campaign.py does. Each rank appends its end to ranks.log
("<allocation> <rank> <host> <status>"), so a test sees which ranks ended and where."""

import logging
import os
import socket
import sys
import time

from mpi4py import MPI

from durable_dispatch import WatchdogConfig, WorkItem
from durable_dispatch.mpi import finish, run_master, run_worker

ITEMS = int(os.environ.get("DD_TEST_ITEMS", "240"))
SECONDS = float(os.environ.get("DD_TEST_SECONDS", "0.3"))
WATCHDOG = float(os.environ.get("DD_TEST_WATCHDOG", "10"))


def work(payload):
    time.sleep(SECONDS)
    return {"id": payload["id"], "host": socket.gethostname()}


def note(rank: int, status: object) -> None:
    with open("ranks.log", "a") as f:
        alloc = os.environ.get("SLURM_RESTART_COUNT", os.environ.get("DD_TEST_RUN", "0"))
        f.write(f"{alloc} {rank} {socket.gethostname()} {status}\n")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        items = [WorkItem(f"w{i}", {"id": f"w{i}"}) for i in range(ITEMS)]
        report = run_master(items, "state", watchdog=WatchdogConfig(WATCHDOG), drain_seconds=20)
        print("REPORT", report.finished, report.reason, flush=True)
        code = 0 if report.finished else 3
        note(0, code)
        finish(comm, code)
        sys.exit(code)
    else:
        run_worker(work)
        note(comm.Get_rank(), 0)
        finish(comm)
