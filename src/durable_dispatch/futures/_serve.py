"""The worker ranks' side of the futures executor: sessions, and the task that runs a call.

A worker rank of the runner (``python -m durable_dispatch.futures``), or a non-root rank inside
a :class:`~durable_dispatch.futures.DurableCommExecutor`, waits in :func:`serve` for the master's
messages on two tags of its own, outside the dispatch protocol: ``SESSION`` opens one
executor's session on a communicator of its own, served by a thread (``run_worker`` until that
executor's STOP), so that several executors open at once share the workers; ``EXIT`` ends
:func:`serve`. A session's first message, on its communicator, is the executor's set-up, pickled
by rank 0 (a trusted peer, never read from disk): the state directory's key, whether to isolate,
the memory limit and the initializer.

:class:`Task` is the work function of a session: it checks the call's HMAC tag (see
:mod:`._seal`), unpickles it, calls it, and seals what it returned or raised. An exception the
call raised is its outcome (committed, not retried, as in the standard library); only a crash,
a hang or a result that cannot be kept is a failure of the task (a retry, then ``TaskFailed``).

The initializer runs once per process that runs calls: in the isolated child when it loads the
task (so a child restarted after a crash runs it again), else in the worker rank before its first
READY. An initializer that raises ends the worker's part in that session (the master sees it
GONE); when every worker's fails, the executor is broken (``BrokenExecutor``), as in the
standard library.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import time
import traceback
import types
from concurrent.futures import BrokenExecutor
from typing import Any

from ..errors import DependencyFailed, IsolationError
from ..mpi import guard
from ..mpi import protocol as P
from ..mpi.context import WorkContext
from ._calls import put_values
from ._seal import Sealer

__all__ = [
    "SESSION",
    "EXIT",
    "Task",
    "serve",
    "open_session",
    "threads_shared",
    "exit_workers",
    "get_comm_workers",
]

log = logging.getLogger("durable_dispatch.futures")

SESSION, EXIT = 31, 32  # tags of the executor's own messages (the protocol's are 11-16)
_TB_CHARS = 32 << 10  # a traceback is kept up to this many characters (its end)
_here = threading.local()  # the workers' communicator of the call this thread runs


def _load_task(config: bytes) -> Task:
    """How an isolated child builds the task (the pickle of a :class:`Task` calls this): it runs
    the initializer there, so a failing one stops the child from starting."""
    task = Task(config)
    task.initialize()
    return task


class Task:
    """The work function of one executor's session (see the module docs).

    Args:
        config: the session's set-up, pickled: ``key``, ``dir``, ``init`` (the pickled
            ``(initializer, initargs)`` or None), ``isolate``, ``memory_limit``.
    """

    def __init__(self, config: bytes) -> None:
        self._config = config
        c = pickle.loads(config)
        self.sealer = Sealer(c["key"], c["dir"])
        self._init: bytes | None = c["init"]
        self.comm_workers: Any = None  # get_comm_workers() in a call run by a worker rank

    def __reduce__(self) -> tuple[Any, ...]:
        return (_load_task, (self._config,))

    def initialize(self) -> None:
        """Set up this process for the executor's calls: its ``path``, ``wdir``, ``env`` and
        ``globals`` (mpi4py's keywords), then its initializer (if it has one)."""
        c = pickle.loads(self._config)
        for p in c.get("path") or ():
            if p not in sys.path:
                sys.path.append(p)
        if c.get("wdir"):
            os.chdir(c["wdir"])
        os.environ.update(c.get("env") or {})
        if c.get("globals"):
            main = sys.modules.get("__mp_main__") or sys.modules["__main__"]
            # the module, and the namespace its functions see (runpy runs a script in a dict
            # of its own, which multiprocessing's spawn copies into the module)
            spaces = [vars(main)] + [
                f.__globals__
                for f in vars(main).values()
                if isinstance(f, types.FunctionType) and f.__module__ == main.__name__
            ]
            for space in {id(d): d for d in spaces}.values():
                space.update(c["globals"])
        if self._init is not None:
            fn, args = pickle.loads(self._init)
            fn(*args)

    def __call__(self, payload: Any, ctx: WorkContext) -> dict[str, Any]:
        """Run one task: its sealed result (JSON)."""
        wid = ctx.work_id
        data = self.sealer.check_call(wid, payload)  # a tag that fails is no outcome
        digest = payload["d"]
        if payload.get("chunk"):
            return self._chunk(wid, digest, data)
        try:
            fn, args, kwargs = pickle.loads(data)  # an argument that cannot be unpickled
            if ctx.dependencies:  # futures of the same executor among the arguments (G4)
                failed = self._dependency_failed(wid, ctx.dependencies)
                if failed is not None:
                    return self._raised(wid, digest, failed)
                args, kwargs = put_values(args, kwargs, self._opened(ctx.dependencies))
            _here.comm = self.comm_workers
            try:
                value = fn(*args, **kwargs)  # raises here, as the call would (as in mpi4py)
            finally:
                _here.comm = None
        except BaseException as e:  # noqa: BLE001 - the call's outcome, kept and re-raised
            return self._raised(wid, digest, e)
        try:
            return self.sealer.seal_result(wid, digest, "ok", value)
        except Exception as e:  # noqa: BLE001 - a value pickle cannot hold
            return self._raised(wid, digest, e)

    def _chunk(self, wid: str, digest: str, data: bytes) -> dict[str, Any]:
        """Run a chunk of a ``map``: its calls in order, each one's outcome kept; sealed once, as
        ``(values, raised)``: the values in order (None where the call raised) and, for each
        call that raised, its position -> ``(exception, traceback text)``."""
        try:
            fn, calls = pickle.loads(data)
        except BaseException as e:  # noqa: BLE001 - the chunk's outcome: its calls fail
            return self._raised(wid, digest, e)
        values: list[Any] = []
        raised: dict[int, tuple[BaseException, str]] = {}
        append = values.append
        _here.comm = self.comm_workers
        try:
            for i, args in enumerate(calls):
                try:
                    append(fn(*args))
                except BaseException as e:  # noqa: BLE001 - this call's outcome (as one call's)
                    append(None)
                    raised[i] = (_portable(e), _traceback(e))
        finally:
            _here.comm = None
        try:
            return self.sealer.seal_result(wid, digest, "ok", (values, raised))
        except Exception:  # noqa: BLE001 - some value pickle cannot hold: that call raises
            for i, v in enumerate(values):
                try:
                    pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as e:  # noqa: BLE001 - its own pickling error, at its place
                    values[i] = None
                    raised[i] = (_portable(e), _traceback(e))
            return self.sealer.seal_result(wid, digest, "ok", (values, raised))

    def _dependency_failed(self, wid: str, results: Any) -> DependencyFailed | None:
        """The failure of a call one of whose dependencies raised (its committed outcome), or
        None when each returned a value."""
        for dep, result in results.items():
            how, _data = self.sealer.check_result(dep, result)
            if how != "ok":
                return DependencyFailed(
                    f"the task never ran: its dependency {dep} raised", work_id=wid, dependency=dep
                )
        return None

    def _opened(self, results: Any) -> Any:
        def value(dep: str) -> Any:
            return self.sealer.open_result(dep, results[dep])[1]

        return value

    def _raised(self, wid: str, digest: str, e: BaseException) -> dict[str, Any]:
        tb = _traceback(e)
        try:
            pickle.loads(pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL))
            return self.sealer.seal_result(wid, digest, "raised", e, tb)
        except Exception:  # noqa: BLE001 - an exception that does not survive a pickle
            stand_in = RuntimeError(f"{type(e).__name__}: {e}")
            return self.sealer.seal_result(wid, digest, "raised", stand_in, tb)


