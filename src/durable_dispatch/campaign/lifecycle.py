"""A campaign state's parts opened from a state directory: the directory's lock, the snapshot's
load and the journals' replay, the core restored with the rollbacks the last run left, the defer
journal repaired (:func:`open_parts`); and the helpers of the close (:func:`close_each`,
:func:`closing_error`). :meth:`CampaignState.open
<durable_dispatch.campaign.state.CampaignState.open>` composes the facade from what
:func:`open_parts` returns. See :mod:`durable_dispatch.campaign.state` for the theory of operation.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..core import Decision, Dispatcher, RetryPolicy, WatchdogConfig
from ..core.ledger import Ledger
from ..errors import NotDurableError, StorageDegradedError
from ..storage import DeferJournal, Journal
from ..storage import fs as _fs
from ..storage.background import Beside as _Beside
from ..storage.defer import DEFAULT_DEFER_NAME
from .admin import (
    _reconcile_store,
)
from .checkpoint import Checkpoints
from .publication import Publisher
from .recorder import record_deferral
from .replay import (
    _holders,
    _load_snapshot,
    _open_and_fold,
    paused_gc,
    release_frozen,
)
from .statedir import (
    STATE_JOURNAL,
    SUBMISSIONS,
    _take_master_lock,
)

__all__ = ["Opened", "open_parts", "adopt_frozen", "close_each", "closing_error"]

log = logging.getLogger("durable_dispatch.state")


@dataclass
class Opened:
    """What :func:`open_parts` opened: the facade's constructor arguments (``parts``: the
    directory fsync running beside too), the rollbacks to persist before the first dispatch,
    and the object that holds what the open froze until the state does (:func:`adopt_frozen`)."""

    directory: str
    parts: dict[str, Any]
    restarts: list[Decision]
    holder: object


def open_parts(
    directory: str | os.PathLike[str],
    *,
    sync: str,
    watchdog: WatchdogConfig | None,
    retry: RetryPolicy | None,
    ranks: Iterable[int],
    starting: bool,
    keep_snapshots: int,
    journal_options: Mapping[str, Any] | None,
) -> Opened:
    """Open the state directory's parts for :meth:`CampaignState.open
    <durable_dispatch.campaign.state.CampaignState.open>` (see its docs); on an error nothing is
    left open or locked."""
    o = _Opening(os.fspath(directory))
    try:
        o.lock_the_directory()
        o.fsync_the_earlier_runs_journals_beside()
        o.start_a_new_defer_journal_beside()
        o.load_the_snapshot(keep_snapshots)
        o.fold_the_journals(sync, journal_options)
        o.open_the_defer_journal()
        o.share_one_directory_fsync()
        restarts = o.restore_the_core(watchdog, retry, ranks, starting)
        o.repair_the_defer_journal()
        o.wait_for_the_earlier_runs_fsyncs()
    except BaseException:
        o.undo()
        raise
    return Opened(o.d, o.parts(), restarts, o.holder)


class _Opening:
    """:func:`open_parts`' steps, in order, and what each opened (undone whole on an error)."""

    def __init__(self, d: str) -> None:
        self.d = d
        self.holder = object()  # holds what the reopen's bulk build freezes until the state does
        self.lock: Any = None
        self.journal: Journal | None = None
        self.store: Journal | None = None
        self.defer: DeferJournal | None = None
        self.defer_opening: _Beside[DeferJournal] | None = None
        self.dir_sync: _Beside[bool] | None = None
        self.earlier: dict[str, _Beside[None]] = {}

    def lock_the_directory(self) -> None:
        """The master lock (S5, S13). A new directory is durable in its parent before anything
        is made in it (its fsync ran beside the lock and the claim): a failed open leaves no
        journal in a directory a crash could lose, and the next open fsyncs it again."""
        self.lock = _take_master_lock(self.d, create=True)
        self.lock.parent_synced()

    def fsync_the_earlier_runs_journals_beside(self) -> None:
        """What an earlier run left unsynced in the journals is made durable before the open
        counts it durable: each journal's open fsynced its file in turn (on a shared
        filesystem three fsyncs in a row on a resume). With the lock held nobody else writes
        them: the three run side by side from here, and each journal's open waits for its own
        (``earlier_synced``; it fsyncs itself a file it cut)."""
        names = self.lock.claim.listing
        if names is None:
            return
        for name in (SUBMISSIONS, STATE_JOURNAL, DEFAULT_DEFER_NAME):
            if name in names:
                path = os.path.abspath(os.path.join(self.d, name))
                self.earlier[path] = _Beside(partial(_fs.fsync_path, path), "fsync-journal")

    def _earlier_synced(self, path: str) -> bool:
        """``Journal.open(earlier_synced=...)``: True once ``path``'s fsync beside ended (its
        error raised), False if none runs."""
        return _done(self.earlier[path], raises=True) if path in self.earlier else False

    def wait_for_the_earlier_runs_fsyncs(self) -> None:
        """Each journal waited for its own; a file no journal opened, or one an open cut and
        fsynced itself, may still be running: the open ends after them."""
        for sync in self.earlier.values():
            interrupted = sync.wait()
            if interrupted is not None:
                raise interrupted

    def _open_defer(self) -> DeferJournal:
        return DeferJournal.open(
            self.d,
            dir_sync=False,
            directory_claim=self.lock.claim,
            earlier_synced=self._earlier_synced,
        )

    def start_a_new_defer_journal_beside(self) -> None:
        """A defer journal this open creates (on a shared filesystem: a lookup, a create, a
        header's write, about 10 ms) is created beside the snapshot's load and the state
        journal's open (issue 49). One that exists opens after them: a refused open (a damaged
        state journal) must leave it as it was, torn tail and all (S9)."""
        names = self.lock.claim.listing
        if names is not None and DEFAULT_DEFER_NAME not in names:
            self.defer_opening = _Beside(self._open_defer, "open-defer-journal")

    def load_the_snapshot(self, keep: int) -> None:
        """The newest valid snapshot (or none)."""
        self.snapshots, snap = _load_snapshot(self.d, keep, self.lock.claim)
        self.base: dict[str, Any] = snap.value if snap is not None else {}

    def fold_the_journals(self, sync: str, journal_options: Mapping[str, Any] | None) -> None:
        """The state journal and the submissions store, replayed onto the snapshot. The
        journals this open creates share one directory fsync (:meth:`share_one_directory_fsync`)
        and take no lock file each: the directory's lock and claim are held (S5, S13)."""
        with paused_gc(self.holder) as block:
            kw = {"dir_sync": False, **dict(journal_options or {})}
            kw["directory_claim"] = self.lock.claim
            kw["earlier_synced"] = self._earlier_synced
            self.journal, self.store, self.proj, self.replayed, stored = _open_and_fold(
                os.path.join(self.d, STATE_JOURNAL), self.base, sync=sync, **kw
            )
            block.items = len(self.proj.items)
        self.covered = _reconcile_store(self.journal, self.store, self.proj, stored)

    def open_the_defer_journal(self) -> None:
        op = self.defer_opening
        self.defer = op.result() if op is not None else self._open_defer()

    def share_one_directory_fsync(self) -> None:
        """One directory fsync for the journals the open created, beside the rest of the open
        and the first submission (issue 49). Each reports nothing durable before it: a
        journal's first fsync waits for it (or, if it failed, fsyncs the directory itself,
        S1)."""
        assert self.journal is not None and self.store is not None and self.defer is not None
        created = [j for j in (self.journal, self.store, self.defer.journal) if j.recovery.created]
        if created:
            where = os.path.abspath(self.d)  # (the caller may chdir meanwhile)
            self.dir_sync = _Beside(partial(_fsync_created, where), "fsync-state-dir")
            for j in created:
                j.directory_sync_beside(partial(_done, self.dir_sync))

    def restore_the_core(
        self,
        watchdog: WatchdogConfig | None,
        retry: RetryPolicy | None,
        ranks: Iterable[int],
        starting: bool,
    ) -> list[Decision]:
        """The core of a new epoch, and the rollbacks of what the last run left in flight."""
        self.core, restarts = Dispatcher.restore(
            self.proj,
            epoch=self.proj.epoch + 1,
            watchdog=watchdog,
            retry=retry,
            ranks=ranks,
            starting=starting,
        )
        return list(restarts)

    def repair_the_defer_journal(self) -> None:
        """What a run that ended while the disk refused left the defer journal without."""
        assert self.defer is not None
        _record_lost_deferrals(self.defer, self.core.ledger)
        _resolve_stale_deferrals(self.defer, self.core.ledger)

    def parts(self) -> dict[str, Any]:
        """The facade's constructor arguments. A snapshot of an earlier version has no delivery
        point: what it folded counts as delivered (its callback ran before that version's
        snapshot), the journal after it not."""
        delivered = int(self.base.get("delivered_seq", self.base.get("journal_seq", -1)))
        return {
            "lock": self.lock,
            "journal": self.journal,
            "submissions": self.store,
            "stored": self.covered,
            "snapshots": self.snapshots,
            "defer": self.defer,
            "core": self.core,
            "replayed": self.replayed,
            "duplicates": self.proj.duplicate_commits,
            "delivered": max(delivered, self.proj.delivered),
            "dir_sync": self.dir_sync,
        }

    def undo(self) -> None:
        """An error: close what was opened (each writer lock too: a later open must not find
        it held) and release the directory's lock."""
        release_frozen(self.holder)
        if self.dir_sync is not None:
            self.dir_sync.wait()
        for sync in self.earlier.values():
            sync.wait()
        op = self.defer_opening
        if self.defer is None and op is not None:
            # it may have opened while the state journal failed: closed below
            op.wait()
            self.defer = op.value
            if op.error is not None:
                log.warning("state %s: the defer journal did not open either: %s", self.d, op.error)
        for opened in (self.journal, self.store, self.defer):
            if opened is not None:
                opened.close()
        if self.lock is not None:
            self.lock.release()


def adopt_frozen(holder: object, state: object) -> None:
    """What the open's bulk build froze under ``holder`` is held by ``state`` from now on (it
    is released when the state closes)."""
    if id(holder) in _holders:
        _holders.discard(id(holder))
        _holders.add(id(state))


def close_writing(
    last: Callable[[], object],
    publication: Publisher,
    checkpoints: Checkpoints,
    claim: Any,
    journal: Journal,
    others: tuple[Journal | DeferJournal, ...],
) -> list[BaseException]:
    """A campaign state's close on a filesystem that answers: its ``last`` deliveries, then the
    snapshot, with the statistics, the owner record's release (``claim``) and the ``others``
    journals closing beside it, then the state ``journal``; returns what closing the
    journals raised. Every journal is closed whatever fails (the deliveries included)."""
    failed: list[BaseException] = []
    beside: _Beside[list[BaseException]] | None = None
    try:
        last()
        # issue 49: the last statistics are written by their thread while the snapshot is
        # written and fsynced here (a display: no order between the two); again here,
        # after that thread ended, if the snapshot failed (a figure changed)
        failures = checkpoints.failures
        handed = publication.hand_over(running=False)
        # and the owner record's release is written and fsynced beside it too (it is
        # renamed into place only once the journals are closed, S13)
        prepare = _Beside(claim.prepare_release, "owner-release")
        # and the submissions store and the defer journal close beside it: nothing writes
        # them after the last delivery (which submitted its children)
        beside = _Beside(lambda: close_each(others), "close-journals")
        try:
            checkpoints.save("close")
        finally:
            interrupted = prepare.wait()
        if interrupted is not None:
            raise interrupted
        if handed and checkpoints.failures == failures:
            publication.close()
        else:
            publication.publish(running=False, force=True)
    finally:
        # whatever failed above: each journal is closed, no writer lock is left held
        if beside is None:
            failed += close_each((journal, *others))
        else:
            failed += close_each((journal,))
            interrupted = beside.wait()  # (S13: the owner's release only after them)
            if interrupted is not None:
                failed.insert(0, interrupted)
            failed += beside.value or []
    return failed


def close_each(journals: Iterable[Journal | DeferJournal]) -> list[BaseException]:
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


def _done(beside: _Beside[Any], *, raises: bool = False) -> bool:
    """Wait for ``beside`` (an interrupt of the wait is raised); True if it returned True (with
    ``raises``: if it returned at all; what it raised is raised)."""
    interrupted = beside.wait()
    if interrupted is not None:
        raise interrupted
    if raises:
        if beside.error is not None:
            raise beside.error
        return True
    return beside.error is None and bool(beside.value)


def closing_error(failed: list[BaseException]) -> BaseException:
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


def _record_lost_deferrals(defer: DeferJournal, ledger: Ledger) -> int:
    """Record again each item the state journal says is deferred but the defer journal lacks:
    its record was held in memory when the last master ended (a full disk, EIO) and the state
    journal's ``deferred`` event was durable. Without it ``deferred list`` would not show the
    item and the futures executor would wait for it forever. Returns how many."""
    if not ledger.deferred:
        return 0
    lost = [(wid, w) for wid, w in ledger.deferred.items() if wid not in defer]
    for wid, w in lost:
        record_deferral(
            defer,
            w,
            attempts=ledger.attempts.get(wid, 0),
            kinds=ledger.kinds.get(wid, ()),
            last_error=ledger.last_error.get(wid),
        )
    if lost:
        log.warning("recorded %d deferred item(s) the defer journal had lost", len(lost))
    return len(lost)


def _resolve_stale_deferrals(defer: DeferJournal, ledger: Ledger) -> int:
    """Resolve each defer-journal record whose item the state journal says is no longer
    deferred: a dependency's commit released it (or a retry put it back) and the last master
    ended before it resolved the record. Without it ``deferred list`` would show as deferred
    an item that ``stats`` counts pending. Returns how many."""
    stale = [d.work_id for d in defer.items() if d.work_id not in ledger.deferred]
    for wid in stale:
        how = "cancelled" if wid in ledger.cancelled else "requeued"
        try:
            defer.resolve(wid, how)
        except StorageDegradedError:
            log.warning("defer journal: %s is not deferred, its record not resolved", wid)
    if stale:
        log.warning("resolved %d defer record(s) of items no longer deferred", len(stale))
    return len(stale)
