"""Replay: the durable campaign state rebuilt from a snapshot and the state journal (no lock,
no write). The campaign (``state.py``) opens through it; the offline operations (``admin.py``)
read through it.

A state directory holds the snapshots ``campaign.<generation>.snap``, the state journal
``events.jsonl``, the results journal ``results.jsonl``, the defer journal and the master lock.
Loading = the newest valid snapshot + the journal records after it, each checked against its
schema (S11) and folded into a :class:`Projection`.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson

from .core.tokens import Token
from .errors import JournalCorruptError
from .schema import Invalid, check_event, check_state_snapshot
from .storage import Journal, SnapshotStore
from .storage.format import RawBatch
from .storage.snapshot import Snapshot

__all__ = [
    "Projection",
    "replay",
    "event_work_ids",
    "STATE_JOURNAL",
    "SNAPSHOT_NAME",
    "LOCK_NAME",
    "RESULT_RECORD_BYTES",
]

STATE_JOURNAL = "events.jsonl"
SNAPSHOT_NAME = "campaign"
LOCK_NAME = "master.lock"
#: A results journal record's bound: a committed record and its sequence number, with room for
#: a state journal opened with a larger ``max_record_bytes``.
RESULT_RECORD_BYTES = 16 << 20


def event_work_ids(ev: Mapping[str, Any]) -> list[str]:
    """The work IDs a journal event names: ``work_ids`` for a multi-item dispatch's
    ``dispatched``/``committed`` record, else ``[work_id]``."""
    ids = ev.get("work_ids")
    return list(ids) if ids is not None else [ev["work_id"]]


class Projection:
    """The durable campaign state rebuilt from a snapshot and journal events (pure, no I/O).

    Its :meth:`to_snapshot` is the same dict :meth:`Dispatcher.snapshot` returns, so replay can be
    checked against the live core.
    """

    def __init__(self, snap: Mapping[str, Any] | None = None) -> None:
        snap = snap or {}
        self.epoch: int = int(snap.get("epoch", 0))
        self.counter: int = int(snap.get("counter", 0))
        self.items: dict[str, dict[str, Any]] = {}
        self.front: deque[str] = deque()
        self.back: dict[str, None] = {}
        self.in_flight: dict[str, dict[str, Any]] = {}
        self.committed: set[str] = set(snap.get("committed", ()))
        self.deferred: dict[str, dict[str, Any]] = {}
        self.attempts: dict[str, int] = {k: int(v) for k, v in snap.get("attempts", {}).items()}
        self.kinds: dict[str, list[str]] = {k: list(v) for k, v in snap.get("kinds", {}).items()}
        self.last_error: dict[str, str] = dict(snap.get("last_error", {}))
        self.solo: set[str] = set(snap.get("solo", ()))
        self.duplicate_commits = 0
        #: the newest ``delivered`` event's point (U6; the snapshot body keeps it, not the state)
        self.delivered = -1
        for it in snap.get("frontier", ()):
            self.items[it["work_id"]] = it
            self.back[it["work_id"]] = None
        for tx in snap.get("in_flight", ()):
            w = tx["work"]
            self.items[w["work_id"]] = w
            self.in_flight[w["work_id"]] = {"token": tx["token"], "rank": tx["rank"]}
        for it in snap.get("deferred", ()):
            self.items[it["work_id"]] = it
            self.deferred[it["work_id"]] = it

    def _unqueue(self, wid: str) -> None:
        if self.back.pop(wid, 0) is None:
            return
        try:
            self.front.remove(wid)
        except ValueError:
            pass

    def known(self, wid: str) -> bool:
        """True when ``wid`` is pending, in flight, committed or deferred."""
        return wid in self.items or wid in self.committed

    def apply(self, ev: Mapping[str, Any]) -> None:
        """Apply one journal event (unknown events are ignored, for forward compatibility).

        Raises:
            schema.Invalid: the event does not match its schema, or a deferral names a work item
                the state never had (S11).
        """
        check_event(ev)
        kind = ev.get("event")
        if kind == "epoch":
            self.epoch = int(ev["epoch"])
            self.counter = 0
        elif kind == "submitted":
            for it in ev["items"]:
                wid = it["work_id"]
                if not self.known(wid):
                    self.items[wid] = it
                    self.back[wid] = None
        elif kind == "dispatched":
            where = {"token": ev["token"], "rank": ev["rank"]}
            for wid in event_work_ids(ev):
                self._unqueue(wid)
                self.in_flight[wid] = where
            t = Token.parse(ev["token"])
            if t is not None and t.epoch == self.epoch:
                self.counter = max(self.counter, t.n)
        elif kind == "committed":
            for wid in event_work_ids(ev):
                if wid in self.committed:
                    self.duplicate_commits += 1
                    continue
                self.in_flight.pop(wid, None)
                self._unqueue(wid)
                self.committed.add(wid)
                self.items.pop(wid, None)
                self.solo.discard(wid)
        elif kind == "requeued":
            wid = ev["work_id"]
            self.in_flight.pop(wid, None)
            self._unqueue(wid)
            self.front.appendleft(wid)
            if ev.get("split"):
                self.solo.add(wid)
            elif ev.get("source") != "master-restart":
                self.attempts[wid] = int(ev["attempts"])
                self.kinds.setdefault(wid, []).append(ev["kind"])
                self.last_error[wid] = ev.get("error") or ""
        elif kind == "deferred":
            wid = ev["work_id"]
            self.in_flight.pop(wid, None)
            self._unqueue(wid)
            item = self.items.get(wid)
            if item is None:
                raise Invalid("work_id", f"{wid!r} names no work item of this campaign")
            self.deferred[wid] = item
            self.solo.discard(wid)
            self.attempts[wid] = int(ev["attempts"])
            self.kinds[wid] = list(ev["kinds"])
            self.last_error[wid] = ev.get("last_error") or ""
        elif kind == "delivered":
            self.delivered = max(self.delivered, int(ev["upto"]))
        elif kind == "requeued_deferred":
            wid = ev["work_id"]
            if self.deferred.pop(wid, None) is not None:
                self.attempts.pop(wid, None)
                self.kinds.pop(wid, None)
                self.last_error.pop(wid, None)
                self.back[wid] = None

    def to_snapshot(self) -> dict[str, Any]:
        """The projection in :meth:`Dispatcher.snapshot` form."""
        order = [*self.front, *self.back]
        return {
            "epoch": self.epoch,
            "counter": self.counter,
            "frontier": [self.items[w] for w in order],
            "in_flight": [
                {"token": v["token"], "rank": v["rank"], "work": self.items[w]}
                for w, v in self.in_flight.items()
            ],
            "committed": sorted(self.committed),
            "deferred": list(self.deferred.values()),
            "attempts": dict(self.attempts),
            "kinds": {k: list(v) for k, v in self.kinds.items()},
            "last_error": dict(self.last_error),
            "solo": sorted(self.solo),
        }


def replay(snapshot: Mapping[str, Any] | None, events: Iterable[Mapping[str, Any]]) -> Projection:
    """Fold ``events`` into ``snapshot``; replay is idempotent for already-applied commits."""
    p = Projection(snapshot)
    for ev in events:
        p.apply(ev)
    return p


def _open_and_fold(
    path: str,
    base: Mapping[str, Any],
    *,
    progress: Callable[[int, int], None] | None = None,
    on_event: Callable[[Mapping[str, Any], int], None] | None = None,
    **journal_kw: Any,
) -> tuple[Journal, Projection, int]:
    """Open the state journal and fold its records newer than the snapshot ``base`` into a
    projection; returns ``(journal, projection, records folded)``.

    The journal is read once: the open's verifying scan hands each run of records to the fold
    (``Journal.open(visit=...)``). Only when the open repaired damage are the records read again.
    """
    after = int(base.get("journal_seq", -1))
    proj = Projection(base.get("state"))
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
            proj, count = Projection(base.get("state")), 0
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
    proj: Projection, ev: Any, path: str, *, offset: int | None = None, seq: int | None = None
) -> None:
    """Apply one event read from ``path``; an invalid one is corruption naming where it is (S11)."""
    try:
        proj.apply(ev)
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