def _traceback(e: BaseException) -> str:
    """The text of ``e``'s traceback, its end up to ``_TB_CHARS`` characters."""
    return "".join(traceback.format_exception(e))[-_TB_CHARS:]


def _portable(e: BaseException) -> BaseException:
    """``e`` if it survives a pickle, else a ``RuntimeError`` that names it (as for one call)."""
    try:
        pickle.loads(pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL))
        return e
    except Exception:  # noqa: BLE001 - an exception that does not survive a pickle
        return RuntimeError(f"{type(e).__name__}: {e}")


def serve(comm: Any = None) -> int:
    """Serve the master's executors until it says EXIT, or (ULFM) until it is gone; returns how
    many sessions were served.

    Rank 0 is the master. Each ``SESSION`` opens one executor's session on a communicator of
    its own (``comm.Dup()``, collective: rank 0 makes it too; with ``isolate=False`` also the
    workers' communicator, :func:`_workers_comm`), served by a thread of this rank
    (``run_worker`` until that executor's STOP), so that executors open at once share the
    workers and their messages never meet. Where MPI gives fewer threads than
    ``MPI_THREAD_MULTIPLE``, a session is served in this thread and rank 0 opens one executor
    at a time. Between messages this rank polls with naps (up to 10 ms), so an idle worker does
    not take a core from a master that computes.
    """
    from mpi4py import MPI

    comm = comm if comm is not None else MPI.COMM_WORLD
    status = MPI.Status()
    sessions = 0
    threads: list[threading.Thread] = []
    failed: list[BaseException] = []  # an error of a session's thread ends the rank (U8)
    while True:
        nap = 0.0001
        try:
            while not comm.Iprobe(source=0, tag=MPI.ANY_TAG, status=status):
                if failed:
                    raise failed[0]
                time.sleep(nap)
                nap = min(nap * 2, 0.01)
        except MPI.Exception as e:  # ULFM: the master died between two sessions
            guard.peer_failed(master=True)
            log.warning("worker %d: the master (rank 0) is gone (%s)", comm.Get_rank(), e)
            _join(threads)
            return sessions
        buf = bytearray(status.Get_count(MPI.BYTE))
        tag = status.Get_tag()
        comm.Recv([buf, MPI.BYTE], source=0, tag=tag)
        if tag == EXIT:
            _join(threads)
            if failed:
                raise failed[0]
            return sessions
        if tag != SESSION:
            continue  # a stray: not ours
        try:
            sub = comm.Dup()  # the session's own communicator (rank 0 makes it too)
        except MPI.Exception as e:  # ULFM: a rank died; rank 0's executor is broken
            guard.peer_failed()
            log.warning("worker %d: the session could not be opened: %s", comm.Get_rank(), e)
            continue
        serves = buf[:1] == b"1"  # else this rank does not serve it (max_workers)
        workers = _workers_comm(sub, serves) if buf[1:2] == b"w" else None
        if not serves:
            continue
        sessions += 1
        if not threads_shared():
            _session(sub, failed, workers)
            if failed:
                raise failed[0]
            if guard.master_failed():  # ULFM: the session ended because the master died
                return sessions
            continue
        threads = [t for t in threads if t.is_alive()]
        t = threading.Thread(
            target=_session,
            args=(sub, failed, workers),
            name="durable-dispatch-session",
            daemon=True,
        )
        t.start()
        threads.append(t)


