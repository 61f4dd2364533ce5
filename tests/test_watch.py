"""``watch``: the figures ``durable-dispatch stats`` and ``watch`` print, computed from a view
of a state directory (here a stand-in with the view's members; the commands themselves are
tested on real directories in ``test_cli.py``)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from durable_dispatch.watch import stats_of, watch_frame


def _view(master: bool, committed: int, pending: int, **live: Any) -> Any:
    summary = {"committed": committed, "pending": pending, "in_flight": 1, "deferred": 2}
    return SimpleNamespace(
        summary=lambda: {**summary, "epoch": 3},
        live=live,
        master_running=master,
        projection=SimpleNamespace(kinds={"a": ["timeout", "crash"], "b": ["timeout"]}),
        snapshot_ts=None,
        stats={"x": 1},
    )


def test_a_frame_has_the_rate_since_the_previous_frame_and_the_eta_of_what_is_left() -> None:
    now = time.time()
    v = _view(True, 100, 9, ts=now - 1.0, stats={"core": {"parked_ranks_now": 1}})
    f = watch_frame(v, (now - 10.0, 50))
    assert 4.0 < f["rate_per_s"] <= 5.0  # 50 commits in about 10 s
    assert f["eta_seconds"] == round(10 / f["rate_per_s"])  # 9 pending + 1 in flight
    assert f["failures_by_kind"] == {"crash": 1, "timeout": 2}
    assert f["parked_ranks"] == 1 and f["epoch"] == 3
    assert not f["ended"] and not f["finished"]
    assert 0.9 <= f["heartbeat_age_seconds"] < 60


def test_without_a_previous_frame_the_rate_is_since_the_master_started() -> None:
    now = time.time()
    v = _view(True, 10, 0, ts=now, started=now - 4.0, stats={"core": {"commits": 20}})
    assert watch_frame(v)["rate_per_s"] == 5.0


def test_a_campaign_whose_master_ended_with_nothing_left_is_finished() -> None:
    f = watch_frame(_view(False, 10, 0))
    assert f["ended"] and f["rate_per_s"] is None and f["eta_seconds"] is None
    assert not f["finished"]  # one still in flight
    v = _view(False, 10, 0)
    v.summary = lambda: {"committed": 10, "pending": 0, "in_flight": 0, "deferred": 0, "epoch": 1}
    assert watch_frame(v)["finished"]


def test_stats_are_live_only_while_the_master_runs() -> None:
    now = time.time()
    s = stats_of(_view(False, 1, 0, ts=now, running=True, host="h", pid=7))
    assert s["live"]["running"] is False  # its last figures say running, but no master is
    assert s["live"]["host"] == "h" and s["master_stats"] == {"x": 1}
    assert s["master_stats_age_seconds"] is None
