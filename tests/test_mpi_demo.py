"""The demo command end to end: `durable-dispatch demo` under a real mpiexec, then resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi


def demo(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_dispatch",
            "demo",
            "--state-dir",
            str(state),
            "--items",
            "30",
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_runs_with_faults_and_resumes(tmp_path: Path) -> None:
    out = demo(tmp_path / "s")
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout)
    assert (s["work_items"], s["lost"], s["duplicate_commits"]) == (30, 0, 0)
    assert s["committed"] + s["deferred"] == 30
    assert s["dispatch_watchdog_timeouts"] >= 1 and s["invalid_result_rollbacks"] >= 1
    if __import__("os").geteuid() == 0:
        assert "OMPI_ALLOW_RUN_AS_ROOT=1" in out.stderr  # says so when it sets them
    again = demo(tmp_path / "s")
    assert again.returncode == 0
    s2 = json.loads(again.stdout)
    assert s2["epoch"] == 2 and s2["committed"] == s["committed"] and s2["lost"] == 0


def test_demo_without_faults_and_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "durable_dispatch", "demo", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "Example:" in out.stdout and "--no-faults" in out.stdout


def test_demo_with_multi_item_dispatches(tmp_path: Path) -> None:
    out = demo(tmp_path / "s", "--no-faults", "--batch", "8")
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout)
    assert (s["committed"], s["lost"], s["duplicate_commits"]) == (30, 0, 0)
    assert s["dispatched_items"] == 30 and s["dispatches"] == 4  # 8 + 8 + 8 + 6
    assert s["batch_splits"] == 0
