"""The job's edges under a real mpiexec (issue 29): a bug in the user's own script on any rank,
a paused master, a paused worker or isolated child, restarted children and per-item timeouts,
every worker failing at start.

Each mpiexec runs in its own session under a generous ends-by-itself limit; the session is
killed after it, and each test checks that no process of the job outlived it. No assertion
depends on the machine's speed: the pauses are far longer than the deadlines they test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from durable_dispatch.campaign.admin import view_state
from durable_dispatch.mpi.launcher import (
    find_mpiexec,
    kill_session,
    launch_env,
    mpiexec_command,
    pids_in_session,
    run_mpiexec,
)

pytestmark = pytest.mark.mpi

if find_mpiexec() is None:  # the mpi extra is part of the test install; fail loudly without it
    raise RuntimeError("mpiexec not found: install the project with '.[test,mpi]'")

EDGE = Path(__file__).parent / "children" / "edge_campaign.py"

# The README's campaign with a bug in the user's own code at one of several places.
BUGGY = """
import logging, sys, time
from mpi4py import MPI
from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master, run_worker

def work(payload):
    return {"y": payload["x"] * 2}

if __name__ == "__main__":
    logging.basicConfig()
    state, where = sys.argv[1], sys.argv[2]
    if MPI.COMM_WORLD.Get_rank() == 0:
        if where == "before-master":
            items = [WorkItem(f"w{i}", {"x": i}) for i in range(10)]
            open("/nonexistent/config.toml")  # the user's bad path
        report = run_master([WorkItem(f"w{i}", {"x": i}) for i in range(10)], state,
                            stop_timeout=5)
        print("REPORT", report.finished, report.reason, flush=True)
        if where == "after-master":
            raise RuntimeError("the user's post-processing failed")
    else:
        if where == "before-worker" and MPI.COMM_WORLD.Get_rank() == 2:
            raise KeyError("the user's worker set-up failed")
        if where == "lambda-workers":
            try:
                run_worker(lambda p: p, isolate=True)  # IsolationError: found by no name
            except Exception as e:
                print(f"WORKER-ERROR {type(e).__name__}", flush=True)  # one write
        elif where == "lambda-workers-unhandled":
            run_worker(lambda p: p, isolate=True)
        else:
            run_worker(work)
