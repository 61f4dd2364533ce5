"""The drain before an allocation's end (U14): the margin against observed task times, in
virtual time (the core), and the reading of the end from the environment and the batch
system's commands (the shell), with real subprocesses for the commands."""

from __future__ import annotations

import math
import os
import signal
import stat
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_dispatch.batch import (
    AllocationEnd,
    parse_slurm_duration,
    parse_slurm_time,
    scontrol_fields,
    slurm_job,
)
from durable_dispatch.core import Dispatcher, WatchdogConfig, WorkItem
from durable_dispatch.core.decisions import Send
from durable_dispatch.core.drain import (
    DrainPlan,
    InFlight,
    allocations_needed,
    remaining_seconds,
)
from durable_dispatch.core.watchdog import QuantileWindow

from .helpers import examples


def window(*values: float) -> QuantileWindow:
    w = QuantileWindow(100)
    for v in values:
        w.add(v)
    return w


# ---------------------------------------------------------------- the window's conditional quantile


def test_quantile_above_is_the_quantile_of_the_longer_measurements() -> None:
    w = window(*range(1, 11))
    assert w.quantile_above(0.9, 0) == 9  # all ten: the ninth
    assert w.quantile_above(0.9, 5) == 10  # 6..10: ceil(4.5) = the fifth
    assert w.quantile_above(0.5, 5) == 8  # 6..10: the third
    assert w.quantile_above(0.9, 10) is None  # none longer
    with pytest.raises(ValueError):
        w.quantile_above(0, 1)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.floats(0, 100, allow_nan=False), max_size=30), st.floats(0, 100))
def test_quantile_above_matches_a_sort(values: list[float], least: float) -> None:
    w = window(*values)
    above = sorted(v for v in values if v > least)
    got = w.quantile_above(0.9, least)
    if not above:
        assert got is None
    else:
        assert got == above[max(0, math.ceil(0.9 * len(above)) - 1)]


# ---------------------------------------------------------------- what a dispatch needs still


def test_remaining_is_the_observed_quantile_minus_what_it_ran() -> None:
    times = window(*([10.0] * 9 + [20.0]))  # per item: mostly 10 s, one 20 s
    assert remaining_seconds(InFlight(0.0), times) == 10.0
    assert remaining_seconds(InFlight(4.0), times) == 6.0
    # past every 10 s task: what the 20 s one took
    assert remaining_seconds(InFlight(12.0), times) == 8.0
    # four items in one dispatch: four times the time per item
    assert remaining_seconds(InFlight(5.0, items=4), times) == 35.0


def test_remaining_is_capped_by_the_deadline_and_falls_back_to_it() -> None:
    times = window(10.0, 10.0, 10.0)
    assert remaining_seconds(InFlight(0.0, deadline_left=3.0), times) == 3.0
    # longer than everything seen: as long again as it ran, at most to its deadline
    assert remaining_seconds(InFlight(50.0, deadline_left=70.0), times) == 50.0
    assert remaining_seconds(InFlight(50.0, deadline_left=20.0), times) == 20.0
    assert remaining_seconds(InFlight(50.0), times) == 50.0
    # nothing observed yet: unknown, the floor covers it
    assert remaining_seconds(InFlight(50.0, deadline_left=70.0), QuantileWindow(10)) == 0.0


# ---------------------------------------------------------------- the margin and the drain


def test_the_margin_is_the_longest_of_the_work_in_flight_and_the_close_or_the_floor() -> None:
    plan = DrainPlan(floor=60.0, close_seconds=5.0, started=0.0)
    end = 10_000.0
    assert plan.margin(end, [], window(1.0)) == 60.0  # the floor
    long = window(*([100.0] * 10))
    assert plan.margin(end, [InFlight(10.0)], long) == 95.0  # 90 s left, then the close
    assert plan.margin(end, [InFlight(10.0), InFlight(95.0)], long) == 95.0  # the longest
    assert DrainPlan(floor=0.0, close_seconds=7.0).margin(end, [], long) == 7.0  # the close


def test_the_floor_is_at_most_a_quarter_of_the_allocation() -> None:
    plan = DrainPlan(floor=60.0, close_seconds=2.0, started=1000.0)
    assert plan.floor_at(1060.0) == 15.0  # a one-minute job does not drain at once
    assert plan.floor_at(1000.0 + 7200) == 60.0


