"""Durable campaign state: snapshot + journal replay, crash-safe rollback, master restart.

Theory of operation. A state directory holds snapshots, the state journal, the submissions store
(every item's payload, once, by dense index), the defer journal and the master lock. The durable
state (the core's :class:`~durable_dispatch.core.ledger.Ledger`) changes only by small events
journaled *before* the shell acts; a snapshot folds them up to a journal sequence number in a
compact form whose cost does not grow with the campaign. Loading = the submissions store + the
newest valid snapshot + the journal records after it.

The campaign is parts with one job each, composed by :class:`CampaignState`, the facade the
master's loop calls (one method per thing that happened: :meth:`~CampaignState.on_ready`,
``on_results``, ``sent``, ``tick`` ...; each asks the core and persists what it decided):
``admission.py`` checks and adds submitted items; ``recorder.py`` persists the core's decisions
before the shell acts; ``delivery.py`` queues what the user must hear until the delivery point,
:meth:`CampaignState.deliver`, the one place user code runs; ``dependencies.py`` holds the
results that waiting items need; ``lifecycle.py`` opens the journals and the snapshot. Replay
(the projection, the fold, the snapshot loader) is in ``replay.py``; offline operations (view,
compact, requeue, drop) in ``admin.py``. docs/explanation/architecture.md draws them.

Durability contract.

* A commit is journaled, and an fsync covers it (under ``always``/``batch``), before the
  core closes the work ID and the delivery point (:meth:`CampaignState.deliver`) reports it
  to the caller's callback: a work ID is committed once *in the durable record*. Execution
  stays at-least-once: a worker may run an item again after a crash or a timeout; only one
  commit is ever recorded.
* Every rollback is followed by an atomic snapshot before the next dispatch, at a cost that does
  not grow with the campaign.
* At every start a new epoch is journaled and fsynced before any dispatch, so no token repeats.
* If the disk fails, records are held in memory (the journal's honest degradation); the campaign
  goes on, ``statistics()`` says how many commits are memory-only, and they become durable when
  the journal is restored.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from functools import partial
from typing import Any

from ..core import (
    Decision,
    Defer,
    Dispatcher,
    PersistSnapshot,
    RetryPolicy,
    Send,
    WatchdogConfig,
    WorkItem,
)
from ..core.events import EpochStarted, WorkerHost, encode
from ..core.ranks import RankState
from ..errors import NotDurableError
from ..storage import DeferJournal, Journal, SnapshotStore
from ..storage import fs as _fs
from ..storage import resources as _resources
from ..storage.background import Beside as _Beside
from ..tokens import Token
from .admission import Admission
from .checkpoint import Checkpoints
from .delivery import Deliveries, OnCommit, spawned
from .dependencies import DependencyResults
from .lifecycle import adopt_frozen, close_writing, closing_error, open_parts
from .outputs import Outputs
from .publication import CampaignStats, Publisher
from .recorder import Recorder
from .replay import paused_gc, release_frozen
from .stuck import Stuck
from .submissions import SubmissionStore

__all__ = ["CampaignState", "CampaignStats", "OnCommit"]

log = logging.getLogger("durable_dispatch.state")


class CampaignState:
    """A campaign's durable state in one directory, driving a :class:`Dispatcher`.

    Open with :meth:`open`; use as a context manager or call :meth:`close`. The master's loop
    calls one method per thing that happened (:meth:`on_ready`, :meth:`on_results`,
    :meth:`sent`, :meth:`tick` ...): each asks the core and persists what it decided. None of
    them runs user code: they queue what the user must hear, and :meth:`deliver` runs it.
    """

    def __init__(
        self,
        directory: str,
        *,
        lock: Any,
        journal: Journal,
        submissions: Journal,
        stored: int,
        snapshots: SnapshotStore,
        defer: DeferJournal,
        core: Dispatcher,
        replayed: int,
        duplicates: int,
        delivered: int,
        dir_sync: _Beside[bool] | None = None,
    ) -> None:
        self.directory = directory
        self._lock = lock
        self.journal = journal
        self.submissions = submissions
        self._store = SubmissionStore(submissions, stored)
        self.snapshots = snapshots
        self.defer = defer
        self.core = core
        self._replayed = replayed
        self._dups = duplicates
        self._closed = False
        self._filesystem = _fs.filesystem()
        self._dependencies = DependencyResults(core, directory)
        self._deliveries = Deliveries(
            journal,
            core,
            directory,
            delivered,
            dependencies=self._dependencies,
            defer=defer,
            persist=lambda decisions: self.persist(decisions),
        )
        self._admission = Admission(journal, self._store, core, self._dependencies)
        self._recorder = Recorder(
            journal,
            defer,
            core,
            self._deliveries,
            self._dependencies,
            outputs=lambda: Outputs(directory, lock.claim),
            save_snapshot=lambda reason: self.save_snapshot(reason),
            deferred=self._deferred,
        )
        #: called with each :class:`Defer` once the defer journal took it: its retries are spent
        self.on_defer: Callable[[Defer], None] | None = None
        #: called with the work ID of each item an operator cancelled, once it is journaled
        self.on_cancel: Callable[[str], None] | None = None
        #: called with each :class:`Send` of :meth:`next_send` once it is journaled and sent
        self.on_dispatch: Callable[[Send], None] | None = None
        #: called with ``(rank, host)`` when a worker's first READY said where it runs: it is up
        self.on_worker_up: Callable[[int, str], None] | None = None
        #: called with ``(rank, error)`` when a worker said it failed and ends (GONE)
        self.on_worker_gone: Callable[[int, str], None] | None = None
        #: called at the end of every :meth:`deliver` while open: a refill, a progress report
        self.every_turn: list[Callable[[], None]] = []
        self._publication = Publisher(
            directory, lock.claim, statistics=self.statistics, allocation=lambda: self.allocation
        )
        self._checkpoints = Checkpoints(
            snapshots,
            journal,
            self._store,
            core,
            self._deliveries,
            statistics=self.statistics,
            wait_durable=lambda seq: self.wait_durable(seq),
        )
        #: the allocation's end as the master reads it (``batch``): ``{"ends_at", ...}``, or None
        self.allocation: Callable[[], dict[str, Any]] | None = None
        self._restore_at, self._restore_backoff = 0.0, 0.5  # a degraded journal's retry
        self._stuck = Stuck(core)
        self._hosts: dict[int, str] = {}  # rank -> host journaled in this run (note_host)
        self._epoch_seq: int | None = None  # this run's epoch record, until it is durable
        self.applied_at_open: list[Any] = []  # the operator commands the open applied
        self._dir_sync = dir_sync  # the open's directory fsync of the journals it created

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

        ``on_commit(work_id, result)`` is the callback of every commit. The commits a crash or
        a failed callback kept from it are queued first, and handed to it at the first
        :meth:`deliver` (so each commit is delivered at least once). It may return work items,
        the children of that result: they are submitted durably before the commit counts as
        delivered, and known work IDs are skipped, so each child is submitted once however
        often the callback runs. See :data:`~durable_dispatch.campaign.delivery.OnCommit` for
        memory-only commits (a disk fault) and the ``durable`` parameter.

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
        opened = open_parts(
            directory,
            sync=sync,
            watchdog=watchdog,
            retry=retry,
            ranks=ranks,
            starting=starting,
            keep_snapshots=keep_snapshots,
            journal_options=journal_options,
        )
        st = cls(opened.directory, **opened.parts)
        adopt_frozen(opened.holder, st)
        try:
            cls._begin(st, opened.restarts, on_commit)
        except BaseException:
            st.close()
            raise
        return st

    def _begin(self, restarts: list[Decision], on_commit: OnCommit | None) -> None:
        """The open's last steps: the new epoch, the rollbacks, the repairs, the operator's
        commands that wait, and the redelivery queued."""
        core = self.core
        epoch = core.epoch
        # The epoch is durable before the first dispatch leaves (next_send), not before the
        # open returns: its fsync runs in the group commit meanwhile, beside the submission's
        # (issue 49). A crash before it loses only an epoch that no token carried yet.
        self._epoch_seq = self.journal.append(encode(EpochStarted(epoch, time.time()))).seq
        if restarts:  # S8: the rollbacks are folded before the first dispatch
            self.persist(restarts)
        # G4: a crash between a dependency's deferral and its dependents' left them waiting
        # (or an operator's cancel and its dependents', O1)
        led = core.ledger
        self.defer_behind_ended(
            [w for w in (*led.deferred, *led.cancelled) if led.dependents.get(w)]
        )
        self._dependencies.load()
        if restarts:
            self.save_snapshot(f"start of epoch {epoch}")
        # else no snapshot: nothing was rolled back, and the journal holds the epoch (issue 49:
        # it cost two fsyncs and a directory scan at every open, a fresh one included)
        _resources.register(self)
        # O1: the operator's commands that wait (``durable-dispatch cancel`` ...), once (none
        # when the claim's listing had no control directory: one lookup less on a slow mount;
        # a command written since is applied by the running loop's next look)
        from .control import CONTROL_DIR, apply_waiting

        names = self._lock.claim.listing
        if names is None or CONTROL_DIR in names:
            self.applied_at_open = apply_waiting(self, running=False)
        if on_commit is not None:  # U6: what the last run did not deliver, first
            self._deliveries.set_callback(on_commit, self._spawn)
            self._deliveries.redeliver(self.journal.next_seq - 1)

    # ------------------------------------------------------------------ input
    def submit(self, items: Iterable[WorkItem]) -> int:
        """Add work items not already known (pending, in flight, committed or deferred).

        Safe to call with the whole work source on every start: known IDs with the payload
        they named are skipped (compared by a digest of the payload's JSON, keys sorted).
        Returns how many were new. Each item's payload is written once, to the submissions
        store, durably before the state journal names it (by index); a crash between the two
        leaves items the next open submits (they were durable).

        The items are built with the cyclic collector paused and then frozen (see
        docs/performance.md), so no collection walks the queue again.

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
            new = self._admission.submit(items)
            if new and self._dependencies.has_after:
                # G4: a new item that names a deferred or cancelled item is deferred too
                self.defer_behind_ended({d: None for w in new for d in w.after})
            block.items = len(new)
            return len(new)

    def defer_behind_ended(self, deps: Iterable[str]) -> None:
        """Defer at once every item waiting for one of ``deps`` that ended without a commit
        (deferred or cancelled), naming it: a new item, an item an operator retried, the open's
        repair after a crash."""
        led = self.core.ledger
        for dep in deps:
            if dep in led.deferred:
                self.persist(self.core.ended_without_commit(dep))
            elif dep in led.cancelled:
                self.persist(self.core.ended_without_commit(dep, "cancelled"))

    def withdraw(self, *, keep: Collection[str] = ()) -> int:
        """Withdraw every pending item from this run but those named in ``keep``, in memory
        only: the run ends without them and puts them back at its end (they stay pending in the
        state directory, and a later run does them). Returns how many."""
        return self.core.ledger.withdraw(keep=keep)

    def withdraw_item(self, work_id: str) -> list[str]:
        """Withdraw ``work_id`` and what waits for it (see :meth:`withdraw`); returns those."""
        led = self.core.ledger
        deps = list(led.waiting_dependents(work_id))
        for w in (work_id, *deps):
            led.withdraw_item(w)
        return deps

    def put_back(self, work_id: str) -> None:
        """Put back a withdrawn item in this run's frontier."""
        self.core.ledger.put_back(work_id)

    # ------------------------------------------------------------ persist
    def persist(self, decisions: Iterable[Decision]) -> list[Decision]:
        """Persist the core's ``decisions`` before the shell acts on them (a commit journaled
        and queued for the delivery point, a requeue, a deferral, a snapshot); returns them.
        No user code runs here."""
        return self._recorder.apply(decisions)

    def notify(self, hook: Callable[[Any], None], arg: Any) -> None:
        """Queue ``hook(arg)`` for the delivery point (:meth:`deliver`)."""
        self._deliveries.notify(hook, arg)

    def wait_durable(self, seq: int) -> bool:
        """Wait until an fsync covers journal record ``seq``; False if the journal holds it in
        memory only (a disk fault)."""
        try:
            self.journal.wait_durable(seq)
            return True
        except NotDurableError:
            return False

    def _deferred(self, d: Defer) -> None:
        """The recorder journaled deferral ``d``: ``on_defer`` hears it at the delivery point."""
        if self.on_defer is not None:
            self._deliveries.notify(self.on_defer, d)

    def _spawn(self, parent: str, children: Any) -> None:
        """G1: the work items a callback returned for ``parent``'s commit, submitted durably
        before the delivery point may pass that commit; known work IDs are skipped, so a
        callback run again after a crash submits nothing twice."""
        items = spawned(parent, children)
        if items:
            self.submit(items)

    # ------------------------------------------------------------ the loop's calls
    # One call per thing that happened: each asks the core and persists what it decided, so a
    # loop built on these cannot forget a persist step (run_master is built on them).
    def next_send(self, now: float, max_items: int = 1) -> Send | None:
        """The next dispatch of up to ``max_items`` items, journaled (persist before you send),
        or None.

        Writes any snapshot the core requires first (one after a rollback). The first waits for
        this run's epoch record to be durable: a token of an epoch a crash could forget would
        be the token of another dispatch after the restart, which starts the same epoch again.
        """
        if self._epoch_seq is not None:
            self.wait_durable(self._epoch_seq)
            self._epoch_seq = None
        if self._dependencies.has_after:  # (no item names an ``after``: nothing to check)
            for wid, error in self._dependencies.too_large(max_items):
                self.persist(self.core.defer_for_dependency(wid, error))
        while True:
            d = self.core.reserve(now, max_items)
            if isinstance(d, PersistSnapshot):
                self.save_snapshot(d.reason)
                continue
            if d is not None:
                self._recorder.record_send(d)
                if self.on_dispatch is not None:
                    self._deliveries.notify(self.on_dispatch, d)
            return d

    def dependencies_of(self, send: Send) -> dict[str, dict[str, Any]] | None:
        """The committed results of the ``after`` IDs of each item of ``send`` that has any, by
        the item's work ID (None when none has: the usual WORK message)."""
        return self._dependencies.dependencies_of(send)

    def on_ready(self, rank: int, token: object, now: float) -> list[Decision]:
        """A READY from ``rank``; see :meth:`Dispatcher.on_ready`."""
        return self.persist(self.core.on_ready(rank, token, now))

    def note_host(self, rank: int, host: str) -> None:
        """Worker ``rank`` runs on ``host`` (its first READY said so): journaled once per rank
        per run (a ``host`` event, for the joblog), ``on_worker_up`` told at the delivery point.
        The record goes with the journal's next flush (not waited for): a crash before it loses
        only the name; the rank's dispatches, journaled after it, need it durable first."""
        self.core.note_host(rank, host)  # its failure domain
        if self.on_worker_up is not None:
            self._deliveries.notify(partial(self.on_worker_up, rank), host)
        if self._hosts.get(rank) == host:
            return
        self._hosts[rank] = host
        self.journal.append(encode(WorkerHost(rank, host, time.time())))

    def note_usage(self, rank: int, token: object, costs: Any, outputs: Any = None) -> None:
        """What the items of ``rank``'s current dispatch ``token`` cost (a RESULT's ``costs``,
        by work ID or as a table: :mod:`.costs`; see :mod:`durable_dispatch.mpi.usage`): held
        until each item's outcome is journaled, which then carries it (``cost``, or for a
        dispatch's commit ``costs`` or ``cost_table``); and what they wrote (``outputs``, with
        isolation): appended to the outputs journal now (:mod:`.outputs`: written in the
        background, never waited for). A RESULT that is not current is ignored, as are entries
        that are not costs or outputs (a worker's word, checked before it is kept)."""
        t = self.core.current_token(rank, token)
        if t is not None:
            self._recorder.note_usage(t, costs, outputs)

    def on_heartbeat(self, rank: int, token: object, now: float) -> list[Decision]:
        """A HEARTBEAT from ``rank``; see :meth:`Dispatcher.on_heartbeat`."""
        return self.persist(self.core.on_heartbeat(rank, token, now))

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
        journaled at once and delivered once durable (:meth:`deliver`), so the loop goes on."""
        out = self.core.on_results(rank, token, results, now, errors=errors, failure=failure)
        return self.persist(out)

    def on_part(
        self, rank: int, token: object, work_ids: Any, results: Any, now: float, *, errors: Any
    ) -> list[Decision]:
        """A partial RESULT from ``rank`` (see :meth:`Dispatcher.on_part`): the outcomes of some
        items of a dispatch that still runs. Their commits are journaled at once and delivered
        once durable, as :meth:`on_results`' are."""
        return self.persist(self.core.on_part(rank, token, work_ids, results, now, errors=errors))

    def sent(self, token: Token, now: float, error: str | None = None) -> list[Decision]:
        """The WORK send of :meth:`next_send`'s dispatch started (``error`` None) or failed."""
        if error is None:
            return self.persist(self.core.mark_dispatched(token, now))
        return self.persist(self.core.send_failed(token, now, error))

    def rank_lost(self, rank: int, now: float, error: str = "rank lost") -> list[Decision]:
        """``rank`` failed (ULFM); see :meth:`Dispatcher.rank_lost`."""
        return self.persist(self.core.rank_lost(rank, now, error))

    def ranks_lost(self, ranks: list[int], now: float, error: str = "rank lost") -> list[Decision]:
        """``ranks`` failed together (one ULFM check); see :meth:`Dispatcher.ranks_lost`."""
        return self.persist(self.core.ranks_lost(ranks, now, error))

    def on_gone(self, rank: int, error: str, now: float) -> list[Decision]:
        """``rank`` said it failed and ends (GONE): its dispatch is rolled back and the rank
        dropped, as for a lost rank (not when lost or unknown already); ``on_worker_gone``."""
        if self.on_worker_gone is not None:
            self._deliveries.notify(partial(self.on_worker_gone, rank), error)
        if self.core.rank_state(rank) in (None, RankState.LOST):
            return []
        log.error("worker %d failed and is gone: %s", rank, error)
        why = f"worker failed: {error}"[:2000]  # its own error, not its node's
        return self.persist(self.core.rank_lost(rank, now, why, domain=False))

    def now(self) -> float:
        """The master's clock: ``time.monotonic()`` as the core's observed clock counts it."""
        return self.core.clock.observe(time.monotonic())

    @property
    def done(self) -> bool:
        """True when every work item is committed or deferred and everything queued for the
        user was delivered: the loop's condition (``while not state.done``)."""
        return self.core.done and self._deliveries.idle

    def stop_reason(self, now: float, *, grace: float) -> str | None:
        """Why the campaign cannot go on although work remains, or None: ``"no workers left"``,
        or ``"every worker parked"`` (none sent its exact READY for ``grace`` seconds of
        ``now``). Logs the reason; the state directory resumes."""
        return self._stuck.reason(now, grace)

    def settle_waiting(self) -> int:
        """Once nothing else can run (nothing pending or in flight, every commit delivered, the
        work source exhausted), defer every waiting item: it waits for a work ID never
        submitted, deferred, or in a cycle (kind ``"dependency"``). Returns how many. Nothing
        while a commit or a hook waits for the delivery point (it may release them)."""
        if not self._deliveries.idle or not self.core.ledger.waiting:
            return 0
        return len(self.persist(self.core.defer_unreachable()))

    def tick(self, now: float, *, drained: bool = True) -> list[Decision]:
        """The end of a turn, the library's part: close the commits an fsync now covers (what
        they release is persisted; their callbacks wait for :meth:`deliver`), roll back every
        READY that came without a valid RESULT, and sweep the watchdog.

        ``drained``: the turn's receive found every message that had arrived (it returned
        fewer than its limit). After a pause of the master, deadlines are judged only once a
        turn drained (a paused master suspects no worker). A degraded journal is retried here
        too, with a back-off (0.5 s, doubling to 30 s).
        """
        if drained:
            self.core.clock.drained()
        if self._deliveries.pending:
            self._deliveries.settle()
        out = self._recorder.apply(self.core.join_invalid(now))  # (persisted, then the sweep)
        out += self._recorder.apply(self.core.sweep(now))
        if not self.journal.health.ok and now >= self._restore_at:
            if self.try_restore():
                self._restore_backoff = 0.5
            else:
                self._restore_at = now + self._restore_backoff
                self._restore_backoff = min(self._restore_backoff * 2, 30.0)
        self.publish_statistics()
        return out

    # ------------------------------------------------------------ the delivery point
    def deliver(self, *, wait: bool = False, turn: bool = True) -> int:
        """The delivery point: the one place where user code runs. Returns how many commits it
        handed to the callback.

        First the library's part: the commits an fsync now covers are closed in the core (a
        commit releases what waits for it) and what follows is persisted. Then, on that
        consistent state and with no structure of the library being walked, the user's part,
        in this order: the commits the last run did not deliver (after an open), each closed
        commit to ``on_commit`` (in commit order), the queued notices in the order they
        happened (``on_defer``, ``on_cancel``, ``on_dispatch``, ``on_worker_up``,
        ``on_worker_gone``), and then, while the state is open, each of :attr:`every_turn`.
        What a hook does (children, a submit, a cancel) is input to the next step; the
        delivery point passes a commit once its callback returned and its children are
        submitted.

        With ``wait=True`` it first waits for the newest journaled commit to be durable; while
        the journal is degraded, commits are delivered as memory-only commits. ``turn=False``
        leaves out :attr:`every_turn` (a delivery in the middle of a turn, before a send).
        """
        d = self._deliveries
        if d.pending:
            d.settle(wait=wait)
        n = d.run() if d.queued else 0
        if turn and self.every_turn and not self._closed:
            for hook in tuple(self.every_turn):
                hook()
        return n

    @property
    def queued(self) -> bool:
        """True when a hook waits for :meth:`deliver` (a closed commit, a notice)."""
        return self._deliveries.queued

    def redeliver(self, on_commit: OnCommit | None) -> int:
        """Make ``on_commit(work_id, result)`` the callback of every later commit, and hand it
        every commit after the delivery point again, in commit order (at least once), through
        :meth:`deliver`. :meth:`open` with ``on_commit`` queues the same redelivery for the
        first :meth:`deliver`. Returns how many results :meth:`deliver` handed over.

        A commit is redelivered when the master crashed after it was durable but before its
        callback returned, or when the callback raised: make the callback idempotent by work ID
        (an upsert keyed by work ID; see ``docs/state-format.md``).

        Raises:
            UsageError: the callback returned something else than None or work items.
        """
        self._deliveries.set_callback(on_commit, self._spawn)
        self._deliveries.redeliver(self.journal.next_seq - 1)
        return self.deliver()

    def committing(self) -> set[str]:
        """The work IDs whose commit is journaled and not yet closed in the core (its fsync
        runs): committed as a replay of the journal counts them."""
        return self._deliveries.committing()

    @property
    def delivered_seq(self) -> int:
        """The delivery point, a journal sequence number; every commit journaled up to it was
        handed to the callback, which returned."""
        return self._deliveries.delivered_seq

    @property
    def commit_durable(self) -> bool:
        """True while the commit callback runs on a commit an fsync covers, False while it runs
        on a memory-only commit (the journal is degraded)."""
        return self._deliveries.commit_durable

    def publish_statistics(self, *, running: bool = True, force: bool = False) -> bool:
        """Write the statistics for readers (``durable-dispatch stats`` and ``watch``), at most
        every :data:`~.publication.STATS_SECONDS` unless ``force``, off the master's thread
        (:class:`~.publication.Publisher`). True when written or handed over."""
        return self._publication.publish(running=running, force=force)

    def save_snapshot(self, reason: str = "") -> bool:
        """Write the campaign's state atomically as a snapshot (``reason`` is logged if it
        fails); tells the core it is persisted. False if the disk refused (the state stays in
        memory and in the journal; the campaign goes on)."""
        return self._checkpoints.save(reason)

    def try_restore(self) -> bool:
        """Try to make memory-only records durable again (submissions store, journal, defer
        journal)."""
        if self.submissions.try_restore():
            self.submissions.sync_now()
        ok = self.journal.try_restore()
        if ok:
            self.journal.sync_now()
            durable = self.journal.durable_seq
            self._deliveries.forget_in_memory(durable)
            self._dependencies.forget_durable(durable)
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
            commits_in_memory=self._deliveries.in_memory,
            snapshot_failures=self._checkpoints.failures,
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
        """Deliver what is left, save a final snapshot, close the journals and release the
        master lock."""
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
        self._recorder.close()  # (never raises: the outputs are diagnostics)
        if self._dir_sync is not None:  # (its thread ends before the journals close)
            waited = self._dir_sync.wait()  # an interrupt: raised once all is closed
            self._dir_sync = None
        if not _fs.reaches(self._filesystem) and not _fs.comes_back(self._filesystem):
            # Opened on a fake filesystem that is gone: touch nothing (the journals abandon
            # themselves; a snapshot or a lock release would reach the real filesystem).
            log.warning("state %s: its filesystem is gone; closed without writing", self.directory)
            self._publication.close()
            for j in (self.journal, self.submissions, self.defer):
                j.close()
            _resources.disown_lock(self._lock)
            return
        failed: list[BaseException] = [waited] if waited is not None else []
        try:
            failed += close_writing(
                self._last_deliveries,
                self._publication,
                self._checkpoints,
                self._lock.claim,
                self.journal,
                (self.submissions, self.defer),
            )
        finally:
            self._lock.release()
            if failed:
                raise closing_error(failed)

    def _last_deliveries(self) -> None:
        """The close's deliveries: everything journaled, once durable, and the delivery point."""
        self.deliver(wait=True)
        self._deliveries.mark(now=True)

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
