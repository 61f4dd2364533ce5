"""The worker loop: receive WORK, run the user's function, answer RESULT then READY.

The function runs one of two ways:

- **In-process** (the default): a daemon thread runs it while the main thread keeps listening, so
  a STOP from the master ends the worker even when the function hangs, and heartbeats the function
  asks for are sent promptly. A hang parks the rank until the job ends (no communicator repair);
  a segfault ends the rank (and, without ULFM, the whole job).
- **Isolated** (``isolate=True``, see :mod:`.isolation`): a supervised child process runs it. At
  the dispatch's deadline the worker kills the child's process tree and reports kind ``timeout``;
  a child that dies is reported as kind ``crash`` (with the signal's name) and restarted; either
  way RESULT and READY follow with the exact token, so the rank comes back (only its exact
  READY releases a parked rank).

Heartbeats are opt-in (``heartbeat=True`` passes ``beat``; ``context=True`` passes a
:class:`~.context.WorkContext` with ``beat()``): a worker that hangs never heartbeats, so the
watchdog can still recover its task.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import processes
from ..errors import UsageError
from . import guard
from . import protocol as P
from .context import (
    CHILD_MARKER,
    MAX_RESULT_BYTES,
    Batch,
    ItemOutcome,
    Outcomes,
    WorkContext,
    run_items,
)
from .isolation import CANCEL_REQUESTED, CancelRequested, IsolatedRunner, StopRequested
from .launchcheck import require_workers
from .protocol import result_message as result_message
from .signals import CaughtSignals
from .usage import InProcessMeter

__all__ = ["run_worker", "WorkContext"]
# (result_message: the RESULT's encoder lives in protocol.py; imported here for the test
# workers of durable_dispatch.testing, which take it from this module)

log = logging.getLogger("durable_dispatch.mpi")
#: When no item of a dispatch has finished for this long, the outcomes the worker holds are
#: sent ahead of the dispatch's RESULT (see :class:`_Ahead`; only for dispatches the master
#: marks ``ahead``: those ``batch="auto"`` sized). Items of such a dispatch finish much closer
#: together than this, so they still travel in one RESULT; a part costs a message and a
#: journal record, at most one per this long per worker.
AHEAD_SECONDS = 0.05


class _Link:
    """The worker's side of the wire: rank 0 only, raw JSON bytes."""

    SPIN = 0.002  # seconds :meth:`receive` polls without a pause before it naps

    def __init__(self, comm: Any, MPI: Any) -> None:
        self.comm, self.MPI = comm, MPI
        self.status = MPI.Status()
        self.interrupted = False  # a second signal request (U10): stop as on STOP

    def send(self, tag: int, raw: bytes) -> None:
        try:
            self.comm.Send([raw, self.MPI.BYTE], dest=0, tag=tag)
        except self.MPI.Exception as e:  # the master is gone: the next receive says STOP
            log.warning("worker %d: a send to the master failed: %s", self.comm.Get_rank(), e)

    def receive(self) -> tuple[int, bytearray]:
        """The next message from rank 0 (waiting for it); a STOP when rank 0 is gone (under
        ULFM the probe fails with MPI_ERR_PROC_FAILED): a worker without a master stops (U4).

        It polls with ``Iprobe``: for ``SPIN`` seconds without a pause (the next WORK of a
        busy campaign comes within that: napping at once cost one-item dispatches 3x their
        throughput), then with naps between polls (50 us, doubling to 1 ms), instead of a
        blocking ``Probe``: MPICH's blocking probe spins on its core for as long as it waits,
        and idle workers that spin starve an oversubscribed master (16 ranks on 2 cores)."""
        probe, status, tag_any = self.comm.Iprobe, self.status, self.MPI.ANY_TAG
        try:
            if not probe(source=0, tag=tag_any, status=status):
                until, nap = time.monotonic() + self.SPIN, 0.00005
                while not probe(source=0, tag=tag_any, status=status):
                    if self.interrupted:
                        return P.STOP, bytearray()
                    if time.monotonic() > until:
                        time.sleep(nap)
                        nap = min(nap * 2, 0.001)
            buf = bytearray(self.status.Get_count(self.MPI.BYTE))
            tag = self.status.Get_tag()
            self.comm.Recv([buf, self.MPI.BYTE], source=0, tag=tag)
        except self.MPI.Exception as e:
            return self._master_gone(e), bytearray()
        return tag, buf

    def stop_arrived(self) -> bool:
        """True (and the STOP consumed) when rank 0 sent STOP, or is gone, or a second signal
        request arrived."""
        if self.interrupted:
            return True
        try:
            if not self.comm.Iprobe(source=0, tag=P.STOP, status=self.status):
                return False
            n = self.status.Get_count(self.MPI.BYTE)
            self.comm.Recv([bytearray(n), self.MPI.BYTE], 0, P.STOP)
        except self.MPI.Exception as e:
            self._master_gone(e)
        return True

    def cancel_arrived(self, token: Any) -> bool:
        """True when rank 0 sent CANCEL for ``token`` (O1; each CANCEL read is consumed, one
        for another token ignored)."""
        hit = False
        try:
            while self.comm.Iprobe(source=0, tag=P.CANCEL, status=self.status):
                buf = bytearray(self.status.Get_count(self.MPI.BYTE))
                self.comm.Recv([buf, self.MPI.BYTE], 0, P.CANCEL)
                body, _err = P.decode(buf)
                hit = hit or (body is not None and body.get("token") == token)
        except self.MPI.Exception as e:
            self._master_gone(e)
        return hit

    def _master_gone(self, e: Exception) -> int:
        guard.peer_failed(master=True)  # MPI_Finalize may wait for it forever: leave without
        log.warning(
            "worker %d: the master (rank 0) is gone (%s); stopping", self.comm.Get_rank(), e
        )
        return P.STOP


