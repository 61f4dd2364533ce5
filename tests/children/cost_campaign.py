"""A campaign whose items burn CPU, take memory, crash, time out and print, run under mpiexec by
tests/test_mpi_costs.py: what each attempt cost, and each item's output.

Usage: mpiexec -n 2 python cost_campaign.py STATE_DIR MODE
MODE ``isolate`` runs the worker with ``isolate=True``, ``inprocess`` without. One worker, so
the items run in order in one child (the small item after the big one shows that an item's peak
is its own, not the child's high-water mark). Rank 0 prints ``REPORT <json>``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

MIB = 1 << 20
#: work ID -> what it does, in order
PLAN = {
    "burn": "burn",  # 0.3 s of CPU (its own clock) and 96 MiB touched
    "small": "small",  # next, in the same child: almost nothing
    "loud": "loud",  # 1 MiB to stdout, then a line to stderr
    "segv": "segv",  # 0.3 s of CPU, 160 MiB, then SIGSEGV
    "spin": "spin",  # 64 MiB, then spins past its own timeout (2 s)
    "twice": "twice",  # prints which attempt it is; the first raises
}


def _burn(seconds: float) -> None:
    t0 = time.process_time()  # CPU time, not wall time: the same on a loaded machine
    while time.process_time() - t0 < seconds:
        pass


def _touch(n: int) -> bytearray:
    b = bytearray(n)
    for i in range(0, n, 4096):
        b[i] = 1
    return b


def work(payload: dict[str, str]) -> object:
    """The work function (module level: the isolated child finds it by name)."""
    what = payload["do"]
    if what == "twice":
        mark = os.path.join(os.path.dirname(os.path.abspath(payload["state"])), "twice-ran")
        if not os.path.exists(mark):
            open(mark, "w").close()
            print("first attempt of twice")
            raise ValueError("twice fails once")
        print("second attempt of twice")
        return "twice"
    if what == "burn":
        _burn(0.3)
        return len(_touch(96 * MIB))
    if what == "loud":
        sys.stdout.write("head-of-loud\n")
        for i in range(1024):
            sys.stdout.write(f"{i:07d}" + "o" * 1016 + "\n")  # 1024 bytes a line: 1 MiB
        sys.stdout.write("tail-of-loud\n")
        sys.stderr.write("loud's error line\n")
        return "printed"
    if what == "segv":
        kept = _touch(160 * MIB)
        _burn(0.3)
        sys.stderr.write("segv is about to crash\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
        return len(kept)
    if what == "spin":
        kept = _touch(64 * MIB)
        print("spin starts spinning", flush=True)
        while kept:
            pass
    return "small"


if __name__ == "__main__":
    import orjson
    from mpi4py import MPI

    from durable_dispatch import RetryPolicy, WatchdogConfig, WorkItem
    from durable_dispatch.mpi import run_master, run_worker

    state_dir, mode = sys.argv[1], sys.argv[2]
    if MPI.COMM_WORLD.Get_rank() == 0:
        items = [
            WorkItem(wid, {"do": do, "state": state_dir}, timeout=2.0 if do == "spin" else None)
            for wid, do in PLAN.items()
        ]
        if mode != "isolate":  # a crash or a hang without isolation is not a scenario
            items = [w for w in items if w.work_id not in ("segv", "spin")]
        report = run_master(
            items,
            state_dir,
            watchdog=WatchdogConfig.build(60.0),
            retry=RetryPolicy(0, per_kind={"error": 1}),
            stop_timeout=5,
        )
        out = {"finished": report.finished, "reason": report.reason}
        print("REPORT", orjson.dumps(out).decode(), flush=True)
    else:
        run_worker(work, isolate=mode == "isolate")
