"""The suite's tiers (tests/conftest.py): a test is classed by what it does, automatically."""

from __future__ import annotations

import subprocess
import sys
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
