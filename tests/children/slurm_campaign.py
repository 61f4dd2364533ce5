"""The campaign the Slurm tests run as ``campaign.py`` (tests/test_slurm.py): ITEMS items of
0.5-1 s (a sleep, the same for a work ID on every run), state in ./state; exits 0 when finished,
3 when it stopped resumably, as examples/campaign.py does. Each rank appends its exit to
ranks.log ("<allocation> <rank> <status>") so a test sees what every rank ended with."""

import logging
import os
import sys
import time
import zlib

from mpi4py import MPI

from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master, run_worker

ITEMS = int(os.environ.get("DD_TEST_ITEMS", "150"))


def work(payload, ctx):
    time.sleep(0.5 + (zlib.crc32(payload["id"].encode()) % 500) / 1000)
    return {"id": payload["id"]}


def note(rank: int, status: object) -> None:
    with open("ranks.log", "a") as f:
        f.write(f"{os.environ.get('SLURM_RESTART_COUNT', '0')} {rank} {status}\n")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    rank = MPI.COMM_WORLD.Get_rank()
    if rank == 0:
        items = [WorkItem(f"w{i}", {"id": f"w{i}"}) for i in range(ITEMS)]
        commits = open("commits.log", "a")  # when each commit came (the allocation tests)
        report = run_master(
            items,
            "state",
            lambda wid, _r: print(f"{time.time():.3f} {wid}", file=commits, flush=True),
            drain_seconds=20,
        )
        print("REPORT", report.finished, report.reason, f"{time.time():.3f}", flush=True)
        code = 0 if report.finished else 3
        note(rank, code)
        sys.exit(code)
    else:
        run_worker(work, context=True, isolate=True)
        note(rank, 0)
