"""Durable campaign state: snapshot + journal replay, crash-safe rollback, master restart.

Theory of operation. A state directory holds a :class:`~durable_dispatch.storage.SnapshotStore`
(``campaign.<generation>.snap``), the state journal ``events.jsonl``, the submissions store
``submissions.jsonl`` (every submitted item's payload, once, by dense index), the defer journal
``.dispatch_protocol_deferred.jsonl`` and the master lock ``master.lock``. The campaign's
durable state is a *projection*: frontier order, in-flight dispatches, committed work IDs,
deferred items and retry counts, the core's :class:`~durable_dispatch.core.ledger.Ledger`. Every
decision of the core that changes it is journaled as a small event (``submitted``,
``dispatched``, ``committed``, ``requeued``, ``deferred``, ``epoch``) *before* the shell acts on
it; a snapshot folds the projection up to a journal sequence number, in the compact form
(:meth:`Ledger.to_compact`: indices and runs, no payload, so its cost does not grow with the
campaign, S8). Loading = the submissions store + newest valid snapshot + replay of the journal
records after it.

The module is split by job: replay (the projection, the fold, the snapshot loader) is in
``replay.py``; offline operations (view, compact, requeue, drop) are in ``admin.py``; the
submissions store is ``submissions.py``; persisting the core's decisions and delivering the
commits (U6, G1) is ``delivery.py``, a part of :class:`CampaignState`; this module is the live
campaign.
:class:`CampaignState` is also the facade the master loop calls, one method per thing that
happened (:meth:`~CampaignState.on_ready`, ``on_results``, ``sent``, ``tick`` ...): each asks the
core and persists what it decided.

Durability contract.

* A commit is journaled, and an fsync covers it (under ``always``/``batch``), before the
  delivery point (:meth:`CampaignState.tick`) closes the work ID in the core and then reports it
  to the caller's callback: a work ID is committed once *in the durable record*. Execution
  stays at-least-once: a worker may run an item again after a crash or a timeout; only one
  commit is ever recorded.
* Every rollback is followed by an atomic snapshot before the next dispatch (S8).
* At every start a new epoch is journaled and fsynced before any dispatch, so no token repeats.
* If the disk fails, records are held in memory (the journal's honest degradation); the campaign
  goes on, ``statistics()`` says how many commits are memory-only, and they become durable when
  the journal is restored.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from ..core import (
    Commit,
    Defer,
    Dispatcher,
    RetryPolicy,
    Send,
    WatchdogConfig,
    WorkItem,
)
from ..core.events import Submitted, encode
from ..core.indexed import DIGEST_BYTES, payload_digests
from ..errors import (
    ChangedPayloadError,
    RecordEncodeError,
    RecordTooLargeError,
    StorageDegradedError,
    UsageError,
)
from ..storage import DeferJournal, Journal, SnapshotStore
from ..storage import fs as _fs
from ..storage import resources as _resources
from ..storage.background import BackgroundSaver
from ..storage.background import Beside as _Beside
from ..tokens import Token
from ..values import Refused, all_plain, stored
from .costs import CostTable
from .delivery import Delivery, OnCommit, _PendingCommit
from .dependencies import Dependencies
from .lifecycle import close_state, open_state
from .loop import LoopCalls
from .outputs import Outputs
from .replay import (
    paused_gc,
    release_frozen,
)
from .statedir import (
    LIVE_STATS_NAME,
    SUBMIT_CHUNK,
)
from .submissions import SubmissionStore

__all__ = ["CampaignState", "CampaignStats", "OnCommit"]

log = logging.getLogger("durable_dispatch.state")


class _JournalBehind(Exception):
    """A snapshot's journal records are not on disk (the journal runs from memory): the
    snapshot is not published (not an OSError: the snapshot store's own health is fine)."""


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


class CampaignState(LoopCalls, Delivery, Dependencies):
    """A campaign's durable state in one directory, driving a :class:`Dispatcher`.

    Open with :meth:`open`; use as a context manager or call :meth:`close`.
    """

    def __init__(self, directory: str, **kw: Any) -> None:
        self.directory = directory
        self._lock = kw["lock"]
        self.journal: Journal = kw["journal"]
        #: the submissions store (``submissions.jsonl``): every item's payload, once
        self.submissions: Journal = kw["submissions"]
        self._store = SubmissionStore(self.submissions, kw["stored"])
        self.snapshots: SnapshotStore = kw["snapshots"]
        self.defer: DeferJournal = kw["defer"]
        self.core: Dispatcher = kw["core"]
        self._replayed: int = kw["replayed"]
        self._dups: int = kw["dups"]
        self._commits_in_memory: list[int] = []
        # one entry per ``committed`` record; the records of one dispatch are next to each other
        # (several only when one would be too big)
        self._pending_commits: list[_PendingCommit] = []
        self._snapshot_failures = 0
        self._closed = False
        self._filesystem = _fs.filesystem()
        # U6: every commit journaled up to this sequence number was handed to the callback
        # (which returned). Kept in each snapshot body and, between snapshots, in ``delivered``
        # events at most every DELIVERY_MARK_SECONDS.
        self._delivered: int = kw["delivered"]
        self._delivered_marked = self._delivered
        self._delivered_at = time.monotonic()
        self._callback_failed = False
        self._notices: list[tuple[Callable[[Any], None], Any]] = []  # for the delivery point
        self._held_results: dict[str, tuple[int, Any]] = {}  # memory-only commits' (G4)
        self._on_commit: Callable[[Commit], None] | None = None  # the facade's callback
        #: called with each :class:`Defer` once the defer journal took it (or kept it in
        #: memory): the item's retries are spent (the futures executor fails its future)
        self.on_defer: Callable[[Defer], None] | None = None
        #: called with the work ID of each item an operator cancelled (``durable-dispatch
        #: cancel``), once its ``cancelled`` record is journaled (the futures executor
        #: fails its future)
        self.on_cancel: Callable[[str], None] | None = None
        #: called with each :class:`Send` of :meth:`next_send` once it is journaled, before
        #: the shell sends it: its items are running (the futures executor marks their futures
        #: running then, and not before, so the calls not sent yet can still be cancelled)
        self.on_dispatch: Callable[[Send], None] | None = None
        # a display, not state: atomic, not fsynced (issue 49; readers take damage as "none")
        self._live = SnapshotStore(
            directory,
            name=LIVE_STATS_NAME,
            keep=2,
            durable=False,
            directory_claim=self._lock.claim,
        )
        self._publisher = BackgroundSaver(self._live)  # off the master's thread (issue 49)
        self._live_at = -STATS_SECONDS  # monotonic time of the last publication
        self._opened_at = time.time()
        #: the allocation's end as the master reads it (``mpi.allocation``), published with
        #: the statistics: a callable returning ``{"ends_at", "started", "source"}``, or None
        self.allocation: Callable[[], dict[str, Any]] | None = None
        self._restore_at, self._restore_backoff = 0.0, 0.5  # storage: retry with a back-off
        self._stuck_since: float | None = None  # since when every live worker is parked
        self._hosts: dict[int, str] = {}  # rank -> host journaled in this run (note_host)
        # token -> work ID -> cost, or a table (note_usage; costs.py)
        self._costs: dict[Token, dict[str, Any] | CostTable] = {}
        self._outputs: Outputs | None = None  # the items' outputs, opened at the first
        #: the sequence number of this run's epoch record until it is durable (next_send)
        self._epoch_seq: int | None = None
        self._dep_results: dict[str, list[Any]] = {}  # G4: see dependencies.py
        self._has_after = False
        self._sized: set[str] = set()
        #: the operator commands this open applied (``control.Applied``)
        self.applied_at_open: list[Any] = []
        #: the directory fsync of the journals the open created, running beside (issue 49)
        self._dir_sync: _Beside[bool] | None = None

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        sync: str = "batch",
        watchdog: WatchdogConfig | None = None,
        retry: RetryPolicy | None = None,
        ranks: Iterable[int] = (),
        starting: bool = False,
        on_commit: OnCommit | None = None,
        keep_snapshots: int = 3,
        journal_options: Mapping[str, Any] | None = None,
    ) -> CampaignState:
        """Open (creating if needed) a state directory and start a new master epoch.

        ``on_commit(work_id, result)`` is the callback of every commit (see :meth:`redeliver`,
        which this calls before returning: the commits a crash or a failed callback kept from
        it are delivered first, so each commit is delivered at least once). It may return work
        items, the children of that result: they are submitted durably before the commit counts
        as delivered, and known work IDs are skipped, so each child is submitted once however
        often the callback runs.
        It is called once a commit is journaled durably, or, while the journal is degraded (a
        disk fault), at once for a memory-only commit: a callback with a parameter named
        ``durable`` is told which (``durable=False``: lost if the process ends before the
        journal is restored, and then delivered again on the next run; see
        :data:`~durable_dispatch.campaign.delivery.OnCommit`).

        ``ranks`` are the workers; with ``starting`` each gets work only after its first READY
        without a token (what ``run_worker`` sends once it is up), so a worker's start-up is
        never counted against an item's deadline.

        In-flight dispatches from a previous run are rolled back to the front of the frontier
        without charging a retry, and then a snapshot is written before anything is dispatched
        (an open that rolled nothing back writes none: the journal holds its epoch).

        Raises:
            LockHeldError: another master holds the directory.
            StorageError: the directory or its lock cannot be created or opened (a read-only or
                full filesystem, a link at the lock's path): nothing was read or changed.
            JournalCorruptError, SnapshotCorruptError, StorageError: see the storage layer.
        """
        st: CampaignState = open_state(
            cls,
            directory,
            sync=sync,
            watchdog=watchdog,
            retry=retry,
            ranks=ranks,
            starting=starting,
            on_commit=on_commit,
            keep_snapshots=keep_snapshots,
            journal_options=journal_options,
        )
        return st

    # ------------------------------------------------------------------ input
    def submit(self, items: Iterable[WorkItem]) -> int:
        """Add work items not already known (pending, in flight, committed or deferred).

        Safe to call with the whole work source on every start: known IDs with the payload
        they named are skipped (compared by a digest of the payload's JSON, keys sorted).
        Returns how many were new. Each item's payload is written once, to the submissions
        store, durably before the state journal names it (by index); a crash between the two
        leaves items the next open submits (they were durable).

        The items are built with the cyclic collector paused and then frozen (see
        ``paused_gc`` and docs/performance.md), so no collection walks the queue again.

        Raises:
            ChangedPayloadError: a known work ID, or one named twice in ``items``, with another
                payload (nothing added).
            RecordEncodeError: a payload holds a value that JSON cannot hold as given (a tuple,
                a set, a datetime, bytes, a numpy array ...), naming its work ID and where in
                the payload (nothing added). NaN, the infinities and numpy scalars are kept
                exactly (see :mod:`durable_dispatch.values`).
            UsageError: an item is not a :class:`WorkItem` with a string work ID and an integer
                priority (nothing added).
            RecordTooLargeError: one item is too large for a record; the items before it were
                added, it and those after it were not.
        """
        with paused_gc(self) as block:
            block.items = self._submit(items)
            return block.items

    def _submit(self, items: Iterable[WorkItem]) -> int:
        new: list[WorkItem] = []
        again: list[WorkItem] = []  # known work IDs, and work IDs twice in this call
        seen: set[str] = set()
        known = self.core.ledger.ids.index
        for i in items:
            if not isinstance(i, WorkItem) or type(i.work_id) is not str:
                raise UsageError(f"expected a WorkItem with a str work_id, got {i!r}")
            if type(i.priority) is not int:
                raise UsageError(f"{i.work_id!r}: priority must be an int, got {i.priority!r}")
            if i.after:
                i = _checked_after(i)
                self._has_after = True
            wid = i.work_id
            if wid not in known and wid not in seen:
                new.append(i)
                seen.add(wid)
            else:
                again.append(i)
        new, again = _exact(new), _exact(again)  # U15: before anything is added
        digests = _digests(new)
        if again:
            self._refuse_changed(again, new, digests)  # U11: before anything is added
        if not new:
            return 0
        first = self._store.stored
        try:
            self._store.store(new, first, digests)
        except RecordTooLargeError:
            done = self._store.stored - first
            if done:
                self._announce(new[:done], first, digests[: done * DIGEST_BYTES])
            raise
        self._announce(new, first, digests)
        if self._has_after:  # G4: a new item that names a deferred or cancelled item is
            self._defer_behind_ended({d: None for w in new for d in w.after})  # deferred too
        return len(new)

    def _defer_behind_ended(self, deps: Iterable[str]) -> None:
        """G4, the one place: every item waiting for one of ``deps`` that ended without a
        commit (deferred or cancelled) is deferred at once, naming it (a new item, an item an
        operator retried, the open's repair after a crash)."""
        led = self.core.ledger
        for dep in deps:
            if dep in led.deferred:
                self._apply(self.core.ended_without_commit(dep))
            elif dep in led.cancelled:
                self._apply(self.core.ended_without_commit(dep, "cancelled"))

    def _refuse_changed(self, again: list[WorkItem], new: list[WorkItem], digests: bytes) -> None:
        """U11: each of ``again`` (a known work ID, or one named earlier in the same call) must
        name the payload and the ``after`` it named before (the ``after`` of a committed item
        is not kept: it ran, what it waited for is moot); the first that does not is refused.

        Raises:
            ChangedPayloadError: naming that work ID.
        """
        led = self.core.ledger
        ids, n = led.ids, DIGEST_BYTES
        mine: dict[str, bytes] | None = None  # this call's new items' digests, when needed
        theirs = _digests(again)
        for j, item in enumerate(again):
            wid = item.work_id
            if wid in ids.index:
                was = ids.digest_of(wid)
                if was is None and wid in led.items:  # a state written before digests
                    was = _digests([led.items[wid]])
            else:
                if mine is None:
                    mine = {w.work_id: digests[k * n : k * n + n] for k, w in enumerate(new)}
                was = mine[wid]
            if was is not None and was != (now := theirs[j * n : j * n + n]):
                st = self.core.status(wid) if wid in ids.index else None
                where = st.name.lower().replace("_", " ") if st else "earlier in this submission"
                raise ChangedPayloadError(
                    f"work ID {wid!r} is known ({where}) "
                    f"with another payload (digest {was.hex()}, this one {now.hex()}): a work ID "
                    "names one payload; give the changed item a new work ID (one that digests "
                    "its payload, say) or start a new state directory",
                    work_id=wid,
                )
            if wid in ids.index:
                before = led.items.after_of(wid) if wid in led.items else None
            else:
                before = next(w.after for w in new if w.work_id == wid)
            if before is not None and set(before) != set(item.after):
                st = self.core.status(wid) if wid in ids.index else None
                where = st.name.lower().replace("_", " ") if st else "earlier in this submission"
                raise ChangedPayloadError(
                    f"work ID {wid!r} is known ({where}) with another after "
                    f"({sorted(before)}, this one {sorted(item.after)}): a work ID names one "
                    "item, its dependencies included; give the changed item a new work ID or "
                    "start a new state directory",
                    work_id=wid,
                )

    def _announce(self, items: list[WorkItem], first: int, digests: bytes) -> None:
        """Journal the submission of the stored ``items`` and hand them to the core (with
        their payload ``digests``). The records name the items by index once the store is
        durable; if the store cannot be made durable (a disk fault), they carry the items
        themselves."""
        stored = self._store.durable()
        for k in range(0, len(items), SUBMIT_CHUNK):
            chunk = tuple(items[k : k + SUBMIT_CHUNK])
            self.journal.append(encode(Submitted(chunk, first + k, stored=stored)))
        self.core.ledger.ids.set_digests(first, digests)  # (so the core computes none)
        self.core.submit(items, first=first, checked=True)

    def publish_statistics(self, *, running: bool = True, force: bool = False) -> bool:
        """Write the statistics for readers (``durable-dispatch stats`` and ``watch``), at most
        every :data:`STATS_SECONDS` unless ``force``: one small atomic file, so a reader beside
        the master sees current figures and how old they are. The file is written by a thread
        of its own: the master's loop never waits for its fsync (a shared filesystem that
        stalls for a minute stalls only that thread). ``force`` (at close) writes it here, once
        that thread finished. Returns True when written or handed over; a disk that refuses is
        not an error (the campaign goes on)."""
        t = time.monotonic()
        if not force and t - self._live_at < STATS_SECONDS:
            return False
        self._live_at = t
        body = self._statistics_body(running)
        if not force:
            return self._publisher.submit(body)
        self._publisher.close()
        try:
            self._live.save(body)
        except StorageDegradedError as e:
            log.warning("statistics not published: %s", e)
            return False
        return True

    def _statistics_body(self, running: bool) -> dict[str, Any]:
        """What the statistics file holds (see :meth:`publish_statistics`)."""
        return {
            "ts": time.time(),
            "running": running,
            "pid": os.getpid(),
            "host": os.uname().nodename,
            "started": self._opened_at,
            "stats": self.statistics().as_dict(),
        } | ({"allocation": self.allocation()} if self.allocation is not None else {})

    def _save_snapshot(self, reason: str = "") -> bool:
        """Write the projection atomically; tells the core it is persisted. False if the disk
        refused (the state stays in memory and in the journal; the campaign goes on)."""
        seq = self.journal.next_seq - 1
        ok = True
        try:
            if not self._store.durable():
                # A compact snapshot names items by index: without the store on disk it would
                # name what a crash could lose. The journal still holds every event.
                raise StorageDegradedError(
                    "the submissions store is not durable",
                    path=self.submissions.path,
                    op="fsync",
                )
            body = {
                "journal_seq": seq,
                "delivered_seq": self._delivered,
                "state": self._projection(),
                "stats": self.statistics().as_dict(),
                "ts": time.time(),
            }

            # The snapshot folds the journal through ``seq``: it is renamed into place only once
            # an fsync covers ``seq``, which the group commit runs while it is written (issue 49),
            # and never while a record through ``seq`` is memory-only: a crash would lose the
            # journal's records the snapshot claims to fold, and the next master would write its
            # own under their numbers, which a replay from this snapshot would then pass over.
            def covered() -> None:
                if not self._durable(seq):
                    raise _JournalBehind(
                        f"the journal's records through {seq} are not on disk "
                        f"({self.journal.path} runs from memory)"
                    )

            self.snapshots.save(body, before_publish=covered if seq >= 0 else None)
        except (StorageDegradedError, _JournalBehind) as e:
            self._snapshot_failures += 1
            log.error("snapshot (%s) not saved: %s", reason, e)
            ok = False
        self.core.snapshot_persisted()
        return ok

    def _projection(self) -> dict[str, Any]:
        """The durable state through the journal's last record: the core's snapshot, with the
        commits already journaled but not yet delivered (a group commit in progress) counted as
        committed, as a replay of the journal would count them. Without this, a snapshot taken
        between a commit's record and its delivery would fold that record in as in flight, and a
        restart would run the work again and record a second commit."""
        done = {c.work_id for p in self._pending_commits for c in p.commits}
        assert self._store.stored >= len(self.core.ledger.ids), "the store covers every index"
        return self.core.ledger.to_compact(done)

    def try_restore(self) -> bool:
        """Try to make memory-only records durable again (submissions store, journal, defer
        journal)."""
        if self.submissions.try_restore():
            self.submissions.sync_now()
        ok = self.journal.try_restore()
        if ok:
            self.journal.sync_now()
            durable = self.journal.durable_seq
            self._commits_in_memory = [s for s in self._commits_in_memory if s > durable]
            held = self._held_results
            for wid in [w for w, (seq, _) in held.items() if seq <= durable]:
                del held[wid]
        before = self.defer.statistics().in_memory
        ok2 = self.defer.try_restore()
        moved = before - self.defer.statistics().in_memory
        if moved > 0:
            self.core.defer_persisted_later(moved)
        return ok and ok2

    # ------------------------------------------------------------------ stats
    def statistics(self) -> CampaignStats:
        """The campaign's counters (the core's plus storage's)."""
        return CampaignStats(
            core=self.core.statistics().as_dict(),
            epoch=self.core.epoch,
            commits_in_memory=len(self._commits_in_memory),
            snapshot_failures=self._snapshot_failures,
            replayed_records=self._replayed,
            duplicate_commits_in_journal=self._dups,
            journal_health=self.journal.health.as_dict(),
            snapshot_health=self.snapshots.health.as_dict(),
            defer_health=self.defer.health.as_dict(),
            submissions_health=self.submissions.health.as_dict(),
            storage_stalls=_fs.stall_report(),
        )

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Save a final snapshot, close the journals and release the master lock."""
        if self._closed:
            return
        self._closed = True
        _resources.unregister(self)
        try:
            self._close()
        finally:
            # issue 50: the objects its bulk builds froze (the last to close), after the close's
            # last delivery, whose children's submit may have frozen under this state too
            release_frozen(self)

    def _close(self) -> None:
        """:meth:`close`'s work: the last deliveries, the snapshot, the journals, the lock."""
        close_state(self)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def __repr__(self) -> str:
        return f"<CampaignState {self.directory!r} epoch={self.core.epoch} closed={self._closed}>"

    def __enter__(self) -> CampaignState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_payload_of = attrgetter("payload")


