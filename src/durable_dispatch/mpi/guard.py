"""An unhandled exception on any rank ends the whole MPI job, never hangs it.

The commonest failure of a real job is a bug in the user's own script: an exception on rank 0
before ``run_master`` (a bad path, a typo, an item builder that fails), after it returned, or on
a worker before ``run_worker``. Python then exits through ``MPI_Finalize``, which in Open MPI and
MPICH waits for every other rank, while the other ranks wait for a message that never comes: the
job burns its whole allocation. mpi4py's own remedy is ``python -m mpi4py script.py``, which calls
``MPI_Abort`` on an unhandled exception; a user should not need to know it.

Importing :mod:`durable_dispatch.mpi` installs :func:`abort_on_unhandled` as ``sys.excepthook``
(chained: the previous hook prints the traceback first). When an exception reaches the top of a
process in which MPI is initialised, not finalised, and ``COMM_WORLD`` has more than one rank, the
hook prints the error, flushes the standard streams, waits until the launcher has read them
(:func:`_drain`) and calls ``MPI_Abort(COMM_WORLD, 1)``, which ends every rank of the job
(ULFM: see below). In a single-rank run, outside MPI, and inside an isolated child (which
never initialises MPI) it only prints, as Python does.

Under ULFM (``mpiexec --with-ft ulfm``) the runtime tolerates a failed process, and an
``MPI_Abort`` ends only the aborting process without the others ever being told. So there the
hook ends its own process with SIGKILL, which the others do learn of: a worker whose master is
gone stops (and the job ends non-zero), a master whose worker is gone rolls its work back and
goes on with the others (what ULFM is for; the error is printed). Open MPI's ``MPI_Finalize``
can then wait forever for the dead process (open-mpi/ompi#11404), so once a rank has seen a peer
fail (:func:`peer_failed`) an ``atexit`` hook, which runs before mpi4py finalises MPI, ends the
process with ``os._exit`` instead: status 1 after an unhandled exception or when the master
died, else 0 (the status of a ``sys.exit(n)`` is not visible there: call
:func:`durable_dispatch.mpi.finish` with it).

``sys.exit(code)`` bypasses ``sys.excepthook`` (Python handles ``SystemExit`` before it), so a
script that ends a rank early that way should call ``MPI.COMM_WORLD.Abort(code)`` itself.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from types import TracebackType
from typing import Any

from .context import CHILD_MARKER
from .transport import ulfm_mode

__all__ = [
    "install",
    "abort_on_unhandled",
    "job_to_abort",
    "peer_failed",
    "exit_now",
    "exit_status",
    "master_failed",
]

_previous: Any = None
_seen = {"unhandled": False, "peer_failed": False, "master_failed": False}


def job_to_abort() -> Any:
    """``COMM_WORLD`` when an exit of this process would leave other ranks waiting (MPI
    initialised and not finalised, more than one rank, not an isolated child); else None."""
    if os.environ.get(CHILD_MARKER):
        return None
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return None
    try:
        if not mpi.Is_initialized() or mpi.Is_finalized():
            return None
        world = mpi.COMM_WORLD
        return world if world.Get_size() > 1 else None
    except Exception:  # noqa: BLE001 - a broken runtime: nothing to abort through
        return None


def abort_on_unhandled(
    kind: type[BaseException], value: BaseException, tb: TracebackType | None
) -> None:
    """``sys.excepthook``: print the error as Python does, then, in a multi-rank MPI job, end
    the whole job with ``MPI_Abort`` (see the module's docs)."""
    _seen["unhandled"] = True
    hook = _previous if _previous is not None else sys.__excepthook__
    try:
        hook(kind, value, tb)
    finally:
        world = job_to_abort()
        if world is not None:
            rank = world.Get_rank()
            if ulfm_mode(world):
                # Under ULFM an MPI_Abort (or an exit without MPI_Finalize) is not reported to
                # the other ranks (measured: none saw it within 8 s), while a process killed by
                # a signal is, within a second: a master's workers then stop, and a worker's
                # master rolls its work back and goes on without it.
                how = "this rank ends (ULFM: the others see it fail and stop or go on)"
            else:
                how = "ending the whole MPI job (MPI_Abort)"
            print(
                f"durable-dispatch: unhandled {kind.__name__} on rank {rank}: {how}, so that "
                "no rank waits for it forever",
                file=sys.stderr,
            )
            _flush()
            _drain()
            if ulfm_mode(world):
                os.kill(os.getpid(), signal.SIGKILL)
            world.Abort(1)


def peer_failed(*, master: bool = False) -> None:
    """Note that a rank of this job died (ULFM told us): this process then leaves with
    ``os._exit`` at exit instead of waiting in ``MPI_Finalize`` for the dead one, with status 1
    when the dead one was the ``master`` (the job failed) or this process had an unhandled
    exception, else 0."""
    _seen["peer_failed"] = True
    _seen["master_failed"] = _seen["master_failed"] or master


def master_failed() -> bool:
    """True once this process learnt that rank 0 (the master) died (:func:`peer_failed`)."""
    return _seen["master_failed"]


def exit_status(code: int) -> int:
    """The status this process ends with when it asked for ``code``: 1 instead of 0 once its
    master died or an exception went unhandled, so a job whose master was killed never ends
    with status 0 (under ULFM ``mpiexec`` reports the status of the ranks that exited)."""
    if code == 0 and (_seen["unhandled"] or _seen["master_failed"]):
        return 1
    return code


def exit_now(code: int) -> None:
    """Flush the standard streams and leave at once (``os._exit``), without ``MPI_Finalize``."""
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _drain(timeout: float = 2.0) -> None:
    """Wait (at most ``timeout`` seconds) until the launcher has read what this process wrote to
    its standard output and error, when they are pipes (``FIONREAD`` on a pipe counts the bytes
    not read yet). ``MPI_Abort`` ends the job at once: MPICH's Hydra then dropped what its proxy
    had not read yet, and the user saw ``Traceback (most recent call last):`` and nothing else
    (about 1 run in 8 here). The proxy forwards what it read before it handles the abort."""
    import array
    import fcntl
    import stat
    import termios
    import time

    end = time.monotonic() + timeout
    unread = array.array("i", [0])
    for fd in (1, 2):
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue
            while time.monotonic() < end:
                fcntl.ioctl(fd, termios.FIONREAD, unread, True)
                if unread[0] == 0:
                    break
                time.sleep(0.002)
        except OSError:
            continue


def _at_exit() -> None:
    """Before mpi4py finalises MPI (it does so after every ``atexit`` hook has run)."""
    if not _seen["peer_failed"] or os.environ.get(CHILD_MARKER):
        return
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return
    if ulfm_mode(mpi.COMM_WORLD):
        exit_now(1 if _seen["unhandled"] or _seen["master_failed"] else 0)


def install() -> None:
    """Make :func:`abort_on_unhandled` the process's ``sys.excepthook`` (once; chained to the
    hook in force)."""
    global _previous
    if sys.excepthook is abort_on_unhandled:
        return
    _previous = sys.excepthook
    sys.excepthook = abort_on_unhandled
    atexit.register(_at_exit)
