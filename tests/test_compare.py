"""benchmarks/compare.py (issue 34) runs both trees and prints a ratio per figure. A smoke run
against HEAD itself, small: it checks the tool works, never a speed (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_compare_against_head_prints_a_ratio_per_figure_and_leaves_no_worktree() -> None:
    before = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "compare.py"),
            "--base",
            "HEAD",
            "--rounds",
            "2",
            "--tasks",
            "400",
            "--only",
            "ceiling-1",
            "mpi-1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    cut = next(i for i, x in enumerate(lines) if x.startswith("the master's CPU per task"))
    rows = {line.split()[0]: line.split() for line in lines[2:cut]}
    assert sorted(rows) == ["ceiling-1", "mpi-1"], res.stdout
    for row in rows.values():
        base, new, ratio = (float(x.replace(",", "")) for x in row[1:4])
        assert base > 0 and new > 0 and abs(ratio - new / base) < 0.01 and len(row) == 6
    # then the master's CPU per task, and the workers', for the figures under mpiexec only
    end = next(i for i, x in enumerate(lines) if x.startswith("the workers' CPU per task"))
    for table in (lines[cut + 3 : end], lines[end + 3 :]):
        cpu = {line.split()[0]: line.split() for line in table}
        assert sorted(cpu) == ["mpi-1"], res.stdout
        base, new, ratio = (float(x) for x in cpu["mpi-1"][1:4])
        assert base > 0 and new > 0 and abs(ratio - base / new) < 0.01
    after = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert after == before  # the base's worktree is removed


def test_a_launch_whose_mpi_runtime_never_started_is_made_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Open MPI sometimes fails to start at all (exit 213, "listener thread failed to start"):
    the figure is launched again; a run that started and failed is not."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("compare", ROOT / "benchmarks" / "compare.py")
    assert spec is not None and spec.loader is not None
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    runs = iter(
        [
            SimpleNamespace(returncode=213, stdout="", stderr="listener thread failed to start"),
            SimpleNamespace(returncode=0, stdout='{"tasks_per_s": 5.0}\n', stderr=""),
        ]
    )
    monkeypatch.setattr(compare, "run_mpiexec", lambda *a, **k: next(runs))
    assert compare.mpi(tmp_path, 10, ["--role", "bare"]) == 5.0
    monkeypatch.setattr(
        compare,
        "run_mpiexec",
        lambda *a, **k: SimpleNamespace(returncode=1, stdout="", stderr="boom"),
    )
    try:
        compare.mpi(tmp_path, 10, ["--role", "bare"])
    except SystemExit as e:
        assert "no result" in str(e) and "boom" in str(e)
    else:
        raise AssertionError("a failed run must end the comparison")
