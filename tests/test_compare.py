"""benchmarks/compare.py (issue 34) runs both trees and prints a ratio per figure. A smoke run
against HEAD itself, small: it checks the tool works, never a speed (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines()[2:]}
    assert sorted(rows) == ["ceiling-1", "mpi-1"], res.stdout
    for row in rows.values():
        base, new, ratio = (float(x.replace(",", "")) for x in row[1:4])
        assert base > 0 and new > 0 and abs(ratio - new / base) < 0.01 and len(row) == 6
    after = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert after == before  # the base's worktree is removed
