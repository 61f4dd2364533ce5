"""Batch-system signals, caught only while a campaign runs (U5).

A batch system ends a job with signals: Slurm sends ``SIGTERM`` to every task at the time limit
(and ``SIGKILL`` after ``KillWait``, 30 s by default), and ``--signal=B:USR1@120`` or
``srun --signal=USR1@120`` sends ``SIGUSR1`` ahead of it; Open MPI's ``mpiexec`` forwards
``SIGUSR1``/``SIGUSR2`` to every rank. :class:`CaughtSignals` records them instead of letting
Python's default action kill the process, so the master can drain and the workers can finish
their current item. Handlers are installed only in the main thread (elsewhere it records
nothing) and the previous ones are restored on exit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

__all__ = ["CaughtSignals", "DRAIN_SIGNALS"]

#: The signals that ask a campaign to drain: a batch system's, and Ctrl-C.
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class CaughtSignals:
    """A context manager recording ``signals`` as they arrive (see the module docs).

    Args:
        signals: the signals to catch.
        on_repeat: called (in the handler) with the signal number when one arrives while an
            earlier one was already recorded; the master stops at once then, a worker exits.
    """

    def __init__(
        self,
        signals: Iterable[int] = DRAIN_SIGNALS,
        on_repeat: Callable[[int], None] | None = None,
    ) -> None:
        self.signals = tuple(signals)
        self.received: list[int] = []
        self._on_repeat = on_repeat
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) > 1 and self._on_repeat is not None:
            self._on_repeat(signum)

    def __enter__(self) -> CaughtSignals:
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