def test_in_virtual_time_the_drain_begins_when_the_work_in_flight_needs_the_time_left() -> None:
    """A dispatcher that observed tasks of 30 s: a task sent at 1000 with the end at 1100
    (floor 10, close 5) begins the drain not while the expected 30 s and the close fit; once
    it runs past everything seen it is expected to take as long again (at most to its
    deadline), which moves the drain earlier; nothing more is sent once 30 s and the close
    do not fit."""
    d = Dispatcher(watchdog=WatchdogConfig(seconds=120), ranks=[1])
    d.submit(WorkItem(f"w{i}", {}) for i in range(30))
    t = 0.0
    for _ in range(20):  # twenty tasks of 30 s each
        s = d.reserve(t)
        assert isinstance(s, Send)
        d.mark_dispatched(s.token, t)
        t += 30.0
        d.on_results(1, s.token, [None], t)
        d.commit_done(s.token)
        d.on_ready(1, s.token, t)
    times = d.policy.task_times
    assert times.quantile(0.9) == 30.0
    s = d.reserve(1000.0)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, 1000.0)
    plan = DrainPlan(floor=10.0, close_seconds=5.0, started=0.0)
    end = 1100.0
    for now in (1000.0, 1020.0, 1029.0, 1040.0):
        assert not plan.drain_now(now, end, d.open_dispatches(now), times), now
    # past every observed time (40 s): as long again: 40 s + 5 > 1100 - 1060? not yet
    assert plan.margin(end, d.open_dispatches(1040.0), times) == 45.0
    # at 1048: 48 s + 5 >= 52 s left: drain
    assert plan.drain_now(1048.0, end, d.open_dispatches(1048.0), times)
    # at 1090 its deadline (1120) bounds it: 30 s + 5
    assert plan.margin(end, d.open_dispatches(1090.0), times) == 35.0
    # the drain waits until the close must begin
    assert plan.drain_until(1048.0, end) == 1095.0
    # sending: 30 s and the close fit until 1065
    assert plan.fits(1065.0, end, 1, times) and not plan.fits(1065.5, end, 1, times)
    assert plan.fits(1000.0, end, 3, times) and not plan.fits(1000.0, end, 4, times)  # 90, 120 s


def test_with_nothing_in_flight_and_nothing_that_fits_the_drain_begins_at_once() -> None:
    times = window(*([300.0] * 10))  # tasks of 5 minutes, 200 s left
    plan = DrainPlan(floor=60.0, close_seconds=5.0, started=0.0)
    assert not plan.drain_now(800.0, 1000.0, [], times)  # nothing pending: the floor decides
    assert plan.drain_now(800.0, 1000.0, [], times, next_items=1)
    assert not plan.drain_now(800.0, 1000.0, [InFlight(250.0)], times, next_items=1)  # 50 s


def test_the_drain_moves_later_with_the_end() -> None:
    times = window(*([20.0] * 10))
    plan = DrainPlan(floor=10.0, close_seconds=5.0, started=0.0)
    flying = [InFlight(5.0)]  # 15 s left: margin 20
    assert plan.drain_now(985.0, 1000.0, flying, times)
    assert not plan.drain_now(985.0, 1060.0, flying, times)  # the limit was raised


def test_task_times_are_observed_whatever_the_timeouts() -> None:
    """The margin's times include items with their own timeout and a fixed watchdog (the
    adaptive rule's window holds only what it governs)."""
    d = Dispatcher(watchdog=WatchdogConfig(seconds=50), ranks=[1])
    d.submit([WorkItem("a", {}, timeout=9.0), WorkItem("b", {}), WorkItem("c", {})])
    for t0, took in ((0.0, 4.0), (10.0, 6.0)):
        s = d.reserve(t0)
        assert isinstance(s, Send)
        d.mark_dispatched(s.token, t0)
        d.on_results(1, s.token, [None], t0 + took)
        d.commit_done(s.token)
        d.on_ready(1, s.token, t0 + took)
    assert len(d.policy.task_times) == 2
    assert d.policy.task_times.quantile(1.0) == 6.0
    s = d.reserve(20.0)  # a dispatch of 5 ms: not measured (nothing to the margin)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, 20.0)
    d.on_results(1, s.token, [None], 20.005)
    assert len(d.policy.task_times) == 2


