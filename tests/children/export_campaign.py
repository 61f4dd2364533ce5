"""A campaign of small sleeps run in-process (LocalWorkers), for tests/test_values.py to kill
with SIGKILL again and again; its callback appends a CSV row (not an upsert: after a SIGKILL it
may write a row twice, which the export never does).

Usage: python export_campaign.py STATE_DIR N
"""

from __future__ import annotations

import sys
import time
from typing import Any


def work(x: int) -> dict[str, Any]:
    time.sleep(0.01)
    return {"x": x, "square": x * x, "ratio": float("nan") if x % 7 == 0 else x / 8}


if __name__ == "__main__":
    from durable_dispatch import WorkItem
    from durable_dispatch.mpi import run_master
    from durable_dispatch.testing import LocalWorkers

    state_dir, n = sys.argv[1], int(sys.argv[2])

    def on_commit(work_id: str, result: Any) -> None:
        with open(state_dir + ".appended.csv", "a") as f:
            f.write(f"{work_id},{result['square']}\n")

    items = [WorkItem(f"w{i:04d}", i) for i in range(n)]
    report = run_master(items, state_dir, on_commit, comm=LocalWorkers(work, 2))
    print("FINISHED" if report.finished else "STOPPED", flush=True)
