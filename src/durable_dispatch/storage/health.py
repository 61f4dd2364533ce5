"""What a journal reports: receipts of appends, records read back, its health, and what an open
recovered. Plain values, no I/O (the journal, the defer journal and the campaign state share them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

from .scan import Damage

__all__ = ["Receipt", "Record", "HealthState", "Health", "RecoveryReport"]


class Receipt(NamedTuple):
    """What ``append`` returns: the record's sequence number and whether it is durable *now*.

    ``durable=False`` in ``batch`` mode means "queued": call ``Journal.wait_durable(seq)``.
    """

    seq: int
    durable: bool


class Record(NamedTuple):
    """One record read back from a journal."""

    seq: int
    payload: Any


class HealthState(str, Enum):
    """Whether storage is writing to disk (``OK``) or holding records in memory (``DEGRADED``)."""

    OK = "OK"
    DEGRADED = "DEGRADED"

    def __repr__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Health:
    """An immutable snapshot of a journal's (or snapshot store's) storage health.

    Attributes:
        state: ``OK`` or ``DEGRADED``.
        op: the fs operation that failed (``write``, ``fsync`` ...), when degraded.
        errno: its error number.
        path: the file it was about.
        since: wall-clock time (``time.time()``) when the degradation began.
        pending: how many records (or snapshots) are held only in memory.
    """

    state: HealthState = HealthState.OK
    op: str | None = None
    errno: int | None = None
    path: str | None = None
    since: float | None = None
    pending: int = 0

    @property
    def ok(self) -> bool:
        """True when everything accepted is on disk or on its way there normally."""
        return self.state is HealthState.OK

    def __repr__(self) -> str:
        if self.ok:
            return "OK"
        err = os.strerror(self.errno) if self.errno is not None else "?"
        return (
            f"DEGRADED(op={self.op!r}, errno={self.errno} [{err}], path={self.path!r}, "
            f"since={self.since}, pending={self.pending})"
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return {
            "state": self.state.value,
            "op": self.op,
            "errno": self.errno,
            "path": self.path,
            "since": self.since,
            "pending": self.pending,
        }


@dataclass(frozen=True)
class RecoveryReport:
    """What ``Journal.open`` found and did.

    Attributes:
        mode: the recovery mode used.
        created: the journal file was new (or empty) and a header was written.
        records: intact records kept.
        cut_offset: where the file was cut back to, when it was.
        cut_bytes: how many bytes were removed from the journal (all copied to ``side_file``).
        side_file: where removed bytes were saved.
        damage: every damaged span found, in file order.
    """

    mode: str
    created: bool = False
    records: int = 0
    cut_offset: int | None = None
    cut_bytes: int = 0
    side_file: str | None = None
    damage: tuple[Damage, ...] = ()

    @property
    def clean(self) -> bool:
        """True when nothing was found damaged."""
        return not self.damage
