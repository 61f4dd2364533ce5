"""The suite's tiers (tests/conftest.py): a test is classed by what it does, automatically."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from durable_dispatch.mpi.launcher import mpiexec_command

from .conftest import TRIGGERS, _names_used
from .helpers import run_demo


def _tiers(*funcs: object) -> set[str]:
    used = _names_used(funcs)
    return {m for m, names in TRIGGERS.items() if used & names}


def _uses_mpiexec() -> None:
    mpiexec_command(4, ["true"])


def _spawns() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _through_a_helper() -> None:
    run_demo  # noqa: B018 - a test helper that launches mpiexec and spawns


def _kills() -> None:
    import os
    import signal

    os.kill(0, signal.SIGKILL)


def _pure() -> None:
    assert sorted([2, 1]) == [1, 2]


def test_a_new_test_is_classed_by_what_it_does() -> None:
    assert _tiers(_uses_mpiexec) == {"mpi"}
    assert _tiers(_spawns) == {"spawn"}
    assert _tiers(_kills) == {"crash"}
    assert {"mpi", "spawn"} <= _tiers(_through_a_helper)  # followed into tests/helpers.py
    assert _tiers(_pure) == set()


def test_the_tiers_of_the_collected_suite(request: Any) -> None:
    """This test is in the fast tier; the crash enumeration and every mpiexec test are not."""
    assert request.node.get_closest_marker("slow") is None
    for item in request.session.items:
        name = item.nodeid
        if "test_crash_consistency.py" in name or "test_mpi_edges.py" in name:
            assert item.get_closest_marker("slow") is not None, name


_WHERE = """
import os
import pytest
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    groups = [g for g in ("cluster", "slurm") if item.get_closest_marker(g)]
    if worker and groups:
        with open(os.environ["DD_WHERE"], "a") as f:
            f.write(worker + " " + groups[0] + "\\n")
"""


def test_a_group_that_must_not_overlap_runs_on_one_process(tmp_path: Any) -> None:
    """Under ``-n 2`` (CI's first pass) every cluster test runs on one process, and every
    Slurm test on one. They did not: this conftest's hook named the groups after xdist's own
    hook had read them, and pytest 9.2 ignores the names xdist gives (pytest-dev/pytest-xdist
    #1386); the cluster cases ran on both processes at once, one killing or cutting a node
    under another's job. Planned, not run (``--setup-plan``)."""
    (tmp_path / "where_plugin.py").write_text(_WHERE)
    where = tmp_path / "where.txt"
    files = ["tests/test_cluster.py", "tests/test_slurm.py", "tests/test_tiers.py"]
    env = {**os.environ, "DD_WHERE": str(where), "PYTHONPATH": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "where_plugin", "-p", "no:randomly",
         "-p", "no:cacheprovider", "--setup-plan", "-q", *files],
        cwd=Path(__file__).parent.parent, env=env, capture_output=True, text=True, timeout=240,
        check=False,
    )  # fmt: skip
    assert r.returncode in (0, 5), r.stdout[-3000:] + r.stderr[-3000:]
    ran: dict[str, set[str]] = {}
    for line in where.read_text().splitlines():
        worker, group = line.split()
        ran.setdefault(group, set()).add(worker)
    assert set(ran) == {"cluster", "slurm"}, ran
    assert all(len(w) == 1 for w in ran.values()), ran
