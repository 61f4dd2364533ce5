"""Durable storage: journal, snapshot store and the fs seam they write through."""

from .journal import Health, HealthState, Journal, Receipt, Record, RecoveryReport
from .snapshot import Snapshot, SnapshotStore

__all__ = [
    "Journal",
    "Receipt",
    "Record",
    "Health",
    "HealthState",
    "RecoveryReport",
    "Snapshot",
    "SnapshotStore",
]
