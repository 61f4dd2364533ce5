"""Offline operations on a state directory: view it, compact it, requeue or drop deferred
items. Reading never takes a lock or creates a file; changing takes the master lock, so it
is refused while a master runs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.decisions import WorkItem
from ..core.events import RequeuedDeferred, Submitted, encode
from ..core.indexed import DIGEST_BYTES, store_form
from ..core.ledger import Ledger
from ..errors import CorruptionError, StorageError
from ..storage import DeferJournal, Journal
from ..storage.format import Header, new_salt
from ..storage.scan import RawBatch
from .outputs import compact_outputs
from .replay import (
    Stored,
    _decoded,
    _fold,
    _load_snapshot,
    _load_store,
    _open_and_fold,
)
from .statedir import (
    LIVE_STATS_NAME,
    RESULT_RECORD_BYTES,
    RESULTS_JOURNAL,
    STATE_JOURNAL,
    SUBMIT_CHUNK,
    _master_locked,
    _master_running,
    is_state_dir,
)

log = logging.getLogger("durable_dispatch.admin")

__all__ = [
    "StateView",
    "CompactReport",
    "view_state",
    "is_state_dir",
    "compact_state",
    "requeue_deferred",
    "drop_deferred",
]


@dataclass(frozen=True)
class StateView:
    """A read-only view of a state directory, for operators (no lock taken, nothing changed).

    Attributes:
        directory: the state directory.
        projection: the replayed durable state (the ledger the live core keeps).
        snapshot_generation: the snapshot replay started from (None: none yet).
        journal_seq: the last journal sequence number folded in or replayed.
        replayed_records: journal records replayed after the snapshot.
        stats: the master's statistics as of the newest snapshot ({} if none).
        master_running: True when a master holds the directory's lock.
        live: the master's newest published statistics (``ts``, ``running``, ``pid``, ``host``,
            ``stats``; {} if none), written every few seconds while it runs and at its close.
        snapshot_ts: when the newest snapshot (and so :attr:`stats`) was written, or None.
    """

    directory: str
    projection: Ledger
    snapshot_generation: int | None
    journal_seq: int
    replayed_records: int
    stats: Mapping[str, Any]
    master_running: bool
    live: Mapping[str, Any] = field(default_factory=dict)
    snapshot_ts: float | None = None  # wall-clock time the newest snapshot was written

    def live_age(self, now: float | None = None) -> float | None:
        """Seconds since the master published :attr:`live` (wall clock: the master's host and
        this one must agree on the time), or None when it never did."""
        ts = self.live.get("ts")
        if not isinstance(ts, (int, float)):
            return None
        return max(0.0, (time.time() if now is None else now) - ts)

    def summary(self) -> dict[str, Any]:
        """Counts of the durable state, JSON-ready."""
        p = self.projection
        return {
            "directory": self.directory,
            "epoch": p.epoch,
            "pending": len(p.frontier),
            "waiting": len(p.waiting),
            "in_flight": len(p.in_flight),
            "committed": len(p.committed),
            "deferred": len(p.deferred),
            "snapshot_generation": self.snapshot_generation,
            "journal_seq": self.journal_seq,
            "replayed_records": self.replayed_records,
            "duplicate_commits_in_journal": p.duplicate_commits,
            "master_running": self.master_running,
        }


def view_state(directory: str | os.PathLike[str]) -> StateView:
    """Replay a state directory read-only (it may have a running master).

    Raises:
        UsageError: not a state directory.
        JournalCorruptError, SnapshotCorruptError: damage found.
    """
    from ..errors import UsageError
    from ..storage.journal import read_journal

    d = os.fspath(directory)
    if not is_state_dir(d):
        raise UsageError(f"{d} is not a durable-dispatch state directory")
    _store, snap = _load_snapshot(d)
    base = snap.value if snap is not None else {}
    after = int(base.get("journal_seq", -1))
    _none, proj, stored = _load_store(d, base.get("state"), writer=False)
    n, last = 0, after
    jpath = os.path.join(d, STATE_JOURNAL)
    if os.path.exists(jpath):
        for rec in read_journal(jpath, from_seq=after + 1):
            _fold(proj, rec.payload, jpath, stored, seq=rec.seq)
            n += 1
            last = rec.seq
    return StateView(
        d,
        proj,
        snap.generation if snap else None,
        last,
        n,
        dict(base.get("stats", {})),
        _master_running(d),
        _live_stats(d),
        base.get("ts") if isinstance(base.get("ts"), (int, float)) else None,
    )


def _live_stats(d: str) -> dict[str, Any]:
    """The newest published statistics of the master, or {} (damage is not an error here: they
    are a display, and the next publication replaces them)."""
    from ..errors import DurableDispatchError
    from ..storage import SnapshotStore

    try:
        snap = SnapshotStore(d, name=LIVE_STATS_NAME, keep=2).load()
    except DurableDispatchError:
        return {}
    value = snap.value if snap is not None else None
    return dict(value) if isinstance(value, dict) else {}


@dataclass(frozen=True)
class CompactReport:
    """What a compaction did (or, with ``dry_run``, would do).

    Attributes:
        path: the journal compacted.
        records_before: records in it before.
        records_after: records in it after.
        bytes_before: its size before.
        bytes_after: its size after (estimated for a dry run: the header only, or the live set).
        snapshot_generation: the snapshot that now holds the folded state (state directories).
        dry_run: nothing was changed.
    """

    path: str
    records_before: int
    records_after: int
    bytes_before: int
    bytes_after: int
    snapshot_generation: int | None
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return dict(vars(self))


def _store_records(
    led: Ledger, first: int, end: int, chunk: int = SUBMIT_CHUNK
) -> Iterator[dict[str, Any]]:
    """The submissions store records of indices ``first .. end-1`` as the ledger knows them: a
    committed item by its work ID only (its payload is no longer kept), a void index as None."""
    ids, items = led.ids.ids, led.items
    for a in range(first, end, chunk):
        out: list[Any] = []
        for i in range(a, min(end, a + chunk)):
            wid = ids[i]
            if wid is None:
                out.append(None)
            elif wid in items:
                out.append(store_form(items[wid]))
            else:
                out.append({"work_id": wid})
        b = min(end, a + chunk)
        digests = bytes(led.ids.digests[a * DIGEST_BYTES : b * DIGEST_BYTES])
        digests += bytes((b - a) * DIGEST_BYTES - len(digests))  # unknown ones: zeros
        yield {"first": a, "items": out, "digests": digests.hex()}


def _reconcile_store(journal: Journal, store: Journal, led: Ledger, stored: Stored) -> int:
    """After a replay, bring the submissions store and the ledger in line; returns the
    indices the store covers (then ``len(led.ids)``). The store's records are fsynced here; the
    journal's become durable with the caller's next fsync (the open's ``epoch`` record;
    compaction's journal syncs every append), and until then a crash only leaves the orphans
    for the next open to submit again.

    * Orphans (items stored but whose ``submitted`` record never reached the journal: a crash
      between the two) are submitted now: they were durable, the caller's ``submit`` was under
      way, and a later ``submit`` of the same IDs skips them.
    * Indices the ledger numbered but the store does not cover (a state written by an earlier
      version, whose snapshot held the payloads; a commit of an ID never submitted) are
      written to the store, so that a compact snapshot can name them.
    """
    run: list[WorkItem] = []
    start = -1
    for i, item in [*stored.orphans(len(led.ids)), (-1, None)]:
        if run and i != start + len(run):
            ev = Submitted(tuple(run), start, stored=True)
            journal.append(encode(ev))
            led.apply(ev)
            run = []
        if item is not None:
            if not run:
                start = i
            run.append(item)
    stored.items.clear()
    if stored.count > len(led.ids):  # void indices at the store's end: skipped here too
        led.ids.pad(stored.count)
    last = -1
    for rec in _store_records(led, stored.count, len(led.ids)):
        last = store.append(rec).seq
    if last >= 0:
        store.wait_durable(last)
    return len(led.ids)


def compact_state(
    directory: str | os.PathLike[str],
    *,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> CompactReport:
    """Fold the state journal into a new snapshot and start a fresh journal (crash-safe).

    Order: (1) replay snapshot + journal, streaming; (2) save the folded state as a new snapshot
    generation (atomic); (3) replace the journal by an empty one whose numbering continues
    (temp file, fsync, rename, directory fsync). A crash before (2) leaves the old snapshot and the
    old journal; between (2) and (3) the new snapshot and the old journal, whose records it already
    holds (replay skips them); after (3) the new pair. Memory is bounded by the live set (the
    projection), not the journal's size. Committed results are never dropped: before (2)
    every committed record not moved yet is appended to the results journal (``results.jsonl``)
    with its sequence number, and fsynced; a compaction interrupted after that moves nothing
    twice. Then the outputs journal (``outputs.jsonl``) is rewritten with each item's newest
    output only (:func:`~.outputs.compact_outputs`).

    The journal is read once: the open's verifying scan hands each run of records to the fold
    (``Journal.open(visit=...)``); only if the open had to repair damage first are the records
    read again. ``progress(bytes_done, bytes_total)`` is called as the journal is read.

    Raises:
        LockHeldError: a master is running on the directory.
        UsageError: not a state directory.
        JournalCorruptError: the journal holds damage the open does not repair, or an intact
            record whose payload is not JSON.
    """
    from ..errors import UsageError

    d = os.fspath(directory)
    if not is_state_dir(d):
        raise UsageError(f"{d} is not a durable-dispatch state directory")
    with _master_locked(d):
        jpath = os.path.join(d, STATE_JOURNAL)
        size = os.path.getsize(jpath) if os.path.exists(jpath) else 0
        snaps, snap = _load_snapshot(d)
        base = snap.value if snap is not None else {}
        results = None if dry_run else _ResultsMover(d)
        try:
            j, store, proj, _n, stored = _open_and_fold(
                jpath,
                base,
                progress=progress,
                on_event=results.move if results else None,
                sync="always",
            )
            if results is not None:
                results.finish()  # durable before the state journal lets go of them
        finally:
            if results is not None:
                results.close()
        with j, store:
            before = j.recovery.records
            if dry_run:
                est = len(Header(new_salt(), j.next_seq).frame())
                return CompactReport(jpath, before, 0, size, est, None, True)
            _reconcile_store(j, store, proj, stored)  # the store covers every index, durably
            last = j.next_seq - 1
            delivered = int(base.get("delivered_seq", base.get("journal_seq", -1)))
            body = {
                "journal_seq": last,
                "delivered_seq": max(delivered, proj.delivered),
                "state": proj.to_compact(),
                "stats": base.get("stats", {}),
            }
            gen = snaps.save(body)
            j.replace_contents([], first_seq=last + 1)
        try:
            compact_outputs(d)  # each item's newest output only (outputs.py)
        except CorruptionError as e:  # a diagnostic file: the campaign's compaction is done
            log.warning("compact: the items' outputs were left as they are: %s", e)
        after_size = os.path.getsize(jpath)
        return CompactReport(jpath, before, 0, size, after_size, gen, False)


class _ResultsMover:
    """Compaction's half of the results store: append each committed record of the state journal
    that the results journal does not hold yet (by sequence number) to it."""

    def __init__(self, d: str) -> None:
        self.moved = -1
        self.sent: dict[Any, Any] = {}  # token -> time of its dispatch, while in flight
        self.hosts: dict[Any, Any] = {}  # rank -> its host in the current run (``host`` events)

        def last(batch: RawBatch) -> None:
            for payload in _decoded(batch, self.path):
                self.moved = max(self.moved, int(payload.get("seq", -1)))

        self.path = os.path.join(d, RESULTS_JOURNAL)
        self.journal = Journal.open(
            self.path, sync="batch", visit=last, max_record_bytes=RESULT_RECORD_BYTES
        )
        if self.journal.recovery.damage:  # the visit saw records before the repair
            self.moved = max((int(r.payload["seq"]) for r in self.journal.records()), default=-1)

    def move(self, ev: Mapping[str, Any], seq: int) -> None:
        kind = ev.get("event")
        if kind == "dispatched":  # its time goes with its results (the joblog's "started")
            self.sent[ev.get("token")] = ev.get("ts")
        elif kind == "epoch":
            self.sent.clear()  # (only the dispatches in flight are kept: the live set)
            self.hosts.clear()
        elif kind == "host":  # the rank's host goes with its results (the joblog's "host")
            self.hosts[ev.get("rank")] = ev.get("host")
        elif kind in ("requeued", "deferred"):
            self.sent.pop(ev.get("token"), None)
        if seq > self.moved and kind == "committed":
            started = self.sent.pop(ev.get("token"), None)
            extra = {"started": started} if started is not None else {}
            host = self.hosts.get(ev.get("rank"))
            if host is not None:
                extra["host"] = host
            self.journal.append({**ev, "event": "result", "seq": seq, **extra})
            self.moved = seq

    def finish(self) -> None:
        self.journal.sync_now()
        if not self.journal.health.ok:
            raise StorageError(
                "the results journal could not be made durable; nothing was compacted",
                path=self.path,
                op="fsync",
            )

    def close(self) -> None:
        self.journal.close()


def requeue_deferred(directory: str | os.PathLike[str], work_ids: Iterable[str]) -> list[str]:
    """Put deferred items back into the frontier durably (the next master run picks them up).

    Journals ``requeued_deferred`` in the state journal and resolves each item as ``requeued``
    in the defer journal. Returns the IDs requeued.

    Raises:
        LockHeldError: a master is running. UsageError: an ID that is not deferred.
    """
    from ..errors import UsageError

    with _master_locked(directory) as d:
        view = view_state(d)
        ids = list(work_ids)
        for w in ids:
            if w not in view.projection.deferred:
                raise UsageError(f"{w!r} is not deferred")
        with (
            Journal.open(os.path.join(d, STATE_JOURNAL), sync="always") as j,
            DeferJournal.open(d) as dj,
        ):
            for w in ids:
                j.append(encode(RequeuedDeferred(w)))
                if w in dj:
                    dj.resolve(w, "requeued")
        return ids


def drop_deferred(directory: str | os.PathLike[str], work_ids: Iterable[str]) -> list[str]:
    """Mark deferred items as dropped in the defer journal (they are no longer listed).

    The campaign state still counts them as deferred: dropping is an operator's decision not to
    replay them, not a commit.

    Raises:
        LockHeldError: a master is running. UsageError: an ID that is not deferred.
    """
    from ..errors import UsageError

    with _master_locked(directory) as d:
        ids = list(work_ids)
        with DeferJournal.open(d) as dj:
            for w in ids:
                if w not in dj:
                    raise UsageError(f"{w!r} is not a listed deferred item")
            for w in ids:
                dj.resolve(w, "dropped")
        return ids
