"""One campaign under ``mpiexec`` (``experiments.py --role campaign``): rank 0 runs the master,
every other rank an isolated worker running :func:`task`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


# ------------------------------------------------------------------ under mpiexec
def task(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """An experiment's task (module level: an isolated child finds it by name)."""
    if ctx.attempt in payload["hang"]:
        while True:
            time.sleep(3600)
    time.sleep(float(payload["seconds"]))
    return {"slept": payload["seconds"]}


def role_campaign(config_path: str) -> None:
    """One campaign: rank 0 runs the master, every other rank a worker."""
    from mpi4py import MPI

    from durable_dispatch import RetryPolicy, WatchdogConfig, WorkItem
    from durable_dispatch.mpi import finish, run_master, run_worker

    cfg = json.loads(Path(config_path).read_text())
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if rank != 0:
        Path(cfg["pids"], f"{rank}.pid").write_text(str(os.getpid()))
        run_worker(task, context=True, isolate=cfg["isolate"])
        finish(comm)
        return
    started: list[bool] = []

    def progress(stats: dict[str, Any]) -> None:
        if not started:
            started.append(True)
            Path(cfg["pids"], "started").write_text(repr(time.time()))

    items = [WorkItem(p["work_id"], p) for p in cfg["items"]]
    report = run_master(
        items,
        cfg["state"],
        comm=comm,
        watchdog=WatchdogConfig(**wd)
        if isinstance(wd := cfg["watchdog"], dict)
        else WatchdogConfig(wd),
        retry=RetryPolicy(cfg["retries"]),
        max_seconds=cfg["budget"],
        progress=progress,
        progress_interval=0.05,
        linger=1.0,
        stop_timeout=5.0,
    )
    out = {
        "finished": report.finished,
        "reason": report.reason,
        "seconds": report.seconds,
        "end": time.time(),
        "mode": report.mode,
        "lost_ranks": {str(k): v for k, v in report.lost_ranks.items()},
        "parked": report.stats["core"]["parked_ranks_now"],
    }
    Path(cfg["out"]).write_text(json.dumps(out))
    finish(comm)
