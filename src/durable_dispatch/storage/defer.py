"""The defer journal: a durable record of work items that ran out of retries.

Theory of operation. A :class:`DeferJournal` is a :class:`~durable_dispatch.storage.journal.Journal`
(same format, default file name ``.dispatch_protocol_deferred.jsonl``, ``sync="always"`` by
default because deferrals are rare and each one matters) holding two kinds of records: ``deferred``
(a work item, its attempts, failure kinds and last error) and ``resolved`` (the item was requeued,
dropped or replayed). The live deferred set is every deferred work ID not resolved since.

Honest counting (the rule from the design this library generalises): a deferral whose append was not
fsynced, because the disk failed and the journal fell back to memory, is counted as
``in_memory``, never as ``persisted``; it moves to ``persisted`` only when ``try_restore()`` has
written it to a fresh, fsynced file.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from operator import eq, getitem, itemgetter, mul, not_
from typing import Any

import orjson

from ..errors import JournalCorruptError, NotDurableError, UsageError
from ..schema import Invalid, check_defer_record
from .health import Health
from .journal import Journal
from .scan import RawBatch

__all__ = [
    "DeferJournal",
    "DeferredItem",
    "DeferReceipt",
    "DeferStats",
    "DEFAULT_DEFER_NAME",
    "compact_journal",
    "compact_file",
]

DEFAULT_DEFER_NAME = ".dispatch_protocol_deferred.jsonl"
RESOLUTIONS = ("requeued", "dropped", "replayed", "cancelled")  # cancelled: issue 52


@dataclass(frozen=True)
class DeferredItem:
    """One deferred work item as recorded.

    Attributes:
        work_id: the stable semantic work ID.
        item: the work item's JSON payload.
        attempts: how many dispatches failed.
        kinds: the failure kinds seen (``timeout``, ``malformed-result``, ``send-failure`` ...).
        last_error: the last failure's description.
        inputs: paths the item needs to be replayed (empty when self-contained).
        self_contained: True when the item carries everything it needs.
        seq: the journal sequence number of the deferral.
        traceback: the last failure's traceback when the work function raised (its last
            lines), else None.
    """

    work_id: str
    item: Any
    attempts: int
    kinds: tuple[str, ...]
    last_error: str | None
    inputs: tuple[str, ...] = ()
    self_contained: bool = False
    seq: int = -1
    traceback: str | None = None

    def replayable(self, exists: Callable[[str], bool] = os.path.exists) -> bool:
        """True when the item can be replayed: it is self-contained or all its inputs exist."""
        return self.self_contained or all(exists(p) for p in self.inputs)


@dataclass(frozen=True)
class DeferReceipt:
    """What :meth:`DeferJournal.defer` returns: the sequence number and whether it is on disk."""

    seq: int
    persisted: bool


@dataclass(frozen=True)
class DeferStats:
    """Immutable counters of a defer journal (this process's view since it opened).

    Attributes:
        persisted: deferrals known fsynced to disk.
        in_memory: deferrals held only in memory after a disk fault (not persisted).
        resolved: resolutions recorded.
        live: work IDs deferred and not resolved.
    """

    persisted: int = 0
    in_memory: int = 0
    resolved: int = 0
    live: int = 0


@dataclass
class _Counts:
    persisted: int = 0
    memory_seqs: list[int] = field(default_factory=list)
    resolved: int = 0


# The compactor reads a record's event and work ID from the payload bytes this module writes:
# b'{"event":"deferred","work_id":"<id>",...' (orjson keeps insertion order, no spaces).
_PREFIXES = (b'{"event":"deferred","work_id":"', b'{"event":"resolved","work_id":"')
_KIND_AT = len(b'{"event":"')  # the byte that tells "deferred" from "resolved"
_ID_AT = len(_PREFIXES[0])
_DEFERRED, _RESOLVED = ord("d"), ord("r")
_cut: Any = getitem  # bytes[slice] -> bytes; typeshed's map() cannot say so


def _event_and_id(raw: bytes) -> tuple[int, bytes]:
    """``(kind, work-ID key)`` of one payload in any form, by decoding it; kind 0 for a record
    that is neither a deferral nor a resolution. The key is the work ID as orjson encodes it
    inside quotes: the form the fast path reads straight from the bytes."""
    p = orjson.loads(raw)
    if not isinstance(p, dict) or not isinstance(p.get("work_id"), str):
        return 0, b""
    ev = p.get("event")
    kind = _DEFERRED if ev == "deferred" else _RESOLVED if ev == "resolved" else 0
    return kind, orjson.dumps(p["work_id"])[1:-1]


def _last_events(offsets: list[int], payloads: list[bytes]) -> dict[bytes, int]:
    """Each work ID's last event in a run of records: the offset of its deferral, or 0 when it
    was resolved (no record starts at offset 0: the header does). Records of other kinds are left
    out.

    Read with C-level ``map`` over the payload bytes when every payload starts with a prefix this
    module writes and no work ID holds an escape; decoded one by one otherwise.
    """
    p = payloads
    n = len(p)
    # Each payload must name "event" and "work_id" once: a decoder takes the last of duplicate
    # keys, so a second one (even inside a nested value) sends the run down the decoding path.
    joined = b"".join(p)
    if (
        n
        and all(map(bytes.startswith, p, repeat(_PREFIXES, n)))
        and joined.count(b'"event":') == joined.count(b'"work_id":') == n
    ):
        ends = list(map(bytes.find, p, repeat(b'"', n), repeat(_ID_AT, n)))
        keys = list(map(_cut, p, map(slice, repeat(_ID_AT, n), ends)))
        if min(ends) >= _ID_AT and b"\\" not in b"".join(keys):
            deferred = map(eq, map(itemgetter(_KIND_AT), p), repeat(_DEFERRED, n))
            return dict(zip(keys, map(mul, offsets, deferred), strict=True))
    last: dict[bytes, int] = {}
    for off, raw in zip(offsets, p, strict=True):
        try:
            kind, key = _event_and_id(raw)
        except orjson.JSONDecodeError:
            # Intact bytes (the checksum holds) that are not JSON: this library never writes
            # them, and DeferJournal cannot read past them; refuse rather than drop the record.
            raise JournalCorruptError(
                f"record at offset {off}: payload is not JSON",
                offset=off,
                reason="payload is not JSON",
            ) from None
        if kind:
            last[key] = off if kind == _DEFERRED else 0
    return last


class _LiveSet:
    """The live deferred set as ``work-ID key -> offset of its newest deferral``, fed run by run
    of records in journal order (the memory compaction needs: the live IDs, not the file)."""

    def __init__(self) -> None:
        self.ids: dict[bytes, int] = {}
        self.records = 0

    def add(self, batch: RawBatch) -> None:
        self.records += len(batch.offsets)
        last = _last_events(batch.offsets, batch.payloads)
        # C-level loops: work IDs whose last event here is a deferral enter the live set, those
        # whose last event is a resolution leave it (never inserted only to be removed).
        self.ids.update(compress(last.items(), last.values()))
        resolved = compress(last, map(not_, last.values()))
        deque(map(self.ids.pop, resolved, repeat(None)), maxlen=0)

    def keep_only(self, journal: Journal, dry_run: bool) -> tuple[int, int]:
        """Rewrite ``journal`` with the live records: re-read at their offsets, verified again,
        copied as they are. Returns ``(records_before, records_after)``."""
        if dry_run:
            return self.records, len(self.ids)
        keep = sorted(self.ids.values())
        self.ids = {}  # free the map before the rewrite
        kept = chain.from_iterable(b.payloads for b in journal.raw_at(keep))
        return self.records, journal.replace_contents(kept, raw=True)


def compact_journal(journal: Journal, *, dry_run: bool = False) -> tuple[int, int]:
    """Rewrite an open defer journal with only the newest deferral of each live work ID,
    crash-safe: at every instant the old or the new file is whole.

    Streaming: one verifying pass over the file keeps only ``work ID -> file offset`` of the live
    deferrals; the kept records are then re-read at those offsets, verified again and copied, as
    they are, into the new file. Memory is bounded by the live set's IDs, not the file. The
    rewrite is atomic (temp file, fsync, rename, directory fsync); the records get new, larger
    sequence numbers. Returns ``(records_before, records_after)``.
    """
    live = _LiveSet()
    journal.sync_now()
    for batch in journal.raw_batches():
        live.add(batch)
    return live.keep_only(journal, dry_run)


def compact_file(
    path: str | os.PathLike[str],
    *,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
    **journal_kw: Any,
) -> tuple[int, int]:
    """Open the defer journal at ``path`` and compact it (see :func:`compact_journal`).

    Reads the file once fewer: the live set is collected by the verifying scan that opening does
    anyway (``Journal.open(visit=...)``). If that scan found damage (a torn tail it cut, say), the
    records are read again after the repair. ``progress(bytes_done, bytes_total)`` is called as
    the file is read. Extra keyword arguments go to :meth:`Journal.open`.

    Raises:
        LockHeldError: a writer has the journal open.
        JournalCorruptError: damage the open does not repair, or an intact record whose payload
            is not JSON.
    """
    live = _LiveSet()
    size = os.path.getsize(path) if os.path.exists(path) else 0

    def visit(batch: RawBatch) -> None:
        live.add(batch)
        if progress is not None:
            progress(batch.offsets[-1], size)

    with Journal.open(path, sync="always", visit=visit, **journal_kw) as journal:
        if journal.recovery.damage:
            return compact_journal(journal, dry_run=dry_run)
        return live.keep_only(journal, dry_run)


class DeferJournal:
    """Durable set of deferred work items with honest persisted/in-memory accounting.

    Open with :meth:`open`; use as a context manager or call :meth:`close`.
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._counts = _Counts()
        self._live: dict[str, DeferredItem] = {}
        self._records = 0
        try:
            for rec in journal.records():
                self._apply(rec.seq, rec.payload)
                self._records += 1
        except BaseException:
            journal.close()  # an invalid record (S11): the open fails, nothing is left open
            raise

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, sync: str = "always", **journal_kw: Any
    ) -> DeferJournal:
        """Open the defer journal at ``path`` (a file, or a directory for the default name).

        Extra keyword arguments go to :meth:`Journal.open`.

        Raises:
            JournalCorruptError: a record does not match the defer record schema, or see
                :meth:`Journal.open`.
        """
        p = os.fspath(path)
        claim = journal_kw.get("directory_claim")
        held = claim is not None and os.path.abspath(claim.directory) == os.path.abspath(p)
        if held or os.path.isdir(p):  # (the claimed state directory is one: no lookup)
            p = os.path.join(p, DEFAULT_DEFER_NAME)
        return cls(Journal.open(p, sync=sync, **journal_kw))

    def _apply(self, seq: int, payload: Any) -> None:
        try:
            check_defer_record(payload)
        except Invalid as e:
            raise JournalCorruptError(
                f"invalid defer record (seq {seq}): {e}",
                path=self.journal.path,
                reason=f"invalid record: {e}",
            ) from None
        event = payload.get("event")
        wid = payload.get("work_id")
        if not isinstance(wid, str):
            return
        if event == "deferred":
            self._live[wid] = DeferredItem(
                work_id=wid,
                item=payload.get("item"),
                attempts=int(payload.get("attempts", 0)),
                kinds=tuple(payload.get("kinds", ())),
                last_error=payload.get("last_error"),
                inputs=tuple(payload.get("inputs", ())),
                self_contained=bool(payload.get("self_contained", False)),
                seq=seq,
                traceback=tb if isinstance(tb := payload.get("traceback"), str) else None,
            )
        elif event == "resolved":
            self._live.pop(wid, None)

    def defer(
        self,
        work_id: str,
        item: Any,
        *,
        attempts: int,
        kinds: tuple[str, ...] | list[str] = (),
        last_error: str | None = None,
        inputs: tuple[str, ...] | list[str] = (),
        self_contained: bool = False,
        traceback: str | None = None,
        cost: dict[str, Any] | None = None,
    ) -> DeferReceipt:
        """Record that ``work_id`` is deferred; returns whether that record is on disk.

        A ``persisted=False`` receipt means the item is held in memory (the journal is degraded):
        it is counted in ``in_memory`` until :meth:`try_restore` succeeds.

        Raises:
            UsageError: ``work_id`` is not a non-empty string.
            MemoryBoundError: degraded and the memory bound is reached (nothing recorded).
        """
        if not isinstance(work_id, str) or not work_id:
            raise UsageError(f"work_id must be a non-empty string, got {work_id!r}")
        payload = {
            "event": "deferred",
            "work_id": work_id,
            "item": item,
            "attempts": attempts,
            "kinds": list(kinds),
            "last_error": last_error,
            "inputs": list(inputs),
            "self_contained": self_contained,
        }
        if traceback is not None:  # the last failure's, when the function raised
            payload["traceback"] = traceback
        if cost is not None:  # what the last failed attempt cost (the joblog's)
            payload["cost"] = cost
        r = self.journal.append(payload)
        persisted = r.durable
        if not persisted and self.journal.sync != "always" and self.journal.health.ok:
            try:
                self.journal.wait_durable(r.seq)
                persisted = True
            except NotDurableError:
                persisted = False
        if persisted:
            self._counts.persisted += 1
        else:
            self._counts.memory_seqs.append(r.seq)
        self._apply(r.seq, payload)
        self._records += 1
        return DeferReceipt(r.seq, persisted)

    def resolve(self, work_id: str, how: str) -> bool:
        """Record that a deferred item was ``requeued``, ``dropped``, ``replayed`` or
        ``cancelled`` (an operator's ``durable-dispatch cancel``).

        Returns:
            True when the resolution is on disk (False: held in memory, degraded).

        Raises:
            UsageError: an unknown resolution or a work ID that is not deferred.
        """
        if how not in RESOLUTIONS:
            raise UsageError(f"unknown resolution {how!r}; use one of {RESOLUTIONS}")
        if work_id not in self._live:
            raise UsageError(f"{work_id!r} is not deferred")
        r = self.journal.append({"event": "resolved", "work_id": work_id, "how": how})
        self._live.pop(work_id, None)
        self._counts.resolved += 1
        self._records += 1
        return r.durable

    def try_restore(self) -> bool:
        """Make memory-only deferrals durable (see :meth:`Journal.try_restore`)."""
        ok = self.journal.try_restore()
        if ok:
            self.journal.sync_now()
            durable = self.journal.durable_seq
            done = [s for s in self._counts.memory_seqs if s <= durable]
            self._counts.persisted += len(done)
            self._counts.memory_seqs = [s for s in self._counts.memory_seqs if s > durable]
        return ok

    def compact(self, *, dry_run: bool = False) -> tuple[int, int]:
        """Drop resolved entries (see :func:`compact_journal`); returns ``(before, after)``."""
        out = compact_journal(self.journal, dry_run=dry_run)
        if not dry_run:
            self._live.clear()
            self._records = 0
            for rec in self.journal.records():
                self._apply(rec.seq, rec.payload)
                self._records += 1
        return out

    def items(self) -> Iterator[DeferredItem]:
        """The live deferred items, oldest deferral first."""
        return iter(sorted(self._live.values(), key=lambda d: d.seq))

    def get(self, work_id: str) -> DeferredItem | None:
        """The live deferred item for ``work_id``, or None."""
        return self._live.get(work_id)

    def __contains__(self, work_id: object) -> bool:
        return work_id in self._live

    def __len__(self) -> int:
        return len(self._live)

    def statistics(self) -> DeferStats:
        """An immutable snapshot of the counters."""
        return DeferStats(
            persisted=self._counts.persisted,
            in_memory=len(self._counts.memory_seqs),
            resolved=self._counts.resolved,
            live=len(self._live),
        )

    @property
    def health(self) -> Health:
        """The underlying journal's health."""
        return self.journal.health

    def close(self) -> None:
        """Close the journal (see :meth:`Journal.close`)."""
        self.journal.close()

    def __enter__(self) -> DeferJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.journal.__exit__(*exc)  # type: ignore[arg-type]
