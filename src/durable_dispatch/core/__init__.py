"""The sans-I/O dispatch core: no clock, file, environment or MPI access (a test checks this).

It takes ``now`` and messages and returns decisions; the MPI master loop is a thin shell around it.
Names load on first use (PEP 562): a worker rank that needs a value type (``ItemFailure``) does not
load the dispatcher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ..tokens import Token
    from .config import Correction, RetryPolicy, WatchdogConfig, parse_watchdog_seconds
    from .decisions import (
        Classification,
        Commit,
        Commits,
        Decision,
        Defer,
        ItemFailure,
        Park,
        PersistSnapshot,
        Quarantine,
        Release,
        Requeue,
        Send,
        WorkItem,
    )
    from .dispatcher import Dispatcher, DispatchStats, Transaction, TxEvent, TxState, WorkStatus
    from .ledger import Ledger
    from .ranks import RankState

__all__ = [
    "Classification",
    "Commit",
    "Commits",
    "Correction",
    "Decision",
    "Defer",
    "Dispatcher",
    "DispatchStats",
    "ItemFailure",
    "Ledger",
    "Park",
    "parse_watchdog_seconds",
    "PersistSnapshot",
    "Quarantine",
    "RankState",
    "Release",
    "Requeue",
    "RetryPolicy",
    "Send",
    "Token",
    "Transaction",
    "TxEvent",
    "TxState",
    "WatchdogConfig",
    "WorkItem",
    "WorkStatus",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Classification": ".decisions",
        "Commit": ".decisions",
        "Commits": ".decisions",
        "Correction": ".config",
        "Decision": ".decisions",
        "Defer": ".decisions",
        "Dispatcher": ".dispatcher",
        "DispatchStats": ".dispatcher",
        "ItemFailure": ".decisions",
        "Ledger": ".ledger",
        "Park": ".decisions",
        "parse_watchdog_seconds": ".config",
        "PersistSnapshot": ".decisions",
        "Quarantine": ".decisions",
        "RankState": ".ranks",
        "Release": ".decisions",
        "Requeue": ".decisions",
        "RetryPolicy": ".config",
        "Send": ".decisions",
        "Token": "..tokens",
        "Transaction": ".dispatcher",
        "TxEvent": ".dispatcher",
        "TxState": ".dispatcher",
        "WatchdogConfig": ".config",
        "WorkItem": ".decisions",
        "WorkStatus": ".dispatcher",
    },
    __all__,
)
