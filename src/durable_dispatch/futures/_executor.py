"""The durable executor: ``concurrent.futures`` on the campaign machinery (F1).

Rank 0's user code calls :meth:`DurableExecutor.submit`; a manager thread runs
:func:`~durable_dispatch.mpi.run_master` on the executor's state directory with a
:class:`~durable_dispatch.mpi.master.Feed` that takes the submitted calls as they come, and the
workers serve the session (:mod:`._serve`). Every call is a work item whose ID is the digest of
the call (:mod:`._calls`), its payload the sealed pickle of the call (:mod:`._seal`); its
result, once committed durably, resolves its future. So a re-run of the same script on the same
state directory resolves every committed call from the record at ``submit``, without running it,
and runs only the rest. A chunked ``map`` (``chunksize > 1``) submits one work item per chunk of
calls instead (:mod:`._chunks`).

This module is the submit side (:class:`DurableExecutor`); its manager side, the feed through
which the calls enter the campaign, is :mod:`._feed`. The two share one part, the executor's
record of its calls (:class:`~._board.Board`: the queue of submitted calls, the committed and
failed outcomes, the flags and events of a shutdown), and nothing else of each other.

Threads. ``submit`` (any thread) seals the call and queues it; only the manager thread touches
the campaign state: it resolves futures (their callbacks run there, as in the standard library),
marks a future running when its call is sent to a worker (``CampaignState.on_dispatch``: a
dispatch is sent whole, so all its calls are running; a cancelled future never is), and fails
the futures whose items were deferred. The calls enter the frontier ahead of the workers (the
next two dispatches per worker), still pending: ``shutdown(cancel_futures=True)`` cancels every
call not sent yet, withdrawing those in the frontier from this run (``Ledger.withdraw``: in
memory; they stay pending in the state directory, and a re-run that submits them runs them).
Several executors may be open at once: each has its own master loop (manager thread) and its
own communicator on every rank (``_serve.open_session``), and the workers serve them all.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import (
    BrokenExecutor,
    Executor,
    Future,
)
from typing import Any

from ..core import RetryPolicy, WatchdogConfig, WorkItem
from ..errors import UsageError
from ..mpi.context import MAX_RESULT_BYTES
from ..mpi.master import MasterReport, run_master
from ..storage import fs
from . import _serve
from ._board import Board
from ._calls import call_digest, call_id, chunk_digest, function_name, take_dependencies
from ._chunks import chunked_map
from ._feed import _CallFeed, _cancel
from ._local import InThread
from ._outcomes import gather

__all__ = ["DurableExecutor", "STATE_DIR_ENV"]

log = logging.getLogger("durable_dispatch.futures")

#: The environment variable that names the state directory of executors made without one.
STATE_DIR_ENV = "DURABLE_DISPATCH_STATE_DIR"

#: The job's runner state: whether the runner runs the script (``runner``), its
#: ``--state-dir`` (``state_dir``), how many executors took their directory from it (``made``),
#: and the executors open now (``open``).
JOB: dict[str, Any] = {"runner": False, "state_dir": None, "made": 0, "open": set()}
_executors: list[DurableExecutor] = []  # the runner shuts down those the script left open


class _Subset:
    """The first ``n`` workers of a transport (``max_workers``): the others idle unasked."""

    def __init__(self, link: Any, n: int) -> None:
        self._link, self.size, self.ulfm = link, n + 1, link.ulfm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._link, name)


def _checked_arguments(
    max_workers: int | None, initializer: Any, task_timeout: float | None, comm: Any
) -> int | None:
    """``max_workers`` (or ``MPI4PY_FUTURES_MAX_WORKERS``), the other arguments checked.

    Raises:
        UsageError: a bad ``max_workers`` or ``task_timeout``, or no runner and no communicator.
        TypeError: an ``initializer`` that is not callable.
    """
    if max_workers is None and os.environ.get("MPI4PY_FUTURES_MAX_WORKERS"):
        max_workers = int(os.environ["MPI4PY_FUTURES_MAX_WORKERS"])
    if max_workers is not None and (type(max_workers) is not int or max_workers <= 0):
        raise UsageError(f"max_workers must be an integer > 0, got {max_workers!r}")
    if initializer is not None and not callable(initializer):
        raise TypeError("initializer must be a callable")
    if task_timeout is not None and not task_timeout > 0:
        raise UsageError(f"task_timeout must be > 0 seconds, got {task_timeout!r}")
    if comm is None and not JOB["runner"]:
        raise UsageError(
            "a DurableExecutor needs worker ranks: run the script with "
            "'mpiexec -n N python -m durable_dispatch.futures script.py', or use "
            "DurableCommExecutor (collective) in a script every rank runs"
        )
    return max_workers


class DurableExecutor(Executor):
    """A ``concurrent.futures.Executor`` whose calls survive a crash (see the module docs).

    Names and argument positions are mpi4py's ``MPIPoolExecutor``'s; everything new is
    keyword-only. Run the script with ``mpiexec -n N python -m durable_dispatch.futures
    script.py``: rank 0 runs the script, the other ranks serve its executors (several may be open
    at once: they share the workers, each with its own state directory).

    Args:
        max_workers: how many worker ranks serve it (default: all); ``<= 0`` is a ValueError.
        initializer: called with ``initargs`` once in each process that runs calls (the isolated
            child, restarted after a crash, runs it again); if it raises, the executor is
            broken (``BrokenExecutor``).
        initargs: the initializer's arguments.
        state_dir: the state directory (an ordinary campaign directory: ``read_results`` and
            the CLI read it). Default: ``<D>/executor-<k>`` for the ``k``-th executor (from 1)
            the script makes without one, where ``D`` is the runner's ``--state-dir`` or
            ``$DURABLE_DISPATCH_STATE_DIR``; with none of them it is a UsageError (there is no
            undurable mode).
        isolate: run each call in a supervised child process (default): a segfault fails only
            its future (:class:`~durable_dispatch.errors.TaskCrashed`), a hang past
            ``task_timeout`` only its own (:class:`~durable_dispatch.errors.TaskTimedOut`).
        task_timeout: seconds a call may run (each attempt); None: the watchdog's deadline.
        retry: retry budgets per failure kind (``RetryPolicy``); default from the environment.
        sync: the state journal's sync policy.
        memory_limit: with ``isolate``, the child's address-space limit in bytes.
        watchdog: the watchdog's configuration (default from the environment).
        path: directories appended to ``sys.path`` where the calls run (mpi4py's).
        wdir: the working directory the calls run in (mpi4py's).
        env: variables set in the environment of the calls (mpi4py's).
        globals: names set in the script's module (``__mp_main__``) where the calls run, before
            the first (mpi4py's ``globals``).
        python_exe, python_args, mpi_info, main, use_pkl5, backoff: mpi4py's, accepted and
            ignored: nothing is spawned (the job's ranks are the pool, started by ``mpiexec``
            with the job's interpreter and MPI info, and the runner's workers import the script
            once, at start); the executor's messages are byte buffers of a bounded size, never
            pickled by MPI (so ``use_pkl5`` changes nothing); and a worker's idle polling is
            the dispatch protocol's own (a 2 ms spin, then naps doubling up to 1 ms, the
            length of mpi4py's default ``backoff``).

    Raises:
        UsageError: no state directory; not run under the runner (nor inside a
            ``DurableCommExecutor``); another executor of this job is still open where MPI
            is not ``MPI_THREAD_MULTIPLE``; no worker
            ranks; a bad argument (a ``ValueError`` too).
        LockHeldError: another master holds the state directory.
        BrokenExecutor: under ULFM, a rank of the job died as the executor opened its session
            on the workers (nothing ran; the state directory resumes).
        ValueCorruptError: the state directory holds a call or result whose tag fails.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
        *,
        state_dir: str | os.PathLike[str] | None = None,
        isolate: bool = True,
        task_timeout: float | None = None,
        retry: RetryPolicy | None = None,
        sync: str = "batch",
        memory_limit: int | None = None,
        watchdog: WatchdogConfig | None = None,
        python_exe: str | None = None,
        python_args: Iterable[str] | None = None,
        mpi_info: Any = None,
        globals: dict[str, Any] | None = None,  # noqa: A002 - mpi4py's name
        main: bool = True,
        path: Iterable[str] | None = None,
        wdir: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        use_pkl5: bool | None = None,
        backoff: float | None = None,
        _comm: Any = None,
    ) -> None:
        max_workers = _checked_arguments(max_workers, initializer, task_timeout, _comm)
        self._dir = _state_dir(state_dir)
        # Isolated children import the script as ``__mp_main__`` (as multiprocessing's spawn
        # does), so a value of a class the script defines comes back pickled as
        # ``__mp_main__.Name``: here that is the script's ``__main__``.
        sys.modules.setdefault("__mp_main__", sys.modules["__main__"])
        if JOB["open"] and not _serve.threads_shared():
            raise UsageError(
                "another executor of this job is still open, and this MPI serves one thread at "
                "a time (not MPI_THREAD_MULTIPLE), so its workers serve one executor at a "
                "time; shut it down first (or use one 'with' block after the other)"
            )
        comm, local = self._choose_workers(_comm, max_workers)
        init = None
        if initializer is not None:
            function_name(initializer)  # a TypeError now, not in every worker
            init = pickle.dumps((initializer, tuple(initargs)), protocol=pickle.HIGHEST_PROTOCOL)
        self._timeout = task_timeout
        # the record of the calls, shared with the manager thread (it is all the feed sees)
        self._board = Board(self._workers)
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._broken: str | None = None
        self._report: MasterReport | None = None
        self._feed = _CallFeed(self._board)
        fs.makedirs(self._dir)
        # the master loop's transport: an InThread, or the session's (which has ``comm``)
        link: Any = InThread() if local else self._open_link(shared=not isolate)
        self._link = link
        JOB["open"].add(self)
        self._start_manager(watchdog=watchdog, retry=retry, sync=sync)
        self._send_session(
            local,
            {
                "init": init,
                "isolate": bool(isolate),
                "memory_limit": memory_limit,
                "path": [os.fspath(p) for p in path or ()],
                "wdir": os.fspath(wdir) if wdir is not None else None,
                "env": {str(k): str(v) for k, v in (env or {}).items()},
                "globals": dict(globals) if globals else None,
            },
        )
        _executors.append(self)

    def _choose_workers(self, given: Any, max_workers: int | None) -> tuple[Any, bool]:
        """The communicator (``given``, or the world) and how many of its ranks serve (at most
        ``max_workers``); True when it is a communicator of one, whose calls run in a thread.

        Raises:
            UsageError: no worker ranks.
        """
        from mpi4py import MPI

        comm = given if given is not None else MPI.COMM_WORLD
        available = comm.Get_size() - 1
        # a communicator of one (MPICommExecutor(MPI.COMM_SELF)): the calls run in a thread
        local = given is not None and available == 0
        if available < 1 and not local:
            raise UsageError("no worker ranks: start the job with at least 2 processes")
        available = max(available, 1)
        self._workers: int = min(available, max_workers or available)
        self._comm = comm
        return comm, local

    def _start_manager(self, **kw: Any) -> None:
        """Start the manager thread (it runs the campaign) and wait until it read the record;
        an error it met there is raised here."""
        self._thread = threading.Thread(
            target=self._manage, name="durable-dispatch-executor", kwargs=kw, daemon=True
        )
        self._thread.start()
        board = self._board
        board.bound.wait()
        if board.error is not None:
            self._thread.join()
            raise board.error

    def _send_session(self, local: bool, settings: dict[str, Any]) -> None:
        """Send every worker the session: how to run the calls (``settings``), the state
        directory and the key that seals their results."""
        from mpi4py import MPI

        board = self._board
        assert board.sealer is not None
        session = pickle.dumps(
            {
                "key": board.sealer.key,
                "dir": self._dir,
                "max_result": MAX_RESULT_BYTES,
                "workers": self._workers,
                **settings,
            }
        )
        if local:
            self._link.start(session)
            return
        sub = self._link.comm
        for r in range(1, self._workers + 1):
            try:
                sub.Send([session, MPI.BYTE], dest=r, tag=_serve.SESSION)
            except MPI.Exception as e:  # ULFM: that rank died; the master loop sees it
                log.warning("the set-up of worker rank %d was not sent: %s", r, e)

    def _open_link(self, shared: bool) -> Any:
        """The session's own communicator on every worker (several executors open at once
        share the workers; their messages never meet), as the master loop's transport;
        ``shared``: the workers' communicator too (``get_comm_workers()``)."""
        from ..mpi.transport import MpiTransport

        comm = _serve.open_session(self._comm, self._workers, shared=shared)
        link: Any = MpiTransport(comm)
        if self._workers < link.size - 1:
            link = _Subset(link, self._workers)
        return link

    # ------------------------------------------------------------------ the manager
    def _manage(self, **kw: Any) -> None:
        why = "the executor was shut down"
        try:
            self._report = run_master(
                self._feed,
                self._dir,
                self._feed.committed,
                comm=self._link,
                batch="auto",
                linger=2.0,
                **kw,
            )
            if not self._report.finished and self._report.reason != "withdrawn":
                why = f"the executor's campaign stopped: {self._report.reason}"
                gone = self._feed.gone  # what the workers said: an isolated child that could
                if gone:  # not start says why, and the fix
                    why += f" (a worker ended: {gone[0]})"
                    if "IsolationError" in gone[0]:
                        why += "; or make the executor with isolate=False (no isolated child)"
                self._broken = why
                log.error("%s; %s resumes it", why, self._dir)
        except BaseException as e:  # noqa: BLE001 - raised to the caller (at start) or kept
            self._board.error = e
            why = f"the executor's campaign failed: {type(e).__name__}: {e}"
            self._broken = why
        finally:
            board = self._board
            board.bound.set()
            board.ready.set()
            with board.lock:
                board.shut = True
            self._feed.abandon(why)
            board.withdrawn.set()
            JOB["open"].discard(self)
            # The session's communicator is never freed: a message still unreceived on it (a
            # worker's last READY) would match a later communicator given its context ID.

    # ------------------------------------------------- futures as arguments (G4)
    def _mine(self, v: Any) -> str | None:
        """The work ID of ``v`` when it is a future this executor returned, else None."""
        if isinstance(v, _CallFuture) and v.owner is self._board:
            return v.work_id
        return None

    # ------------------------------------------------------------------ the API
    @property
    def state_dir(self) -> str:
        """The executor's state directory."""
        return self._dir

    @property
    def num_workers(self) -> int:
        """The number of worker ranks serving this executor, 0 once it is shut down or broken
        (as mpi4py's)."""
        if self._board.shut or self._broken is not None:
            return 0
        return self._workers

    def bootup(self, wait: bool = True) -> DurableExecutor:
        """Start the workers (they start with the executor); returns the executor. With
        ``wait``, return once every worker is up (its isolated child started, as mpi4py's
        waits for its workers), gone, or the executor ended.

        Raises:
            RuntimeError: after :meth:`shutdown`.
        """
        if self._board.shut:
            raise RuntimeError("cannot bootup after shutdown")
        if wait:
            self._board.bound.wait()
            self._board.ready.wait()
        return self

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Schedule ``fn(*args, **kwargs)``; returns its future, with ``.work_id``. A call
        committed by an earlier run resolves at once from the record.

        The future is running once a dispatch sends the call to a worker; until then its
        ``cancel()`` succeeds and the call never runs in this run (one that had entered the
        state directory stays pending there: a re-run that submits it runs it).

        A future this executor returned, passed as an argument (positional or keyword, or an
        element of a list, tuple or dict argument, one level deep), is a dependency: the
        call waits for it and receives its value in its place. The call's work ID digests the
        dependency's work ID, not its value. If the dependency failed (raised, crashed, timed
        out), this call never runs and its future fails with :class:`DependencyFailed`, whose
        ``__cause__`` is the dependency's exception. A re-run resolves both from the record.

        An argument that cannot be pickled fails the future it returns with the pickling
        error itself (its own type), as in mpi4py and the standard library; that future has
        no work ID (None): nothing is recorded.

        Raises:
            TypeError: ``fn`` cannot be found by name in a worker (a lambda, a nested
                function).
            RuntimeError: after :meth:`shutdown`.
            BrokenExecutor: the executor is broken.
        """
        name = function_name(fn)
        args, kwargs, after = take_dependencies(args, kwargs, self._mine)
        try:
            digest = call_digest(fn, args, kwargs)
        except Exception as e:  # noqa: BLE001 - an argument pickle refuses: the future's
            with self._board.lock:
                self._check_open()
            return _failed(e)
        with self._board.lock:
            self._check_open()
            n = self._counts[(name, digest)]
            self._counts[(name, digest)] = n + 1
            wid = call_id(name, digest, n)
            return self._enqueue(wid, name, digest, (fn, args, kwargs), after)

    def submit_as(
        self, work_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Future[Any]:
        """:meth:`submit` under the caller's own work ID. Submitting a known ID again with the
        same call returns another future of the same task.

        Raises:
            ValueError: ``work_id`` is not a non-empty string, or it is known with another
                call (another function or other arguments).
        """
        if type(work_id) is not str or not work_id:
            raise UsageError(f"work_id must be a non-empty str, got {work_id!r}")
        name = function_name(fn)
        args, kwargs, after = take_dependencies(args, kwargs, self._mine)
        try:
            digest = call_digest(fn, args, kwargs)
        except Exception as e:  # noqa: BLE001 - as in submit
            with self._board.lock:
                self._check_open()
            return _failed(e)
        with self._board.lock:
            self._check_open()
            return self._enqueue(work_id, name, digest, (fn, args, kwargs), after)

    def _check_open(self) -> None:
        if self._broken is not None:
            raise BrokenExecutor(self._broken)
        if self._board.shut:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def _submit_chunk(
        self, fn: Callable[..., Any], calls: tuple[tuple[Any, ...], ...]
    ) -> Future[Any] | None:
        """Schedule a chunk of a chunked ``map`` (the calls ``fn(*args)``, ``args`` in
        ``calls``) as one task; returns its future (its value ``(values, raised)``, see
        :mod:`._chunks`), or None when the chunk cannot be one task (an argument the digest or
        the pickle refuses, a future among them): the caller submits its calls one by one.

        Raises:
            RuntimeError: after :meth:`shutdown`.
            BrokenExecutor: the executor is broken.
        """
        name = function_name(fn)
        try:
            digest = chunk_digest(fn, calls)
        except Exception:  # noqa: BLE001 - each call alone: only the one refused fails
            return None
        with self._board.lock:
            self._check_open()
            n = self._counts[(name, digest)]
            self._counts[(name, digest)] = n + 1
            fut = self._enqueue(call_id(name, digest, n), name, digest, (fn, calls), chunk=True)
        return fut if getattr(fut, "work_id", None) is not None else None

    def _enqueue(
        self,
        wid: str,
        name: str,
        digest: str,
        call: Any,
        after: list[str] | None = None,
        chunk: bool = False,
    ) -> Future[Any]:
        board = self._board
        known = board.digests.get(wid)
        if known is not None and known != digest:
            raise UsageError(
                f"work ID {wid!r} is known with another call (digest {known[:12]}, this one "
                f"{digest[:12]}): a work ID names one call"
            )
        fut = _CallFuture(board, wid)  # (its owner: it may be an argument of a later call, G4)
        if after:
            board.after[wid] = tuple(after)
        if board.settle(wid, fut, locked=True):  # committed or deferred: from the record
            return fut
        assert board.sealer is not None
        size = len(call[1]) if chunk else 0
        try:
            payload = board.sealer.seal_call(wid, name, digest, call, size)
        except Exception as e:  # noqa: BLE001 - as in submit
            return _failed(e)  # (a chunk's: its calls are submitted one by one)
        board.digests[wid] = digest
        # a chunk's deadline: task_timeout for each of its calls
        timeout = self._timeout * size if chunk and self._timeout is not None else self._timeout
        item = WorkItem(
            wid, payload, timeout=timeout, self_contained=True, after=tuple(after or ())
        )
        board.queue.append((fut, item))
        return fut

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
        unordered: bool = False,
    ) -> Iterator[Any]:
        """``map(fn, *iterables)``: the results in order (or as they complete, ``unordered``).

        ``chunksize=1``: one task per element (as :meth:`submit`). ``chunksize=k > 1``: one
        task per chunk of up to ``k`` consecutive calls, run in order by one worker and
        committed as one record; its work ID digests the function and the chunk's calls (never
        a single call's ID), so a re-run with the same chunks resolves them from the record,
        and its deadline is ``task_timeout`` times its calls. A chunk that fails as a whole (a
        crash or a hang in each attempt) is split once its retries are spent: its calls are
        submitted one by one, with ``chunksize=1``'s work IDs, so only the call that crashed
        fails. A chunk with a future of this executor among its arguments (a dependency), or
        an argument that cannot be pickled, is submitted as single calls.

        ``timeout`` counts from this call; ``buffersize`` bounds the tasks (chunks) submitted
        ahead of the results read (in order only, as in mpi4py). An exception a call raised is
        raised when its result is reached (each call's own, at its position, in a chunk too).

        Raises:
            TypeError: ``chunksize`` or ``buffersize`` is not an integer.
            ValueError: ``chunksize < 1``, ``buffersize < 1``, or ``buffersize`` with
                ``unordered``.
        """
        return self.starmap(
            fn,
            zip(*iterables, strict=False),
            timeout=timeout,
            chunksize=chunksize,
            buffersize=buffersize,
            unordered=unordered,
        )

    def starmap(
        self,
        fn: Callable[..., Any],
        iterable: Iterable[Iterable[Any]],
        timeout: float | None = None,
        chunksize: int = 1,
        buffersize: int | None = None,
        unordered: bool = False,
    ) -> Iterator[Any]:
        """``fn(*args)`` for each ``args`` of ``iterable``; see :meth:`map` (chunks too)."""
        if not isinstance(chunksize, int):
            raise TypeError("chunksize must be an integer")
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if buffersize is not None:
            if not isinstance(buffersize, int):
                raise TypeError("buffersize must be an integer or None")
            if buffersize < 1:
                raise ValueError("buffersize must be None or > 0")
            if unordered:
                raise ValueError("buffersize must be None if unordered")
        end = None if timeout is None else time.monotonic() + timeout
        if chunksize > 1:
            return chunked_map(
                self._submit_chunk,
                self.submit,
                fn,
                iterable,
                chunksize,
                end,
                buffersize,
                unordered,
            )
        args = iter(iterable)
        ahead = itertools.islice(args, buffersize) if buffersize is not None else args
        first = collections.deque(self.submit(fn, *a) for a in ahead)

        def refill() -> Future[Any] | None:
            for a in itertools.islice(args, 1):
                return self.submit(fn, *a)
            return None

        return gather(first, refill if buffersize is not None else None, end, unordered=unordered)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new calls; the submitted ones finish, then the workers stop serving it.
        Everything committed is durable before a ``wait=True`` shutdown returns.

        With ``cancel_futures``, every call not yet sent to a worker is cancelled before this
        returns (its future's ``cancelled()`` is True; as in the standard library): the calls
        sent (a dispatch of several calls is sent whole) run to their end and their futures
        resolve. A cancelled call stays pending in the state directory: a re-run of the script
        that submits it again runs it.

        Raises:
            NotDurableError: the disk refused the journal to the end: some results resolved
                their futures but are in memory only (a re-run runs those calls again). Any
                other error that ended the executor's campaign is raised here too, once.
        """
        board = self._board
        with board.lock:
            board.shut = True
            if cancel_futures:
                board.cancel = True
        if cancel_futures:
            while board.queue:
                try:
                    fut, _ = board.queue.popleft()
                except IndexError:
                    break
                _cancel(fut)
            if threading.current_thread() is not self._thread:  # (not from a callback)
                board.withdrawn.wait()  # the manager's next turn withdraws the frontier's
        if wait:
            self._thread.join()
            error, board.error = board.error, None
            if error is not None:  # once: e.g. NotDurableError (the disk refused to the end)
                raise error

    def __repr__(self) -> str:
        return f"DurableExecutor(state_dir={self._dir!r}, workers={self._workers})"


class _CallFuture(Future[Any]):
    """The standard library's ``Future``, whose :meth:`cancel` also tells its executor, so that
    a call cancelled in the frontier (ahead of the workers, not sent) is withdrawn from the run
    and never runs.

    Args:
        owner: the record of the executor that returned it (a future it is given as an
            argument of a later call is one of its own when it names this record); None for
            one made bare, by ``collect`` or ``compose``, which has no ``work_id`` either.
        work_id: the work ID of its call.
    """

    work_id: str

    def __init__(self, owner: Board | None = None, work_id: str | None = None) -> None:
        super().__init__()
        self.owner = owner
        if work_id is not None:
            self.work_id = work_id

    def cancel(self) -> bool:
        """As ``concurrent.futures.Future.cancel``: False once the call was sent to a worker
        (running) or settled; else the future is cancelled and True."""
        if not super().cancel():
            return False
        if self.owner is not None:
            self.owner.dropped.append(self.work_id)
        return True


def _failed(error: BaseException) -> Future[Any]:
    """A future that failed with ``error`` before it had a task (no work ID)."""
    fut: Future[Any] = Future()
    fut.work_id = None  # type: ignore[attr-defined]
    fut.set_running_or_notify_cancel()
    fut.set_exception(error)
    return fut


def _state_dir(state_dir: str | os.PathLike[str] | None) -> str:
    if state_dir is not None:
        return os.path.abspath(os.fspath(state_dir))
    base = JOB["state_dir"] or os.environ.get(STATE_DIR_ENV)
    if not base:
        raise UsageError(
            "a DurableExecutor needs a state directory: pass state_dir=, or run the script with "
            f"'python -m durable_dispatch.futures --state-dir D', or set {STATE_DIR_ENV}"
        )
    JOB["made"] += 1
    return os.path.abspath(os.path.join(base, f"executor-{JOB['made']}"))


def shutdown_all() -> None:
    """Shut down (waiting) every executor the script left open (the runner calls this)."""
    for ex in list(_executors):
        ex.shutdown(wait=True)
    _executors.clear()
