"""A stall is not a failure (issue 49): fsync stalls are reported, and the live statistics are
written off the master's thread."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import CampaignState
from durable_dispatch.storage import SnapshotStore, fs
from durable_dispatch.storage.background import BackgroundSaver


@pytest.fixture(autouse=True)
def own_stalls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stalls these tests make (under a lowered bound) are the process's: kept apart, so
    that a later test in the same process does not read them (a shuffled run once showed
    "1 fsync(s) slower than the 5s stall bound, the slowest 0.1s" in another test's stats)."""
    monkeypatch.setattr(fs, "_stalls", fs._Stalls())


def test_a_stall_is_reported_while_it_lasts_and_once_it_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fs, "STALL_SECONDS", 0.05)
    release = threading.Event()
    real = os.fsync

    def stalled_fsync(fd: int) -> None:
        release.wait(30)
        real(fd)

    monkeypatch.setattr(os, "fsync", stalled_fsync)
    before = fs.stall_report()["count"]
    fd = fs.open_append(str(tmp_path / "f"))
    t = threading.Thread(target=fs.fsync, args=(fd,))
    caplog.set_level(logging.WARNING, "durable_dispatch.storage")
    t.start()
    try:
        end = time.monotonic() + 30
        while fs.stall_report()["ongoing_seconds"] <= 0.05:  # type: ignore[operator]
            assert time.monotonic() < end
            time.sleep(0.01)
        r = fs.stall_report()
        assert r["ongoing_path"] == str(tmp_path / "f")
        fs.stall_report()  # logged once per stall, not at every look
        assert sum("has been waiting" in m for m in caplog.messages) == 1
    finally:
        release.set()
        t.join()
        fs.close(fd)
    r = fs.stall_report()
    assert r["count"] == before + 1  # type: ignore[operator]
    assert r["last_path"] == str(tmp_path / "f") and r["ongoing_seconds"] == 0.0
    assert any("took" in m for m in caplog.messages)


def test_the_statistics_file_is_written_off_the_callers_thread(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, name="stats", keep=2)
    gate = threading.Event()
    saved: list[Any] = []
    real = store.save

    def slow_save(obj: Any) -> int:
        gate.wait(30)  # a disk that stalls
        saved.append(obj)
        return real(obj)

    store.save = slow_save  # type: ignore[method-assign]
    w = BackgroundSaver(store)
    assert w.submit({"n": 1})  # returns at once although the save is blocked
    end = time.monotonic() + 30
    while w.busy_seconds == 0.0:
        assert time.monotonic() < end
        time.sleep(0.01)
    for n in range(2, 10):
        assert w.submit({"n": n})  # replaces the one waiting: no queue builds up
    gate.set()
    w.close()
    assert saved == [{"n": 1}, {"n": 9}]
    assert not w.submit({"n": 10})
    loaded = store.load()
    assert loaded is not None and loaded.value == {"n": 9}


def test_a_campaign_reports_its_stalls_and_publishes_at_close(tmp_path: Path) -> None:
    s = CampaignState.open(tmp_path / "s")
    try:
        assert set(s.statistics().storage_stalls) >= {"count", "ongoing_seconds", "bound_seconds"}
        assert s.publish_statistics(force=False)
    finally:
        s.close()
    live = SnapshotStore(tmp_path / "s", name="master-stats", keep=2).load()
    assert live is not None and live.value["running"] is False
    assert "storage_stalls" in live.value["stats"]


def test_an_fsync_in_progress_under_the_bound_is_no_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stats`` said "1 fsync stall(s) over the bound, longest 0.0s" when the statistics were
    published while an ordinary fsync was running: only an fsync past the bound is a stall."""
    from durable_dispatch.views.view import _stalls

    release, started = threading.Event(), threading.Event()
    real = os.fsync

    def held_fsync(fd: int) -> None:
        started.set()
        release.wait(30)
        real(fd)

    monkeypatch.setattr(os, "fsync", held_fsync)
    fd = fs.open_append(str(tmp_path / "f"))
    t = threading.Thread(target=fs.fsync, args=(fd,))
    t.start()
    try:
        assert started.wait(30)
        while not fs.stall_report()["ongoing_seconds"]:
            time.sleep(0.001)  # (the clock moved: an fsync is in progress)
        report = fs.stall_report()
        assert 0 < report["ongoing_seconds"] < report["bound_seconds"]  # type: ignore[operator]
        seen = _stalls({"storage_stalls": report})
    finally:
        release.set()
        t.join()
        fs.close(fd)
    assert seen["storage_stalls"] == report["count"], (seen, report)  # (ended stalls only)
    past = _stalls({"storage_stalls": {**report, "count": 0, "ongoing_seconds": 7.5}})
    assert past == {"storage_stalls": 1, "longest_stall_seconds": 7.5}
