"""The watchdog's two rules (docs/how-to/watchdog.md), on in-process workers.

python examples/watchdog.py
"""

import tempfile

from durable_dispatch import WatchdogConfig, WorkItem
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers

# The fixed rule: every dispatch gets 600 s after its send returned (default: 120 s).
fixed = WatchdogConfig(600)
# The adaptive rule: once 20 dispatches have succeeded, 3 times the measured 99th percentile of
# task time, never less than 1 s and never more than 120 s (also the deadline until then).
adaptive = WatchdogConfig(120, quantile=0.99)

items = [WorkItem(f"w{i}", {"x": i}) for i in range(50)]
items.append(WorkItem("slow-one", {"x": -1}, timeout=3600))  # its own deadline, either rule

if __name__ == "__main__":
    for name, watchdog in (("fixed", fixed), ("adaptive", adaptive)):
        report = run_master(
            items,
            tempfile.mkdtemp(prefix=f"dd-{name}-"),
            comm=LocalWorkers(lambda payload: payload["x"] * 2, 3),
            watchdog=watchdog,
        )
        print(name, report.finished, report.stats["core"]["watchdog_deadline_now"])
