"""The worker loop: receive WORK, run the user's function, answer RESULT then READY.

The function runs in a daemon thread while the main thread keeps listening, so a STOP from the
master ends the worker even when the function hangs, and heartbeats the function asks for are sent
promptly. Heartbeats are opt-in (``heartbeat=True`` passes a callable to the function): a worker
that hangs never heartbeats, so the watchdog can still recover its task.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from . import protocol as P
from .signals import CaughtSignals

__all__ = ["run_worker", "WorkerFault"]

#: Test-only lies a worker can tell, keyed by name (see ``faults`` in :func:`run_worker`).
WorkerFault = str
_FAULTS = ("hang", "slow", "malformed", "missing", "old-token", "crash", "raise", "unencodable")


def _send(comm: Any, mpi: Any, body: Any, tag: int, raw: bytes | None = None) -> None:
    data = raw if raw is not None else P.encode(body)
    comm.Send([data, mpi.BYTE], dest=0, tag=tag)


def _result_message(token: Any, box: dict[str, Any]) -> bytes:
    """The RESULT for a finished dispatch: one entry per item, and an ``errors`` entry for each
    item whose function raised or returned a value JSON cannot hold (the master charges that item
    a retry and commits the rest), never a dead worker."""
    results: list[Any] = box["results"]
    errors: dict[str, str] = box["errors"]
    body: dict[str, Any] = {"token": token, "results": results}
    if errors:
        body["errors"] = errors
    try:
        return P.encode(body)
    except TypeError:  # orjson.JSONEncodeError: find the items whose results cannot be sent
        for i, value in enumerate(results):
            try:
                P.encode(value)
            except TypeError as e:
                results[i] = None
                errors[str(i)] = f"result is not JSON-serializable: {e}"
        body["errors"] = errors
        return P.encode(body)


def _work(
    fn: Callable[..., Any],
    items: list[tuple[Any, str | None]],
    slow_seconds: float,
    heartbeat: bool,
    beats: queue.SimpleQueue[int],
    box: dict[str, Any],
) -> None:
    """Run the user's function on each ``(payload, fault)`` in the work thread, in order; the
    outcomes go into ``box["results"]`` and ``box["errors"]`` (index -> reason)."""
    results: list[Any] = []
    errors: dict[str, str] = {}
    box["results"], box["errors"] = results, errors
    beat = lambda: beats.put(1)  # noqa: E731
    for i, (payload, fault) in enumerate(items):
        try:
            if fault == "hang":
                while True:
                    time.sleep(3600)
            if fault == "slow":
                time.sleep(slow_seconds)
            if fault == "raise":
                raise RuntimeError("injected failure in the work function")
            if fault == "unencodable":
                results.append({"not JSON": {1, 2}})  # a set: this result cannot be sent
                continue
            results.append(fn(payload, beat) if heartbeat else fn(payload))
        except BaseException as e:  # the master learns of it as this item's error
            results.append(None)
            errors[str(i)] = f"{type(e).__name__}: {e}"


_MESSAGE_FAULTS = ("malformed", "missing", "old-token")


def run_worker(
    fn: Callable[..., Any],
    *,
    comm: Any = None,
    heartbeat: bool = False,
    faults: Callable[[str, int], WorkerFault | None] | None = None,
    slow_seconds: float = 0.0,
    poll: float = 0.001,
) -> int:
    """Serve WORK from rank 0 until STOP; returns how many work items this worker ran.

    Each WORK message holds one or more items (see :mod:`.protocol`); the function runs on each
    in order, and one RESULT with an entry per item, then READY, answer the message.

    Args:
        fn: ``fn(payload) -> result`` (JSON-compatible), or ``fn(payload, beat)`` with
            ``heartbeat=True``, where ``beat()`` asks the worker to send a HEARTBEAT now.
        comm: the communicator (``MPI.COMM_WORLD`` by default).
        heartbeat: pass a heartbeat callable to ``fn``.
        faults: test hook ``faults(work_id, attempt) -> name or None`` making this worker lie:
            ``hang`` (never answer), ``slow`` (sleep ``slow_seconds`` then answer), ``malformed``
            (a RESULT that is not JSON), ``missing`` (READY without RESULT), ``old-token`` (RESULT
            with another token), ``crash`` (SIGKILL itself); and two failures of the function
            itself: ``raise`` (it raises) and ``unencodable`` (it returns a value JSON cannot
            hold). Either becomes an ``errors`` entry for that item in the RESULT: the worker
            lives on. In a multi-item dispatch, ``hang`` and ``slow`` act at their item, and
            ``crash``, ``malformed``, ``missing`` and ``old-token`` act on the whole message.
        slow_seconds: how long a ``slow`` fault sleeps.
        poll: seconds between probes while idle or while the function runs.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    _send(comm, MPI, {"token": None}, P.READY)
    # One long-lived daemon thread runs the user's function, so the main thread stays free to
    # hear STOP (even when the function hangs) and to send the heartbeats it asks for.
    jobs: queue.SimpleQueue[tuple[tuple[Any, ...], threading.Event]] = queue.SimpleQueue()
    beats: queue.SimpleQueue[int] = queue.SimpleQueue()

    def runner() -> None:
        while True:
            args, finished = jobs.get()
            _work(*args)
            finished.set()

    threading.Thread(target=runner, name="durable-dispatch-work", daemon=True).start()
    # U5: a batch system signals every task. The first signal is only noted (the item in hand
    # is finished, and the draining master sends STOP); a second one ends the worker at once.
    with CaughtSignals(on_repeat=lambda signum: os._exit(128 + signum)):
        return _serve(comm, MPI, fn, faults, slow_seconds, heartbeat, poll, jobs, beats)


