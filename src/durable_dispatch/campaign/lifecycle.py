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
    parts = {
        "lock": lock,
        "journal": journal,
        "submissions": store,
        "stored": covered,
        "snapshots": snapshots,
        "defer": defer,
        "core": core,
        "replayed": n,
        "duplicates": proj.duplicate_commits,
        "delivered": max(delivered, proj.delivered),
        "dir_sync": dir_sync,
    }
    return Opened(d, parts, list(restarts), opening)


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


def _done(beside: _Beside[bool]) -> bool:
    """Wait for ``beside`` (an interrupt of the wait is raised); True if it returned True."""
    interrupted = beside.wait()
    if interrupted is not None:
        raise interrupted
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
