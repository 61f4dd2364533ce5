"""Replay: the durable campaign state rebuilt from a snapshot and the state journal (no lock,
no write). The campaign (``state.py``) opens through it; the offline operations (``admin.py``)
read through it.

A state directory holds the snapshots ``campaign.<generation>.snap``, the state journal
``events.jsonl``, the results journal ``results.jsonl``, the defer journal and the master lock.
Loading = the newest valid snapshot + the journal records after it, each checked against its
schema (S11) and folded into a :class:`~durable_dispatch.core.ledger.Ledger`, the same model the
live dispatcher keeps (issue 16: there is no second one here).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from .core.ledger import Ledger
from .errors import JournalCorruptError
from .schema import Invalid, check_state_snapshot
from .storage import Journal, SnapshotStore
from .storage.format import RawBatch
from .storage.snapshot import Snapshot

__all__ = [
    "replay",
    "event_work_ids",
    "STATE_JOURNAL",
    "SNAPSHOT_NAME",
    "LIVE_STATS_NAME",
    "LOCK_NAME",
    "RESULT_RECORD_BYTES",
]

STATE_JOURNAL = "events.jsonl"
SNAPSHOT_NAME = "campaign"
#: the master's live statistics: ``master-stats.<generation>.snap`` (see ``CampaignState.tick``)
LIVE_STATS_NAME = "master-stats"
LOCK_NAME = "master.lock"
#: A results journal record's bound: a committed record and its sequence number, with room for
#: a state journal opened with a larger ``max_record_bytes``.
RESULT_RECORD_BYTES = 16 << 20


def event_work_ids(ev: Mapping[str, Any]) -> list[str]:
    """The work IDs a journal event names: ``work_ids`` for a multi-item dispatch's
    ``dispatched``/``committed`` record, else ``[work_id]``."""
    ids = ev.get("work_ids")
    return list(ids) if ids is not None else [ev["work_id"]]


def replay(snapshot: Mapping[str, Any] | None, events: Iterable[Mapping[str, Any]]) -> Ledger:
    """Fold the journal records ``events`` into the snapshot state ``snapshot`` (a snapshot body's
    ``state``, or None); replay is idempotent for already-applied commits.

    Raises:
        schema.Invalid: a record does not match its schema (S11).
    """
    led = Ledger.from_snapshot(snapshot)
    for ev in events:
        led.apply_record(ev)
    return led


def _open_and_fold(
    path: str,
    base: Mapping[str, Any],
    *,
    progress: Callable[[int, int], None] | None = None,
    on_event: Callable[[Mapping[str, Any], int], None] | None = None,
    **journal_kw: Any,
) -> tuple[Journal, Ledger, int]:
    """Open the state journal and fold its records newer than the snapshot ``base`` into a
    ledger; returns ``(journal, ledger, records folded)``.

    The journal is read once: the open's verifying scan hands each run of records to the fold
    (``Journal.open(visit=...)``). Only when the open repaired damage are the records read again.
    """
    after = int(base.get("journal_seq", -1))
    proj = Ledger.from_snapshot(base.get("state"))
    count = 0
    size = os.path.getsize(path) if os.path.exists(path) else 0

    def fold(batch: RawBatch) -> None:
        nonlocal count
        rows = zip(batch.offsets, batch.seqs, _decoded(batch, path), strict=True)
        for offset, seq, payload in rows:
            if seq > after:
                _fold(proj, payload, path, offset=offset, seq=seq)
                count += 1
            if on_event is not None:
                on_event(payload, seq)
        if progress is not None:
            progress(batch.offsets[-1], size)

    journal = Journal.open(path, visit=fold, **journal_kw)
    if journal.recovery.damage:  # the fold saw records before the repair: fold what was kept
        try:
            proj, count = Ledger.from_snapshot(base.get("state")), 0
            for rec in journal.records(from_seq=after + 1):
                _fold(proj, rec.payload, path, seq=rec.seq)
                count += 1
                if on_event is not None:
                    on_event(rec.payload, rec.seq)
        except BaseException:
            journal.close()
            raise
    return journal, proj, count


def _fold(
    proj: Ledger, ev: Any, path: str, *, offset: int | None = None, seq: int | None = None
) -> None:
    """Apply one event read from ``path``; an invalid one is corruption naming where it is (S11)."""
    try:
        proj.apply_record(ev)
    except Invalid as e:
        where = f"offset {offset}" if offset is not None else f"sequence number {seq}"
        raise JournalCorruptError(
            f"invalid event at {where} (seq {seq}): {e}",
            path=path,
            offset=offset,
            reason=f"invalid event: {e}",
        ) from None


def _load_snapshot(d: str, keep: int = 3) -> tuple[SnapshotStore, Snapshot | None]:
    """The state directory's snapshot store and its newest valid generation (S11: a generation
    whose body does not match its schema is passed over like a damaged one)."""
    store = SnapshotStore(d, name=SNAPSHOT_NAME, keep=keep)
    return store, store.load(validate=check_state_snapshot)


def _decoded(batch: RawBatch, path: str) -> list[Any]:
    """The payloads of a batch, decoded in one orjson call (one by one only to name damage)."""
    try:
        values: list[Any] = orjson.loads(b"[" + b",".join(batch.payloads) + b"]")
        return values
    except orjson.JSONDecodeError:
        for off, raw in zip(batch.offsets, batch.payloads, strict=True):
            try:
                orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise JournalCorruptError(
                    f"journal damaged at offset {off}: payload is not JSON",
                    path=path,
                    offset=off,
                    reason="payload is not JSON",
                ) from None
        raise
