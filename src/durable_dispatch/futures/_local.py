"""An executor on a communicator of one rank (``MPICommExecutor(MPI.COMM_SELF)``): as in mpi4py,
its calls run in a thread of that rank, here the executor's manager thread, which runs each
dispatch as it sends it (a :class:`~durable_dispatch.testing.LocalWorkers` transport of one
worker). Each call is durable as on worker ranks (sealed, journaled, committed before its future
resolves); nothing is isolated: a crash ends the rank, a hang holds the executor, and
``task_timeout`` cannot stop a call (mpi4py's threads are the same)."""

from __future__ import annotations

import threading
from typing import Any

from ..mpi import protocol as P
from ..mpi.context import WorkContext
from ..testing.workers import LocalWorkers
from ._serve import Task

__all__ = ["InThread"]


class _Forget(list):  # type: ignore[type-arg]
    """A log that keeps nothing (LocalWorkers logs every message for tests)."""

    def append(self, _: Any) -> None:
        pass


class InThread(LocalWorkers):
    """One worker that runs the calls in the thread that sends them (see the module docs)."""

    def __init__(self) -> None:
        super().__init__(self._call, 1, context=True)
        self.log = _Forget()
        self._task: Task | None = None
        self._set = threading.Event()
        self._state = "new"  # "up" once the initializer ran, "gone" when it raised

    def start(self, session: bytes) -> None:
        """The executor's set-up (as a worker rank gets it); the calls may run from now."""
        from mpi4py import MPI

        self._task = Task(session)
        self._task.comm_workers = MPI.COMM_SELF  # get_comm_workers(): this rank alone
        self._set.set()

    def _call(self, payload: Any, ctx: WorkContext) -> Any:
        assert self._task is not None
        return self._task(payload, ctx)

    def receive(self, limit: int) -> list[tuple[int, int, bytes]]:
        """As :class:`LocalWorkers`; the worker's first READY once the set-up came and the
        initializer ran in this thread (one that raises ends the worker as a worker rank's
        does: GONE instead of READY, and the executor is broken)."""
        if self._state == "new":
            if not self._set.is_set():
                return []
            assert self._task is not None
            try:
                self._task.initialize()
                self._state = "up"
            except BaseException as e:  # noqa: BLE001 - the master learns it (GONE)
                self._state = "gone"
                error = f"the initializer failed: {type(e).__name__}: {e}"
                self._inbox.clear()
                self._inbox.append((1, P.GONE, P.encode({"error": error})))
        return super().receive(limit)
