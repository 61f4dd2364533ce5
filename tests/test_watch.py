"""The view (``durable_dispatch.views.view``) and what ``stats`` and ``watch`` print of it, computed
from a stand-in ledger and published statistics (the commands themselves are tested on real
directories in ``test_cli.py`` and ``test_view.py``)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from durable_dispatch.views.view import campaign_view
from durable_dispatch.views.watch import duration, stats_of, stats_text, watch_frame, watch_text


def _ledger(committed: int, pending: int, in_flight: int = 1, deferred: int = 2) -> Any:
    return SimpleNamespace(
        committed=range(committed),
        frontier=range(pending),
        in_flight=range(in_flight),
        deferred=range(deferred),
        kinds={"a": ["timeout", "crash"], "b": ["timeout"], "c": []},
        epoch=3,
        duplicate_commits=0,
    )


def test_a_running_campaign_has_its_rate_since_the_master_started_and_the_eta_of_what_is_left() -> (
    None
):
    now = time.time()
    live = {
        "ts": now - 1.0,
        "started": now - 11.0,
        "running": True,
        "host": "h",
        "pid": 7,
        "stats": {
            "core": {"commits": 50, "parked_ranks_now": 1},
            "journal_health": {"state": "OK"},
        },
    }
    v = campaign_view(_ledger(100, 9), live, running=True, now=now)
    assert v.rate_per_s == 5.0 and v.eta_seconds == 2.0  # 9 pending + 1 in flight at 5/s
    assert v.failures_by_kind == {"crash": 1, "timeout": 2} and v.failed_items == 2
    assert v.parked_ranks == 1 and v.epoch == 3 and v.state == "running" and not v.finished
    assert v.work_items == 112 and v.storage == "OK" and v.master_age_seconds == 11.0
    as_stats = stats_of(v, {"core": {}})
    assert as_stats.pop("master_statistics") == {"core": {}}
    assert watch_frame(v) == as_stats  # one view: the same names and numbers
    text = "\n".join(watch_text(v))
    assert "5.0 items/s" in text and "ETA 2s" in text and "timeout 2" in text


def test_a_master_that_is_not_running_has_nothing_in_flight() -> None:
    now = time.time()
    live = {"ts": now - 60, "started": now - 100, "running": True, "host": "h", "pid": 7}
    v = campaign_view(_ledger(10, 4, in_flight=3), live, running=False, now=now)
    assert v.in_flight == 0 and v.pending == 7 and v.interrupted == 3 and v.state == "stopped"
    assert v.master_ended == "killed"  # its last statistics say running, but no master is
    assert v.rate_per_s is None and v.parked_ranks is None
    lines = stats_text(v, {}, verbose=False)
    assert len(lines) <= 10
    assert any("ended without closing" in x for x in lines)
    done = campaign_view(_ledger(10, 0, in_flight=0), {}, running=False, now=now)
    assert done.finished and done.state == "finished" and done.master_ended is None


def test_storage_names_the_journals_that_hold_records_in_memory() -> None:
    stats = {
        "journal_health": {"state": "DEGRADED", "pending": 66},
        "defer_health": {"state": "DEGRADED", "pending": 1},
        "snapshot_health": {"state": "OK"},
    }
    v = campaign_view(_ledger(1, 0), {"ts": time.time(), "stats": stats}, running=True, now=0.0)
    assert v.storage == "DEGRADED: journal (66 records in memory), defer (1 records in memory)"


def test_durations_read_well() -> None:
    assert [duration(s) for s in (None, 5, 75, 3 * 3600 + 300, 2 * 86400 + 4 * 3600)] == [
        "-",
        "5s",
        "1m 15s",
        "3h 05m",
        "2d 04h",
    ]


def test_the_allocation_end_and_time_left_stand_beside_the_eta_and_say_when_it_is_past() -> None:
    """The master publishes its allocation's end: stats, watch and report show the time left
    beside the ETA, and how many more allocations the ETA needs when it is past the end."""
    from durable_dispatch.views.report import _summary

    now = time.time()
    live = {
        "ts": now - 1.0,
        "started": now - 11.0,
        "running": True,
        "stats": {"core": {"commits": 10}},  # 1 item/s; 109 left: ETA 109 s
        "allocation": {"ends_at": now + 30.0, "started": now - 20.0, "source": "squeue"},
    }
    v = campaign_view(_ledger(100, 108), live, running=True, now=now)
    assert v.eta_seconds == 109.0 and v.allocation_left_seconds == 30.0
    assert v.allocation_ends_at == now + 30.0
    assert v.allocations_needed == 2  # 79 s beyond this allocation, 50 s each
    for text in (
        "\n".join(watch_text(v)),
        "\n".join(stats_text(v, {}, False)),
        _summary(v.as_dict(), {"gaps": [], "start": None, "end": None}),
    ):
        assert "the allocation ends in 30s" in text, text
        assert "needs about 2 more allocations" in text, text
    assert watch_frame(v)["allocations_needed"] == 2
    fits = campaign_view(_ledger(100, 8), live, running=True, now=now)  # ETA 9 s
    assert fits.allocations_needed == 0 and "more allocation" not in "\n".join(watch_text(fits))
    gone = campaign_view(_ledger(100, 8), live, running=False, now=now)
    assert gone.allocation_ends_at is None and gone.allocations_needed is None
