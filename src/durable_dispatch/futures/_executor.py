"""The durable executor: ``concurrent.futures`` on the campaign machinery (F1).

Rank 0's user code calls :meth:`DurableExecutor.submit`; a manager thread runs
:func:`~durable_dispatch.mpi.run_master` on the executor's state directory with a
:class:`~durable_dispatch.mpi.master.Feed` that takes the submitted calls as they come, and the
workers serve the session (:mod:`._serve`). Every call is a work item whose ID is the digest of
the call (:mod:`._calls`), its payload the sealed pickle of the call (:mod:`._seal`); its
result, once committed durably, resolves its future. So a re-run of the same script on the same
state directory resolves every committed call from the record at ``submit``, without running it,
and runs only the rest.

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
    CancelledError,
    Executor,
    Future,
)
from typing import Any

from ..campaign.results import read_results
from ..campaign.state import CampaignState
from ..core import RetryPolicy, WatchdogConfig, WorkItem
from ..core.decisions import Defer, Send
from ..errors import DependencyFailed, RecordTooLargeError, UsageError
from ..mpi.context import MAX_RESULT_BYTES
from ..mpi.master import Feed, MasterReport, run_master
from ..storage import fs
from . import _serve
from ._calls import call_digest, call_id, function_name, take_dependencies
from ._outcomes import failure, gather, resolve
from ._seal import Sealer, load_or_create_key

__all__ = ["DurableExecutor", "STATE_DIR_ENV"]

log = logging.getLogger("durable_dispatch.futures")

#: The last error of a call an operator cancelled (``durable-dispatch cancel``).
CANCELLED_ERROR = "cancelled by an operator (durable-dispatch cancel)"
#: The environment variable that names the state directory of executors made without one.
STATE_DIR_ENV = "DURABLE_DISPATCH_STATE_DIR"

_job: dict[str, Any] = {"runner": False, "state_dir": None, "made": 0, "open": set()}
_executors: list[DurableExecutor] = []  # the runner shuts down those the script left open


class _Subset:
    """The first ``n`` workers of a transport (``max_workers``): the others idle unasked."""

    def __init__(self, link: Any, n: int) -> None:
        self._link, self.size, self.ulfm = link, n + 1, link.ulfm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._link, name)


class _CallFeed(Feed):
    """The executor's calls, fed to the campaign as they are submitted (manager thread)."""

    #: dispatches per worker whose calls are in the frontier ahead of the workers (pending
    #: until a dispatch sends them); the other calls wait here
    AHEAD = 2

    def __init__(self, ex: DurableExecutor) -> None:
        self.ex = ex
        # work ID -> its futures not settled: pending until its call is sent, then running
        self.waiting: dict[str, list[Future[Any]]] = {}
        self.sent: set[str] = set()  # work IDs sent to a worker in this run, not settled
        self.local: collections.deque[WorkItem] = collections.deque()
        self.queued: set[str] = set()  # the work IDs in ``local``
        self.withdrew = False  # shutdown(cancel_futures=True) was handled
        self.unrun: set[str] = set()  # work IDs that never run in this run (cancelled)
        self.early: set[str] = set()  # work IDs cancelled before refill took their future

    @property
    def exhausted(self) -> bool:  # type: ignore[override]
        """Shut down, and every submitted call is in the frontier (or settled)."""
        ex = self.ex
        return ex._shut and not ex._queue and not self.local

    def attach(self, state: CampaignState) -> None:
        """Read the record: committed results, deferred items, pending calls (checked)."""
        super().attach(state)
        ex = self.ex
        try:
            ex._sealer = Sealer(load_or_create_key(state.directory), state.directory)
            for r in read_results(state.directory):  # checked now: a forged one fails closed
                ex._sealer.check_result(r.work_id, r.result)
                ex._record[r.work_id] = r.result
                if isinstance(r.result, dict) and isinstance(r.result.get("d"), str):
                    ex._digests[r.work_id] = r.result["d"]
            ledger = state.core.ledger
            for d in state.defer.items():
                if _brought_back(ledger, d.work_id):  # its dependency was retried: it may run
                    continue
                ex._failed[d.work_id] = (d.kinds, d.last_error, d.attempts)
                after = d.item.get("after") if isinstance(d.item, dict) else None
                if after:
                    ex._after[d.work_id] = tuple(after)
                payload = d.item.get("payload") if isinstance(d.item, dict) else None
                if isinstance(payload, dict) and isinstance(payload.get("d"), str):
                    ex._digests[d.work_id] = payload["d"]
            ledger = state.core.ledger
            for wid in ledger.cancelled:  # an operator's cancel (O1): final, like a deferral
                ex._failed[wid] = (("cancelled",), CANCELLED_ERROR, ledger.attempts.get(wid, 0))
            for wid in (*ledger.frontier, *ledger.waiting):  # calls an earlier run left: checked
                payload = ledger.items[wid].payload
                ex._sealer.check_call(wid, payload)
                ex._digests[wid] = payload["d"]
            state.on_defer = self.deferred
            state.on_cancel = self.cancelled
            state.on_dispatch = self.dispatched
        except BaseException as e:
            ex._error = e  # before the constructor wakes: it raises this
            raise
        finally:
            ex._bound.set()

    def refill(self) -> None:
        """Take the submitted calls; move calls into the frontier while it is short."""
        ex, waiting = self.ex, self.waiting
        ledger = self.state.core.ledger
        while ex._queue:
            try:
                fut, item = ex._queue.popleft()
            except IndexError:  # shutdown(cancel_futures=True) took it
                break
            wid = item.work_id
            if self.early and wid in self.early and not _live(fut):
                continue  # cancelled before this turn took it (see _drop_cancelled)
            futs = waiting.get(wid)
            if futs is not None:  # (a call submitted again: one task, several futures)
                if wid not in self.sent or fut.set_running_or_notify_cancel():
                    futs.append(fut)
                    self.unrun.discard(wid)  # (cancelled while here: it runs after all)
            elif not self._settled(wid, fut):
                if wid in self.sent:  # an earlier run's call, sent before it was submitted
                    if fut.set_running_or_notify_cancel():
                        waiting[wid] = [fut]
                    continue
                waiting[wid] = [fut]
                if wid in self.unrun:  # it never ran in this run (cancelled), submitted again
                    dep = next((a for a in item.after if a in self.unrun), None)
                    if dep is not None:  # and what it waits for still never runs
                        self._fail_dependent(wid, dep)
                        continue
                    self.unrun.discard(wid)
                    ledger.put_back(wid)
                if not ledger.known(wid):  # (else an earlier run's call, pending)
                    self.local.append(item)
                    self.queued.add(item.work_id)
        if ex._dropped:
            self._drop_cancelled()
        if ex._cancel:
            self._cancel_local()
            if not self.withdrew:
                self._withdraw()
        frontier = ledger.frontier
        batch: list[WorkItem] = []
        # as many calls as the next dispatches take: a dispatch's size (batch="auto") for
        # each worker, twice, so none waits for work (they stay cancellable until sent)
        low = self.AHEAD * self.ex._workers * self.state.core.auto_batch()
        unrun = self.unrun
        while self.local and len(frontier) + len(batch) < low:
            item = self.local.popleft()
            wid = item.work_id
            self.queued.discard(wid)
            if unrun and (wid in unrun or (item.after and not unrun.isdisjoint(item.after))):
                if wid in unrun:  # every future of it was cancelled (_drop_cancelled)
                    del waiting[wid]
                else:  # it waits for a call that never runs in this run
                    self._fail_dependent(wid, next(a for a in item.after if a in unrun))
                continue
            batch.append(item)
        if batch:
            self._submit(batch)

    def dispatched(self, send: Send) -> None:
        """``on_dispatch``: the calls of ``send`` are sent to a worker now (the whole dispatch):
        their futures are running. (A future cancelled in the same loop turn, before the turn's
        :meth:`_drop_cancelled`, is dropped here: its call runs all the same, as it is in the
        dispatch, and its result is recorded.)"""
        waiting, sent = self.waiting, self.sent
        for item in send.items:
            wid = item.work_id
            if wid in sent:  # sent again (retried): running already
                continue
            sent.add(wid)
            for f in waiting.get(wid, ()):
                if not f.set_running_or_notify_cancel():  # cancelled: its call runs anyway
                    waiting[wid] = [g for g in waiting[wid] if _start(g)]
                    break

    def _drop_cancelled(self) -> None:
        """Each call whose every future was cancelled (``Future.cancel``, any thread) and that
        no dispatch sent never runs in this run: one still here is left out of the frontier,
        one in the frontier (or waiting for a dependency) is withdrawn from this run (it stays
        pending in the state directory, as :meth:`_withdraw`'s calls do), and the calls that
        wait for it fail with DependencyFailed."""
        dropped, waiting, ledger = self.ex._dropped, self.waiting, self.state.core.ledger
        while dropped:
            wid = dropped.popleft()
            futs = waiting.get(wid)
            if wid in self.sent or wid in self.unrun:
                continue  # running, or dropped already
            if futs is None:  # settled, or still in the executor's queue: refill checks it
                self.early.add(wid)
                continue
            live = [f for f in futs if _live(f)]
            if live:
                waiting[wid] = live
                continue
            self.unrun.add(wid)
            if wid in self.queued:
                continue  # not in the frontier yet: refill leaves it out
            del waiting[wid]
            deps = ledger.waiting_dependents(wid)
            ledger.withdraw_item(wid)
            for d in deps:
                ledger.withdraw_item(d)
                self._fail_dependent(d, wid)

    def _fail_dependent(self, wid: str, dep: str) -> None:
        """The call ``wid`` waits for ``dep``, which never runs in this run (cancelled): it never
        runs either (nothing is recorded); its futures fail with DependencyFailed."""
        self.unrun.add(wid)
        e = DependencyFailed(
            f"the task never ran: its dependency {dep} was cancelled",
            work_id=wid,
            attempts=0,
            dependency=dep,
        )
        e.__cause__ = CancelledError()
        for f in self.waiting.pop(wid, ()):
            if _start(f):
                f.set_exception(e)

    def _withdraw(self) -> None:
        """``shutdown(cancel_futures=True)``: cancel the future of every call not sent to a
        worker, and withdraw those calls from this run (the frontier's and those waiting for a
        dependency): the campaign ends once the calls sent have ended, and the withdrawn ones
        stay pending in the state directory (a re-run that submits them runs them). The calls
        sent and retried since stay in the frontier: their futures are running."""
        self.withdrew = True
        sent = self.sent
        self.state.core.ledger.withdraw(keep=sent)
        for wid in [w for w in self.waiting if w not in sent]:
            for f in self.waiting.pop(wid):
                _cancel(f)
        self.ex._withdrawn.set()

    def _submit(self, batch: list[WorkItem]) -> None:
        # A call pending from an earlier run is known by its work ID (the call's canonical
        # digest); its payload, a new pickle of the same call, may differ byte for byte (a set's
        # order), which the state would refuse as a changed payload (U11): it is not submitted.
        known = self.state.core.ledger.ids.index
        batch = [item for item in batch if item.work_id not in known]
        if not batch:
            return
        try:
            self.state.submit(batch)
        except RecordTooLargeError:
            for item in batch:  # known IDs are skipped: the ones before it went in
                try:
                    self.state.submit([item])
                except RecordTooLargeError as e:
                    for f in self.waiting.pop(item.work_id, ()):
                        if _start(f):
                            f.set_exception(e)

    def _settled(self, wid: str, fut: Future[Any], *, locked: bool = False) -> bool:
        """Resolve ``fut`` from the record if ``wid`` is committed or deferred (any thread)."""
        ex = self.ex
        if locked:
            rec, failed = ex._record.get(wid), ex._failed.get(wid)
        else:
            with ex._lock:
                rec, failed = ex._record.get(wid), ex._failed.get(wid)
        if rec is not None:
            if _start(fut):
                ex._resolve(fut, wid, rec)
            return True
        if failed is not None:
            if _start(fut):
                fut.set_exception(ex._failure(wid, failed))
            return True
        return False

    def _cancel_local(self) -> None:
        for item in self.local:
            for f in self.waiting.pop(item.work_id, ()):
                _cancel(f)
        self.local.clear()
        self.queued.clear()

    def committed(self, wid: str, result: Any) -> None:
        """``on_commit``: the result is durable; resolve its futures."""
        ex = self.ex
        with ex._lock:
            ex._record[wid] = result
        self.sent.discard(wid)
        for f in self.waiting.pop(wid, ()):  # (each running: its call was sent)
            ex._resolve(f, wid, result)

    def deferred(self, d: Defer) -> None:
        """``on_defer``: the item's retries are spent; fail its futures."""
        wid = d.work.work_id
        with self.ex._lock:
            self.ex._failed[wid] = (d.kinds, d.last_error, d.attempts)
        if d.work.after:
            self.ex._after.setdefault(wid, d.work.after)
        self.sent.discard(wid)
        for f in self.waiting.pop(wid, ()):
            if _start(f):  # (pending when it never ran: a dependency failed)
                f.set_exception(self.ex._failure(wid, (d.kinds, d.last_error, d.attempts)))
        # the items deferred for it earlier that its retry had brought back: failed now
        led = self.state.core.ledger
        for dep in led.dependents_of(wid):
            if dep in led.deferred and dep not in self.ex._failed:
                kinds = (*led.kinds.get(dep, ()),)
                attempts, error = led.attempts.get(dep, 0), led.last_error.get(dep)
                self.deferred(Defer(led.items[dep], None, "dependency", attempts, kinds, error))

    def cancelled(self, wid: str) -> None:
        """``on_cancel``: an operator cancelled the call (``durable-dispatch cancel``, O1); its
        futures fail with :class:`TaskFailed` (kind ``"cancelled"``), now and in a re-run."""
        failed = (("cancelled",), CANCELLED_ERROR, self.state.core.ledger.attempts.get(wid, 0))
        with self.ex._lock:
            self.ex._failed[wid] = failed
        self.sent.discard(wid)
        for f in self.waiting.pop(wid, ()):
            if _start(f):
                f.set_exception(self.ex._failure(wid, failed))

    def abandon(self, why: str) -> None:
        """The campaign ended before these calls: each future fails with BrokenExecutor."""
        ex = self.ex
        while ex._queue:
            try:
                fut, _ = ex._queue.popleft()
            except IndexError:
                break
            if _start(fut):
                fut.set_exception(BrokenExecutor(why))
        for futs in self.waiting.values():
            for f in futs:
                if _start(f):
                    f.set_exception(BrokenExecutor(why))
        self.waiting.clear()
        self.sent.clear()
        self.local.clear()
        self.queued.clear()


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

    Raises:
        UsageError: no state directory; not run under the runner (nor inside a
            ``DurableCommExecutor``); another executor of this job is still open where MPI
            is not ``MPI_THREAD_MULTIPLE``; no worker
            ranks; a bad argument (a ``ValueError`` too).
        LockHeldError: another master holds the state directory.
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
        _comm: Any = None,
    ) -> None:
        if max_workers is not None and (type(max_workers) is not int or max_workers <= 0):
            raise UsageError(f"max_workers must be an integer > 0, got {max_workers!r}")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if task_timeout is not None and not task_timeout > 0:
            raise UsageError(f"task_timeout must be > 0 seconds, got {task_timeout!r}")
        if _comm is None and not _job["runner"]:
            raise UsageError(
                "a DurableExecutor needs worker ranks: run the script with "
                "'mpiexec -n N python -m durable_dispatch.futures script.py', or use "
                "DurableCommExecutor (collective) in a script every rank runs"
            )
        self._dir = _state_dir(state_dir)
        # Isolated children import the script as ``__mp_main__`` (as multiprocessing's spawn
        # does), so a value of a class the script defines comes back pickled as
        # ``__mp_main__.Name``: here that is the script's ``__main__``.
        sys.modules.setdefault("__mp_main__", sys.modules["__main__"])
        if _job["open"] and not _serve.threads_shared():
            raise UsageError(
                "another executor of this job is still open, and this MPI serves one thread at "
                "a time (not MPI_THREAD_MULTIPLE), so its workers serve one executor at a "
                "time; shut it down first (or use one 'with' block after the other)"
            )
        from mpi4py import MPI

        comm = _comm if _comm is not None else MPI.COMM_WORLD
        available = comm.Get_size() - 1
        if available < 1:
            raise UsageError("no worker ranks: start the job with at least 2 processes")
        self._workers: int = min(available, max_workers or available)
        self._comm = comm
        init = None
        if initializer is not None:
            function_name(initializer)  # a TypeError now, not in every worker
            init = pickle.dumps((initializer, tuple(initargs)), protocol=pickle.HIGHEST_PROTOCOL)
        self._timeout = task_timeout
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[Future[Any], WorkItem]] = collections.deque()
        self._record: dict[str, Any] = {}
        self._failed: dict[str, tuple[tuple[str, ...], str | None, int]] = {}
        self._digests: dict[str, str] = {}
        self._after: dict[str, tuple[str, ...]] = {}  # a call's dependencies (G4)
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._sealer: Sealer | None = None
        self._shut = self._cancel = False
        self._broken: str | None = None
        self._error: BaseException | None = None
        self._report: MasterReport | None = None
        self._bound = threading.Event()
        self._withdrawn = threading.Event()  # a cancel_futures shutdown was handled
        self._dropped: collections.deque[str] = collections.deque()  # cancelled: work IDs
        self._feed = _CallFeed(self)
        fs.makedirs(self._dir)
        self._link = self._open_link()
        _job["open"].add(self)
        self._thread = threading.Thread(
            target=self._manage,
            name="durable-dispatch-executor",
            kwargs={"watchdog": watchdog, "retry": retry, "sync": sync},
            daemon=True,
        )
        self._thread.start()
        self._bound.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        assert self._sealer is not None
        session = pickle.dumps(
            {
                "key": self._sealer._key,
                "dir": self._dir,
                "init": init,
                "isolate": bool(isolate),
                "memory_limit": memory_limit,
                "max_result": MAX_RESULT_BYTES,
            }
        )
        sub = self._link.comm
        for r in range(1, self._workers + 1):
            sub.Send([session, MPI.BYTE], dest=r, tag=_serve.SESSION)
        _executors.append(self)

    def _open_link(self) -> Any:
        """The session's own communicator on every worker (several executors open at once
        share the workers; their messages never meet), as the master loop's transport."""
        from ..mpi.transport import MpiTransport

        link: Any = MpiTransport(_serve.open_session(self._comm, self._workers))
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
                self._broken = why
                log.error("%s; %s resumes it", why, self._dir)
        except BaseException as e:  # noqa: BLE001 - raised to the caller (at start) or kept
            self._error = e
            why = f"the executor's campaign failed: {type(e).__name__}: {e}"
            self._broken = why
        finally:
            self._bound.set()
            with self._lock:
                self._shut = True
            self._feed.abandon(why)
            self._withdrawn.set()
            _job["open"].discard(self)
            # The session's communicator is never freed: a message still unreceived on it (a
            # worker's last READY) would match a later communicator given its context ID.

    def _resolve(self, fut: Future[Any], wid: str, result: Any) -> None:
        assert self._sealer is not None
        resolve(fut, self._sealer, wid, result, self._exception_of)

    # ------------------------------------------------- futures as arguments (G4)
    def _mine(self, v: Any) -> str | None:
        """The work ID of ``v`` when it is a future this executor returned, else None."""
        if isinstance(v, Future) and getattr(v, "_dd_owner", None) is self:
            return getattr(v, "work_id", None)
        return None

    def _failure(self, wid: str, failed: tuple[tuple[str, ...], str | None, int]) -> BaseException:
        """The exception of the deferred call ``wid``: :class:`DependencyFailed` (its cause the
        failed dependency's exception) when a dependency failed, else :func:`failure`'s."""
        kinds, last_error, attempts = failed
        if not kinds or kinds[-1] != "dependency":
            return failure(wid, kinds, last_error, attempts)
        dep = next((d for d in self._after.get(wid, ()) if self._exception_of(d) is not None), None)
        e = DependencyFailed(
            f"the task never ran: its dependency {dep} failed ({last_error})",
            work_id=wid,
            attempts=attempts,
            dependency=dep,
        )
        e.__cause__ = self._exception_of(dep) if dep is not None else None
        return e

    def _exception_of(self, wid: str) -> BaseException | None:
        """The exception the call ``wid``'s future fails with, from the record; None when it
        returned a value or has not ended."""
        failed = self._failed.get(wid)
        if failed is not None:
            return self._failure(wid, failed)
        rec = self._record.get(wid)
        if rec is None:
            return None
        probe: Future[Any] = Future()
        self._resolve(probe, wid, rec)
        return probe.exception()

    # ------------------------------------------------------------------ the API
    @property
    def state_dir(self) -> str:
        """The executor's state directory."""
        return self._dir

    @property
    def num_workers(self) -> int:
        """The number of worker ranks serving this executor, 0 once it is shut down or broken
        (as mpi4py's)."""
        if self._shut or self._broken is not None:
            return 0
        return self._workers

    def bootup(self, wait: bool = True) -> DurableExecutor:
        """Start the workers (they start with the executor); returns the executor.

        Raises:
            RuntimeError: after :meth:`shutdown`.
        """
        if self._shut:
            raise RuntimeError("cannot bootup after shutdown")
        if wait:
            self._bound.wait()
        return self

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Schedule ``fn(*args, **kwargs)``; returns its future, with ``.work_id``. A call
        committed by an earlier run resolves at once from the record.

        The future is running once a dispatch sends the call to a worker; until then its
        ``cancel()`` succeeds and the call never runs in this run (one that had entered the
        state directory stays pending there: a re-run that submits it runs it).

        A future this executor returned, passed as an argument (positional or keyword, or an
        element of a list, tuple or dict argument, one level deep), is a dependency (G4): the
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
            with self._lock:
                self._check_open()
            return _failed(e)
        with self._lock:
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
            with self._lock:
                self._check_open()
            return _failed(e)
        with self._lock:
            self._check_open()
            return self._enqueue(work_id, name, digest, (fn, args, kwargs), after)

    def _check_open(self) -> None:
        if self._broken is not None:
            raise BrokenExecutor(self._broken)
        if self._shut:
            raise RuntimeError("cannot schedule new futures after shutdown")

    def _enqueue(
        self, wid: str, name: str, digest: str, call: Any, after: list[str] | None = None
    ) -> Future[Any]:
        known = self._digests.get(wid)
        if known is not None and known != digest:
            raise UsageError(
                f"work ID {wid!r} is known with another call (digest {known[:12]}, this one "
                f"{digest[:12]}): a work ID names one call"
            )
        fut: Future[Any] = _CallFuture()
        fut.work_id = wid  # type: ignore[attr-defined]
        fut._dd_owner = self  # type: ignore[attr-defined]  # (an argument of a later call, G4)
        if after:
            self._after[wid] = tuple(after)
        if self._feed._settled(wid, fut, locked=True):  # committed or deferred: from the record
            return fut
        assert self._sealer is not None
        try:
            payload = self._sealer.seal_call(wid, name, digest, call)
        except Exception as e:  # noqa: BLE001 - as in submit
            return _failed(e)
        self._digests[wid] = digest
        item = WorkItem(
            wid, payload, timeout=self._timeout, self_contained=True, after=tuple(after or ())
        )
        self._queue.append((fut, item))
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

        One task per element, whatever ``chunksize`` (the work IDs do not depend on it; the
        dispatches are sized from the measured task time). ``timeout`` counts from this call;
        ``buffersize`` bounds the tasks submitted ahead of the results read (in order only, as
        in mpi4py). An exception a call raised is raised when its result is reached.

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
        """``fn(*args)`` for each ``args`` of ``iterable``; see :meth:`map`."""
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
        with self._lock:
            self._shut = True
            if cancel_futures:
                self._cancel = True
        if cancel_futures:
            while self._queue:
                try:
                    fut, _ = self._queue.popleft()
                except IndexError:
                    break
                _cancel(fut)
            if threading.current_thread() is not self._thread:  # (not from a callback)
                self._withdrawn.wait()  # the manager's next turn withdraws the frontier's
        if wait:
            self._thread.join()
            error, self._error = self._error, None
            if error is not None:  # once: e.g. NotDurableError (the disk refused to the end)
                raise error

    def __repr__(self) -> str:
        return f"DurableExecutor(state_dir={self._dir!r}, workers={self._workers})"


