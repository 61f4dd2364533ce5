"""A campaign of misbehaving work functions, run under mpiexec by tests/test_mpi_isolation.py.

Usage: mpiexec -n 4 python isolated_campaign.py STATE_DIR MODE
MODE ``isolate`` runs the workers with ``isolate=True`` (the issue-14 campaign: every item ends
committed or deferred, no rank is lost or parked); ``segfault`` and ``hang`` run one kind of bad
item without isolation, to document what that costs. Rank 0 prints ``REPORT <json>``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

#: work ID -> what its function does (``-once``: only on the first attempt).
PLAN = {
    "ok-0": "ok",
    "ok-1": "ok",
    "ok-2": "ok",
    "ok-3": "ok",
    "hang": "hang",
    "hang-once": "hang-once",
    "segfault": "segfault",
    "segfault-once": "segfault-once",
    "abort": "abort",
    "memory": "memory",
    "raise": "raise",
    "children": "children",
    "output-64mb": "output-64mb",
    "too-large": "too-large",
    "launcher-env": "launcher-env",
}
#: what Open MPI's and Hydra's (MPICH, Intel MPI) mpiexec give a rank: never the child (issue 33)
LAUNCHER_VARS = ("OMPI_", "PMIX_", "PRTE_", "PMI_", "HYDI_", "HYDRA_", "MPI_LOCAL")
MEMORY_LIMIT = 1 << 30  # RLIMIT_AS of the isolated child


def work(payload: dict[str, str], ctx: object) -> object:
    """The work function (module level: the isolated child finds it by name)."""
    what: str = payload["do"]
    first = getattr(ctx, "attempt", 0) == 0
    if what.endswith("-once"):
        what = what.removesuffix("-once") if first else "ok"
    if what == "hang":
        while True:
            time.sleep(3600)
    if what == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if what == "abort":
        os.abort()
    if what == "memory":
        return len(bytearray(2 * MEMORY_LIMIT))  # over RLIMIT_AS: MemoryError
    if what == "raise":
        raise ValueError("bad input for this item")
    if what == "children":
        # One child stays in the item's process group; one leaves it (setsid -f forks a new
        # session and its parent exits, so it is re-parented to the worker, the subreaper).
        subprocess.Popen(["sleep", "301.5"])
        subprocess.Popen(["setsid", "-f", "sleep", "302.5"])
        return "left children behind"
    if what == "output-64mb":
        from durable_dispatch import run_command

        code = "import sys; sys.stdout.write('x' * (64 << 20))"
        out = run_command([sys.executable, "-c", code], timeout=60, max_output=1024)
        return {"bytes": out.stdout_bytes, "kept": len(out.stdout), "sha": out.stdout_sha256}
    if what == "launcher-env":
        return sorted(k for k in os.environ if k.startswith(LAUNCHER_VARS))
    if what == "too-large":
        return "y" * (2 << 20)  # over one journal record
    return {"pid": os.getpid()}


if __name__ == "__main__":
    import orjson
    from mpi4py import MPI

    from durable_dispatch import RetryPolicy, WatchdogConfig, WorkItem
    from durable_dispatch.mpi import run_master, run_worker

    state_dir, mode = sys.argv[1], sys.argv[2]
    if MPI.COMM_WORLD.Get_rank() == 0:
        if mode == "isolate":
            plan = PLAN
        else:
            plan = {k: v for k, v in PLAN.items() if v in ("ok", mode)}
        report = run_master(
            [WorkItem(wid, {"do": do}) for wid, do in plan.items()],
            state_dir,
            watchdog=WatchdogConfig.build(2.0),
            retry=RetryPolicy(1),
            stop_timeout=5,
            stuck_grace=3.0,
        )
        out = {
            "finished": report.finished,
            "reason": report.reason,
            "seconds": report.seconds,
            "core": report.stats["core"],
        }
        print("REPORT", orjson.dumps(out).decode(), flush=True)
    else:
        if mode == "isolate":
            run_worker(work, context=True, isolate=True, memory_limit=MEMORY_LIMIT)
        else:
            run_worker(work, context=True)