"""


def _leftovers(session: int) -> list[int]:
    deadline = time.monotonic() + 10
    while pids_in_session(session) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids_in_session(session)


def _buggy(tmp_path: Path, where: str, *, ulfm: bool = False, n: int = 4) -> Any:
    script = tmp_path / "campaign.py"
    script.write_text(BUGGY)
    cmd = mpiexec_command(
        n, [sys.executable, str(script), str(tmp_path / "state"), where], ulfm=ulfm
    )
    start = time.monotonic()
    res = run_mpiexec(cmd, timeout=60)
    res.wall = time.monotonic() - start  # type: ignore[attr-defined]
    assert _leftovers(res.session) == [], "processes of the job outlived it"
    return res


@pytest.mark.parametrize("ulfm", [False, True], ids=["plain", "ulfm"])
def test_a_user_exception_on_rank_0_before_run_master_ends_the_job(
    tmp_path: Path, ulfm: bool
) -> None:
    """Issue 29.1: rank 0 exited through MPI_Finalize while the workers waited for WORK in
    run_worker: the job never ended (still running at 60 s, under plain mpiexec and ULFM)."""
    res = _buggy(tmp_path, "before-master", ulfm=ulfm)
    assert not res.timed_out, "the job hung after the user's exception on rank 0"
    assert res.returncode != 0
    assert "FileNotFoundError" in res.stderr and "/nonexistent/config.toml" in res.stderr
    assert "durable-dispatch: unhandled FileNotFoundError on rank 0" in res.stderr, res.stderr


def test_a_user_exception_after_run_master_returned_ends_the_job(tmp_path: Path) -> None:
    res = _buggy(tmp_path, "after-master")
    assert not res.timed_out
    assert "REPORT True None" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.returncode != 0 and "the user's post-processing failed" in res.stderr
    p = view_state(tmp_path / "state").projection
    assert len(p.committed) == 10 and p.duplicate_commits == 0


def test_a_worker_exception_before_run_worker_ends_the_job(tmp_path: Path) -> None:
    res = _buggy(tmp_path, "before-worker")
    assert not res.timed_out, "the job hung after a worker's exception"
    assert res.returncode != 0 and "the user's worker set-up failed" in res.stderr


def test_every_worker_failing_at_start_ends_the_job_at_once(tmp_path: Path) -> None:
    """Issue 29.4: each worker's run_worker raised IsolationError before its first READY and
    the master waited until max_seconds with 0 committed. The error now ends the job."""
    res = _buggy(tmp_path, "lambda-workers-unhandled")
    assert not res.timed_out, "the master waited for workers that had failed"
    assert res.returncode != 0 and "IsolationError" in res.stderr, res.stderr[-3000:]
    assert "lambda" in res.stderr


def test_workers_that_fail_at_start_and_catch_it_leave_no_workers(tmp_path: Path) -> None:
    """The same failure caught by the user's own code on each worker: the worker has told the
    master it is gone, so the master stops with reason "no workers left", not at max_seconds."""
    res = _buggy(tmp_path, "lambda-workers")
    assert not res.timed_out, "the master waited for workers that had failed"
    assert "REPORT False no workers left" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.count("WORKER-ERROR IsolationError") == 3
    assert "is gone" in res.stderr  # the master logged each worker's reason


# ------------------------------------------------------------------------------ pauses (U7)
def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for e in env:  # Open MPI's name, then MPICH's (Hydra's PMI)
        if e.startswith((b"OMPI_COMM_WORLD_RANK=", b"PMI_RANK=")):
            return int(e.split(b"=", 1)[1])
    return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _report(out: str) -> dict[str, Any] | None:
    line = next((x for x in out.splitlines() if x.startswith("REPORT ")), None)
    return orjson.loads(line.removeprefix("REPORT ")) if line else None


def _paused_campaign(tmp_path: Path, mode: str, target: str) -> dict[str, Any]:
    """Run edge_campaign.py MODE; once 6 items committed, SIGSTOP ``target`` (``master``,
    ``worker`` or ``child``) for 7 s (far past the 3 s watchdog), SIGCONT it, let it end."""
    state = tmp_path / "state"
    cmd = mpiexec_command(4, [sys.executable, str(EDGE), str(state), mode, "40"])
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=launch_env(None, quiet=True),
        start_new_session=True,
    )
    try:
        journal, deadline = state / "events.jsonl", time.monotonic() + 60
        while time.monotonic() < deadline and (
            not journal.exists() or journal.read_bytes().count(b'"committed"') < 6
        ):
            time.sleep(0.05)
        pids = pids_in_session(proc.pid)
        if target == "child":
            victims = [p for p in pids if "durable_dispatch.mpi.isolation" in _cmdline(p)]
        else:
            rank = 0 if target == "master" else 1
            victims = [p for p in pids if str(EDGE) in _cmdline(p) and _rank_of(p) == rank]
        assert victims, f"no {target} process found"
        victim = victims[0]
        os.kill(victim, signal.SIGSTOP)
        try:
            time.sleep(7.0)
        finally:
            try:
                os.kill(victim, signal.SIGCONT)
            except ProcessLookupError:  # a stopped child is killed at its deadline
                pass
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill_session(proc)
            proc.communicate()
    assert _leftovers(proc.pid) == []
    report = _report(out)
    assert report is not None, out[-2000:] + err[-3000:]
    assert report["finished"], report
    core: dict[str, Any] = report["core"]
    assert core["commits"] == 40 and core["parked_ranks_now"] == 0, core
    p = view_state(state).projection
    assert len(p.committed) == 40 and p.duplicate_commits == 0
    return core


@pytest.mark.parametrize("mode", ["steady", "steady-isolated"])
def test_a_paused_master_suspects_no_worker(tmp_path: Path, mode: str) -> None:
    """Issue 29.2: SIGSTOP of rank 0 for 7 s with every worker busy (0.25 s items, a 3 s
    watchdog) timed out every dispatch in flight (3 of 3) and classed its waiting RESULT
    stale. The gap is now not counted against the workers: nothing is suspected."""
    core = _paused_campaign(tmp_path, mode, "master")
    assert core["dispatch_watchdog_timeouts"] == 0, core
    assert core["stale"] == {} and core["malformed"] == {}, core
    assert core["master_pauses"] >= 1 and core["master_paused_seconds"] > 3.0, core


def test_a_paused_worker_still_times_out_and_comes_back(tmp_path: Path) -> None:
    """A paused *worker* is what the watchdog is for: its item moves, its rank is parked, and
    its exact READY after SIGCONT releases it."""
    core = _paused_campaign(tmp_path, "steady", "worker")
    assert core["dispatch_watchdog_timeouts"] >= 1, core
    assert core["watchdog_worker_recoveries"] >= 1, core
    # The worker's 7 s stop is not taken for the master's own pause: a pause the master saw of
    # itself (a loaded machine descheduled it) is its own, far shorter than the worker's stop.
    assert core["master_pauses"] == 0 or core["master_paused_seconds"] < 3.5, core


def test_a_paused_isolated_child_is_killed_at_its_deadline(tmp_path: Path) -> None:
    """A stopped child is a hang: its worker kills it at the deadline and reports kind
    timeout, the item is retried elsewhere or there, and the rank serves on."""
    core = _paused_campaign(tmp_path, "steady-isolated", "child")
    assert core["item_failures"] >= 1, core
    kinds = view_state(tmp_path / "state").projection.kinds
    assert ["timeout"] in kinds.values(), kinds


# ------------------------------------------------------------------ per-item timeouts (U9)
def test_restarted_children_keep_each_items_own_timeout(tmp_path: Path) -> None:
    """Issue 29.3: once a child had been restarted, the next item's deadline became now + the
    watchdog's 120 s lease, and a heartbeat moved the master's deadline with it: 42 items (6
    hang, 3 segfault, 3 leave a sleep behind, timeout=2.0, RetryPolicy(1)) committed 14 of 42
    in 90 s and stopped at max_seconds. Now every item ends committed or deferred, with the
    kinds its function earned, and every rank is back at the end."""
    state = tmp_path / "state"
    cmd = mpiexec_command(4, [sys.executable, str(EDGE), str(state), "timeouts"])
    res = run_mpiexec(cmd, timeout=150)
    try:
        assert not res.timed_out, res.stderr[-3000:]
        report = _report(res.stdout)
        assert report is not None, res.stdout[-2000:] + res.stderr[-3000:]
        assert report["finished"], report
        core = report["core"]
        assert core["parked_ranks_now"] == 0 and core["ranks_lost"] == 0, core
        # issue 29.4: the first READY of a worker whose child was still starting arrived for a
        # rank the master had already parked (it had sent it work before it was up)
        assert core["malformed"] == {} and core["parked_ready_missing"] == 0, core
        p = view_state(state).projection
        hang = {f"t{i:02d}" for i in range(42) if i % 7 == 1}
        crash = {f"t{i:02d}" for i in range(42) if i % 14 == 3}
        assert set(p.deferred) == hang | crash, sorted(p.deferred)
        assert len(p.committed) == 42 - 9 and p.duplicate_commits == 0
        assert {w: p.kinds[w] for w in hang} == {w: ["timeout", "timeout"] for w in hang}
        assert {w: p.kinds[w] for w in crash} == {w: ["crash", "crash"] for w in crash}
    finally:
        left = [
            e.name
            for e in Path("/proc").iterdir()
            if e.name.isdigit() and "sleep 303.5" in _cmdline(int(e.name))
        ]
    assert left == [] and _leftovers(res.session) == []