class _CallFuture(Future[Any]):
    """The standard library's ``Future``, whose :meth:`cancel` also tells its executor, so that
    a call cancelled in the frontier (ahead of the workers, not sent) is withdrawn from the run
    and never runs."""

    def cancel(self) -> bool:
        """As ``concurrent.futures.Future.cancel``: False once the call was sent to a worker
        (running) or settled; else the future is cancelled and True."""
        if not super().cancel():
            return False
        self._dd_owner._dropped.append(self.work_id)  # type: ignore[attr-defined]
        return True


def _start(fut: Future[Any]) -> bool:
    """Mark ``fut`` running unless it is; True when it is running now (it may be settled),
    False when it was cancelled (its waiters are told) or settled already."""
    try:
        return fut.set_running_or_notify_cancel()
    except RuntimeError:  # running already, or cancelled (and told) or settled before
        return fut.running()


def _live(fut: Future[Any]) -> bool:
    """False when ``fut`` was cancelled (its waiters are told now): its call need not run."""
    if not fut.cancelled():
        return True
    _cancel(fut)
    return False


def _cancel(fut: Future[Any]) -> None:
    """Cancel a call that did not start, and tell its waiters (``wait``, ``as_completed``)."""
    if Future.cancel(fut):  # (not _CallFuture's: the executor cancels it itself)
        try:
            fut.set_running_or_notify_cancel()
        except RuntimeError:  # (they were told already)
            pass


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
    base = _job["state_dir"] or os.environ.get(STATE_DIR_ENV)
    if not base:
        raise UsageError(
            "a DurableExecutor needs a state directory: pass state_dir=, or run the script with "
            f"'python -m durable_dispatch.futures --state-dir D', or set {STATE_DIR_ENV}"
        )
    _job["made"] += 1
    return os.path.abspath(os.path.join(base, f"executor-{_job['made']}"))


def shutdown_all() -> None:
    """Shut down (waiting) every executor the script left open (the runner calls this)."""
    for ex in list(_executors):
        ex.shutdown(wait=True)
    _executors.clear()


def _brought_back(ledger: Any, wid: str) -> bool:
    """True when ``wid``, deferred for a dependency, waits for one that may still commit (an
    operator's retry brought it back): it is not failed now, its dependency's commit releases
    it."""
    if not ledger.missing.get(wid) or wid not in ledger.deferred:
        return False
    return any(
        ledger.known(dep)
        and dep not in ledger.committed
        and dep not in ledger.deferred
        and dep not in ledger.cancelled
        for dep in ledger.items[wid].after
    )