def test_allocations_needed() -> None:
    assert allocations_needed(100.0, 300.0, 3600.0) == 0
    assert allocations_needed(4000.0, 300.0, 3600.0) == 2  # 3700 s beyond this one
    assert allocations_needed(3900.0, 300.0, 3600.0) == 1
    assert allocations_needed(None, 300.0, 3600.0) == 0


# ---------------------------------------------------------------- reading the end (the shell)


def test_the_end_given_wins_and_nothing_is_asked() -> None:
    asked: list[list[str]] = []

    def run(argv: list[str], timeout: float) -> str | None:
        asked.append(list(argv))
        return None

    env = {"SLURM_JOB_ID": "7", "DD_ENDS_AT": "2000"}
    a = AllocationEnd(env, ends_at=1500.0, run=run)  # type: ignore[arg-type]
    assert (a.ends_at, a.source, a.asks) == (1500.0, "ends_at", False)
    b = AllocationEnd(env, run=run)  # type: ignore[arg-type]
    assert (b.ends_at, b.source, b.asks) == (2000.0, "DD_ENDS_AT", False)
    assert not b.start()._thread and not asked
    c = AllocationEnd({"DD_ENDS_AT": "soon"}, run=run)  # type: ignore[arg-type]
    assert c.ends_at is None  # refused with a warning, not taken as 0


def test_slurm_end_time_in_the_environment_is_read_then_squeue_moves_it() -> None:
    later = "2026-12-05T04:00:00"

    def run(argv: list[str], timeout: float) -> str | None:
        return f"2026-12-05T03:00:00 {later}\n" if "squeue" in argv[0] else None

    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": "1000", "SLURM_JOB_START_TIME": "900"}
    a = AllocationEnd(env, run=run)  # type: ignore[arg-type]
    assert (a.ends_at, a.started, a.source) == (1000.0, 900.0, "SLURM_JOB_END_TIME")
    assert a.read_once()
    assert (a.ends_at, a.source) == (parse_slurm_time(later), "squeue")


def test_a_failing_squeue_falls_back_to_scontrol_and_a_failing_both_is_counted() -> None:
    answers = {"squeue": None, "scontrol": "JobId=7 StartTime=2026-12-05T03:00:00 "
               "EndTime=2026-12-05T03:30:00 TimeLimit=00:30:00"}  # fmt: skip

    def run(argv: list[str], timeout: float) -> str | None:
        return answers[os.path.basename(argv[0])]

    a = AllocationEnd({"SLURM_JOB_ID": "7"}, run=run)  # type: ignore[arg-type]
    assert a.read_once() and a.source == "scontrol"
    assert a.ends_at == parse_slurm_time("2026-12-05T03:30:00")
    answers["scontrol"] = None
    assert not a.read_once() and a.failures == 1
    assert a.ends_at == parse_slurm_time("2026-12-05T03:30:00")  # the last answer stays


def test_flux_timeleft() -> None:
    out = {"v": "120\n"}
    a = AllocationEnd(
        {"FLUX_JOB_ID": "f1"},
        clock=lambda: 5000.0,
        run=lambda argv, timeout: out["v"],  # type: ignore[arg-type,misc]
    )
    assert a.read_once() and (a.ends_at, a.source) == (5120.0, "flux")
    out["v"] = f"{2**32 - 1}\n"  # no time limit
    assert not a.read_once()


def _stub(directory: Path, name: str, body: str) -> None:
    p = directory / name
    p.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    p.chmod(p.stat().st_mode | stat.S_IXUSR)


