"""A campaign of numpy values, non-finite floats and a raising function, run under mpiexec by
tests/test_values.py.

Usage: mpiexec -n 3 python values_campaign.py STATE_DIR MODE
MODE ``isolate`` runs the workers with ``isolate=True``, ``plain`` in the worker's process.
Rank 0 prints ``REPORT <json>``: how many dispatches the master made.
"""

from __future__ import annotations

import sys


def work(payload: dict[str, object], ctx: object) -> object:
    """The work function (module level: the isolated child finds it by name)."""
    import numpy as np

    what = payload["do"]
    if what == "np-scalars":
        return {
            "f": np.float64(0.1),
            "i": np.int64(-7),
            "b": np.bool_(True),
            "n": np.float64("nan"),
        }
    if what == "non-finite":  # the payload's own non-finite floats, sent back
        return {"echo": payload["x"], "inf": float("inf")}
    if what == "np-array":
        return {"a": np.arange(3.0)}
    if what == "raise":
        return _diverge(payload)
    return None


def _diverge(payload: dict[str, object]) -> object:
    raise ValueError("diverged")


if __name__ == "__main__":
    import orjson
    from mpi4py import MPI

    from durable_dispatch import RetryPolicy, WorkItem
    from durable_dispatch.mpi import run_master, run_worker

    state_dir, mode = sys.argv[1], sys.argv[2]
    if MPI.COMM_WORLD.Get_rank() == 0:
        items = [
            WorkItem("np-scalars", {"do": "np-scalars"}),
            WorkItem("non-finite", {"do": "non-finite", "x": [float("nan"), float("-inf")]}),
            WorkItem("np-array", {"do": "np-array"}),
            WorkItem("raise", {"do": "raise"}),
        ]
        report = run_master(items, state_dir, retry=RetryPolicy(1), stop_timeout=5)
        out = {"finished": report.finished, "dispatches": report.stats["core"]["dispatches"]}
        print("REPORT", orjson.dumps(out).decode(), flush=True)
    else:
        run_worker(work, context=True, isolate=(mode == "isolate"))
