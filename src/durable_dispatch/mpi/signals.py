"""Batch-system signals, caught only while a campaign runs: they drain the job, and it ends
with the resumable status.

A batch system ends a job with signals: Slurm sends ``SIGTERM`` to every task at the time limit
(and ``SIGKILL`` after ``KillWait``, 30 s by default), and ``--signal=B:USR1@120`` or
``srun --signal=USR1@120`` sends ``SIGUSR1`` ahead of it; Open MPI's ``mpiexec`` forwards
``SIGUSR1``/``SIGUSR2`` to every rank. :class:`CaughtSignals` records them instead of letting
Python's default action kill the process, so the master can drain and the workers can finish
their current item. Handlers are installed only in the main thread (elsewhere it records
nothing) and the previous ones are restored on exit.

One event, several signals. Slurm delivers one event as several signals: the time limit's
SIGTERM goes to the batch shell and to every task, and ``srun`` forwards the SIGTERM it got to
every task again; ``scancel --signal=USR1 --full`` signals every process and a batch script's
``trap`` forwards it once more. So signals that arrive within :data:`SAME_REQUEST_SECONDS` (5 s)
of the first signal of a request are that same request: only a signal later than that is a
second request (which stops at once). :attr:`CaughtSignals.requests` holds one entry per
request; :attr:`CaughtSignals.received` every signal.

Late copies. A copy of the request can arrive after the campaign returned (the master has
drained within the window and is finalising MPI): on exit, once a signal was caught, the
handlers stay in place until the window has passed, absorbing copies, and only then does a
drain signal get its previous handler (the default ends the process). A rank that drained so
ends with its resumable outcome, never with 128 + the signal's number.

Early signals. Slurm's ``--signal`` can arrive seconds after the job started (measured: 1 s into
a one-minute job with ``@30``), before ``run_master``/``run_worker`` installed their handlers, and
the default action killed the rank (exit 138, a FAILED job). So a process started by an MPI
launcher (:func:`record_early`, called when :mod:`durable_dispatch.mpi` is imported) records
SIGTERM and SIGUSR1 from then on: the campaign that starts later drains at once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

__all__ = [
    "CaughtSignals",
    "DRAIN_SIGNALS",
    "EARLY_SIGNALS",
    "SAME_REQUEST_SECONDS",
    "record_early",
    "launched_rank",
]

#: The signals that ask a campaign to drain: a batch system's, and Ctrl-C.
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

#: Signals within this many seconds of the first signal of a request are the same request
#: (one event that Slurm delivers several times); a later one is a second request.
SAME_REQUEST_SECONDS = 5.0


#: The signals a launched rank records from import on (SIGINT keeps Python's KeyboardInterrupt).
EARLY_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_early: list[tuple[int, float]] = []  # (signal, monotonic time) before a campaign started


def _early_handler(signum: int, _frame: FrameType | None) -> None:
    _early.append((signum, time.monotonic()))


def launched_rank(env: Any = None) -> bool:
    """True in a process an MPI launcher started as a rank (``mpiexec``: Open MPI's
    ``OMPI_COMM_WORLD_RANK``, Hydra's ``PMI_RANK``; ``srun``: ``SLURM_PROCID`` in a step), not
    in an isolated child of a worker."""
    env = os.environ if env is None else env
    if env.get("DURABLE_DISPATCH_ISOLATED_CHILD"):  # context.CHILD_MARKER
        return False
    if env.get("OMPI_COMM_WORLD_RANK") or env.get("PMI_RANK") or env.get("PMIX_RANK"):
        return True
    return bool(env.get("SLURM_PROCID")) and env.get("SLURM_STEP_ID", "batch") not in (
        "batch",
        "extern",
    )


def record_early(env: Any = None) -> bool:
    """In a launched rank (:func:`launched_rank`), record SIGTERM and SIGUSR1 from now on
    instead of dying of them (main thread only; a signal that has a handler already is left
    alone); the next :class:`CaughtSignals` takes them as its first request. Returns True when
    it installed the handlers."""
    if not launched_rank(env) or threading.current_thread() is not threading.main_thread():
        return False
    done = False
    for s in EARLY_SIGNALS:
        if signal.getsignal(s) == signal.SIG_DFL:
            signal.signal(s, _early_handler)
            done = True
    return done


class CaughtSignals:
    """A context manager recording ``signals`` as they arrive (see the module docs).

    Args:
        signals: the signals to catch.
        on_repeat: called (in the handler) with the signal number when a second *request*
            arrives (a signal more than ``window`` seconds after the first of the previous
            request); the master stops at once then, a worker stops.
        window: seconds during which further signals count as the same request.
        clock: the monotonic clock (a test may pass its own).

    Attributes:
        received: every signal caught, in order.
        requests: the first signal of each request, in order (what a campaign acts on).
    """

    def __init__(
        self,
        signals: Iterable[int] = DRAIN_SIGNALS,
        on_repeat: Callable[[int], None] | None = None,
        *,
        window: float = SAME_REQUEST_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.signals = tuple(signals)
        self.received: list[int] = []
        self.requests: list[int] = []
        self.window = window
        self._clock = clock
        self._request_at: float | None = None
        self._on_repeat = on_repeat
        self._previous: dict[int, Any] = {}
        self._closed = False

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        now = self._clock()
        if self._closed:
            self._late(signum, now)
            return
        self.received.append(signum)
        if self._request_at is not None and now - self._request_at < self.window:
            return  # a copy of the request in progress (U10)
        self._request_at = now
        self.requests.append(signum)
        if len(self.requests) > 1 and self._on_repeat is not None:
            self._on_repeat(signum)

    def _late(self, signum: int, now: float) -> None:
        """A signal after the context ended: a copy within the window is absorbed; a later one
        gets the handler that was there before (the default ends the process)."""
        if self._request_at is not None and now - self._request_at < self.window:
            return
        self._restore()
        previous = signal.getsignal(signum)
        if callable(previous):
            previous(signum, None)
        elif previous == signal.SIG_DFL:
            os.kill(os.getpid(), signum)  # the default action, now that it is back

    def same_request(self, now: float | None = None) -> bool:
        """True while a signal now would count as a copy of the last request."""
        t = self._clock() if now is None else now
        return self._request_at is not None and t - self._request_at < self.window

    def __enter__(self) -> CaughtSignals:
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handle)
            early, _early[:] = list(_early), []
            for signum, at in early:  # arrived before the campaign started: a request now
                if signum in self.signals:
                    self.received.append(signum)
                    if not self.requests:  # its time, on this object's clock
                        self._request_at = self._clock() - (time.monotonic() - at)
                        self.requests.append(signum)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.received and self.same_request():
            self._closed = True  # keep absorbing copies until the window has passed
            return
        self._restore()

    def _restore(self) -> None:
        self._closed = True
        for s, handler in self._previous.items():
            if signal.getsignal(s) == self._handle:  # nobody else took it over since
                signal.signal(s, handler)
        self._previous.clear()
