"""The submissions store (``submissions.jsonl``): every submitted work item's payload, written
once, by dense index, before the state journal names it.

A record is ``{"first": i, "items": [...], "digests": "..."}``: the items of indices ``i, i+1, ...``
in their compact form (:func:`~durable_dispatch.core.indexed.store_form`) and their payload digests
(:func:`~durable_dispatch.core.indexed.payload_digests`, in hex: a reopen reads them, so a known
work ID submitted again is compared without hashing the store again), up to
:data:`~durable_dispatch.campaign.statedir.SUBMIT_CHUNK` per record, halved while one is too large
for a record. The state journal's ``submitted`` events name the items by index once an fsync covers
the store (:meth:`SubmissionStore.durable`); if the disk refuses, they carry the items themselves,
so nothing submitted is lost either way.
"""

from __future__ import annotations

from ..core import WorkItem
from ..core.indexed import DIGEST_BYTES, payload_digests, store_form
from ..errors import NotDurableError, RecordTooLargeError
from ..storage import Journal
from .statedir import SUBMIT_CHUNK

__all__ = ["SubmissionStore"]


class SubmissionStore:
    """Appends work items to the store's journal by index (see the module docs).

    Args:
        journal: the open ``submissions.jsonl``.
        stored: how many indices the store covers already.
    """

    def __init__(self, journal: Journal, stored: int) -> None:
        self.journal = journal
        #: the indices the store covers: the next item takes this index
        self.stored = stored
        self._seq = journal.next_seq - 1  # its newest record

    def store(self, items: list[WorkItem], first: int, digests: bytes | None = None) -> None:
        """Append ``items`` from index ``first``, with their payload ``digests`` (computed when
        None); :attr:`stored` is the index after the last item stored, also when one item is
        too large.

        Raises:
            RecordTooLargeError: one item is too large for a record (it and those after it
                were not stored).
        """
        if digests is None:
            digests = payload_digests(w.payload for w in items)
        n = DIGEST_BYTES
        for k in range(0, len(items), SUBMIT_CHUNK):
            chunk = items[k : k + SUBMIT_CHUNK]
            self._store_chunk(chunk, first + k, digests[k * n : (k + len(chunk)) * n])

    def _store_chunk(self, items: list[WorkItem], first: int, digests: bytes) -> None:
        rec = {"first": first, "items": [store_form(w) for w in items], "digests": digests.hex()}
        try:
            r = self.journal.append(rec)
        except RecordTooLargeError as e:
            if len(items) == 1:
                raise RecordTooLargeError(
                    f"work item {items[0].work_id!r} is too large to store: {e}",
                    size=e.size,
                    limit=e.limit,
                ) from None
            half = len(items) // 2
            self._store_chunk(items[:half], first, digests[: half * DIGEST_BYTES])
            self._store_chunk(items[half:], first + half, digests[half * DIGEST_BYTES :])
            return
        self.stored = first + len(items)
        self._seq = r.seq

    def durable(self) -> bool:
        """True once an fsync covers every record of the store (waits for it)."""
        if self._seq < 0:
            return True
        try:
            self.journal.wait_durable(self._seq)
        except NotDurableError:
            return False
        return True