#: what the in-process runner's thread tells the worker's loop (with the dispatch's box)
_DONE, _BEAT = 0, 1


class _InProcessRunner:
    """Runs each dispatch's items in one long-lived daemon thread of this process.

    The thread tells the worker's loop of a heartbeat and of the dispatch's end through one
    ``SimpleQueue`` (C-level: the loop wakes at once, and a one-item dispatch's hand-over and
    back costs about half of what an ``Event`` per dispatch cost on a VM's two cores); the
    loop wakes at least every ``poll`` seconds to look for STOP. The thread writes each item's
    outcome into the dispatch's :class:`~.context.Outcomes` (its ``done`` moves after each),
    which the loop reads as it grows."""

    def __init__(self, fn: Callable[..., Any], mode: str, max_result: int, poll: float) -> None:
        self.fn, self.mode, self.max_result, self.poll = fn, mode, max_result, poll
        self.jobs: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        #: (the outcomes of the dispatch it is about, _DONE or _BEAT), from the thread
        self.events: queue.SimpleQueue[tuple[Outcomes, int]] = queue.SimpleQueue()
        threading.Thread(target=self._thread, name="durable-dispatch-work", daemon=True).start()

    def _thread(self) -> None:
        meter = InProcessMeter()  # (this process: other threads count too)
        events = self.events
        while True:
            batch, out, deadline, lease = self.jobs.get()
            beat = functools.partial(events.put, (out, _BEAT))
            meter.rebase()
            run_items(
                self.fn, self.mode, batch, deadline, lease, beat, self.max_result, out, meter=meter
            )
            meter.settle(out)
            events.put((out, _DONE))

    def run(
        self,
        batch: Batch,
        out: Outcomes,
        deadline: float | None,
        lease: float,
        tick: Callable[[], bool],
        beat: Callable[[], None],
        report: Callable[[int], None] | None = None,
    ) -> ItemOutcome | None:
        """Run ``batch`` into ``out``; None (an in-process dispatch never fails as a whole).
        ``report(index)`` is called as each item's outcome arrives; ``tick()`` about every
        ``poll`` seconds (True: STOP arrived, :class:`StopRequested` is raised)."""
        self.jobs.put((batch, out, deadline, lease))
        reported = 0
        events, poll = self.events, self.poll
        while True:
            over = False
            try:
                said = events.get(timeout=poll)
                while True:  # (and whatever else came meanwhile)
                    if said[0] is out:  # (an abandoned dispatch's word is not this one's)
                        if said[1] == _DONE:
                            over = True
                        else:
                            beat()
                    said = events.get_nowait()
            except queue.Empty:
                pass
            if report is not None:
                while reported < out.done:
                    report(reported)
                    reported += 1
            if over:
                return None
            if tick():  # the function may still run; its thread is a daemon
                raise StopRequested

    @staticmethod
    def seal_part(part: Outcomes) -> None:
        """Give the items of a part sent ahead the worker's peak now (see :mod:`.usage`)."""
        part.rss = [InProcessMeter.peak()] * len(part.rss)

    def prepare(self) -> None:
        """Nothing to get ready between dispatches."""

    def close(self) -> None:
        pass


