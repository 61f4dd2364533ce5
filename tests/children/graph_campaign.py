"""A campaign that grows (issue 31): exploring a generated graph, run under mpiexec by
tests/test_mpi_growth.py, which SIGKILLs the whole job at random moments.

Usage: mpiexec -n 4 python graph_campaign.py STATE_DIR SINK KILL
Each node's work returns its children (1 to 3 of them, shared between parents, from a digest of
the node's number); ``on_commit`` appends ``node`` to SINK and returns the children as work
items. KILL is ``none``, ``after:<seconds>`` (a timer SIGKILLs rank 0) or ``callback:<k>`` (rank
0 SIGKILLs itself inside the k-th callback of this run). Rank 0 prints ``REPORT <finished>``.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import threading
import time

NODES = 4000


def children(node: int) -> list[int]:
    """1 to 3 children of ``node`` among NODES, from a digest of its number (deterministic)."""
    d = hashlib.sha256(str(node).encode()).digest()
    return sorted(
        {int.from_bytes(d[2 * k : 2 * k + 2], "big") % NODES for k in range(1 + d[7] % 3)}
    )


def closure(root: int = 0) -> set[int]:
    seen, todo = set(), [root]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += children(n)
    return seen


def work(payload: dict[str, int]) -> list[int]:
    time.sleep(0.004)  # a few seconds for the whole closure: the kills land inside a run
    return children(payload["node"])


if __name__ == "__main__":
    from mpi4py import MPI

    from durable_dispatch import WatchdogConfig, WorkItem
    from durable_dispatch.mpi import run_master, run_worker

    state, sink_path, kill = sys.argv[1], sys.argv[2], sys.argv[3]
    if MPI.COMM_WORLD.Get_rank() == 0:
        how, _, arg = kill.partition(":")
        if how == "after":
            threading.Timer(float(arg), lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        calls = [0]
        sink = open(sink_path, "a")

        def on_commit(work_id: str, result: list[int]) -> list[WorkItem]:
            calls[0] += 1
            if how == "callback" and calls[0] == int(arg):
                os.kill(os.getpid(), signal.SIGKILL)
            sink.write(f"{work_id}\n")
            sink.flush()
            return [WorkItem(f"n{c}", {"node": c}) for c in result]  # deterministic IDs

        report = run_master(
            [WorkItem("n0", {"node": 0})],
            state,
            on_commit,
            watchdog=WatchdogConfig.build(30),
            batch=8,
        )
        print("REPORT", report.finished, flush=True)
    else:
        run_worker(work)
