"""The MPI shell: master and worker loops on mpi4py, and an ``mpiexec`` launcher.

This is the only package that imports mpi4py (lazily, inside the functions), so the rest of the
library works without an MPI runtime. Names load on first use: a worker rank that imports
``run_worker`` does not load the master, the campaign state or the dispatch core.

Importing it installs :func:`.guard.abort_on_unhandled` as ``sys.excepthook``: an unhandled
exception on any rank of a multi-rank job ends the whole job with ``MPI_Abort`` instead of
leaving the other ranks waiting for it forever; in a rank an MPI launcher started, it records
SIGTERM and SIGUSR1 (:func:`.signals.record_early`), so a batch system's early signal drains the
campaign that starts later instead of killing the rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from . import guard, signals

guard.install()
signals.record_early()  # a launched rank records SIGTERM/SIGUSR1 until its campaign starts

if TYPE_CHECKING:
    from .context import WorkContext
    from .launcher import mpiexec_command, run_mpiexec
    from .master import Feed, MasterReport, finish, run_master, ulfm_mode
    from .worker import run_worker

__all__ = [
    "run_master",
    "run_worker",
    "WorkContext",
    "MasterReport",
    "Feed",
    "ulfm_mode",
    "finish",
    "mpiexec_command",
    "run_mpiexec",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "run_master": ".master",
        "run_worker": ".worker",
        "WorkContext": ".context",
        "MasterReport": ".master",
        "Feed": ".master",
        "ulfm_mode": ".master",
        "finish": ".master",
        "mpiexec_command": ".launcher",
        "run_mpiexec": ".launcher",
    },
    __all__,
)