class _Ahead:
    """A dispatch's finished items, sent ahead of its RESULT when the rest is slow.

    The runner reports each item as its outcome arrives (:meth:`add`, its index); :meth:`due`,
    called about every millisecond while the dispatch runs, sends the outcomes held as a part
    (a RESULT with ``ids``, see :mod:`.protocol`) once no item has finished for
    :data:`AHEAD_SECONDS` and some item is still to come. So a call that ended waits for a slow
    batch-mate at most that long, and the master commits it durably at once. :meth:`rest`
    gives the outcomes the dispatch's RESULT still carries.
    """

    def __init__(
        self,
        link: _Link,
        token: Any,
        ids: list[Any],
        out: Outcomes,
        seal: Callable[[Outcomes], None],
    ) -> None:
        self.link, self.token, self.ids, self.out, self.seal = link, token, ids, out, seal
        self.held: list[int] = []
        self.sent: set[int] = set()
        self.last = 0.0  # when the last outcome arrived

    def add(self, index: int) -> None:
        """The outcome of item ``index`` arrived."""
        self.held.append(index)
        self.last = time.monotonic()

    def tick(self) -> bool:
        """The runner's ``tick``: send what is due, then say whether STOP arrived."""
        self.due()
        return self.link.stop_arrived()

    def due(self) -> None:
        """Send the outcomes held as a part, if they are due."""
        held = self.held
        if (
            held
            and len(self.sent) + len(held) < len(self.ids)
            and time.monotonic() - self.last >= AHEAD_SECONDS
        ):
            order = sorted(held)
            part = self.out.select(order)
            self.seal(part)
            ids = [self.ids[i] for i in order]
            self.link.send(P.RESULT, P.part_message(self.token, part, ids))
            self.sent.update(order)
            held.clear()

    def rest(self) -> tuple[Outcomes, list[Any]]:
        """The outcomes and the work IDs of the items not sent ahead, in order."""
        if not self.sent:
            return self.out, self.ids
        keep = [i for i in range(len(self.ids)) if i not in self.sent]
        return self.out.select(keep), [self.ids[i] for i in keep]


class WorkerHooks:
    """Where a test worker may lie (``durable_dispatch.testing.run_lying_worker``); the
    production loop uses this class as it is, which changes nothing."""

    def on_work(self, token: Any, items: Batch) -> None:
        """A WORK message arrived (before its items run)."""

    def result(self, token: Any, raw: bytes) -> bytes | None:
        """The RESULT about to be sent; None sends none."""
        return raw


