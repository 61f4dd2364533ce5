"""Tests of the durable-dispatch command, through a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_dispatch", *args], capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "name,code,problem",
    [
        ("valid.jsonl", 0, None),
        ("torn_tail.jsonl", 1, "torn record (no newline)"),
        ("corrupt_middle.jsonl", 1, "checksum mismatch"),
        ("wrong_version.jsonl", 1, "unsupported format version 2"),
        ("campaign.000000000001.snap", 0, None),
    ],
)
def test_verify_fixtures(name: str, code: int, problem: str | None) -> None:
    before = (FIXTURES / name).read_bytes()
    out = run("verify", str(FIXTURES / name), "--json")
    assert out.returncode == code, out.stderr
    res = json.loads(out.stdout)
    assert res["problem"] == problem
    assert (FIXTURES / name).read_bytes() == before  # verify never modifies


def test_verify_empty_missing_and_unreadable(tmp_path: Path) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    assert run("verify", str(empty)).returncode == 1
    out = run("verify", str(tmp_path / "missing.jsonl"))
    assert out.returncode == 2 and out.stderr.startswith("Error:")
    if os.geteuid() != 0:  # root reads anything
        noperm = tmp_path / "n.jsonl"
        noperm.write_bytes((FIXTURES / "valid.jsonl").read_bytes())
        noperm.chmod(0)
        assert run("verify", str(noperm)).returncode == 2


def test_inspect_counts_kinds() -> None:
    out = run("inspect", str(FIXTURES / "valid.jsonl"), "--json")
    assert out.returncode == 0
    res = json.loads(out.stdout)
    assert res["records"] == 5 and res["kinds"] == {
        "dispatched": 2,
        "committed": 2,
        "rolled_back": 1,
    }
    torn = json.loads(run("inspect", str(FIXTURES / "torn_tail.jsonl"), "--json").stdout)
    assert torn["torn_tail"] and torn["torn_tail_bytes"] > 0


def test_usage_error_exit_code_and_help_examples() -> None:
    assert run("nonsense").returncode == 2
    for cmd in ("verify", "inspect"):
        out = run(cmd, "--help")
        assert out.returncode == 0 and "Example:" in out.stdout