def test_a_real_squeue_command_is_read_through_path(tmp_path: Path) -> None:
    _stub(tmp_path, "squeue", 'echo "2026-12-05T03:00:00 2026-12-05T03:01:00"\n')
    a = AllocationEnd({"SLURM_JOB_ID": "7", "PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert a.read_once() and a.source == "squeue"
    assert a.ends_at == parse_slurm_time("2026-12-05T03:01:00")


def test_a_hung_squeue_is_killed_with_its_children_and_scontrol_answers(tmp_path: Path) -> None:
    """A squeue that hangs (a wrapper whose child sleeps): the question ends at its timeout,
    the whole process group is killed (a child holding the pipe would otherwise keep the
    reader waiting), and scontrol answers instead."""
    pids = tmp_path / "pids"
    _stub(tmp_path, "squeue", f"sleep 300 & echo $! > {pids}\nwait\n")
    _stub(tmp_path, "scontrol", 'echo "JobId=7 EndTime=2026-12-05T03:02:00"\n')
    a = AllocationEnd({"SLURM_JOB_ID": "7", "PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=1.0)
    assert a.read_once() and a.source == "scontrol"
    child = int(pids.read_text())
    for _ in range(100):  # the kill is sent; the child is reaped by init
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the hung squeue's child still runs")


def test_the_reader_thread_never_blocks_its_caller(tmp_path: Path) -> None:
    """``start`` returns at once while the question hangs; the end stays unknown meanwhile."""
    pid = tmp_path / "pid"
    _stub(tmp_path, "squeue", f"echo $$ > {pid}\nexec sleep 300\n")
    a = AllocationEnd({"SLURM_JOB_ID": "7", "PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30.0)
    a.start()
    try:
        assert a._thread is not None and a._thread.is_alive()
        assert a.ends_at is None and a.reads == 0
    finally:
        a.close()
        for _ in range(200):  # the stub has started (it wrote its pid): end it, by its pid
            if pid.exists() and pid.read_text().strip():
                os.kill(int(pid.read_text()), signal.SIGKILL)
                break
            time.sleep(0.05)


def test_parse_slurm_time() -> None:
    assert parse_slurm_time("N/A") is None and parse_slurm_time("Unknown") is None
    assert parse_slurm_time("2026-12-05T03:01:00") == time.mktime(
        time.strptime("2026-12-05T03:01:00", "%Y-%m-%dT%H:%M:%S")
    )


# ---------------------------------------------------------------- the master loop, in-process


def test_the_master_drains_before_the_end_it_was_given_and_loses_nothing(tmp_path: Path) -> None:
    """``run_master(ends_at=)``, no signal: the master stops dispatching before the end, lets
    what is in flight finish, and stops resumably (``reason="allocation"``); the published
    statistics carry the end, and a second run finishes the rest, every item once. (How long
    before the end, on a real Slurm: test_slurm_allocation.py.)"""
    from durable_dispatch.campaign.admin import view_state
    from durable_dispatch.mpi import run_master
    from durable_dispatch.testing import LocalWorkers

    def work(p: int) -> int:
        time.sleep(0.05)
        return p

    items = [WorkItem(f"w{i:03d}", i) for i in range(800)]  # ~20 s of work on 2 workers
    ends_at = time.time() + 12.0  # the close's 5 s and a floor of 1 s: drains ~7 s in
    got: dict[str, int] = {}
    report = run_master(
        items,
        tmp_path / "state",
        got.__setitem__,
        comm=LocalWorkers(work, workers=2),
        ends_at=ends_at,
        drain_margin=1.0,
        linger=0,
    )
    assert not report.finished and report.reason == "allocation"
    v = view_state(tmp_path / "state")
    assert 0 < len(v.projection.committed) < 800
    assert v.live["allocation"]["ends_at"] == ends_at
    assert v.live["allocation"]["source"] == "ends_at"
    report = run_master(  # (the rest at full speed)
        items, tmp_path / "state", got.__setitem__, comm=LocalWorkers(int, workers=2), linger=0
    )
    assert report.finished and sorted(got) == [w.work_id for w in items]
    assert view_state(tmp_path / "state").projection.duplicate_commits == 0


def test_a_bad_drain_margin_is_refused(tmp_path: Path) -> None:
    from durable_dispatch.errors import UsageError
    from durable_dispatch.mpi import run_master
    from durable_dispatch.testing import LocalWorkers

    with pytest.raises(UsageError, match="drain_margin"):
        run_master([], tmp_path / "s", comm=LocalWorkers(lambda p: p, workers=1), drain_margin=-1)


def test_slurm_is_read_by_one_module_for_the_master_and_for_launch() -> None:
    """``launch`` and the allocation's end read ``scontrol`` with the same parsers."""
    f = scontrol_fields("JobId=7 JobState=COMPLETING RunTime=1-00:00:20 Comment=a=b Junk")
    assert f == {"JobId": "7", "JobState": "COMPLETING", "RunTime": "1-00:00:20", "Comment": "a=b"}
    assert parse_slurm_duration(f["RunTime"]) == 86420.0
    assert parse_slurm_duration("05:00") == 300.0 and parse_slurm_duration("UNLIMITED") is None
    assert slurm_job({"SLURM_JOBID": "9"}) == "9" and slurm_job({"SLURM_JOB_ID": ""}) is None
