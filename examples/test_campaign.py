"""A user's test of a campaign without mpiexec, as the README shows it.

Run with ``python -m pytest examples/test_campaign.py``.
"""

from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers


def work(payload):
    return {"y": payload["x"] * 2}


items = [WorkItem(f"w{i}", {"x": i}) for i in range(10)]


def test_my_campaign(tmp_path):
    got = {}
    report = run_master(items, tmp_path / "state", got.__setitem__, comm=LocalWorkers(work))
    assert report.finished and len(got) == len(items)
