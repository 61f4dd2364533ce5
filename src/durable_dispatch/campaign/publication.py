"""The campaign's statistics: :class:`CampaignStats` (the counters, an immutable snapshot), and
their publication for readers beside the master (``durable-dispatch stats`` and ``watch``):
one small atomic file, ``master-stats.*.snap``, written at most every :data:`STATS_SECONDS` by a
thread of its own. A display, not state: it is not fsynced, and readers take a damaged one as
none.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import StorageDegradedError
from ..storage import SnapshotStore
from ..storage.background import BackgroundSaver
from .statedir import LIVE_STATS_NAME

__all__ = ["CampaignStats", "Publisher", "STATS_SECONDS"]

log = logging.getLogger("durable_dispatch.state")

#: The master publishes its statistics (``master-stats.*.snap``) at most this often, from
#: ``tick``, so that ``durable-dispatch stats`` and ``watch`` show current figures with their age.
STATS_SECONDS = 2.0


@dataclass(frozen=True)
class CampaignStats:
    """An immutable snapshot of the campaign's counters: the core's, plus storage's.

    Attributes:
        core: the dispatch core's statistics, as a dict.
        epoch: this master run's epoch.
        commits_in_memory: commits accepted while the journal was degraded (not yet durable).
        snapshot_failures: snapshots not saved (the disk refused, or the journal ran from memory).
        replayed_records: journal records replayed at start.
        duplicate_commits_in_journal: second commits of a work ID found (and ignored) at replay.
        journal_health, snapshot_health, defer_health, submissions_health: storage health
            as dicts.
        storage_stalls: fsyncs of this process that took longer than the stall bound
            (``storage.fs.STALL_SECONDS``), ended and ongoing (``storage.fs.stall_report``).
    """

    core: Mapping[str, Any]
    epoch: int
    commits_in_memory: int
    snapshot_failures: int
    replayed_records: int
    duplicate_commits_in_journal: int
    journal_health: Mapping[str, Any]
    snapshot_health: Mapping[str, Any]
    defer_health: Mapping[str, Any]
    submissions_health: Mapping[str, Any] = field(default_factory=dict)
    storage_stalls: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in vars(self).items()}


class Publisher:
    """Publishes a campaign's statistics (see the module docs): ``statistics()`` and, when
    ``allocation()`` returns one, what the master read of its allocation's end."""

    def __init__(
        self,
        directory: str,
        claim: Any,
        *,
        statistics: Callable[[], CampaignStats],
        allocation: Callable[[], Callable[[], dict[str, Any]] | None],
    ) -> None:
        self._live = SnapshotStore(
            directory, name=LIVE_STATS_NAME, keep=2, durable=False, directory_claim=claim
        )
        self._saver = BackgroundSaver(self._live)  # off the master's thread
        self._at = -STATS_SECONDS  # monotonic time of the last publication
        self._statistics = statistics
        self._allocation = allocation
        self._opened_at = time.time()

    def _body(self, running: bool) -> dict[str, Any]:
        """What the statistics file holds."""
        allocation = self._allocation()
        return {
            "ts": time.time(),
            "running": running,
            "pid": os.getpid(),
            "host": os.uname().nodename,
            "started": self._opened_at,
            "stats": self._statistics().as_dict(),
        } | ({"allocation": allocation()} if allocation is not None else {})

    def publish(self, *, running: bool = True, force: bool = False) -> bool:
        """Write the statistics at most every :data:`STATS_SECONDS` unless ``force``, by the
        publisher's thread (the master's loop never waits for its fsync: a shared filesystem
        that stalls for a minute stalls only that thread); ``force`` (at close) writes it here,
        once that thread finished. Returns True when written or handed over; a disk that
        refuses is not an error (the campaign goes on)."""
        t = time.monotonic()
        if not force and t - self._at < STATS_SECONDS:
            return False
        self._at = t
        body = self._body(running)
        if not force:
            return self._saver.submit(body)
        self._saver.close()
        try:
            self._live.save(body)
        except StorageDegradedError as e:
            log.warning("statistics not published: %s", e)
            return False
        return True

    def hand_over(self, *, running: bool) -> bool:
        """Hand the statistics to the publisher's thread now (the close's last figures, written
        beside the close's snapshot); True when it took them."""
        return self._saver.submit(self._body(running))

    def close(self) -> None:
        """Wait for the publisher's thread to end."""
        self._saver.close()
