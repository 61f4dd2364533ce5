"""The sans-I/O dispatch core: no clock, file, environment or MPI access (a test checks this).

It takes ``now`` and messages and returns decisions; the MPI master loop is a thin shell around it.
"""

from .config import Correction, RetryPolicy, WatchdogConfig, parse_watchdog_seconds
from .decisions import (
    Classification,
    Commit,
    Decision,
    Defer,
    Park,
    PersistSnapshot,
    Quarantine,
    Release,
    Requeue,
    Send,
    WorkItem,
)
from .dispatcher import Dispatcher, DispatchStats, Transaction, TxState, WorkStatus
from .tokens import Token

__all__ = [
    "Classification",
    "Commit",
    "Correction",
    "Decision",
    "Defer",
    "Dispatcher",
    "DispatchStats",
    "Park",
    "PersistSnapshot",
    "Quarantine",
    "Release",
    "Requeue",
    "RetryPolicy",
    "Send",
    "Token",
    "Transaction",
    "TxState",
    "WatchdogConfig",
    "WorkItem",
    "WorkStatus",
    "parse_watchdog_seconds",
]
