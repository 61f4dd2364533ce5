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
import traceback
from collections.abc import Callable
from typing import Any

from . import protocol as P

__all__ = ["run_worker", "WorkerFault"]

#: Test-only lies a worker can tell, keyed by name (see ``faults`` in :func:`run_worker`).
WorkerFault = str
_FAULTS = ("hang", "slow", "malformed", "missing", "old-token", "crash", "raise", "unencodable")


def _send(comm: Any, mpi: Any, body: Any, tag: int, raw: bytes | None = None) -> None:
    data = raw if raw is not None else P.encode(body)
    comm.Send([data, mpi.BYTE], dest=0, tag=tag)


def _result_message(token: Any, box: dict[str, Any]) -> bytes:
    """The RESULT for a finished function: its result, or its error. A result JSON cannot hold is
    an error RESULT (the master counts an invalid result and retries), never a dead worker."""
    if "error" not in box:
        try:
            return P.encode({"token": token, "result": box.get("result")})
        except TypeError as e:  # orjson.JSONEncodeError
            box["error"] = f"result is not JSON-serializable: {e}"
    return P.encode({"token": token, "error": box["error"]})


def _work(
    fn: Callable[..., Any],
    payload: Any,
    fault: str | None,
    slow_seconds: float,
    heartbeat: bool,
    beats: queue.SimpleQueue[int],
    box: dict[str, Any],
) -> None:
    """Run the user's function in the work thread; the outcome goes into ``box``."""
    try:
        if fault == "hang":
            while True:
                time.sleep(3600)
        if fault == "slow":
            time.sleep(slow_seconds)
        if fault == "raise":
            raise RuntimeError("injected failure in the work function")
        if fault == "unencodable":
            box["result"] = {"not JSON": {1, 2}}  # a set: the function's result cannot be sent
            return
        box["result"] = fn(payload, lambda: beats.put(1)) if heartbeat else fn(payload)
    except BaseException as e:  # the master learns of it as an error result
        box["error"] = f"{type(e).__name__}: {e}"
        box["trace"] = traceback.format_exc(limit=5)


def run_worker(
    fn: Callable[..., Any],
    *,
    comm: Any = None,
    heartbeat: bool = False,
    faults: Callable[[str, int], WorkerFault | None] | None = None,
    slow_seconds: float = 0.0,
    poll: float = 0.001,
) -> int:
    """Serve WORK from rank 0 until STOP; returns how many items this worker ran.

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
            hold). Either becomes a RESULT with an ``error``: the worker lives on.
        slow_seconds: how long a ``slow`` fault sleeps.
        poll: seconds between probes while idle or while the function runs.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    _send(comm, MPI, {"token": None}, P.READY)
    status = MPI.Status()
    done = 0
    last_token: str | None = None
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
        token = body.get("token")
        wid = str(body.get("work_id"))
        fault = faults(wid, int(body.get("attempt", 0))) if faults else None
        if fault == "crash":
            os.kill(os.getpid(), 9)
        box: dict[str, Any] = {}
        finished = threading.Event()
        jobs.put(((fn, body.get("payload"), fault, slow_seconds, heartbeat, beats, box), finished))
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
        done += 1
        if fault == "malformed":
            _send(comm, MPI, None, P.RESULT, raw=b"{not json")
        elif fault == "old-token":
            _send(comm, MPI, {"token": last_token or "e0-0", "result": box.get("result")}, P.RESULT)
        elif fault != "missing":
            _send(comm, MPI, None, P.RESULT, raw=_result_message(token, box))
        _send(comm, MPI, {"token": token}, P.READY)
        last_token = token
