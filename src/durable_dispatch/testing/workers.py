"""Workers for tests, above the MPI shell: a worker that lies on purpose, and in-process workers.

:func:`run_lying_worker` is a worker built on the public worker loop that lies to the master on
purpose, for tests of the master's rules (a hang, a late answer, a malformed RESULT ...).

:class:`LocalWorkers` runs a campaign's work function in-process, as the workers would, so
``run_master`` runs without ``mpiexec``: a user's test of a campaign, and the loop's own test of
the order of its steps in a turn. Users import both as :mod:`durable_dispatch.testing`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from typing import Any

from ..errors import UsageError

__all__ = ["run_lying_worker", "WORKER_LIES", "LocalWorkers"]

#: The lies :func:`run_lying_worker` can tell (see there).
WORKER_LIES = ("hang", "slow", "malformed", "missing", "old-token", "crash", "raise", "unencodable")


def run_lying_worker(
    fn: Any,
    faults: Any,
    *,
    slow_seconds: float = 0.0,
    heartbeat: bool = False,
    context: bool = False,
    isolate: bool = False,
    comm: Any = None,
    poll: float = 0.001,
) -> int:
    """Serve WORK like ``run_worker(fn, ...)``, lying where ``faults`` says so.

    Args:
        fn: the work function, called as ``run_worker`` would call it.
        faults: ``faults(work_id, attempt) -> lie or None``, asked once per item as its WORK
            arrives. Lies of the function: ``hang`` (never answer), ``slow`` (sleep
            ``slow_seconds``, then answer), ``raise`` (raise: kind ``error``), ``unencodable``
            (return a value JSON cannot hold: kind ``malformed-result``, deferred at once: a
            value that cannot be stored is not retried). Lies of the message,
            acting on the whole dispatch: ``malformed`` (a RESULT that is not JSON), ``missing``
            (READY without RESULT), ``old-token`` (a RESULT with the previous token), ``crash``
            (SIGKILL this process).
            With ``isolate=True`` only the lies of the message are told (the function runs in
            the child as it is; put a function's misbehaviour in its payload instead).
        slow_seconds: how long ``slow`` sleeps.
        heartbeat, context, isolate, comm, poll: as for ``run_worker``.

    Returns:
        How many work items it ran.
    """
    import orjson

    # The MPI shell is imported when used, not with the package: the pytest plugin imports
    # durable_dispatch.testing into every test run of a user's suite.
    from ..mpi import worker as _w
    from ..mpi.context import MAX_RESULT_BYTES

    plan: dict[str, str | None] = {}
    function_lies = ("hang", "slow", "raise", "unencodable")

    def lying(payload: Any, ctx: Any) -> Any:
        lie = plan.get(ctx.work_id)
        if lie == "hang":
            while True:
                time.sleep(3600)
        if lie == "slow":
            time.sleep(slow_seconds)
        if lie == "raise":
            raise RuntimeError("injected failure in the work function")
        if lie == "unencodable":
            return {"not JSON": {1, 2}}  # a set: this result cannot be sent
        if context:
            return fn(payload, ctx)
        return fn(payload, ctx.beat) if heartbeat else fn(payload)

    class Lies(_w.WorkerHooks):
        last_token: Any = None
        message_lie: str | None = None

        def on_work(self, token: Any, items: Any) -> None:
            plan.clear()
            attempts = items.attempts or [0] * len(items.ids)
            for work_id, attempt in zip(items.ids, attempts, strict=True):
                lie = faults(str(work_id), attempt)
                if lie is not None and lie not in WORKER_LIES:
                    raise UsageError(f"unknown lie {lie!r}; use one of {WORKER_LIES}")
                if isolate and lie in function_lies:
                    raise UsageError(f"the lie {lie!r} of the function needs isolate=False")
                plan[str(work_id)] = lie
            if "crash" in plan.values():
                os.kill(os.getpid(), signal.SIGKILL)
            lies = [x for x in plan.values() if x in ("malformed", "missing", "old-token")]
            self.message_lie = lies[0] if lies else None

        def result(self, token: Any, raw: bytes) -> bytes | None:
            lie, last, self.last_token = self.message_lie, self.last_token, token
            if lie == "malformed":
                return b"{not json"
            if lie == "missing":
                return None
            if lie == "old-token":
                return orjson.dumps({**orjson.loads(raw), "token": last or "e0-0"})
            return raw

    if heartbeat and context:
        raise UsageError("pass heartbeat=True or context=True, not both (ctx.beat() beats)")
    return _w._run(
        fn if isolate else lying,
        comm=comm,
        mode=("context" if context else "beat" if heartbeat else "payload")
        if isolate
        else "context",
        isolate=isolate,
        memory_limit=None,
        max_result=MAX_RESULT_BYTES,
        poll=poll,
        hooks=Lies(),
    )


def _no_beat() -> None:
    """A heartbeat of an in-process worker: nothing to send (no deadline runs out here)."""


class LocalWorkers:
    """A :class:`~durable_dispatch.mpi.transport.Transport` whose workers run in this process:
    test a campaign (its work function, its callback, its resume) with no ``mpiexec``::

        from durable_dispatch import run_master
        from durable_dispatch.testing import LocalWorkers

        report = run_master(items, tmp_path / "state", on_commit, comm=LocalWorkers(fn, 3))

    Each WORK is answered as ``run_worker(fn)`` answers it (one RESULT with an entry per item;
    a function that raised is an item error of kind ``error``), then READY; both arrive at the
    master's next receive, in that order, as MPI's non-overtaking rule delivers them. Each
    worker announces itself first with a READY without a token. The work runs when the WORK is
    sent, in the master's thread: no hang or crash is isolated (use ``mpiexec`` for those).

    Args:
        fn: ``fn(payload) -> result``; ``fn(payload, ctx)`` with ``context=True``.
        workers: how many worker ranks (1 .. workers; the master is rank 0).
        context: pass a ``WorkContext`` to ``fn``.
        answer: ``answer(rank, token, work_ids)`` may return False to leave a WORK unanswered
            (a hung worker: the watchdog parks its rank), or ``"result-only"`` to send the
            RESULT without its READY; anything else answers normally.
        hosts: the host name each rank's first READY names (rank -> name; a rank not in it
            names this machine's, ``socket.gethostname()``), as workers on several nodes would.

    Attributes:
        log: every call the master made, in order: ``("receive", [(rank, TAG), ...])``,
            ``("send", rank, "WORK", token)``, ``("stop", [ranks])`` (receives that found
            nothing are not logged).
    """

    def __init__(
        self,
        fn: Any,
        workers: int = 3,
        *,
        context: bool = False,
        answer: Any = None,
        hosts: Mapping[int, str] | None = None,
    ) -> None:
        import socket
        from collections import deque

        import orjson

        from ..mpi import protocol as P
        from ..mpi.context import MAX_RESULT_BYTES, Outcomes, run_items
        from ..mpi.worker import result_message

        if type(workers) is not int or workers < 1:
            raise UsageError(f"workers must be an integer >= 1, got {workers!r}")
        self._P = P
        # (what each send uses, looked up once: a send is one task of a campaign's test)
        self._loads, self._run_items, self._result = orjson.loads, run_items, result_message
        self._outcomes = Outcomes
        self._max_result = MAX_RESULT_BYTES
        self.fn, self.mode, self.answer = fn, "context" if context else "payload", answer
        self.size = workers + 1
        self.ulfm = False
        self.log: list[tuple[Any, ...]] = []
        self.stopped: list[int] = []
        here, named = socket.gethostname(), dict(hosts or {})
        self._inbox: deque[tuple[int, int, bytes]] = deque(
            (r, P.READY, P.encode({"token": None, "host": named.get(r, here)}))
            for r in range(1, self.size)
        )

    def receive(self, limit: int) -> list[tuple[int, int, bytes]]:
        """The messages the workers sent since the last call, up to ``limit``, in order."""
        out: list[tuple[int, int, bytes]] = []
        while self._inbox and len(out) < limit:
            out.append(self._inbox.popleft())
        if out:
            self.log.append(("receive", [(r, self._P.TAG_NAMES[t]) for r, t, _ in out]))
        return out

    def send(self, rank: int, tag: int, data: bytes) -> str | None:
        """Take a WORK to ``rank``: run its items now and queue the RESULT and READY."""
        P = self._P
        if not 1 <= rank < self.size:
            return f"no rank {rank}"
        body = self._loads(data)
        token = body.get("token")
        self.log.append(("send", rank, P.TAG_NAMES.get(tag, str(tag)), token))
        if tag != P.WORK:
            return None
        work = P.read_work(body, data)
        if work is None:  # (a worker ignores a WORK it cannot read)
            return None
        items = work.items
        how = self.answer(rank, token, list(items.ids)) if self.answer else None
        if how is False:
            return None
        deadline = time.monotonic() + work.seconds if work.seconds is not None else None
        out = self._outcomes(len(items))
        self._run_items(
            self.fn, self.mode, items, deadline, work.lease, _no_beat, self._max_result, out
        )
        self._inbox.append((rank, P.RESULT, self._result(token, out, None)))
        if how != "result-only":
            self._inbox.append((rank, P.READY, P.encode({"token": token})))
        return None

    def failed_ranks(self) -> list[int]:
        """Never any (no ULFM here)."""
        return []

    def stop(self, ranks: Any, data: bytes, tag: int, timeout: float) -> bool:
        """STOP to ``ranks``: recorded in :attr:`stopped` and the log."""
        self.stopped = sorted(ranks)
        self.log.append(("stop", self.stopped))
        return True

    def abort(self, code: int) -> None:
        """A real job would end here; in a test that is a failure of its own."""
        raise RuntimeError(f"the master aborted the job (code {code})")