def run_worker(
    fn: Callable[..., Any],
    *,
    comm: Any = None,
    heartbeat: bool = False,
    context: bool = False,
    isolate: bool = False,
    memory_limit: int | None = None,
    max_result_bytes: int = MAX_RESULT_BYTES,
    poll: float = 0.001,
    child_mpi: bool = False,
) -> int:
    """Serve WORK from rank 0 until STOP; returns how many work items this worker ran.

    Each WORK message holds one or more items (see :mod:`.protocol`); the function runs on each
    in order, and one RESULT with an entry per item, then READY, answer the message (in a
    dispatch marked ``ahead``, when a slow item holds finished ones back for
    :data:`AHEAD_SECONDS`, their entries go ahead in a part, and the RESULT has the rest). An
    item whose function raised is reported as kind ``error``, a value JSON cannot hold as
    ``malformed-result``, one over ``max_result_bytes`` as ``result-too-large``: the worker
    lives on and the master charges that item's retry budget for its kind.

    Args:
        fn: ``fn(payload) -> result`` (JSON-compatible); ``fn(payload, beat)`` with
            ``heartbeat=True``, where ``beat()`` sends a HEARTBEAT now; ``fn(payload, ctx)`` with
            ``context=True``, where ``ctx`` is a :class:`WorkContext` (work ID, attempt,
            deadline, ``beat()``).
        comm: the communicator (``MPI.COMM_WORLD`` by default).
        heartbeat: pass a heartbeat callable to ``fn``.
        context: pass a :class:`WorkContext` to ``fn``.
        isolate: run ``fn`` in a supervised child process (see :mod:`.isolation`): a hang
            costs its deadline (kind ``timeout``), a crash a restart (kind ``crash``), never
            the rank. ``fn`` must be a module-level function, and the script's MPI part must
            sit under ``if __name__ == "__main__":``.
        memory_limit: with ``isolate``, the child's address-space limit in bytes
            (``RLIMIT_AS``); an item that needs more fails with ``MemoryError`` (kind ``error``)
            or dies (kind ``crash``), and the rank lives on.
        max_result_bytes: a result's bound once encoded (default: one journal record).
        poll: seconds between checks for STOP while the function runs.
        child_mpi: with ``isolate``, the child may initialize MPI, as a world of its own (a
            singleton: the launcher's variables are not in its environment), for a script
            that calls MPI when it is imported; its start then takes MPI's initialization
            (about 1 s under Open MPI). By default the child never initializes MPI, and such a
            script fails it with :class:`IsolationError`.

    Raises:
        UsageError: ``heartbeat`` with ``context``; ``memory_limit`` without ``isolate``; a
            ``memory_limit``, ``max_result_bytes`` or ``poll`` out of range; called inside an
            isolated child (the script runs its MPI part at import).
        IsolationError: ``isolate=True`` and the child cannot load ``fn`` (raised before this
            worker says READY, so the job ends at once with the reason).
    """
    return _run(
        fn,
        comm=comm,
        mode="context" if context else "beat" if heartbeat else "payload",
        isolate=isolate,
        memory_limit=memory_limit,
        max_result=max_result_bytes,
        poll=poll,
        hooks=WorkerHooks(),
        both=heartbeat and context,
        child_mpi=child_mpi,
    )


