"""A campaign state's open and close: :meth:`CampaignState.open
<durable_dispatch.campaign.state.CampaignState.open>` and :meth:`CampaignState.close
<durable_dispatch.campaign.state.CampaignState.close>` do their work here (the state
directory's lock, the snapshot's load and the journals' replay, the new epoch, the rollbacks
and the commands that wait; at the close the last deliveries, the snapshot, the journals and
the lock). See :mod:`durable_dispatch.campaign.state` for the theory of operation.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from ..core import Dispatcher, RetryPolicy, WatchdogConfig
from ..core.events import EpochStarted, encode
from ..core.ledger import Ledger
from ..errors import NotDurableError, StorageDegradedError
from ..storage import DeferJournal, Journal
from ..storage import fs as _fs
from ..storage import resources as _resources
from ..storage.background import Beside as _Beside
from ..storage.defer import DEFAULT_DEFER_NAME
from .admin import (
    _reconcile_store,
)
from .delivery import OnCommit
from .replay import (
    _holders,
    _load_snapshot,
    _open_and_fold,
    paused_gc,
    release_frozen,
)
from .statedir import (
    STATE_JOURNAL,
    _take_master_lock,
)

__all__ = ["open_state", "close_state"]

log = logging.getLogger("durable_dispatch.state")


def open_state(
    cls: Any,
    directory: str | os.PathLike[str],
    *,
    sync: str,
    watchdog: WatchdogConfig | None,
    retry: RetryPolicy | None,
    ranks: Iterable[int],
    starting: bool,
    on_commit: OnCommit | None,
    keep_snapshots: int,
    journal_options: Mapping[str, Any] | None,
) -> Any:
    """:meth:`CampaignState.open <durable_dispatch.campaign.state.CampaignState.open>`'s work
    (see its docs)."""
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
        _resolve_stale_deferrals(defer, core.ledger)
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
    led = core.ledger
    st._defer_behind_ended([w for w in (*led.deferred, *led.cancelled) if led.dependents.get(w)])
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


def close_state(st: Any) -> None:
    """:meth:`CampaignState.close <durable_dispatch.campaign.state.CampaignState.close>`'s work:
    the last deliveries, the snapshot, the journals, the lock."""
    waited: BaseException | None = None
    if st._outputs is not None:  # (never raises: the outputs are diagnostics, see outputs.py)
        st._outputs.close()
        st._outputs = None
    if st._dir_sync is not None:  # (its thread ends before the journals close)
        waited = st._dir_sync.wait()  # an interrupt: raised once all is closed
        st._dir_sync = None
    if not _fs.reaches(st._filesystem) and not _fs.comes_back(st._filesystem):
        # Opened on a fake filesystem that is gone: touch nothing (the journals abandon
        # themselves; a snapshot or a lock release would reach the real filesystem).
        log.warning("state %s: its filesystem is gone; closed without writing", st.directory)
        st._publisher.close()
        st.journal.close()
        st.submissions.close()
        st.defer.close()
        _resources.disown_lock(st._lock)
        return
    failed: list[BaseException] = [waited] if waited is not None else []
    beside: _Beside[list[BaseException]] | None = None
    try:
        try:
            st._complete_commits(wait=True)
            st._mark_delivered(now=True)
            # issue 49: the last statistics are written by their thread while the snapshot
            # is written and fsynced here (a display: no order between the two); again
            # here, after that thread ended, if the snapshot failed (a figure changed)
            failures = st._snapshot_failures
            handed = st._publisher.submit(st._statistics_body(running=False))
            # and the owner record's release is written and fsynced beside it too (it is
            # renamed into place only once the journals are closed, S13)
            prepare = _Beside(st._lock.claim.prepare_release, "owner-release")
            # and the submissions store and the defer journal close beside it: nothing
            # writes them after the last delivery (which submitted its children)
            beside = _Beside(lambda: _close_each((st.submissions, st.defer)), "close-journals")
            try:
                st._save_snapshot("close")
            finally:
                interrupted = prepare.wait()
            if interrupted is not None:
                raise interrupted
            if handed and st._snapshot_failures == failures:
                st._publisher.close()
            else:
                st.publish_statistics(running=False, force=True)
        finally:
            # whatever failed above: each journal is closed, no writer lock is left held
            if beside is None:
                failed += _close_each((st.journal, st.submissions, st.defer))
            else:
                failed += _close_each((st.journal,))
                interrupted = beside.wait()  # (S13: the owner's release only after them)
                if interrupted is not None:
                    failed.insert(0, interrupted)
                failed += beside.value or []
    finally:
        st._lock.release()
        if failed:
            raise _closing_error(failed)


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
