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

* A commit is journaled and waited for (``wait_durable``: an fsync under ``always``/``batch``)
  before :meth:`CampaignState.apply` reports it to the caller's callback and before the core closes
  the work ID: a work ID is committed once *in the durable record*. Execution stays at-least-once:
  a worker may run an item again after a crash or a timeout; only one commit is ever recorded.
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
from functools import partial
from operator import attrgetter
from typing import Any

from ..core import (
    Commit,
    Decision,
    Defer,
    Dispatcher,
    PersistSnapshot,
    RetryPolicy,
    Send,
    WatchdogConfig,
    WorkItem,
)
from ..core.events import EpochStarted, Submitted, WorkerHost, encode
from ..core.indexed import DIGEST_BYTES, payload_digests
from ..core.ledger import Ledger
from ..core.ranks import RankState
from ..errors import (
    ChangedPayloadError,
    NotDurableError,
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
from ..storage.defer import DEFAULT_DEFER_NAME
from ..tokens import Token
from ..values import Refused, all_plain, stored
from .admin import (
    _reconcile_store,
)
from .delivery import Delivery, OnCommit, _PendingCommit
from .dependencies import Dependencies
from .replay import (
    _holders,
    _load_snapshot,
    _open_and_fold,
    paused_gc,
    release_frozen,
)
from .statedir import (
    LIVE_STATS_NAME,
    STATE_JOURNAL,
    SUBMIT_CHUNK,
    _take_master_lock,
)
from .submissions import SubmissionStore

__all__ = ["CampaignState", "CampaignStats", "OnCommit"]

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
        snapshot_failures: snapshots the disk refused.
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


class CampaignState(Delivery, Dependencies):
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
        d = os.fspath(directory)
        lock = _take_master_lock(d, create=True)
        journal: Journal | None = None
        store: Journal | None = None
        defer: DeferJournal | None = None
        opening = object()  # holds what the reopen's bulk build freezes until the state does

        # issue 49: a defer journal this open creates (on a shared filesystem: a lookup, a
        # create, a header's write, about 10 ms) is created beside the snapshot's load and the
        # state journal's open. One that exists opens after them, as before: a refused open
        # (a damaged state journal) must leave it as it was, torn tail and all (S9).
        def open_defer() -> DeferJournal:
            return DeferJournal.open(d, dir_sync=False, directory_claim=lock.claim)

        defer_opening: _Beside[DeferJournal] | None = None
        dir_sync: _Beside[bool] | None = None
        try:
            # A new directory is durable in its parent before anything is made in it (its
            # fsync ran beside the lock and the claim): a failed open leaves no journal in a
            # directory a crash could lose, and the next open fsyncs it again (statedir).
            lock.parent_synced()
            names = lock.claim.listing
            if names is not None and DEFAULT_DEFER_NAME not in names:
                defer_opening = _Beside(open_defer, "open-defer-journal")
            snapshots, snap = _load_snapshot(d, keep_snapshots, lock.claim)
            base = snap.value if snap is not None else {}
            with paused_gc(opening) as block:
                # issue 49: the journals this open creates share one directory fsync (below),
                # and take no lock file each: the directory's lock and claim are held (S5, S13)
                kw = {"dir_sync": False, **dict(journal_options or {})}
                kw["directory_claim"] = lock.claim
                journal, store, proj, n, stored = _open_and_fold(
                    os.path.join(d, STATE_JOURNAL), base, sync=sync, **kw
                )
                block.items = len(proj.items)
            defer = defer_opening.result() if defer_opening is not None else open_defer()
            # The journals it created: one directory fsync for them all, beside the rest of
            # the open and the first submission (issue 49). Each reports nothing durable before
            # it: a journal's first fsync waits for it (or, if it failed, fsyncs the directory
            # itself, S1).
            created = [j for j in (journal, store, defer.journal) if j.recovery.created]
            if created:
                where = os.path.abspath(d)  # (the caller may chdir meanwhile)
                dir_sync = _Beside(partial(_fsync_created, where), "fsync-state-dir")
                for j in created:
                    j.directory_sync_beside(partial(_done, dir_sync))
            covered = _reconcile_store(journal, store, proj, stored)
            epoch = proj.epoch + 1
            core, restarts = Dispatcher.restore(
                proj, epoch=epoch, watchdog=watchdog, retry=retry, ranks=ranks, starting=starting
            )
            _record_lost_deferrals(defer, core.ledger)
        except BaseException:
            release_frozen(opening)
            if dir_sync is not None:
                dir_sync.wait()
            if defer is None and defer_opening is not None:
                # it may have opened while the state journal failed: closed below
                defer_opening.wait()
                defer = defer_opening.value
                if defer_opening.error is not None:
                    log.warning(
                        "state %s: the defer journal did not open either: %s",
                        d,
                        defer_opening.error,
                    )
            for opened in (journal, store, defer):
                if opened is not None:
                    opened.close()  # its writer lock too: a later open must not find it held
            lock.release()
            raise
        # A snapshot of an earlier version has no delivery point: what it folded counts as
        # delivered (its callback ran before that version's snapshot), the journal after it not.
        delivered = int(base.get("delivered_seq", base.get("journal_seq", -1)))
        st = cls(
            d,
            lock=lock,
            journal=journal,
            submissions=store,
            stored=covered,
            snapshots=snapshots,
            defer=defer,
            core=core,
            replayed=n,
            dups=proj.duplicate_commits,
            delivered=max(delivered, proj.delivered),
        )
        st._dir_sync = dir_sync
        if id(opening) in _holders:  # what the reopen froze: the state holds it now
            _holders.discard(id(opening))
            _holders.add(id(st))
        # The epoch is durable before the first dispatch leaves (next_send), not before the
        # open returns: its fsync runs in the group commit meanwhile, beside the submission's
        # (issue 49). A crash before it loses only an epoch that no token carried yet.
        st._epoch_seq = journal.append(encode(EpochStarted(epoch, time.time()))).seq
        if restarts:  # S8: the rollbacks are folded before the first dispatch
            st._apply(restarts)
        # G4: a crash between a dependency's deferral and its dependents' left them waiting
        # (or an operator's cancel and its dependents', O1)
        for wid in [w for w in core.ledger.deferred if core.ledger.dependents.get(w)]:
            st._apply(core.ended_without_commit(wid))
        for wid in [w for w in core.ledger.cancelled if core.ledger.dependents.get(w)]:
            st._apply(core.ended_without_commit(wid, "cancelled"))
        st._load_dependency_results()
        if restarts:
            st._save_snapshot(f"start of epoch {epoch}")
        # else no snapshot: nothing was rolled back, and the journal holds the epoch (issue 49:
        # it cost two fsyncs and a directory scan at every open, a fresh one included)
        _resources.register(st)
        try:  # O1: the operator's commands that wait (``durable-dispatch cancel`` ...), once
            from .control import CONTROL_DIR, apply_waiting

            # (none when the claim's listing had no control directory: one lookup less on a
            # slow mount; a command written since is applied by the running loop's next look)
            names = lock.claim.listing
            if names is None or CONTROL_DIR in names:
                st.applied_at_open = apply_waiting(st, running=False)
        except BaseException:
            st.close()
            raise
        if on_commit is not None:
            try:
                st.redeliver(on_commit)
            except BaseException:
                st.close()
                raise
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
        if self._has_after:  # G4: a new item that names a deferred item is deferred too
            led = self.core.ledger
            for dep in {d: None for w in new for d in w.after if d in led.deferred}:
                self._apply(self.core.ended_without_commit(dep))
        return len(new)

    def _refuse_changed(self, again: list[WorkItem], new: list[WorkItem], digests: bytes) -> None:
        """U11: each of ``again`` (a known work ID, or one named earlier in the same call) must
        name the payload it named before; the first that does not is refused.

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

    def next_send(self, now: float, max_items: int = 1) -> Send | None:
        """The next dispatch of up to ``max_items`` items, journaled (persist before you send),
        or None.

        Writes any snapshot the core requires first (one after a rollback). The first waits for
        this run's epoch record to be durable: a token of an epoch a crash could forget would be the
        token of another dispatch after the restart, which starts the same epoch again.
        """
        if self._epoch_seq is not None:
            self._durable(self._epoch_seq)
            self._epoch_seq = None
        self._check_dependency_sizes(max_items)
        while True:
            d = self.core.reserve(now, max_items)
            if isinstance(d, PersistSnapshot):
                self._save_snapshot(d.reason)
                continue
            if d is not None:
                self._record_send(d)
                if self.on_dispatch is not None:
                    self.on_dispatch(d)
            return d

    # ---------------------------------------------------------------- the facade
    # One call per thing that happened: each asks the core and persists what it decided, so a
    # loop built on these cannot forget a persist step (run_master is built on them).
    def on_ready(self, rank: int, token: object, now: float) -> list[Decision]:
        """A READY from ``rank``; see :meth:`Dispatcher.on_ready`."""
        return self._apply(self.core.on_ready(rank, token, now), self._on_commit)

    def note_host(self, rank: int, host: str) -> None:
        """Worker ``rank`` runs on ``host`` (its first READY said so): journaled once per rank
        per run (a ``host`` event, for the joblog's host column). The record goes with the
        journal's next flush (the loop does not wait for it): a crash before it loses only the
        name, and the rank's dispatches, journaled after it, cannot become durable without it
        (one journal, in order)."""
        self.core.note_host(rank, host)  # its failure domain
        if self._hosts.get(rank) == host:
            return
        self._hosts[rank] = host
        self.journal.append(encode(WorkerHost(rank, host, time.time())))

    def on_heartbeat(self, rank: int, token: object, now: float) -> list[Decision]:
        """A HEARTBEAT from ``rank``; see :meth:`Dispatcher.on_heartbeat`."""
        return self._apply(self.core.on_heartbeat(rank, token, now), self._on_commit)

    def on_results(
        self,
        rank: int,
        token: object,
        results: Any,
        now: float,
        *,
        errors: Any = None,
        failure: Any = None,
    ) -> list[Decision]:
        """A RESULT from ``rank`` (see :meth:`Dispatcher.on_results`): ``errors`` names the items
        the worker could not do, ``failure`` why the whole dispatch failed. Its commits are
        journaled at once and delivered once durable (:meth:`tick`), so the loop goes on."""
        out = self.core.on_results(rank, token, results, now, errors=errors, failure=failure)
        return self._apply(out, self._on_commit, wait=False)

    def on_part(
        self, rank: int, token: object, work_ids: Any, results: Any, now: float, *, errors: Any
    ) -> list[Decision]:
        """A partial RESULT from ``rank`` (see :meth:`Dispatcher.on_part`): the outcomes of some
        items of a dispatch that still runs. Their commits are journaled at once and delivered
        once durable (:meth:`tick`), as :meth:`on_results`' are."""
        out = self.core.on_part(rank, token, work_ids, results, now, errors=errors)
        return self._apply(out, self._on_commit, wait=False)

    def sent(self, token: Token, now: float, error: str | None = None) -> list[Decision]:
        """The WORK send of :meth:`next_send`'s dispatch returned (``error`` None) or failed."""
        if error is None:
            return self._apply(self.core.mark_dispatched(token, now), self._on_commit)
        return self._apply(self.core.send_failed(token, now, error), self._on_commit)

    def rank_lost(self, rank: int, now: float, error: str = "rank lost") -> list[Decision]:
        """``rank`` failed (ULFM); see :meth:`Dispatcher.rank_lost`."""
        return self._apply(self.core.rank_lost(rank, now, error), self._on_commit)

    def ranks_lost(self, ranks: list[int], now: float, error: str = "rank lost") -> list[Decision]:
        """``ranks`` failed together (ULFM: one check found them); see
        :meth:`Dispatcher.ranks_lost` (a node that lost several charges its items nothing)."""
        return self._apply(self.core.ranks_lost(ranks, now, error), self._on_commit)

    def on_gone(self, rank: int, error: str, now: float) -> list[Decision]:
        """``rank`` said it failed and ends (a GONE message): its dispatch is rolled back
        and the rank dropped, as for a lost rank; a rank already lost or unknown is ignored."""
        if self.core.rank_state(rank) in (None, RankState.LOST):
            return []
        log.error("worker %d failed and is gone: %s", rank, error)
        why = f"worker failed: {error}"[:2000]  # its own error, not its node's
        return self._apply(self.core.rank_lost(rank, now, why, domain=False), self._on_commit)

    def now(self) -> float:
        """The master's clock for this turn: ``time.monotonic()`` as the core's observed clock
        counts it (a pause of the master is not held against the workers)."""
        return self.core.clock.observe(time.monotonic())

    @property
    def done(self) -> bool:
        """True when every work item is committed or deferred and every commit was delivered:
        the loop's condition (``while not state.done``)."""
        return self.core.done and not self._pending_commits

    def stop_reason(self, now: float, *, grace: float) -> str | None:
        """Why the campaign cannot go on although work remains, or None: ``"no workers left"``
        (every rank was lost or said it is gone), or ``"every worker parked"`` (every live
        worker is parked or still starting, at least one parked, and none sent its exact READY
        for ``grace`` seconds of ``now``). Logs the reason; the state directory resumes."""
        core = self.core  # (every question O(1): this runs every turn, at 10,000 ranks too)
        live = core.live_rank_count()
        if not live:
            log.error("master: no worker left; %d item(s) pending", len(core.pending()))
            return "no workers left"
        parked = core.parked_rank_count()
        if core.done or not parked or parked + core.starting_ranks() < live:
            self._stuck_since = None  # some worker serves, or may still come up
            return None
        if self._stuck_since is None:
            self._stuck_since = now
        if now - self._stuck_since < grace:
            return None
        log.error(
            "master: every worker (%d) is parked and %d item(s) remain; no exact READY came "
            "within %.0fs: stopping (resumable; hung work functions need worker isolation to "
            "give their ranks back)",
            live,
            len(core.pending()),
            grace,
        )
        return "every worker parked"

    def tick(self, now: float, *, drained: bool = True) -> list[Decision]:
        """The end of a turn (its last two steps): deliver the commits an fsync now covers, roll
        back every READY that came without a valid RESULT, and sweep the watchdog.

        ``drained``: the turn's receive found every message that had arrived (it returned
        fewer than its limit). After a pause of the master, deadlines are judged only once a
        turn drained (a paused master suspects no worker). A degraded journal is retried here
        too, with a back-off (0.5 s, doubling to 30 s).
        """
        if drained:
            self.core.clock.drained()
        self._complete_commits()
        out = self._apply(self.core.join_invalid(now), self._on_commit)
        out += self._apply(self.core.sweep(now), self._on_commit)
        if not self.journal.health.ok and now >= self._restore_at:
            if self.try_restore():
                self._restore_backoff = 0.5
            else:
                self._restore_at = now + self._restore_backoff
                self._restore_backoff = min(self._restore_backoff * 2, 30.0)
        self.publish_statistics()
        return out

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
            # an fsync covers ``seq``, which the group commit runs while it is written (issue 49)
            self.snapshots.save(
                body, before_publish=(lambda: self._durable(seq)) if seq >= 0 else None
            )
        except StorageDegradedError as e:
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
        waited: BaseException | None = None
        if self._dir_sync is not None:  # (its thread ends before the journals close)
            waited = self._dir_sync.wait()  # an interrupt: raised once all is closed
            self._dir_sync = None
        if not _fs.reaches(self._filesystem) and not _fs.comes_back(self._filesystem):
            # Opened on a fake filesystem that is gone: touch nothing (the journals abandon
            # themselves; a snapshot or a lock release would reach the real filesystem).
            log.warning("state %s: its filesystem is gone; closed without writing", self.directory)
            self._publisher.close()
            self.journal.close()
            self.submissions.close()
            self.defer.close()
            _resources.disown_lock(self._lock)
            return
        failed: list[BaseException] = [waited] if waited is not None else []
        beside: _Beside[list[BaseException]] | None = None
        try:
            try:
                self._complete_commits(wait=True)
                self._mark_delivered(now=True)
                # issue 49: the last statistics are written by their thread while the snapshot
                # is written and fsynced here (a display: no order between the two); again
                # here, after that thread ended, if the snapshot failed (a figure changed)
                failures = self._snapshot_failures
                handed = self._publisher.submit(self._statistics_body(running=False))
                # and the owner record's release is written and fsynced beside it too (it is
                # renamed into place only once the journals are closed, S13)
                prepare = _Beside(self._lock.claim.prepare_release, "owner-release")
                # and the submissions store and the defer journal close beside it: nothing
                # writes them after the last delivery (which submitted its children)
                beside = _Beside(
                    lambda: _close_each((self.submissions, self.defer)), "close-journals"
                )
                try:
                    self._save_snapshot("close")
                finally:
                    interrupted = prepare.wait()
                if interrupted is not None:
                    raise interrupted
                if handed and self._snapshot_failures == failures:
                    self._publisher.close()
                else:
                    self.publish_statistics(running=False, force=True)
            finally:
                # whatever failed above: each journal is closed, no writer lock is left held
                if beside is None:
                    failed += _close_each((self.journal, self.submissions, self.defer))
                else:
                    failed += _close_each((self.journal,))
                    interrupted = beside.wait()  # (S13: the owner's release only after them)
                    if interrupted is not None:
                        failed.insert(0, interrupted)
                    failed += beside.value or []
        finally:
            self._lock.release()
            if failed:
                raise _closing_error(failed)

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


def _close_each(journals: Iterable[Journal | DeferJournal]) -> list[BaseException]:
    """Close each of ``journals`` whatever the others do; what each close raised."""
    failed: list[BaseException] = []
    for journal in journals:
        try:
            journal.close()
        except BaseException as e:  # noqa: BLE001 - the caller raises them, all of them
            failed.append(e)
    return failed


def _fsync_created(d: str) -> bool:
    """One directory fsync for the journals an open created in ``d`` (instead of one each,
    issue 49); False if it failed: each then fsyncs the directory itself at its first fsync
    (S1)."""
    try:
        _fs.fsync_dir(d)
    except OSError as e:
        log.warning("state %s: the directory fsync of its new journals failed: %s", d, e)
        return False
    return True


def _done(beside: _Beside[bool]) -> bool:
    """Wait for ``beside`` (an interrupt of the wait is raised); True if it returned True."""
    interrupted = beside.wait()
    if interrupted is not None:
        raise interrupted
    return beside.error is None and bool(beside.value)


def _closing_error(failed: list[BaseException]) -> BaseException:
    """What :meth:`CampaignState.close` raises when closing its journals failed: an error other
    than :class:`NotDurableError` as it was; else one :class:`NotDurableError` naming every
    journal with records held only in memory, the one holding most first (its ``path``;
    ``pending`` counts them all), so the state journal's memory-only commits are not hidden
    behind the defer journal's one record."""
    other = [e for e in failed if not isinstance(e, NotDurableError)]
    if other:
        return other[0]
    held = [e for e in failed if isinstance(e, NotDurableError)]
    held.sort(key=lambda e: -(e.pending or 0))
    first = held[0]
    each = "; ".join(f"{e.pending} in {e.path}" for e in held)
    total = sum(e.pending or 0 for e in held)
    return NotDurableError(
        f"closed with {total} record(s) held only in memory ({each}): the disk refused them "
        f"({first.op or 'a write'}{', errno ' + str(first.errno) if first.errno else ''}) and "
        "they are lost with this process; a later run does the work they recorded again",
        path=first.path,
        op=first.op,
        errno=first.errno,
        pending=total,
    )


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


def _record_lost_deferrals(defer: DeferJournal, ledger: Ledger) -> int:
    """Record again each item the state journal says is deferred but the defer journal lacks:
    its record was held in memory when the last master ended (a full disk, EIO) and the state
    journal's ``deferred`` event was durable. Without it ``deferred list`` would not show the
    item and the futures executor would wait for it forever. Returns how many."""
    if not ledger.deferred:
        return 0
    lost = [(wid, w) for wid, w in ledger.deferred.items() if wid not in defer]
    for wid, w in lost:
        defer.defer(
            wid,
            w.to_json(),
            attempts=ledger.attempts.get(wid, 0),
            kinds=ledger.kinds.get(wid, ()),
            last_error=ledger.last_error.get(wid),
            inputs=w.inputs,
            self_contained=w.self_contained,
        )
    if lost:
        log.warning("recorded %d deferred item(s) the defer journal had lost", len(lost))
    return len(lost)