def _digests(items: list[WorkItem]) -> bytes:
    """The payload digests of ``items`` (:func:`payload_digests`).

    Raises:
        RecordEncodeError: a payload is not JSON (naming its work ID); nothing was added.
    """
    try:
        return payload_digests(map(_payload_of, items))
    except TypeError:
        for w in items:
            try:
                payload_digests((w.payload,))
            except TypeError as e:
                raise RecordEncodeError(
                    f"work item {w.work_id!r}: its payload cannot be encoded as JSON: {e}"
                ) from None
        raise


def _exact(items: list[WorkItem]) -> list[WorkItem]:
    """``items`` with each payload in its stored form (:mod:`durable_dispatch.values`): the same
    list when every payload is plain JSON (one C-level pass), else a list where the items whose
    payload needed a stored form (NaN, a numpy scalar) are copies holding it.

    Raises:
        RecordEncodeError: a payload cannot be stored as given, naming the work ID, the path
            inside the payload and the value.
    """
    if not items or all_plain([w.payload for w in items]):
        return items
    out = []
    for w in items:
        try:
            p = stored(w.payload)
        except Refused as e:
            raise RecordEncodeError(
                f"work item {w.work_id!r}: its payload {e} (nothing of this submission was added)",
                work_id=w.work_id,
                path=e.path,
            ) from None
        out.append(w if p is w.payload else replace(w, payload=p))
    return out


def _checked_after(item: WorkItem) -> WorkItem:
    """``item`` with its ``after`` as a tuple of work IDs (a list is taken as given).

    Raises:
        UsageError: ``after`` is a string (a common slip for ``[id]``) or names a non-string.
    """
    after = item.after
    if isinstance(after, str) or not all(type(a) is str for a in after):
        raise UsageError(
            f"{item.work_id!r}: after must be a list or tuple of work IDs (strings), got {after!r}"
        )
    return item if type(after) is tuple else replace(item, after=tuple(after))
