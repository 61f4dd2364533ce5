"""The durable executor's record of its calls, the one part that the threads submitting calls
(:mod:`._executor`) and the manager thread feeding them to the campaign (:mod:`._feed`) share:
:class:`Board`. Each side reads and writes it through its public attributes and asks it how a
future ends (:meth:`Board.settle`, :meth:`Board.resolve`, :meth:`Board.failure`); neither side
reads the other's own state."""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future
from typing import Any

from ..core import WorkItem
from ..errors import DependencyFailed
from ._outcomes import failure, resolve
from ._seal import Sealer

__all__ = ["Board", "Failed", "start_future"]

#: A call that failed without a result: the kinds of its failures, its last error, attempts.
Failed = tuple[tuple[str, ...], str | None, int]


class Board:
    """What an executor knows of its calls, shared by the threads that submit them and the
    manager thread that feeds them to the campaign.

    Attributes:
        lock: held while a call is submitted, and by the manager thread when it writes
            ``record`` or ``failed`` or sets ``shut``, so that a call is never both queued
            and resolved from the record.
        queue: the submitted calls (each its future and its work item) the manager thread has
            not taken yet.
        record: work ID -> the committed, sealed outcome of its call.
        failed: work ID -> how the call failed without a result (deferred, or cancelled by an
            operator): its failure kinds, last error and attempts.
        digests: work ID -> the digest of the call it names (a work ID names one call).
        after: work ID -> the work IDs of the calls it waits for (futures it was given).
        dropped: the work IDs whose futures were cancelled, for the manager thread to drop.
        sealer: seals and opens the pickles of the state directory (set once the manager
            thread has read the record).
        shut: no new calls (the executor was shut down, or its campaign ended).
        cancel: the shutdown cancels every call not sent to a worker yet.
        error: what ended the campaign with an exception, for the executor to raise.
        bound: set once the manager thread has read the record (or failed to).
        ready: set once every worker is up or gone, or the campaign ended.
        withdrawn: set once the manager thread has handled a cancelling shutdown.
        workers: how many worker ranks serve the executor.
    """

    def __init__(self, workers: int) -> None:
        self.lock = threading.Lock()
        self.queue: collections.deque[tuple[Future[Any], WorkItem]] = collections.deque()
        self.record: dict[str, Any] = {}
        self.failed: dict[str, Failed] = {}
        self.digests: dict[str, str] = {}
        self.after: dict[str, tuple[str, ...]] = {}
        self.dropped: collections.deque[str] = collections.deque()
        self.sealer: Sealer | None = None
        self.shut = False
        self.cancel = False
        self.error: BaseException | None = None
        self.bound = threading.Event()
        self.ready = threading.Event()
        self.withdrawn = threading.Event()
        self.workers = workers

    def settle(self, wid: str, fut: Future[Any], *, locked: bool = False) -> bool:
        """Resolve ``fut`` from the record if the call ``wid`` is committed or failed; True
        when it is (any thread; ``locked``: the caller holds :attr:`lock`)."""
        if locked:
            rec, failed = self.record.get(wid), self.failed.get(wid)
        else:
            with self.lock:
                rec, failed = self.record.get(wid), self.failed.get(wid)
        if rec is not None:
            if start_future(fut):
                self.resolve(fut, wid, rec)
            return True
        if failed is not None:
            if start_future(fut):
                fut.set_exception(self.failure(wid, failed))
            return True
        return False

    def resolve(self, fut: Future[Any], wid: str, result: Any) -> None:
        """Settle ``fut`` with the committed ``result`` of the call ``wid``: its value, or the
        exception it raised."""
        assert self.sealer is not None
        resolve(fut, self.sealer, wid, result, self.exception_of)

    def failure(self, wid: str, failed: Failed) -> BaseException:
        """The exception of the call ``wid`` that failed without a result: a
        :class:`DependencyFailed` (its cause the failed dependency's exception) when a
        dependency failed, else the exception of its last failure's kind. The dependency it
        names is one the campaign deferred it for (deferred or cancelled itself), not one that
        raised beside it: a call whose dependencies all ended runs, and one that raised alone
        makes its outcome a committed DependencyFailed (the worker's)."""
        kinds, last_error, attempts = failed
        if not kinds or kinds[-1] != "dependency":
            return failure(wid, kinds, last_error, attempts)
        after = self.after.get(wid, ())
        dep = next((d for d in after if d in self.failed), None)
        if dep is None:
            dep = next((d for d in after if self.exception_of(d) is not None), None)
        e = DependencyFailed(
            f"the task never ran: its dependency {dep} failed ({last_error})",
            work_id=wid,
            attempts=attempts,
            dependency=dep,
        )
        e.__cause__ = self.exception_of(dep) if dep is not None else None
        return e

    def exception_of(self, wid: str) -> BaseException | None:
        """The exception the call ``wid``'s future fails with, from the record; None when it
        returned a value or has not ended."""
        failed = self.failed.get(wid)
        if failed is not None:
            return self.failure(wid, failed)
        rec = self.record.get(wid)
        if rec is None:
            return None
        probe: Future[Any] = Future()
        self.resolve(probe, wid, rec)
        return probe.exception()


def start_future(fut: Future[Any]) -> bool:
    """Mark ``fut`` running unless it is; True when it is running now (it may be settled),
    False when it was cancelled (its waiters are told) or settled already."""
    if fut.running():  # (asking again would log "Future ... in unexpected state: RUNNING")
        return True
    if fut.done() and not fut.cancelled():
        return False  # settled already
    try:
        return fut.set_running_or_notify_cancel()
    except RuntimeError:  # running already, or cancelled (and told) or settled before
        return fut.running()
