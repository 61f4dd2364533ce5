"""durable-dispatch: crash-safe MPI master/worker task farms.

Only re-exports live here; see the README for the tour and ``docs/`` for the details. The names are
loaded on first use (PEP 562), so a process that needs one part (a worker rank, the command line
on a journal file) does not pay for the others.

The library logs under the ``durable_dispatch`` logger, which has a ``NullHandler`` (the logging
HOWTO's rule for libraries): nothing is printed unless the program configures logging
(``logging.basicConfig()``); the ``durable-dispatch`` command and the demo do, for people.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from .campaign.results import CommittedResult, read_results
    from .campaign.state import CampaignState
    from .core import Dispatcher, ItemFailure, RetryPolicy, WatchdogConfig, WorkItem
    from .errors import DurableDispatchError
    from .mpi.context import WorkContext
    from .programs import CommandOutcome, run_command
    from .storage import (
        DeferJournal,
        Health,
        HealthState,
        Journal,
        Receipt,
        Record,
        RecoveryReport,
        Snapshot,
        SnapshotStore,
    )

__version__ = "0.1.0"

__all__ = [
    "CampaignState",
    "CommittedResult",
    "read_results",
    "CommandOutcome",
    "run_command",
    "Dispatcher",
    "ItemFailure",
    "RetryPolicy",
    "WatchdogConfig",
    "WorkItem",
    "WorkContext",
    "DeferJournal",
    "DurableDispatchError",
    "Health",
    "HealthState",
    "Journal",
    "Receipt",
    "Record",
    "RecoveryReport",
    "Snapshot",
    "SnapshotStore",
]

logging.getLogger("durable_dispatch").addHandler(logging.NullHandler())

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CampaignState": ".campaign.state",
        "CommittedResult": ".campaign.results",
        "read_results": ".campaign.results",
        "CommandOutcome": ".programs",
        "run_command": ".programs",
        "Dispatcher": ".core",
        "ItemFailure": ".core",
        "WorkContext": ".mpi.context",
        "RetryPolicy": ".core",
        "WatchdogConfig": ".core",
        "WorkItem": ".core",
        "DeferJournal": ".storage",
        "DurableDispatchError": ".errors",
        "Health": ".storage",
        "HealthState": ".storage",
        "Journal": ".storage",
        "Receipt": ".storage",
        "Record": ".storage",
        "RecoveryReport": ".storage",
        "Snapshot": ".storage",
        "SnapshotStore": ".storage",
    },
    __all__,
)
