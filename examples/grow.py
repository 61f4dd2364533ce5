"""A campaign that grows: each result names more work (a crawler, a fuzzer's queue, a search).

Run with ``python examples/grow.py [STATE_DIR]`` (in-process workers); under MPI, pass the same
``on_commit`` to ``run_master`` on rank 0 and run ``run_worker(links)`` on the others.
"""

import sys
import tempfile

from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers

SITE = {"/": ["/a", "/b"], "/a": ["/b", "/c"], "/b": ["/"], "/c": []}  # a tiny web site


def links(payload):  # the work: fetch a page, return the links it has
    return SITE[payload["path"]]


def on_commit(work_id, links_found):  # at least once per commit: return the children
    print(work_id, "->", links_found)
    return [WorkItem(f"page:{p}", {"path": p}) for p in links_found]  # deterministic IDs


if __name__ == "__main__":
    state = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dd-grow-")
    start = [WorkItem("page:/", {"path": "/"})]
    report = run_master(start, state, on_commit, comm=LocalWorkers(links, 2))
    print("finished:", report.finished, "pages:", report.stats["core"]["commits"])
