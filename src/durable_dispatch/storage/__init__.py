"""Durable storage: journal, snapshot store and the fs seam they write through."""

from .defer import DeferJournal, DeferReceipt, DeferredItem, DeferStats
from .health import Health, HealthState, Receipt, Record, RecoveryReport
from .journal import Journal
from .snapshot import Snapshot, SnapshotStore

__all__ = [
    "DeferJournal",
    "DeferReceipt",
    "DeferredItem",
    "DeferStats",
    "Journal",
    "Receipt",
    "Record",
    "Health",
    "HealthState",
    "RecoveryReport",
    "Snapshot",
    "SnapshotStore",
]