def _run(
    fn: Callable[..., Any],
    *,
    comm: Any,
    mode: str,
    isolate: bool,
    memory_limit: int | None,
    max_result: int,
    poll: float,
    hooks: WorkerHooks,
    both: bool = False,
    child_mpi: bool = False,
) -> int:
    """:func:`run_worker`, with the hooks a test worker lies through."""
    if os.environ.get(CHILD_MARKER):
        raise UsageError(
            "run_worker was called inside an isolated child: the campaign script runs its MPI "
            "part when imported; put it under 'if __name__ == \"__main__\":'"
        )
    if both:
        raise UsageError("pass heartbeat=True or context=True, not both (ctx.beat() beats)")
    if memory_limit is not None and not isolate:
        raise UsageError("memory_limit needs isolate=True (it limits the child process)")
    if memory_limit is not None and (type(memory_limit) is not int or memory_limit <= 0):
        raise UsageError(f"memory_limit must be a positive number of bytes, got {memory_limit!r}")
    if type(max_result) is not int or max_result <= 0:
        raise UsageError(f"max_result_bytes must be a positive integer, got {max_result!r}")
    if type(poll) not in (int, float) or not poll >= 0:  # (NaN too)
        raise UsageError(f"poll must be a number of seconds, 0 or more, got {poll!r}")
    from mpi4py import MPI

    link = _Link(comm or MPI.COMM_WORLD, MPI)
    require_workers(link.comm)  # U10: a world of size 1 has no master to serve
    runner: _InProcessRunner | IsolatedRunner | None = None

    def second_signal(signum: int) -> None:
        # U10: a second request (not a copy of the first) stops this worker as a STOP would:
        # the item in hand is abandoned (an isolated child is killed), the rank ends with 0
        link.interrupted = True

    try:
        # U3: whatever ends this process (SIGKILL, the OOM killer, its normal end), what its
        # items started dies with it (see processes.start_reaper)
        if not processes.start_reaper():
            log.warning(
                "worker %d: no reaper (needs Linux): a program an item starts may outlive "
                "this rank if it is killed",
                link.comm.Get_rank(),
            )
        if isolate:
            runner = IsolatedRunner(fn, mode, max_result, memory_limit, child_mpi=child_mpi)
        else:
            runner = _InProcessRunner(fn, mode, max_result, poll)
        # up: the master may send work now (and journals the host for the joblog)
        link.send(P.READY, P.encode({"token": None, "host": socket.gethostname()}))
        # U5: a batch system signals every task. The first signal is only noted (the item in
        # hand is finished, and the draining master sends STOP); copies of it within the
        # window are the same request (U10); a second request stops the worker.
        with CaughtSignals(on_repeat=second_signal):
            return _serve(link, runner, hooks)
    except Exception as e:
        # U8: tell the master this rank is gone, so that it never waits for it (with every
        # worker gone it stops with reason "no workers left"); the error then ends this rank.
        error = f"{type(e).__name__}: {e}"[: P.REASON_MAX]
        log.error("worker %d: %s", link.comm.Get_rank(), error)
        link.send(P.GONE, P.encode({"error": error}))
        raise
    finally:
        if runner is not None:
            runner.close()


def _tick_or_cancel(tick: Callable[[], bool], link: _Link, token: Any) -> Any:
    """An isolated runner's ``tick``: STOP first, then a CANCEL of this dispatch."""
    return tick() or (CANCEL_REQUESTED if link.cancel_arrived(token) else False)


def _serve(link: _Link, runner: _InProcessRunner | IsolatedRunner, hooks: WorkerHooks) -> int:
    """The worker's loop (see :func:`run_worker`)."""
    done = 0
    while True:
        tag, buf = link.receive()
        if tag == P.STOP:
            return done
        work = P.read_work(P.decode(buf)[0], buf)
        if work is None:
            continue
        token, batch, seconds, lease = work.token, work.items, work.seconds, work.lease
        deadline = time.monotonic() + seconds if seconds is not None else None
        hooks.on_work(token, batch)
        beat = functools.partial(link.send, P.HEARTBEAT, P.encode({"token": token}))
        out = Outcomes(len(batch))
        ahead = _Ahead(link, token, batch.ids, out, runner.seal_part) if work.ahead else None
        tick: Callable[[], bool] = link.stop_arrived
        report: Callable[[int], None] | None = None
        if ahead is not None:  # a slow item must not hold the others' outcomes (see _Ahead)
            tick, report = ahead.tick, ahead.add
        if isinstance(runner, IsolatedRunner):  # O1: an operator's cancel kills the child
            tick = functools.partial(_tick_or_cancel, tick, link, token)
        try:
            whole = runner.run(batch, out, deadline, lease, tick, beat, report)
        except StopRequested:
            return done
        except CancelRequested:  # (the master rolled it back: READY releases the rank, W7)
            runner.prepare()
            link.send(P.READY, P.encode({"token": token}))
            continue
        done += len(batch)
        ids = batch.ids
        if ahead is not None and whole is None:
            out, ids = ahead.rest()
        raw = hooks.result(token, result_message(token, out, whole, ids))
        if raw is not None:
            link.send(P.RESULT, raw)
        runner.prepare()  # a killed or crashed child is restarted before READY, not in an item
        link.send(P.READY, P.encode({"token": token}))
