"""A user's fault-injection tests under pyfakefs, as the README shows them (run by CI on its own).

Run with ``python -m pytest examples/test_pyfakefs_faults.py``. The ``fs`` fixture comes from
pyfakefs, ``inject_faults`` from durable-dispatch's pytest plugin (installed with the package).

Fixture order does not matter: the plugin closes every journal or campaign state a test left open
*before* pyfakefs tears its fake filesystem down, and reports each with a
``StorageLeftOpenWarning``. The last test here leaves journals open on purpose.
"""

from __future__ import annotations

import errno

import pytest

from durable_dispatch import CampaignState, Journal, WorkItem
from durable_dispatch.testing import FaultInjector, disk_full


def test_an_fsync_error_degrades_and_a_restore_heals(fs: object, inject_faults: FaultInjector):
    with Journal.open("/state/events.jsonl", sync="always") as j:
        inject_faults.fail("fsync", errno.EIO, path="*.jsonl", nth=1)  # only the next fsync
        r = j.append({"event": "x"})
        assert not r.durable and not j.health.ok  # never reported durable
        inject_faults.heal()
        assert j.try_restore()
    with Journal.open("/state/events.jsonl") as again:
        assert [rec.payload for rec in again.records()] == [{"event": "x"}]


def test_a_full_disk_keeps_the_campaign_in_memory(fs: object) -> None:
    with CampaignState.open("/state", sync="always", ranks=[1]) as state:
        disk_full(fs, free_bytes=0, path="/state")  # real ENOSPC from pyfakefs
        state.submit(WorkItem(f"w-{i}", {"seed": i}) for i in range(20))
        assert not state.journal.health.ok  # the submissions are held in memory, not durable
        fs.set_disk_usage(1 << 30, "/state")  # type: ignore[attr-defined]
        assert state.try_restore()  # written to a fresh file: durable now


@pytest.mark.filterwarnings("ignore::durable_dispatch.testing.StorageLeftOpenWarning")
@pytest.mark.parametrize("sync", ["always", "batch", "never"])
def test_a_journal_left_open_is_closed_for_you(fs: object, sync: str) -> None:
    j = Journal.open("/state/left-open.jsonl", sync=sync)
    j.append({"event": "forgot to close"})
