"""Priorities: higher first, first in first out within one (docs/how-to/priorities.md)."""

import sys
import tempfile

from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers


def work(payload):
    return payload["name"]


if __name__ == "__main__":
    state = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dd-priorities-")
    items = [
        WorkItem("routine-1", {"name": "routine-1"}),  # priority 0, the default
        WorkItem("routine-2", {"name": "routine-2"}),
        WorkItem("urgent", {"name": "urgent"}, priority=10),
        WorkItem("soon", {"name": "soon"}, priority=5),
    ]
    order = []
    run_master(
        items, state, lambda work_id, result: order.append(work_id), comm=LocalWorkers(work, 1)
    )  # one worker: the commit order is the dispatch order
    print(order)
