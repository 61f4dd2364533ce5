"""mpi4py.futures, durable: the same API, and a crash, a hang or a restart loses nothing.

Change one line of an mpi4py.futures script::

    from durable_dispatch.futures import MPIPoolExecutor   # was: from mpi4py.futures import ...

and run it with ``mpiexec -n 4 python -m durable_dispatch.futures --state-dir D script.py``
(also ``-m module`` and ``-c command``): rank 0 runs the script, the other ranks serve its
executors. Every call is a task with a stable work ID (a digest of the call), committed durably
in the executor's state directory before its future resolves, so a re-run after a crash or a
batch system's time limit resolves what was committed from the record and runs only the rest.
With ``isolate=True`` (the default) a call that segfaults or hangs fails only its own future
(:class:`TaskCrashed`, :class:`TaskTimedOut`); an exception it raises is re-raised from
``result()`` as in the standard library, with the worker's traceback as its ``__cause__``.

``DurableCommExecutor`` (``MPICommExecutor``) is the collective form for scripts every rank
runs::

    with DurableCommExecutor(MPI.COMM_WORLD, 0, state_dir="state") as ex:
        if ex is not None:          # rank 0; the other ranks served it and get None
            print(list(ex.map(f, range(100))))

See ``docs/futures.md``.
"""

from __future__ import annotations

from concurrent.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    BrokenExecutor,
    CancelledError,
    Executor,
    Future,
    InvalidStateError,
    TimeoutError,
    as_completed,
    wait,
)
from types import TracebackType
from typing import Any

from ..errors import DependencyFailed, TaskCrashed, TaskFailed, TaskTimedOut, UsageError
from ._executor import STATE_DIR_ENV, DurableExecutor
from ._serve import get_comm_workers
from ._util import collect, compose

__all__ = [
    "DurableExecutor",
    "DurableCommExecutor",
    "MPIPoolExecutor",
    "MPICommExecutor",
    "TaskFailed",
    "TaskCrashed",
    "TaskTimedOut",
    "DependencyFailed",
    "STATE_DIR_ENV",
    "Executor",
    "Future",
    "wait",
    "as_completed",
    "FIRST_COMPLETED",
    "FIRST_EXCEPTION",
    "ALL_COMPLETED",
    "CancelledError",
    "TimeoutError",
    "BrokenExecutor",
    "InvalidStateError",
    "collect",
    "compose",
    "get_comm_workers",
]
# ``ThreadPoolExecutor`` and ``ProcessPoolExecutor`` are attributes (below), not in ``__all__``:
# a ``*`` import, or the reference's build, must not start MPI.


def __getattr__(name: str) -> Any:
    """``ThreadPoolExecutor`` and ``ProcessPoolExecutor`` are mpi4py.futures' own (not durable:
    a pool of threads, or of processes it spawns, with no state directory), imported when first
    asked for, since importing ``mpi4py.futures`` starts MPI, which importing this package must
    not."""
    if name in ("ThreadPoolExecutor", "ProcessPoolExecutor"):
        import mpi4py.futures

        return getattr(mpi4py.futures, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DurableCommExecutor:
    """A context manager every rank of ``comm`` enters: on ``root`` it gives a
    :class:`DurableExecutor` served by the other ranks; on the others it serves until the root
    leaves its ``with`` block, then gives None (like mpi4py's ``MPICommExecutor``).

    Under the runner (``python -m durable_dispatch.futures``) only rank 0 runs the script and
    the other ranks already serve its executors (mpi4py's shared pool): there the block gives
    rank 0 an executor served by them, ``comm`` and ``root`` are not used, and leaving the
    block shuts down that executor only.

    On a communicator of one rank (``MPI.COMM_SELF``) the calls run in a thread of that rank,
    as in mpi4py's: durable all the same, but not isolated (a crash ends the rank, a hang holds
    the executor, ``task_timeout`` cannot stop a call).

    Entering the same instance again while it is entered raises ``RuntimeError``, as mpi4py's.

    Args:
        comm: the communicator (``MPI.COMM_WORLD`` by default).
        root: the rank that submits; it must be 0 (the master of this library is rank 0).
        **kwargs: the :class:`DurableExecutor`'s keyword arguments (``state_dir=`` ...).

    Raises:
        UsageError: ``root`` is not 0 (a ``ValueError``, as mpi4py's for a root out of range).
    """

    def __init__(self, comm: Any = None, root: int = 0, **kwargs: Any) -> None:
        if root != 0:
            raise UsageError(f"root must be 0 (the master is rank 0), got {root!r}")
        self._comm, self._kw = comm, kwargs
        self._entered = False
        self._ex: DurableExecutor | None = None
        self._runner = False

    def __enter__(self) -> DurableExecutor | None:
        if self._entered:
            raise RuntimeError("this MPICommExecutor is entered already (its 'with' block)")
        self._entered = True
        try:
            return self._enter()
        except BaseException:
            self._entered = False
            raise

    def _enter(self) -> DurableExecutor | None:
        from mpi4py import MPI

        from . import _executor, _serve

        if _executor.JOB["runner"]:
            # under the runner the job's ranks already serve rank 0's executors (mpi4py's
            # shared pool): the block is an executor of those, and leaving it ends only it
            self._ex = DurableExecutor(**self._kw)
            self._runner = True
            return self._ex
        comm = self._comm if self._comm is not None else MPI.COMM_WORLD
        self._comm = comm
        if comm.Get_rank() != 0:
            _serve.serve(comm)
            return None
        try:
            self._ex = DurableExecutor(_comm=comm, **self._kw)
        except BaseException:
            self._exit_workers()
            raise
        return self._ex

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        ex, self._ex, self._entered = self._ex, None, False
        if ex is None:
            return
        try:
            ex.shutdown(wait=True)
        finally:
            if not self._runner:
                self._exit_workers()

    def _exit_workers(self) -> None:
        from ._serve import exit_workers

        exit_workers(self._comm)


#: mpi4py.futures' name for :class:`DurableExecutor`.
MPIPoolExecutor = DurableExecutor
#: mpi4py.futures' name for :class:`DurableCommExecutor`.
MPICommExecutor = DurableCommExecutor
