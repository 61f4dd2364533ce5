"""The manager side of the durable executor: :class:`_CallFeed`, the feed through which the
executor's submitted calls enter its campaign, run by the manager thread (see
:mod:`._executor` for the threads), and the helpers that settle a future once (``_live``,
``_cancel``; ``start_future`` is :mod:`._board`'s). The feed shares only the executor's
:class:`~._board.Board` with the threads that submit calls."""

from __future__ import annotations

import collections
from concurrent.futures import BrokenExecutor, CancelledError, Future
from typing import Any

from ..campaign.results import read_results
from ..campaign.state import CampaignState
from ..core import WorkItem
from ..core.decisions import Defer, Send
from ..errors import DependencyFailed, RecordTooLargeError
from ..mpi.master import Feed
from ._board import Board, start_future
from ._seal import Sealer, load_or_create_key

#: The last error of a call an operator cancelled (``durable-dispatch cancel``).
CANCELLED_ERROR = "cancelled by an operator (durable-dispatch cancel)"


class _CallFeed(Feed):
    """The executor's calls, fed to the campaign as they are submitted (manager thread)."""

    #: dispatches per worker whose calls are in the frontier ahead of the workers (pending
    #: until a dispatch sends them); the other calls wait here
    AHEAD = 2

    def __init__(self, board: Board) -> None:
        self.board = board  # the executor's record of its calls, shared with its submitters
        # work ID -> its futures not settled: pending until its call is sent, then running
        self.waiting: dict[str, list[Future[Any]]] = {}
        self.sent: set[str] = set()  # work IDs sent to a worker in this run, not settled
        self.local: collections.deque[WorkItem] = collections.deque()
        self.queued: set[str] = set()  # the work IDs in ``local``
        self.withdrew = False  # shutdown(cancel_futures=True) was handled
        self.unrun: set[str] = set()  # work IDs that never run in this run (cancelled)
        self.early: set[str] = set()  # work IDs cancelled before refill took their future
        self.gone: list[str] = []  # the errors of the workers that said they ended (GONE)
        self.heard: set[int] = set()  # the ranks that said READY (up) or GONE, once each

    @property
    def exhausted(self) -> bool:  # type: ignore[override]
        """Shut down, and every submitted call is in the frontier (or settled)."""
        board = self.board
        return board.shut and not board.queue and not self.local

    def attach(self, state: CampaignState) -> None:
        """Read the record: committed results, deferred items, pending calls (checked)."""
        super().attach(state)
        board = self.board
        try:
            board.sealer = Sealer(load_or_create_key(state.directory), state.directory)
            for r in read_results(state.directory):  # checked now: a forged one fails closed
                board.sealer.check_result(r.work_id, r.result)
                board.record[r.work_id] = r.result
                if isinstance(r.result, dict) and isinstance(r.result.get("d"), str):
                    board.digests[r.work_id] = r.result["d"]
            ledger = state.core.ledger
            for d in state.defer.items():
                if _brought_back(ledger, d.work_id):  # its dependency was retried: it may run
                    continue
                board.failed[d.work_id] = (d.kinds, d.last_error, d.attempts)
                after = d.item.get("after") if isinstance(d.item, dict) else None
                if after:
                    board.after[d.work_id] = tuple(after)
                payload = d.item.get("payload") if isinstance(d.item, dict) else None
                if isinstance(payload, dict) and isinstance(payload.get("d"), str):
                    board.digests[d.work_id] = payload["d"]
            ledger = state.core.ledger
            for wid in ledger.cancelled:  # an operator's cancel (O1): final, like a deferral
                board.failed[wid] = (("cancelled",), CANCELLED_ERROR, ledger.attempts.get(wid, 0))
            for wid in (*ledger.frontier, *ledger.waiting):  # calls an earlier run left: checked
                payload = ledger.items[wid].payload
                board.sealer.check_call(wid, payload)
                board.digests[wid] = payload["d"]
            state.on_defer = self.deferred
            state.on_cancel = self.cancelled
            state.on_dispatch = self.dispatched
            state.on_worker_up = self._host
            state.on_worker_gone = self._gone
        except BaseException as e:
            board.error = e  # before the constructor wakes: it raises this
            raise
        finally:
            board.bound.set()

    def _host(self, rank: int, host: str) -> None:
        """``on_worker_up``: a worker's first READY (it is up)."""
        self._up(rank)

    def _gone(self, rank: int, error: str) -> None:
        """``on_worker_gone``: a worker said it failed and ends; the executor's error names why."""
        self.gone.append(error)
        self._up(rank)

    def _up(self, rank: int) -> None:
        """Worker ``rank`` is up (its first READY: an isolated child started) or gone; once
        every worker of the executor is, ``bootup(wait=True)`` returns."""
        self.heard.add(rank)
        if len(self.heard) >= self.board.workers:
            self.board.ready.set()

    def refill(self) -> None:
        """Take the submitted calls; move calls into the frontier while it is short."""
        board, waiting = self.board, self.waiting
        ledger = self.state.core.ledger
        while board.queue:
            try:
                fut, item = board.queue.popleft()
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
            elif not self.board.settle(wid, fut):
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
                    self.state.put_back(wid)
                if not ledger.known(wid):  # (else an earlier run's call, pending)
                    self.local.append(item)
                    self.queued.add(item.work_id)
        if board.dropped:
            self._drop_cancelled()
        if board.cancel:
            self._cancel_local()
            if not self.withdrew:
                self._withdraw()
        frontier = ledger.frontier
        batch: list[WorkItem] = []
        # as many calls as the next dispatches take: a dispatch's size (batch="auto") for
        # each worker, twice, so none waits for work (they stay cancellable until sent)
        low = self.AHEAD * self.board.workers * self.state.core.auto_batch()
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
                    waiting[wid] = [g for g in waiting[wid] if start_future(g)]
                    break

    def _drop_cancelled(self) -> None:
        """Each call whose every future was cancelled (``Future.cancel``, any thread) and that
        no dispatch sent never runs in this run: one still here is left out of the frontier,
        one in the frontier (or waiting for a dependency) is withdrawn from this run (it stays
        pending in the state directory, as :meth:`_withdraw`'s calls do), and the calls that
        wait for it fail with DependencyFailed."""
        dropped, waiting = self.board.dropped, self.waiting
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
            for d in self.state.withdraw_item(wid):
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
            if start_future(f):
                f.set_exception(e)

    def _withdraw(self) -> None:
        """``shutdown(cancel_futures=True)``: cancel the future of every call not sent to a
        worker, and withdraw those calls from this run (the frontier's and those waiting for a
        dependency): the campaign ends once the calls sent have ended, and the withdrawn ones
        stay pending in the state directory (a re-run that submits them runs them). The calls
        sent and retried since stay in the frontier: their futures are running."""
        self.withdrew = True
        sent = self.sent
        self.state.withdraw(keep=sent)
        for wid in [w for w in self.waiting if w not in sent]:
            for f in self.waiting.pop(wid):
                _cancel(f)
        self.board.withdrawn.set()

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
                        if start_future(f):
                            f.set_exception(e)

    def _cancel_local(self) -> None:
        for item in self.local:
            for f in self.waiting.pop(item.work_id, ()):
                _cancel(f)
        self.local.clear()
        self.queued.clear()

    def committed(self, wid: str, result: Any) -> None:
        """``on_commit``: the result is durable; resolve its futures."""
        board = self.board
        with board.lock:
            board.record[wid] = result
        self.sent.discard(wid)
        for f in self.waiting.pop(wid, ()):  # (each running: its call was sent)
            board.resolve(f, wid, result)

    def deferred(self, d: Defer) -> None:
        """``on_defer``: the item's retries are spent; fail its futures, and those of the items
        deferred for it earlier that its retry had brought back (found first, then failed: no
        future's callback runs while the ledger's structures are walked)."""
        led = self.state.core.ledger
        failed = [(d.work.work_id, d.work.after, (d.kinds, d.last_error, d.attempts))]
        seen = {d.work.work_id}
        k = 0
        while k < len(failed):
            for dep in tuple(led.dependents_of(failed[k][0])):
                if dep in led.deferred and dep not in self.board.failed and dep not in seen:
                    seen.add(dep)
                    kinds = (*led.kinds.get(dep, ()),)
                    attempts, error = led.attempts.get(dep, 0), led.last_error.get(dep)
                    failed.append((dep, led.items[dep].after, (kinds, error, attempts)))
            k += 1
        for wid, after, why in failed:
            self._fail(wid, after, why)

    def _fail(self, wid: str, after: Any, why: tuple[Any, ...]) -> None:
        """Record ``wid`` as failed (``why``: kinds, last error, attempts) and fail its futures."""
        with self.board.lock:
            self.board.failed[wid] = why
        if after:
            self.board.after.setdefault(wid, after)
        self.sent.discard(wid)
        for f in self.waiting.pop(wid, ()):
            if start_future(f):  # (pending when it never ran: a dependency failed)
                f.set_exception(self.board.failure(wid, why))

    def cancelled(self, wid: str) -> None:
        """``on_cancel``: an operator cancelled the call (``durable-dispatch cancel``, O1); its
        futures fail with :class:`TaskFailed` (kind ``"cancelled"``), now and in a re-run."""
        failed = (("cancelled",), CANCELLED_ERROR, self.state.core.ledger.attempts.get(wid, 0))
        with self.board.lock:
            self.board.failed[wid] = failed
        self.sent.discard(wid)
        for f in self.waiting.pop(wid, ()):
            if start_future(f):
                f.set_exception(self.board.failure(wid, failed))

    def abandon(self, why: str) -> None:
        """The campaign ended before these calls: each future fails with BrokenExecutor."""
        board = self.board
        while board.queue:
            try:
                fut, _ = board.queue.popleft()
            except IndexError:
                break
            if start_future(fut):
                fut.set_exception(BrokenExecutor(why))
        for futs in self.waiting.values():
            for f in futs:
                if start_future(f):
                    f.set_exception(BrokenExecutor(why))
        self.waiting.clear()
        self.sent.clear()
        self.local.clear()
        self.queued.clear()


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
