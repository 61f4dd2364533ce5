"""Shared pytest configuration: hypothesis profiles, and the suite's tiers.

**Hypothesis profiles.** ``dev`` (a few dozen examples: day-to-day runs), ``ci`` (the full
counts: chosen when ``CI`` is set, as ``.ci/run`` runs) and ``long`` (soaks); ``HYPOTHESIS_PROFILE``
picks one by name. A test that needs its own count asks :func:`tests.helpers.examples` for it,
which scales it by the profile in force, so no test fixes a count of its own.

**Tiers.** Each test is marked at collection by what it does, read from the names its code,
the test helpers it calls and the fixtures it uses refer to: ``mpi`` (it launches ``mpiexec``),
``spawn`` (it starts processes), ``crash`` (it kills them with SIGKILL, or enumerates every
crash point of a workload), ``mount`` (real mounts or loop devices), ``browser`` (headless
Chromium). ``slow`` is the union of those. So a new test is classed without anyone remembering
to, and ``python -m pytest -m "not slow"`` is the fast tier: the core, the storage under pyfakefs
and fault injection, the ledger and the property tests (at the ``dev`` profile).

**Two processes.** CI runs the suite with ``-n 2`` (pytest-xdist; ``--dist loadgroup`` in
pyproject.toml): each test runs in one of two worker processes, beside another test. Tests keep
to their own ``tmp_path``, their own mpiexec session (``start_new_session``) and mount point and
loop device, and look for their leftover processes by their own session, directory or a sleep
length of their own, so they may overlap. What must not overlap shares an ``xdist_group``, and
xdist runs a group on one process, one test after another: every ``slurm`` test (group
``slurm``, added below: the module fixture of tests/test_slurm.py submits 7 jobs of 3 tasks, 21
of the cluster's 24 CPUs, to run side by side within their 1-minute time limits; split over two
processes it would run once in each, and half of the jobs would wait in the queue), and every
``cluster`` test (group ``cluster``: they kill and cut the nodes of .ci/cluster.sh's box, which
another such test would be running on). A worker
that dies (a test that kills its own process) fails the run: xdist reports the test it was
running as failed, and starts another worker for the rest. Without ``-n`` the suite runs in one
process, as before (``-s`` and ``--pdb`` need that).
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

_QUIET = [HealthCheck.too_slow]
settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=_QUIET)
settings.register_profile("long", max_examples=5000, deadline=None, suppress_health_check=_QUIET)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)

# Open MPI tries libfabric (its "ofi" components) at every MPI_Init before it settles, for ranks
# on one host, on what it uses without it (the ob1 layer over shared memory): that try cost about
# 1.1 of the 1.4 s an `mpiexec -n 4` start took here, and the suite starts a few hundred. Left
# out for the suite's launches (they inherit this environment), unless the caller chose; MPICH
# and Intel MPI ignore these names. What the ranks run over is the same with or without it.
os.environ.setdefault("OMPI_MCA_mtl", "^ofi")
os.environ.setdefault("OMPI_MCA_btl", "^ofi")

#: marker -> names whose use puts a test in that tier
TRIGGERS: dict[str, frozenset[str]] = {
    "mpi": frozenset({"mpiexec_command", "run_mpiexec", "run_demo"}),
    "spawn": frozenset(
        {"subprocess", "Popen", "executable", "IsolatedRunner", "run_command", "fork"}
    ),
    "crash": frozenset({"SIGKILL", "crash_states"}),  # real kills, and crash-point enumeration
    "mount": frozenset({"Tmpfs", "Ext4Image", "require_mounts"}),
    "browser": frozenset({"_chromium", "chromium"}),
}
SLOW = tuple(TRIGGERS)


def _code_names(code: types.CodeType) -> set[str]:
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _code_names(const)
    return out


def _names_used(funcs: Iterable[Any]) -> set[str]:
    """Every global and attribute name the functions refer to, through the test helpers (any
    function, or method of a class, of the ``tests`` package) they call."""
    seen: set[int] = set()
    names: set[str] = set()
    todo = [f for f in funcs if f is not None]
    while todo:
        f = inspect_unwrap(todo.pop())
        code = getattr(f, "__code__", None)
        if code is None or id(code) in seen:
            continue
        seen.add(id(code))
        used = _code_names(code)
        names |= used
        glob = getattr(f, "__globals__", {})
        for name in used:
            obj = glob.get(name)
            if not str(getattr(obj, "__module__", "")).startswith("tests"):
                continue
            if isinstance(obj, type):
                todo.extend(v for v in vars(obj).values() if isinstance(v, types.FunctionType))
            elif callable(obj):
                todo.append(obj)
    return names


def inspect_unwrap(f: Any) -> Any:
    while hasattr(f, "__wrapped__"):
        f = f.__wrapped__
    inner = getattr(getattr(f, "hypothesis", None), "inner_test", None)
    return inner if inner is not None else f


def pytest_configure(config: pytest.Config) -> None:
    for name, why in (
        ("spawn", "starts processes"),
        ("crash", "kills processes with SIGKILL"),
        ("mount", "needs real mounts or loop devices (root)"),
        ("browser", "renders a page in headless Chromium"),
    ):
        config.addinivalue_line("markers", f"{name}: {why} (set by tests/conftest.py)")


def _ulfm_skip() -> pytest.MarkDecorator | None:
    """A skip for tests that need ULFM, when the MPI in use has none (MPICH, issue 33)."""
    from durable_dispatch.mpi.launcher import find_mpiexec, mpi_flavor, ulfm_available

    if find_mpiexec() is None or ulfm_available():
        return None
    why = f"needs ULFM (Open MPI's --with-ft ulfm); this MPI is {mpi_flavor()}"
    return pytest.mark.skip(reason=why)


# First of every plugin's: xdist's worker names each test by its group from the xdist_group
# markers added here (``--dist loadgroup``), in a hook of its own that ran before this one
# (pytest loads this conftest before xdist registers its worker): the groups were never
# formed, and the cluster and Slurm tests ran on both processes at once, one case killing or
# cutting a node under another's job. ``-m`` selects after this too (the tiers added here).
# pytest 9.2 ignores those names altogether: pyproject.toml keeps pytest below it.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ulfm_items = [
        i
        for i in items
        if i.get_closest_marker("ulfm")
        or getattr(getattr(i, "callspec", None), "params", {}).get("ulfm") is True
    ]
    skip = _ulfm_skip() if ulfm_items else None
    for item in ulfm_items:
        item.add_marker("ulfm")
        if skip is not None:
            item.add_marker(skip)
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        info = getattr(item, "_fixtureinfo", None)
        fixtures = []
        for defs in info.name2fixturedefs.values() if info is not None else ():
            fixtures += [d.func for d in defs if str(d.func.__module__).startswith("tests")]
        used = _names_used([item.obj, *fixtures])
        tiers = [m for m, names in TRIGGERS.items() if used & names]
        tiers += [m for m in SLOW if item.get_closest_marker(m) and m not in tiers]
        for m in tiers:
            item.add_marker(m)
        if tiers and not item.get_closest_marker("slow"):
            item.add_marker("slow")
        if item.get_closest_marker("slurm"):  # one process for them all (module docstring)
            item.add_marker(pytest.mark.xdist_group("slurm"))
        if item.get_closest_marker("cluster"):  # they kill and cut the box's nodes: one at a time
            item.add_marker(pytest.mark.xdist_group("cluster"))
