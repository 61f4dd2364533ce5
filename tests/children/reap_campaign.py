"""A campaign whose items start programs, for the tests of what outlives a killed rank
(tests/test_mpi_reap.py).

Usage: mpiexec -n 3 python reap_campaign.py STATE_DIR MODE ISOLATE

Every rank writes ``rank <rank> <pid>`` to ``STATE_DIR.pids`` at its start; every item starts
``sh -c "sleep S; true"`` (two processes: the shell and its sleep), writes ``item <rank>``
there, and waits for it. MODE ``master``: every item sleeps 300 s (the test SIGKILLs the master
once both workers run one). MODE ``worker``: rank 1's items sleep 300 s, rank 2's 0.05 s (the
test SIGKILLs rank 1 under ULFM, and rank 2 finishes the campaign). ISOLATE ``1`` runs the
items in isolated children.
"""

from __future__ import annotations

import os
import subprocess
import sys


def work(payload: dict[str, object]) -> object:
    """Start a shell that sleeps, and wait for it (module level: a child finds it by name)."""
    rank = int(os.environ["REAP_RANK"])
    seconds = "300" if payload["mode"] == "master" or rank == 1 else "0.05"
    p = subprocess.Popen(["sh", "-c", f"sleep {seconds}; true"])
    with open(str(payload["pids"]), "a") as f:
        f.write(f"item {rank} {p.pid}\n")
    p.wait()
    return {"x": payload["x"]}


if __name__ == "__main__":
    import logging

    from mpi4py import MPI

    from durable_dispatch import WorkItem
    from durable_dispatch.mpi import finish, run_master, run_worker

    logging.basicConfig(level=logging.WARNING)
    state, mode, isolate = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    pids = state + ".pids"
    rank = MPI.COMM_WORLD.Get_rank()
    os.environ["REAP_RANK"] = str(rank)
    with open(pids, "a") as f:
        f.write(f"rank {rank} {os.getpid()}\n")
    if rank == 0:
        items = [WorkItem(f"w{i}", {"x": i, "mode": mode, "pids": pids}) for i in range(8)]
        report = run_master(items, state, stop_timeout=5)
        print("REPORT", report.finished, flush=True)
        finish(code=0 if report.finished else 3)
    else:
        run_worker(work, isolate=isolate)
        finish()
