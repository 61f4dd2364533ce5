"""The campaign's snapshots: the durable state folded up to a journal sequence number, written
atomically (a :class:`~durable_dispatch.storage.SnapshotStore`), in the compact form (indices and
runs, no payload: its cost does not grow with the campaign).

A snapshot is published only once the journal it folds is on disk: it is renamed into place only
once an fsync covers its last record, and never while a record it folds is memory-only. Commits
journaled and not yet closed in the core (a group commit runs) are folded as committed, as a
replay of the journal counts them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..core import Dispatcher
from ..errors import StorageDegradedError
from ..storage import Journal, SnapshotStore
from .delivery import Deliveries
from .publication import CampaignStats
from .submissions import SubmissionStore

__all__ = ["Checkpoints"]

log = logging.getLogger("durable_dispatch.state")


class _JournalBehind(Exception):
    """A snapshot's journal records are not on disk (the journal runs from memory): the
    snapshot is not published (not an OSError: the snapshot store's own health is fine)."""


class Checkpoints:
    """Writes the campaign's snapshots (see the module docs) and counts the ones not saved."""

    def __init__(
        self,
        snapshots: SnapshotStore,
        journal: Journal,
        store: SubmissionStore,
        core: Dispatcher,
        deliveries: Deliveries,
        *,
        statistics: Callable[[], CampaignStats],
        wait_durable: Callable[[int], bool],
    ) -> None:
        self._snapshots = snapshots
        self._journal = journal
        self._store = store
        self._core = core
        self._deliveries = deliveries
        self._statistics = statistics
        self._wait_durable = wait_durable
        #: snapshots not saved (the disk refused, or the journal ran from memory)
        self.failures = 0

    def save(self, reason: str = "") -> bool:
        """Write a snapshot; tells the core it is persisted. False if the disk refused (logged
        with ``reason``: the state stays in memory and in the journal; the campaign goes on)."""
        seq = self._journal.next_seq - 1
        ok = True
        try:
            if not self._store.durable():
                # A compact snapshot names items by index: without the store on disk it would
                # name what a crash could lose. The journal still holds every event.
                raise StorageDegradedError(
                    "the submissions store is not durable",
                    path=self._store.journal.path,
                    op="fsync",
                )
            body = {
                "journal_seq": seq,
                "delivered_seq": self._deliveries.delivered_seq,
                "state": self._projection(),
                "stats": self._statistics().as_dict(),
                "ts": time.time(),
            }

            # The snapshot folds the journal through ``seq``: it is renamed into place only once
            # an fsync covers ``seq``, which the group commit runs while it is written (issue 49),
            # and never while a record through ``seq`` is memory-only: a crash would lose the
            # journal's records the snapshot claims to fold, and the next master would write its
            # own under their numbers, which a replay from this snapshot would then pass over.
            def covered() -> None:
                if not self._wait_durable(seq):
                    raise _JournalBehind(
                        f"the journal's records through {seq} are not on disk "
                        f"({self._journal.path} runs from memory)"
                    )

            self._snapshots.save(body, before_publish=covered if seq >= 0 else None)
        except (StorageDegradedError, _JournalBehind) as e:
            self.failures += 1
            log.error("snapshot (%s) not saved: %s", reason, e)
            ok = False
        self._core.snapshot_persisted()
        return ok

    def _projection(self) -> dict[str, Any]:
        """The durable state through the journal's last record: the core's snapshot, with the
        commits already journaled but not yet closed (a group commit in progress) counted as
        committed, as a replay of the journal would count them. Without this, a snapshot taken
        between a commit's record and its delivery would fold that record in as in flight, and a
        restart would run the work again and record a second commit."""
        done = self._deliveries.committing()
        assert self._store.stored >= len(self._core.ledger.ids), "the store covers every index"
        return self._core.ledger.to_compact(done)