def threads_shared() -> bool:
    """True when MPI serves every thread at once (``MPI_THREAD_MULTIPLE``): then sessions of
    several executors may run at once."""
    from mpi4py import MPI

    return bool(MPI.Query_thread() >= MPI.THREAD_MULTIPLE)


def _join(threads: list[threading.Thread], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))


def _workers_comm(sub: Any, serves: bool) -> Any:
    """The communicator of the workers serving a session (``get_comm_workers()``), made by
    every rank of ``sub`` at once, rank 0 and the ranks that do not serve included (they get
    none): a ``Split`` ordered by rank, so its rank ``i`` is worker rank ``i + 1``. Returns the
    ``MPI.Exception`` instead when it failed: under ULFM a rank of the job died while the
    session started.

    A collective over ``sub`` whole, not ``Create_group`` over the workers only: under Open
    MPI's ULFM (5.0.x, measured) a ``Create_group`` one of whose members died never returned,
    not even once ``sub`` was revoked, while ``Split``, ``Create`` and ``Dup`` over ``sub``
    raise ``MPI_ERR_PROC_FAILED`` at once on every live rank."""
    from mpi4py import MPI

    try:
        return sub.Split(0 if serves else MPI.UNDEFINED, sub.Get_rank())
    except MPI.Exception as e:
        guard.peer_failed()  # MPI_Finalize may wait for the dead rank forever
        log.warning("rank %d: the workers' communicator could not be made: %s", sub.Get_rank(), e)
        return e


