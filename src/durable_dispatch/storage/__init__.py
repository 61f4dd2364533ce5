"""Durable storage: journal, snapshot store and the fs seam they write through."""

from .defer import DeferJournal, DeferReceipt, DeferredItem, DeferStats
from .journal import Health, HealthState, Journal, Receipt, Record, RecoveryReport
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