def _serve(
    comm: Any,
    MPI: Any,
    fn: Callable[..., Any],
    faults: Callable[[str, int], WorkerFault | None] | None,
    slow_seconds: float,
    heartbeat: bool,
    poll: float,
    jobs: queue.SimpleQueue[tuple[tuple[Any, ...], threading.Event]],
    beats: queue.SimpleQueue[int],
) -> int:
    """The worker's loop (see :func:`run_worker`)."""
    status = MPI.Status()
    done = 0
    last_token: str | None = None
    while True:
        comm.Probe(source=0, tag=MPI.ANY_TAG, status=status)
        n = status.Get_count(MPI.BYTE)
        buf = bytearray(n)
        comm.Recv([buf, MPI.BYTE], source=0, tag=status.Get_tag())
        if status.Get_tag() == P.STOP:
            return done
        body, _err = P.decode(buf)
        if body is None:
            continue
        work = body.get("items")
        if not isinstance(work, list) or not all(isinstance(w, dict) for w in work):
            continue
        token = body.get("token")
        plan = [
            (w.get("payload"), faults(str(w.get("work_id")), int(w.get("attempt", 0))))
            if faults
            else (w.get("payload"), None)
            for w in work
        ]
        if any(f == "crash" for _, f in plan):
            os.kill(os.getpid(), 9)
        fault = next((f for _, f in plan if f in _MESSAGE_FAULTS), None)
        box: dict[str, Any] = {}
        finished = threading.Event()
        jobs.put(((fn, plan, slow_seconds, heartbeat, beats, box), finished))
        while True:
            over = finished.wait(poll)
            while not beats.empty():
                beats.get()
                _send(comm, MPI, {"token": token}, P.HEARTBEAT)
            if over:
                break
            if comm.Iprobe(source=0, tag=P.STOP, status=status):
                comm.Recv([bytearray(status.Get_count(MPI.BYTE)), MPI.BYTE], 0, P.STOP)
                return done  # the function may still be running; its thread is a daemon
        done += len(plan)
        if fault == "malformed":
            _send(comm, MPI, None, P.RESULT, raw=b"{not json")
        elif fault == "old-token":
            _send(comm, MPI, {"token": last_token or "e0-0", "results": box["results"]}, P.RESULT)
        elif fault != "missing":
            _send(comm, MPI, None, P.RESULT, raw=_result_message(token, box))
        _send(comm, MPI, {"token": token}, P.READY)
        last_token = token
