"""durable-dispatch: crash-safe MPI master/worker task farms.

Only re-exports live here; see the README for the tour and ``docs/`` for the details.
"""

from .core import Dispatcher, RetryPolicy, WatchdogConfig, WorkItem
from .errors import DurableDispatchError
from .state import CampaignState
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
    "Dispatcher",
    "RetryPolicy",
    "WatchdogConfig",
    "WorkItem",
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
