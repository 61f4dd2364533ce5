"""The MPI shell: master and worker loops on mpi4py, and an ``mpiexec`` launcher.

This is the only package that imports mpi4py (lazily, inside the functions), so the rest of the
library works without an MPI runtime.
"""

from .launcher import mpiexec_command, run_mpiexec
from .master import MasterReport, finish, run_master, ulfm_mode
from .worker import run_worker

__all__ = [
    "run_master",
    "run_worker",
    "MasterReport",
    "ulfm_mode",
    "finish",
    "mpiexec_command",
    "run_mpiexec",
]
