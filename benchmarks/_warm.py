"""Run a tree's ``bench_mpi.py`` with its package imported first (compare.py's launcher).

``python _warm.py SCRIPT ARGS...``: imports every module of the ``durable_dispatch`` found first
on ``sys.path`` (compare.py puts the measured tree's ``src`` there), then runs SCRIPT as
``__main__`` with ARGS. ``bench_mpi.py --role ours`` times ``run_master`` as a whole, and
``run_master`` imports most of the package lazily on its first call: without this, a figure of
20,000 trivial tasks (0.15 s of work at batch 64) counted the imports of some 60 modules, and a
tree split into more modules measured slower for it. The same for both trees of a comparison;
the package's import time is a start-up cost, measured apart (``python -X importtime``).
Each rank prints its CPU seconds at the end (``{"rank": R, "cpu_s": S}``), for compare.py's
master CPU per task.

Left out: the modules that import what a campaign does not (pytest, the futures runner, the
command line, the operator's views).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import resource
import runpy
import sys

SKIP = ("testing", "futures", "pytest_plugin", "cli", "__main__", "demo", "views", "report")


def warm() -> int:
    import durable_dispatch

    n = 0
    for m in pkgutil.walk_packages(durable_dispatch.__path__, "durable_dispatch."):
        if any(part in SKIP for part in m.name.split(".")):
            continue
        try:
            importlib.import_module(m.name)
            n += 1
        except Exception:  # an optional module (its extra not installed): measured as it is
            pass
    return n


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


if __name__ == "__main__":
    warm()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    before = cpu_seconds()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:  # each rank's CPU seconds: less at the mercy of a loaded machine than tasks/s
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
        print(json.dumps({"rank": rank, "cpu_s": cpu_seconds() - before}), flush=True)
