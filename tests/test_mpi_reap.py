"""No process outlives a rank, however the rank dies (issue 60): a master SIGKILLed under
``mpiexec`` (the job ends), a worker rank SIGKILLed under ULFM (the job goes on), with items
that start programs (``sh -c "sleep 300; true"``), in-process and isolated. Each test checks
that once the job ended no process of it is left (the session and the job's mark, as
``kill_session`` finds them). No assertion depends on the machine's speed: the programs sleep
far longer than a test runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durable_dispatch.campaign.admin import view_state
from durable_dispatch.mpi.launcher import (
    JOB_MARK,
    find_mpiexec,
    kill_session,
    launch_env,
    mpiexec_command,
    pids_in_session,
)

pytestmark = pytest.mark.mpi

if find_mpiexec() is None:  # the mpi extra is part of the test install; fail loudly without it
    raise RuntimeError("mpiexec not found: install the project with '.[test,mpi]'")

CAMPAIGN = Path(__file__).parent / "children" / "reap_campaign.py"


def _lines(path: Path) -> list[list[str]]:
    try:
        return [ln.split() for ln in path.read_text().splitlines() if ln.strip()]
    except FileNotFoundError:
        return []


def _wait_for(path: Path, ready: object, proc: subprocess.Popen[str], seconds: float) -> None:
    end = time.monotonic() + seconds
    while not ready(_lines(path)):  # type: ignore[operator]
        assert proc.poll() is None, f"the job ended first: {proc.communicate()}"
        assert time.monotonic() < end, f"not ready after {seconds} s: {_lines(path)}"
        time.sleep(0.1)


def _leftovers(session: int, seconds: float = 20.0) -> list[str]:
    """What is still alive of the job after it ended (waiting up to ``seconds`` for it to go:
    a generous bound, not a measurement)."""
    end = time.monotonic() + seconds
    while pids_in_session(session) and time.monotonic() < end:
        time.sleep(0.1)
    out = []
    for pid in pids_in_session(session):
        try:
            out.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()!r}")
        except OSError:
            pass
    return out


def _start(tmp_path: Path, mode: str, isolate: bool, ulfm: bool) -> subprocess.Popen[str]:
    state = tmp_path / "state"
    argv = [sys.executable, str(CAMPAIGN), str(state), mode, "1" if isolate else "0"]
    env = launch_env()
    assert env[JOB_MARK]
    proc = subprocess.Popen(
        mpiexec_command(3, argv, ulfm=ulfm),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    return proc


def _clean(proc: subprocess.Popen[str]) -> None:
    """Kill what is left of the job, whatever the test found."""
    if proc.poll() is None:
        kill_session(proc)
    for pid in pids_in_session(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _ranks(lines: list[list[str]]) -> dict[int, int]:
    return {int(w[1]): int(w[2]) for w in lines if w[0] == "rank"}


@pytest.mark.parametrize(
    "isolate, ulfm", [(True, False), (False, True)], ids=["isolated-plain", "in-process-ulfm"]
)
def test_a_sigkilled_master_leaves_no_program_its_workers_items_started(
    tmp_path: Path, isolate: bool, ulfm: bool
) -> None:
    """Before: mpiexec ended the job, and the items' shells and sleeps ran on, re-parented to
    init (2-5 of them after each master kill of a 150-item campaign). Open MPI signals each
    live rank's process group, which took an in-process item's programs with it; but an
    isolated child's group is its own, and under ULFM a worker whose master died ends by
    itself, before anyone signals its group. (The other two pairs passed before too: an
    in-process item under plain mpiexec, whose group Open MPI kills, and an isolated one under
    ULFM, whose worker ends by itself and kills its child's tree.)"""
    pids = tmp_path / "state.pids"
    proc = _start(tmp_path, "master", isolate, ulfm=ulfm)
    try:
        _wait_for(pids, lambda ls: {w[1] for w in ls if w[0] == "item"} == {"1", "2"}, proc, 120)
        os.kill(_ranks(_lines(pids))[0], signal.SIGKILL)
        proc.communicate(timeout=120)
        left = _leftovers(proc.pid)
        assert left == [], f"processes of the job outlived it: {left}"
    finally:
        _clean(proc)


@pytest.mark.ulfm
@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_a_sigkilled_worker_rank_leaves_no_program_its_items_started(
    tmp_path: Path, isolate: bool
) -> None:
    """Under ULFM the job goes on without the rank; before, its item's shell and sleep ran on
    (re-parented to init) after the campaign had finished and the job had ended."""
    pids = tmp_path / "state.pids"
    proc = _start(tmp_path, "worker", isolate, ulfm=True)
    try:
        _wait_for(pids, lambda ls: any(w[:2] == ["item", "1"] for w in ls), proc, 120)
        os.kill(_ranks(_lines(pids))[1], signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        assert "REPORT True" in out, out[-2000:] + err[-3000:]
        p = view_state(tmp_path / "state").projection
        assert len(p.committed) == 8 and p.duplicate_commits == 0
        left = _leftovers(proc.pid)
        assert left == [], f"processes of the job outlived it: {left}"
    finally:
        _clean(proc)