def _session(sub: Any, failed: list[BaseException], workers: Any = None) -> None:
    """Serve one executor on its communicator ``sub``: its set-up (``SESSION``), then
    ``run_worker`` until its STOP. A STOP (or EXIT) instead of the set-up: its master could not
    start. ``workers``: what :func:`_workers_comm` made (with ``isolate=False``); when that
    failed, this rank tells the master it is gone and waits for the next session."""
    from mpi4py import MPI

    from ..mpi.worker import run_worker

    status = MPI.Status()
    try:
        nap = 0.0001
        try:
            while not sub.Iprobe(source=0, tag=MPI.ANY_TAG, status=status):
                time.sleep(nap)
                nap = min(nap * 2, 0.01)
        except MPI.Exception as e:  # ULFM: the master died
            guard.peer_failed(master=True)
            log.warning("worker %d: the master (rank 0) is gone (%s)", sub.Get_rank(), e)
            return
        buf = bytearray(status.Get_count(MPI.BYTE))
        tag = status.Get_tag()
        sub.Recv([buf, MPI.BYTE], source=0, tag=tag)
        if tag != SESSION:
            return  # its master could not start (it sent STOP)
        config = bytes(buf)
        c = pickle.loads(config)
        task = Task(config)
        if not c["isolate"]:  # the calls run in this rank: they may reach the other workers
            error = None
            if workers is None or isinstance(workers, MPI.Exception):
                error = (
                    "the workers' communicator could not be made (a rank of the job failed "
                    f"while the executor's session started): {workers}"
                )
            else:
                task.comm_workers = workers
                try:
                    task.initialize()
                except BaseException as e:  # noqa: BLE001 - the master learns it (GONE)
                    error = f"the initializer failed: {type(e).__name__}: {e}"
            if error is not None:
                log.error("worker %d: %s", sub.Get_rank(), error)
                try:
                    sub.Send([P.encode({"error": error}), MPI.BYTE], dest=0, tag=P.GONE)
                except MPI.Exception as e:  # ULFM: the master died too
                    guard.peer_failed(master=True)
                    log.warning("worker %d: the master (rank 0) is gone (%s)", sub.Get_rank(), e)
                return
        try:
            run_worker(
                task,
                comm=sub,
                context=True,
                isolate=c["isolate"],
                memory_limit=c["memory_limit"],
                max_result_bytes=c["max_result"],
                child_mpi=True,  # a script that calls MPI when imported (most mpi4py scripts)
            )
        except IsolationError as e:  # it told the master (GONE); wait for the next session
            log.error("worker %d: %s", sub.Get_rank(), e)
    except BaseException as e:  # noqa: BLE001 - raised by serve() in the rank's main thread
        failed.append(e)
    # ``sub`` is never freed: a message still unreceived on it (a STOP that crossed the
    # session's end) would match a later communicator given its context ID (MPICH reuses them)


def get_comm_workers() -> Any:
    """The communicator of the worker ranks serving the executor whose call is running, from
    inside that call (as mpi4py's ``get_comm_workers``): rank ``i`` of it is worker rank
    ``i + 1``. Calls run in the worker rank only with ``isolate=False``; an isolated child is
    not an MPI rank of the job.

    Raises:
        RuntimeError: not called from a call an executor runs in a worker rank (rank 0, or an
            isolated child, or no call).
    """
    from ..mpi.context import CHILD_MARKER

    comm = getattr(_here, "comm", None)
    if comm is not None:
        return comm
    if os.environ.get(CHILD_MARKER):
        raise RuntimeError(
            "get_comm_workers() is called in an isolated child process, which is not an MPI "
            "rank of the job: make the executor with isolate=False to run the calls in the "
            "worker ranks"
        )
    raise RuntimeError("get_comm_workers() is called outside a call run by a worker rank")


def open_session(comm: Any, workers: int, *, shared: bool = False) -> Any:
    """Rank 0: open an executor's session on every other rank of ``comm`` (the first
    ``workers`` of them serve it) and return its own communicator (``comm.Dup()``); the
    executor then sends its set-up on it (``SESSION``) and runs its master loop there.
    ``shared`` (``isolate=False``): every rank also makes the workers' communicator
    (:func:`_workers_comm`; rank 0 takes part and gets none). Where that fails (under ULFM a
    rank died meanwhile) the worker says so (GONE); with no worker left the executor is broken
    (``BrokenExecutor``), and the state directory resumes.

    Raises:
        BrokenExecutor: under ULFM, a rank of the job died before the session's communicator
            was made (every live rank's ``Dup`` fails; the workers wait for the next session).
    """
    from mpi4py import MPI

    with _opening:  # one collective at a time on ``comm`` (executors made in two threads)
        for r in range(1, comm.Get_size()):
            flag = (b"1" if r <= workers else b"0") + (b"w" if shared else b"")
            try:
                comm.Send([flag, MPI.BYTE], dest=r, tag=SESSION)
            except MPI.Exception as e:  # ULFM: that rank died (the others go on to the Dup)
                log.warning("the session could not be opened on rank %d: %s", r, e)
        try:
            sub = comm.Dup()
        except MPI.Exception as e:  # ULFM: a rank of the job died (every live rank sees it)
            guard.peer_failed()
            raise BrokenExecutor(
                f"the executor's session could not be opened: a rank of the job failed ({e}); "
                "run the script again on the same state directory"
            ) from e
        if shared:
            _workers_comm(sub, False)
        return sub


_opening = threading.Lock()


def exit_workers(comm: Any = None, timeout: float = 10.0) -> bool:
    """Send EXIT to every other rank of ``comm`` (each leaves :func:`serve`); False when some
    send did not complete within ``timeout``."""
    from ..mpi.transport import MpiTransport

    link = MpiTransport(comm)
    return link.stop(range(1, link.size), b"", EXIT, timeout)
