"""Replay: the durable campaign state rebuilt from a snapshot and the state journal (no lock,
no write). The campaign (``state.py``) opens through it; the offline operations (``admin.py``)
read through it.

A state directory holds the snapshots ``campaign.<generation>.snap``, the state journal
``events.jsonl``, the results journal ``results.jsonl``, the defer journal and the master lock.
Loading = the newest valid snapshot + the journal records after it, each checked against its
schema and folded into a :class:`~durable_dispatch.core.ledger.Ledger`, the same model the
live dispatcher keeps (there is no second one here).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import orjson

from ..core.decisions import WorkItem
from ..core.ledger import Ledger, LedgerLoader
from ..errors import JournalCorruptError
from ..schema import Invalid, check_state_snapshot, check_submission_record, submission_digests
from ..storage import Journal, SnapshotStore
from ..storage.journal import read_journal
from ..storage.owner import OwnerClaim
from ..storage.scan import RawBatch
from ..storage.snapshot import Snapshot
from .statedir import (
    SNAPSHOT_NAME,
    SUBMISSION_RECORD_BYTES,
    SUBMISSIONS,
)

__all__ = ["replay", "event_work_ids"]


def event_work_ids(ev: Mapping[str, Any]) -> list[str]:
    """The work IDs a journal event names: ``work_ids`` for a multi-item dispatch's
    ``dispatched``/``committed`` record, else ``[work_id]``."""
    ids = ev.get("work_ids")
    return list(ids) if ids is not None else [ev["work_id"]]


def replay(
    snapshot: Mapping[str, Any] | None,
    events: Iterable[Mapping[str, Any]],
    submissions: Iterable[Mapping[str, Any]] = (),
) -> Ledger:
    """Fold the journal records ``events`` into the snapshot state ``snapshot`` (a snapshot body's
    ``state`` in either form, or None); replay is idempotent for already-applied commits.
    ``submissions``: the submissions store's records (``submissions.jsonl``), which a compact
    snapshot and the stored ``submitted`` records name their items from.

    Raises:
        schema.Invalid: a record does not match its schema, or the store does not hold an item
            named.
    """
    load = LedgerLoader(snapshot)
    for rec in submissions:
        check_submission_record(rec)
        load.take(rec["first"], rec["items"], submission_digests(rec))
    led, tail = load.finish()
    stored = Stored(tail, load.stored)
    for ev in events:
        led.apply_record(ev, stored.take)
    return led


class Stored:
    """The submissions store's items that the snapshot did not place, by index, for the state
    journal's stored ``submitted`` records to take up (:meth:`take`); what is left after the
    replay are *orphans*: stored, but a crash came before their record reached the journal."""

    __slots__ = ("items", "count")

    def __init__(self, items: dict[int, WorkItem], count: int) -> None:
        self.items = items
        self.count = count  # the indices the store covers

    def take(self, first: int, count: int) -> list[WorkItem]:
        """The items of indices ``first .. first+count-1`` (each taken once).

        Raises:
            schema.Invalid: the store does not hold one of them.
        """
        try:
            return [self.items.pop(i) for i in range(first, first + count)]
        except KeyError as e:
            raise Invalid("first", f"index {e.args[0]} is not in the submissions store") from None

    def orphans(self, after: int) -> list[tuple[int, WorkItem]]:
        """The items left at indices ``after`` and up, in order."""
        return sorted((i, w) for i, w in self.items.items() if i >= after)


#: A bulk build (a submit, a reopen) that leaves at least this many new objects for the cyclic
#: collector freezes them at once (``gc.freeze``).
FREEZE_AT = 50_000
#: Smaller builds (a work source's refill, the children of a commit, a Feed) freeze once they
#: added this many items since the last freeze, after a full collection (which then walks
#: only what came since, and leaves no garbage to freeze). Not fewer: the first full
#: collection walks the whole interpreter (about 10 ms after the package's imports), more
#: than the collections it spares cost while the queue is this small (20,000 items cost a
#: campaign of 20,000 one-item tasks 0.6-0.7 us a task that way; a full collection walks
#: 100,000 unfrozen items in a few ms).
FREEZE_EVERY = 100_000

_built = 0  # objects the builds since the last freeze left


class _Frozen:
    """A :func:`paused_gc` block: the caller sets ``items`` to how many items it added; ``froze``
    is True once the block's end froze the collector's objects."""

    __slots__ = ("froze", "items")

    def __init__(self) -> None:
        self.froze = False
        self.items = 0


#: Open campaign states whose builds froze objects; the last to close unfreezes them.
_holders: set[int] = set()


@contextmanager
def paused_gc(holder: object | None = None) -> Iterator[_Frozen]:
    """Pause the cyclic garbage collector while millions of small acyclic objects are built
    (a reopen, a submit): each collection would walk every object built so far, and at a
    million items those walks cost more than the building. Reference counting still frees
    what is dropped; the collector resumes (if it ran before) when the block ends.

    With a ``holder`` (the campaign state), what the builds leave is moved to the collector's
    permanent generation (``gc.freeze()``), so that no later collection walks the queue again:
    without it, the first collections after a submit of a million items walked them twice
    (0.2 to 2 s) and every full collection walked them again. A block that leaves
    :data:`FREEZE_AT` objects to the collector's youngest generation freezes at once; otherwise
    once the blocks added :data:`FREEZE_EVERY` items (the block's ``items``) since the last
    freeze, after a full collection. A frozen object is still freed by reference counting when
    it dies (an item when it commits); :func:`release_frozen` unfreezes once the last holder
    closed (docs/performance.md).
    """
    global _built
    was = gc.isenabled()
    gc.disable()
    out = _Frozen()
    try:
        yield out
    finally:
        # A closed holder froze nothing: its close gave back what it held, and nothing would
        # give this back (a submit during or after its close: a callback's children, a Feed).
        if holder is not None and not getattr(holder, "closed", False):
            _built += out.items
            if gc.get_count()[0] >= FREEZE_AT:  # (a collection now would walk all it built)
                out.froze = True
            elif _built >= FREEZE_EVERY:
                gc.collect()  # the objects since the last freeze: no garbage is frozen
                out.froze = True
            if out.froze:
                gc.freeze()
                _built = 0
                _holders.add(id(holder))
        if was:
            gc.enable()


def release_frozen(holder: object) -> bool:
    """``holder`` (a campaign state that :func:`paused_gc` froze for) closed: when it was the
    last, unfreeze (``gc.unfreeze()``: what is still alive goes back to the collector's oldest
    generation, and a cycle that died while frozen is collected by its next full collection).
    Returns True when it unfroze."""
    if id(holder) not in _holders:
        return False
    _holders.discard(id(holder))
    if _holders:
        return False
    gc.unfreeze()
    return True


def _load_store(
    d: str,
    state: Mapping[str, Any] | None,
    *,
    writer: bool,
    **journal_kw: Any,
) -> tuple[Journal | None, Ledger, Stored]:
    """The ledger of the snapshot ``state`` (either form), its items read from the submissions
    store; opened for writing (``writer``, the store's journal returned) or only read.

    Raises:
        JournalCorruptError: the store is damaged or does not cover the snapshot (S11).
    """
    path = os.path.join(d, SUBMISSIONS)
    if not writer:
        exists = os.path.exists(path)
        rows = read_journal(path, max_record_bytes=SUBMISSION_RECORD_BYTES) if exists else ()
        return None, *_load_from(state, path, ((r.payload, None) for r in rows))
    load = _Loader(state, path)
    kw = {"max_record_bytes": SUBMISSION_RECORD_BYTES, **journal_kw}
    store = Journal.open(path, visit=load.visit, **kw)
    try:
        if store.recovery.damage:  # the visit saw records before the repair: take what was kept
            return store, *_load_from(state, path, ((r.payload, None) for r in store.records()))
        return store, *load.finish()
    except BaseException:
        store.close()
        raise


class _Loader:
    """A :class:`LedgerLoader` fed from the submissions store's records, its errors turned into
    corruption errors naming the store (S11)."""

    def __init__(self, state: Mapping[str, Any] | None, path: str) -> None:
        self.path = path
        try:
            self.load = LedgerLoader(state)
        except Invalid as e:
            raise self._error(f"the snapshot's state does not load: {e}", e) from None

    def _error(self, what: str, e: Invalid, offset: int | None = None) -> JournalCorruptError:
        return JournalCorruptError(what, path=self.path, offset=offset, reason=str(e))

    def take(self, payload: Any, offset: int | None) -> None:
        try:
            check_submission_record(payload)
            self.load.take(payload["first"], payload["items"], submission_digests(payload))
        except Invalid as e:
            what = f"invalid submissions record at offset {offset}: {e}"
            raise self._error(what, e, offset) from None

    def visit(self, batch: RawBatch) -> None:
        for offset, payload in zip(batch.offsets, _decoded(batch, self.path), strict=True):
            self.take(payload, offset)

    def finish(self) -> tuple[Ledger, Stored]:
        try:
            led, tail = self.load.finish()
        except Invalid as e:
            what = f"the submissions store does not cover the snapshot: {e}"
            raise self._error(what, e) from None
        return led, Stored(tail, self.load.stored)


def _load_from(
    state: Mapping[str, Any] | None, path: str, rows: Iterable[tuple[Any, int | None]]
) -> tuple[Ledger, Stored]:
    """:class:`_Loader` over ``(payload, offset)`` rows of the store at ``path``."""
    load = _Loader(state, path)
    for payload, offset in rows:
        load.take(payload, offset)
    return load.finish()


def _open_and_fold(
    path: str,
    base: Mapping[str, Any],
    *,
    progress: Callable[[int, int], None] | None = None,
    on_event: Callable[[Mapping[str, Any], int], None] | None = None,
    **journal_kw: Any,
) -> tuple[Journal, Journal, Ledger, int, Stored]:
    """Open the submissions store and the state journal beside it and fold the journal's records
    newer than the snapshot ``base`` into a ledger; returns ``(journal, store, ledger, records
    folded, the store's items not taken up)``.

    Each file is read once: the open's verifying scan hands each run of records to the fold
    (``Journal.open(visit=...)``). Only when the open repaired damage are the records read again.
    """
    after = int(base.get("journal_seq", -1))
    d = os.path.dirname(path)
    store, proj, stored = _load_store(d, base.get("state"), writer=True, **journal_kw)
    assert store is not None
    count = 0
    size = 0
    if progress is not None:  # (a lookup less on a slow mount when nobody shows progress)
        size = os.path.getsize(path) if os.path.exists(path) else 0

    def fold(batch: RawBatch) -> None:
        nonlocal count
        rows = zip(batch.offsets, batch.seqs, _decoded(batch, path), strict=True)
        for offset, seq, payload in rows:
            if seq > after:
                _fold(proj, payload, path, stored, offset=offset, seq=seq)
                count += 1
            if on_event is not None:
                on_event(payload, seq)
        if progress is not None:
            progress(batch.offsets[-1], size)

    try:
        journal = Journal.open(path, visit=fold, **journal_kw)
    except BaseException:
        store.close()
        raise
    if journal.recovery.damage:  # the fold saw records before the repair: fold what was kept
        try:
            rows = ((r.payload, None) for r in store.records())
            proj, stored = _load_from(base.get("state"), store.path, rows)
            count = 0
            for rec in journal.records(from_seq=after + 1):
                _fold(proj, rec.payload, path, stored, seq=rec.seq)
                count += 1
                if on_event is not None:
                    on_event(rec.payload, rec.seq)
        except BaseException:
            journal.close()
            store.close()
            raise
    return journal, store, proj, count, stored


def _fold(
    proj: Ledger,
    ev: Any,
    path: str,
    stored: Stored,
    *,
    offset: int | None = None,
    seq: int | None = None,
) -> None:
    """Apply one event read from ``path``; an invalid one is corruption naming where it is (S11)."""
    try:
        proj.apply_record(ev, stored.take)
    except Invalid as e:
        where = f"offset {offset}" if offset is not None else f"sequence number {seq}"
        raise JournalCorruptError(
            f"invalid event at {where} (seq {seq}): {e}",
            path=path,
            offset=offset,
            reason=f"invalid event: {e}",
        ) from None


def _load_snapshot(
    d: str, keep: int = 3, claim: OwnerClaim | None = None
) -> tuple[SnapshotStore, Snapshot | None]:
    """The state directory's snapshot store and its newest valid generation (S11: a generation
    whose body does not match its schema is passed over like a damaged one); ``claim``: the
    directory's owner claim when this process holds the directory (a master's open)."""
    store = SnapshotStore(d, name=SNAPSHOT_NAME, keep=keep, directory_claim=claim)
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
