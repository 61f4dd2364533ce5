"""A launch that cannot work fails fast, with a status that is not resumable.

``srun -n 4 python campaign.py`` with an MPI library that does not speak the process manager
``srun`` offers (the Open MPI wheel under ``--mpi=none`` or ``--mpi=pmi2``) starts four
processes that each see an MPI world of size 1: each one is a master without workers. Without
this check one of them took the state directory's lock, the others raised ``LockHeldError``,
and the lock holder returned ``reason="no workers left"``, which a requeue-on-3 job script
requeued forever.

:func:`check_world` looks at the world's size and at what the launcher says it started
(``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS`` in a Slurm step, ``PMI_SIZE``, ``PMIX_SIZE``,
``OMPI_COMM_WORLD_SIZE``, ``MPI_LOCALNRANKS``...) and returns a message naming the fix, or None;
:func:`require_workers` raises :class:`~durable_dispatch.errors.ConfigurationError` with it.
That error is not resumable: the process ends with status 1 (never the resumable code) within
seconds, before the state directory is opened.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import ConfigurationError

__all__ = ["check_world", "launched_tasks", "require_workers", "LAUNCH_FIX"]

#: How to start the ranks as one MPI world, by MPI library.
LAUNCH_FIX = (
    "start the ranks as one MPI world: inside a Slurm allocation 'srun --mpi=pmix' for Open MPI "
    "(the 'mpi' extra; needs Slurm's PMIx plugin, see 'srun --mpi=list'), 'srun --mpi=pmi2' for "
    "MPICH or Intel MPI (the 'mpich'/'impi' extras), or 'mpiexec -n N' (any MPI); "
    "see docs/slurm.md"
)

# the variables a launcher sets to the number of processes it started (first found wins)
_TASK_VARS = (
    "OMPI_COMM_WORLD_SIZE",  # Open MPI's mpiexec
    "PMI_SIZE",  # PMI-1/PMI-2 launchers: Hydra, srun --mpi=pmi2
    "PMIX_SIZE",
    "MPI_LOCALNRANKS",  # Hydra
    "SLURM_STEP_NUM_TASKS",  # srun (any --mpi)
)


def launched_tasks(env: Mapping[str, str]) -> tuple[str, int] | None:
    """The variable and number of processes a launcher says it started, when more than one;
    else None. ``SLURM_NTASKS`` counts only inside an ``srun`` step (``SLURM_STEP_ID`` set):
    in the batch script itself it is the allocation's size, not what started this process."""
    names = list(_TASK_VARS)
    if env.get("SLURM_STEP_ID", "batch") not in ("batch", "extern"):
        names.append("SLURM_NTASKS")
    for name in names:
        value = env.get(name, "")
        if value.strip().isdigit() and int(value) > 1:
            return name, int(value)
    return None


def check_world(size: int, env: Mapping[str, str] | None = None, library: str = "") -> str | None:
    """Why an MPI world of ``size`` processes cannot run a campaign, or None when it can.

    Args:
        size: ``COMM_WORLD``'s size.
        env: the environment (``os.environ``).
        library: ``MPI.Get_library_version()``, to name the fix for this MPI.
    """
    if size > 1:
        return None
    env = os.environ if env is None else env
    # (the MPI library's version string may end in a NUL byte: a message holds printable text)
    library = "".join(c if c.isprintable() or c == "\n" else " " for c in library)
    lib = library.splitlines()[0].strip() if library.strip() else "this MPI"
    launched = launched_tasks(env)
    if "Open MPI" in library:
        fix = "use 'srun --mpi=pmix' (Open MPI) or 'mpiexec -n N'"
    elif "MPICH" in library or "Intel" in library:
        fix = "use 'srun --mpi=pmi2' (MPICH, Intel MPI) or 'mpiexec -n N'"
    else:
        fix = "use 'srun --mpi=pmix' (Open MPI), 'srun --mpi=pmi2' (MPICH) or 'mpiexec -n N'"
    if launched is not None:
        name, n = launched
        return (
            f"this process is an MPI world of size 1, but {name}={n} says the launcher started "
            f"{n} processes: each one is a world of its own ({lib} found no process manager it "
            f"speaks), a master without workers; {fix}. Full advice: {LAUNCH_FIX}. "
            "Not resumable: fix the launch line"
        )
    return (
        "the master has no workers: this is an MPI world of size 1 (run the campaign script "
        f"on 2 or more ranks: 'mpiexec -n 4 python campaign.py'; under Slurm {fix}). "
        "Not resumable: fix the launch line"
    )


def require_workers(comm: object) -> None:
    """Raise :class:`~durable_dispatch.errors.ConfigurationError` when ``comm`` (an mpi4py
    communicator) cannot run a campaign (see :func:`check_world`); call it before anything is
    opened.

    Raises:
        ConfigurationError: a world of size 1, with the fix in its message.
    """
    size = comm.Get_size()  # type: ignore[attr-defined]
    if size > 1:
        return
    try:
        from mpi4py import MPI

        library = MPI.Get_library_version()
    except Exception:  # noqa: BLE001 - only the message's wording depends on it
        library = ""
    why = check_world(size, os.environ, library)
    if why is not None:
        raise ConfigurationError(why)
