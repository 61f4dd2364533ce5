"""Worker isolation under a real mpiexec (issue 14): 4 ranks, work functions that hang forever,
segfault, abort(), exceed their memory limit, raise, leave children behind (one in a session of
its own), print 64 MB through run_command, and return a result too large for a record.

Each mpiexec runs in its own session with a timeout, and the session is killed after it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import orjson

from durable_dispatch.campaign.admin import view_state
from durable_dispatch.mpi.launcher import (
    find_mpiexec,
    mpiexec_command,
    pids_in_session,
    run_mpiexec,
)

if find_mpiexec() is None:  # the mpi extra is part of the test install; fail loudly without it
    raise RuntimeError("mpiexec not found: install the project with '.[test,mpi]'")

CAMPAIGN = Path(__file__).parent / "children" / "isolated_campaign.py"


def _run(tmp_path: Path, mode: str) -> tuple[Any, dict[str, Any] | None, float]:
    cmd = mpiexec_command(4, [sys.executable, str(CAMPAIGN), str(tmp_path / "state"), mode])
    start = time.monotonic()
    res = run_mpiexec(cmd, timeout=150)
    wall = time.monotonic() - start
    line = next((x for x in res.stdout.splitlines() if x.startswith("REPORT ")), None)
    return res, orjson.loads(line.removeprefix("REPORT ")) if line else None, wall


def _results(state: Path) -> dict[str, Any]:
    """work ID -> committed result, read from the state journal."""
    from durable_dispatch.campaign.statedir import STATE_JOURNAL
    from durable_dispatch.storage.journal import read_journal

    out: dict[str, Any] = {}
    for rec in read_journal(state / STATE_JOURNAL):
        ev = rec.payload
        if ev.get("event") == "committed":
            ids = ev.get("work_ids") or [ev.get("work_id")]
            values = ev.get("results") or [ev.get("result")]
            out.update(zip(ids, values, strict=True))
    return out


def _leftovers(session: int) -> list[str]:
    """Processes of the job's session, and the campaign's sleeps wherever they went."""
    out = [f"pid {p} in the job's session" for p in pids_in_session(session)]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "sleep 301.5" in cmd or "sleep 302.5" in cmd:
                out.append(f"pid {entry.name}: {cmd}")
    return out


def test_isolated_workers_survive_every_kind_of_bad_work_function(tmp_path: Path) -> None:
    """Issue 14: without isolation a segfault ended the whole job and a hang cost its rank.
    With isolate=True every item ends committed or deferred with the right kind, no rank is
    parked or lost at the end, nothing the functions started outlives the job, and the job's
    time stays within its deadlines plus start-up."""
    res, report, wall = _run(tmp_path, "isolate")
    try:
        assert not res.timed_out and res.returncode == 0, res.stderr[-4000:]
        assert report is not None and report["finished"], res.stdout[-3000:]
        core = report["core"]
        assert core["parked_ranks_now"] == 0 and core["ranks_lost"] == 0, core
        view = view_state(tmp_path / "state")
        p = view.projection
        committed = set(p.committed)
        assert {"ok-0", "ok-1", "ok-2", "ok-3", "children", "output-64mb"} <= committed
        assert _results(tmp_path / "state")["launcher-env"] == []  # none of mpiexec's (#33)
        assert {"hang-once", "segfault-once"} <= committed  # one bad attempt, then fine
        deferred = set(p.deferred)
        kinds = {wid: p.kinds[wid] for wid in deferred}
        assert kinds == {
            "hang": ["timeout", "timeout"],
            "segfault": ["crash", "crash"],
            "abort": ["crash", "crash"],
            "memory": ["error", "error"],
            "raise": ["error", "error"],
            "too-large": ["result-too-large", "result-too-large"],
        }, kinds
        assert "SIGSEGV" in p.last_error["segfault"] and "SIGABRT" in p.last_error["abort"]
        assert "MemoryError" in p.last_error["memory"]
        assert p.kinds["hang-once"] == ["timeout"] and p.kinds["segfault-once"] == ["crash"]
        assert len(committed) + len(deferred) == 15 and p.duplicate_commits == 0
        out = _results(tmp_path / "state")["output-64mb"]
        assert out == {"bytes": 64 << 20, "kept": 1024, "sha": out["sha"]}
        # Deadlines: hang 2 x 2 s and hang-once 2 s over 3 workers, plus start-up and restarts.
        assert wall < 6 + 60, wall
    finally:
        left = _leftovers(res.session)
    assert left == [], left


def test_without_isolation_a_segfault_ends_the_whole_job(tmp_path: Path) -> None:
    """Documents what isolate=True is for: one segfaulting item ends every rank (Open MPI aborts
    the job), and the restart has to resume from the durable state."""
    res, report, _wall = _run(tmp_path, "segfault")
    assert not res.timed_out
    assert res.returncode != 0 and report is None, res.stdout[-2000:]


def test_without_isolation_a_hang_costs_its_rank(tmp_path: Path) -> None:
    """Documents what isolate=True is for: a hung function parks its rank for good (W10); its
    item moves on, and the rank never comes back."""
    res, report, _wall = _run(tmp_path, "hang")
    assert not res.timed_out and res.returncode == 0, res.stderr[-3000:]
    assert report is not None and report["core"]["parked_ranks_now"] >= 1, report
    p = view_state(tmp_path / "state").projection
    assert {wid: p.kinds[wid] for wid in p.deferred} == {"hang": ["timeout", "timeout"]}
