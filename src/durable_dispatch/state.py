"""Durable campaign state: snapshot + journal replay, crash-safe rollback, master restart.

Theory of operation. A state directory holds a :class:`~durable_dispatch.storage.SnapshotStore`
(``campaign.<generation>.snap``), the state journal ``events.jsonl``, the defer journal
``.dispatch_protocol_deferred.jsonl`` and the master lock ``master.lock``. The campaign's
durable state is a *projection*: frontier order, in-flight dispatches, committed work IDs,
deferred items and retry counts, exactly the dict :meth:`Dispatcher.snapshot` returns. Every
decision of the core that changes it is journaled as a small event (``submitted``,
``dispatched``, ``committed``, ``requeued``, ``deferred``, ``epoch``) *before* the shell acts on
it; a snapshot folds the projection up to a journal sequence number. Loading = newest valid
snapshot + replay of the journal records after it.

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
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import filelock
import orjson

from .core import (
    Commit,
    Decision,
    Defer,
    Dispatcher,
    PersistSnapshot,
    Requeue,
    RetryPolicy,
    Send,
    WatchdogConfig,
    WorkItem,
)
from .core.tokens import Token
from .errors import (
    JournalCorruptError,
    LockHeldError,
    NotDurableError,
    RecordTooLargeError,
    StorageDegradedError,
    StorageError,
)
from .logs import log_decisions
from .schema import Invalid, check_event, check_state_snapshot
from .storage import DeferJournal, Journal, SnapshotStore
from .storage import fs as _fs
from .storage import resources as _resources
from .storage.format import Header, RawBatch, new_salt
from .storage.snapshot import Snapshot

__all__ = [
    "CampaignState",
    "CampaignStats",
    "Projection",
    "StateView",
    "CompactReport",
    "replay",
    "event_work_ids",
    "view_state",
    "is_state_dir",
    "compact_state",
    "requeue_deferred",
    "drop_deferred",
    "STATE_JOURNAL",
    "SNAPSHOT_NAME",
    "LOCK_NAME",
]

log = logging.getLogger("durable_dispatch.state")

STATE_JOURNAL = "events.jsonl"
SNAPSHOT_NAME = "campaign"
LOCK_NAME = "master.lock"
_SUBMIT_CHUNK = 512
#: A ``delivered`` event records the delivery point between snapshots once it is this old or
#: this many records behind: after a crash at most about that much is delivered again.
DELIVERY_MARK_SECONDS = 0.25
DELIVERY_MARK_RECORDS = 256
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
        journal_health, snapshot_health, defer_health: storage health as dicts.
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

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in vars(self).items()}


class CampaignState:
    """A campaign's durable state in one directory, driving a :class:`Dispatcher`.

    Open with :meth:`open`; use as a context manager or call :meth:`close`.
    """

    def __init__(self, directory: str, **kw: Any) -> None:
        self.directory = directory
        self._lock = kw["lock"]
        self.journal: Journal = kw["journal"]
        self.snapshots: SnapshotStore = kw["snapshots"]
        self.defer: DeferJournal = kw["defer"]
        self.core: Dispatcher = kw["core"]
        self._replayed: int = kw["replayed"]
        self._dups: int = kw["dups"]
        self._commits_in_memory: list[int] = []
        # (journal seq, token, its Commits in that record, callback): one entry per record; the
        # records of one dispatch are next to each other (several only when one would be too big)
        self._pending_commits: list[
            tuple[int, Token, list[Commit], Callable[[Commit], None] | None]
        ] = []
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

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        sync: str = "batch",
        watchdog: WatchdogConfig | None = None,
        retry: RetryPolicy | None = None,
        ranks: Iterable[int] = (),
        keep_snapshots: int = 3,
        journal_options: Mapping[str, Any] | None = None,
    ) -> CampaignState:
        """Open (creating if needed) a state directory and start a new master epoch.

        In-flight dispatches from a previous run are rolled back to the front of the frontier
        without charging a retry, and a snapshot is written before anything is dispatched.

        Raises:
            LockHeldError: another master holds the directory.
            StorageError: the directory or its lock cannot be created or opened (a read-only or
                full filesystem, a link at the lock's path): nothing was read or changed (S9).
            JournalCorruptError, SnapshotCorruptError, StorageError: see the storage layer.
        """
        d = os.fspath(directory)
        lock = _take_master_lock(d, create=True)
        journal: Journal | None = None
        defer: DeferJournal | None = None
        try:
            snapshots, snap = _load_snapshot(d, keep_snapshots)
            base = snap.value if snap is not None else {}
            journal, proj, n = _open_and_fold(
                os.path.join(d, STATE_JOURNAL), base, sync=sync, **dict(journal_options or {})
            )
            defer = DeferJournal.open(d)
            epoch = proj.epoch + 1
            core, restarts = Dispatcher.restore(
                proj.to_snapshot(), epoch=epoch, watchdog=watchdog, retry=retry, ranks=ranks
            )
        except BaseException:
            for opened in (journal, defer):
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
            snapshots=snapshots,
            defer=defer,
            core=core,
            replayed=n,
            dups=proj.duplicate_commits,
            delivered=max(delivered, proj.delivered),
        )
        r = journal.append({"event": "epoch", "epoch": epoch, "ts": time.time()})
        st._durable(r.seq)
        st.apply(restarts)
        st.save_snapshot(f"start of epoch {epoch}")
        _resources.register(st)
        return st

    # ------------------------------------------------------------------ input
    def submit(self, items: Iterable[WorkItem]) -> int:
        """Add work items not already known (pending, in flight, committed or deferred).

        Safe to call with the whole work source on every start: known IDs are skipped.
        Returns how many were new.
        """
        new: list[WorkItem] = []
        seen: set[str] = set()
        for i in items:
            if self.core.status(i.work_id) is None and i.work_id not in seen:
                new.append(i)
                seen.add(i.work_id)
        for k in range(0, len(new), _SUBMIT_CHUNK):
            chunk = new[k : k + _SUBMIT_CHUNK]
            self.journal.append({"event": "submitted", "items": [i.to_json() for i in chunk]})
        return self.core.submit(new)

    def next_send(self, now: float, max_items: int = 1) -> Send | None:
        """The next dispatch of up to ``max_items`` items, journaled (persist before you send),
        or None.

        Writes any snapshot the core requires first (S8).
        """
        while True:
            d = self.core.reserve(now, max_items)
            if isinstance(d, PersistSnapshot):
                self.save_snapshot(d.reason)
                continue
            if d is not None:
                self.record_send(d)
            return d

    # ---------------------------------------------------------------- actions
    def record_send(self, send: Send) -> None:
        """Journal a dispatch before its WORK is sent (persist before you send): one record for
        all its items."""
        ev: dict[str, Any] = {"event": "dispatched", "token": str(send.token), "rank": send.rank}
        if len(send.items) == 1:
            ev["work_id"] = send.items[0].work_id
        else:
            ev["work_ids"] = [w.work_id for w in send.items]
        self.journal.append(ev)

    def apply(
        self,
        decisions: Iterable[Decision],
        on_commit: Callable[[Commit], None] | None = None,
        *,
        wait: bool = True,
    ) -> list[Decision]:
        """Persist each decision that changes durable state, in order; returns them all.

        * :class:`Commit`: journal it (the Commits of one dispatch, which the core returns next to
          each other, as one record). Once an fsync covers it (``wait=True``: now; ``wait=False``:
          whenever :meth:`complete_commits` finds it durable, so the master keeps dispatching while
          the group commit runs) ``on_commit`` is called and the core closes it.
        * :class:`Requeue` / :class:`Defer`: journal it; a Defer is appended to the defer journal
          and its outcome (on disk or in memory) reported to the core.
        * :class:`PersistSnapshot`: write the snapshot now.
        """
        out = list(decisions)
        if not out:
            return out
        group: list[Commit] = []
        refused: list[Decision] = []
        for i, d in enumerate(out):
            if isinstance(d, Commit):
                group.append(d)
                nxt = out[i + 1] if i + 1 < len(out) else None
                if not isinstance(nxt, Commit) or nxt.token != d.token:
                    refused += self._journal_commits(group, on_commit)
                    group = []
            elif isinstance(d, Requeue):
                ev = {
                    "event": "requeued",
                    "token": str(d.token),
                    "work_id": d.work_id,
                    "source": d.source,
                    "kind": d.kind,
                    "attempts": d.attempts,
                    "error": d.error,
                }
                if d.split:
                    ev["split"] = True
                self.journal.append(ev)
            elif isinstance(d, Defer):
                w = d.work
                self.journal.append(
                    {
                        "event": "deferred",
                        "token": str(d.token),
                        "work_id": w.work_id,
                        "source": d.source,
                        "attempts": d.attempts,
                        "kinds": list(d.kinds),
                        "last_error": d.last_error,
                    }
                )
                try:
                    rec = self.defer.defer(
                        w.work_id,
                        w.to_json(),
                        attempts=d.attempts,
                        kinds=d.kinds,
                        last_error=d.last_error,
                        inputs=w.inputs,
                        self_contained=w.self_contained,
                    )
                    persisted = rec.persisted
                except StorageDegradedError:
                    persisted = False
                self.core.defer_recorded(w.work_id, persisted)
            elif isinstance(d, PersistSnapshot):
                self.save_snapshot(d.reason)
        log_decisions(out)
        if refused:
            out += self.apply(refused)
        if self._pending_commits:
            # Wait only for commits this call journaled; earlier ones complete when durable.
            self.complete_commits(wait=wait and any(isinstance(d, Commit) for d in out))
        return out

    def _journal_commits(
        self, commits: list[Commit], on_commit: Callable[[Commit], None] | None
    ) -> list[Decision]:
        """One ``committed`` record for the Commits of one dispatch, or several when one would
        exceed the journal's record bound. A single result too large for any record is refused:
        the core retries that item (returns its decisions)."""
        first = commits[0]
        ev: dict[str, Any] = {
            "event": "committed",
            "token": str(first.token),
            "rank": first.rank,
            "ts": time.time(),
        }
        if len(commits) == 1:
            ev["work_id"], ev["result"] = first.work_id, first.result
        else:
            ev["work_ids"] = [c.work_id for c in commits]
            ev["results"] = [c.result for c in commits]
        try:
            r = self.journal.append(ev)
        except RecordTooLargeError as e:
            if len(commits) > 1:
                half = len(commits) // 2
                return self._journal_commits(commits[:half], on_commit) + self._journal_commits(
                    commits[half:], on_commit
                )
            log.error("result of %s cannot be journaled: %s", first.work_id, e)
            return self.core.commit_refused(first.token, first.work_id, f"result too large: {e}")
        self._pending_commits.append((r.seq, first.token, commits, on_commit))
        return []

    def complete_commits(self, *, wait: bool = False) -> int:
        """Deliver every journaled commit an fsync now covers: callback, then close in the core.

        With ``wait=True`` it first waits for the newest pending commit to be durable. While the
        journal is degraded, pending commits are delivered as memory-only commits (counted in
        ``statistics().commits_in_memory``) so the campaign goes on. Returns how many work
        items were committed.
        """
        pending = self._pending_commits
        if not pending:
            return 0
        if wait:
            self._durable(pending[-1][0])
        degraded = not self.journal.health.ok
        durable = self.journal.durable_seq
        n = items = 0
        try:
            while n < len(pending) and (degraded or pending[n][0] <= durable):
                seq, token, commits, cb = pending[n]
                if seq > durable:
                    self._commits_in_memory.extend([seq] * len(commits))
                if cb is not None and not self._callback_failed:
                    try:
                        for c in commits:
                            cb(c)
                    except BaseException:
                        # U6: this record and every later one are delivered again on the next
                        # open; from now on nothing is handed to the callback (it failed).
                        self._callback_failed = True
                        raise
                if not self._callback_failed:
                    self._delivered = max(self._delivered, seq)
                if n + 1 == len(pending) or pending[n + 1][1] != token:
                    follow = self.core.commit_done(token)  # the dispatch's last record is in
                    if follow:
                        self.apply(follow)
                n += 1
                items += len(commits)
        finally:
            del pending[:n]
        self._mark_delivered()
        return items

    def _mark_delivered(self, *, now: bool = False) -> None:
        """Journal the delivery point if it moved and the last mark is old enough (or ``now``)."""
        if self._delivered <= self._delivered_marked:
            return
        t = time.monotonic()
        behind = self._delivered - self._delivered_marked
        if (
            now
            or t - self._delivered_at >= DELIVERY_MARK_SECONDS
            or behind >= DELIVERY_MARK_RECORDS
        ):
            self.journal.append({"event": "delivered", "upto": self._delivered})
            self._delivered_marked, self._delivered_at = self._delivered, t

    @property
    def delivered_seq(self) -> int:
        """The delivery point (U6): every commit journaled up to this sequence number was handed
        to the callback, which returned."""
        return self._delivered

    def redeliver(self, on_commit: Callable[[str, Any], None] | None) -> int:
        """Hand every commit after the delivery point to ``on_commit(work_id, result)`` again,
        in commit order (U6: at least once); call it after :meth:`open`, before dispatching.
        ``run_master`` does. Returns how many results it delivered.

        A commit is redelivered when the master crashed after it was durable but before its
        callback returned, or when the callback raised. The callback must be idempotent by work
        ID (an upsert keyed by work ID); see ``docs/state-format.md``.
        """
        from .results import read_results

        n = 0
        upto = self.journal.next_seq - 1
        for r in read_results(self.directory, after_seq=self._delivered):
            if r.seq > upto:
                break
            if on_commit is not None:
                on_commit(r.work_id, r.result)
            self._delivered = max(self._delivered, r.seq)
            n += 1
        if n:
            log.warning("redelivered %d committed result(s) to the callback (U6)", n)
        self._delivered = max(self._delivered, upto)  # nothing after it is a commit yet
        self._mark_delivered(now=True)
        return n

    def _durable(self, seq: int) -> bool:
        try:
            self.journal.wait_durable(seq)
            return True
        except NotDurableError:
            return False

    def save_snapshot(self, reason: str = "") -> bool:
        """Write the projection atomically; tells the core it is persisted. False if the disk
        refused (the state stays in memory and in the journal; the campaign goes on)."""
        seq = self.journal.next_seq - 1
        body = {
            "journal_seq": seq,
            "delivered_seq": self._delivered,
            "state": self._projection(),
            "stats": self.statistics().as_dict(),
        }
        ok = True
        try:
            if seq >= 0:
                self._durable(seq)
            self.snapshots.save(body)
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
        state = self.core.snapshot()
        if self._pending_commits:
            done = {c.work_id for _, _, commits, _ in self._pending_commits for c in commits}
            state["in_flight"] = [t for t in state["in_flight"] if t["work"]["work_id"] not in done]
            state["committed"] = sorted(done.union(state["committed"]))
            state["solo"] = [w for w in state["solo"] if w not in done]
        return state

    def try_restore(self) -> bool:
        """Try to make memory-only records durable again (journal, defer journal)."""
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
        )

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Save a final snapshot, close the journals and release the master lock."""
        if self._closed:
            return
        self._closed = True
        _resources.unregister(self)
        if not _fs.reaches(self._filesystem) and not _fs.comes_back(self._filesystem):
            # Opened on a fake filesystem that is gone: touch nothing (the journals abandon
            # themselves; a snapshot or a lock release would reach the real filesystem).
            log.warning("state %s: its filesystem is gone; closed without writing", self.directory)
            self.journal.close()
            self.defer.close()
            _resources.disown_lock(self._lock)
            return
        try:
            try:
                self.complete_commits(wait=True)
                self._mark_delivered(now=True)
                self.save_snapshot("close")
            finally:
                self.journal.close()  # whatever failed above: no writer lock is left held
        finally:
            try:
                self.defer.close()
            finally:
                self._lock.release()

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


# --------------------------------------------------------------------- offline operations
@dataclass(frozen=True)
class StateView:
    """A read-only view of a state directory, for operators (no lock taken, nothing changed).

    Attributes:
        directory: the state directory.
        projection: the replayed durable state.
        snapshot_generation: the snapshot replay started from (None: none yet).
        journal_seq: the last journal sequence number folded in or replayed.
        replayed_records: journal records replayed after the snapshot.
        stats: the master's statistics as of the newest snapshot ({} if none).
        master_running: True when a master holds the directory's lock.
    """

    directory: str
    projection: Projection
    snapshot_generation: int | None
    journal_seq: int
    replayed_records: int
    stats: Mapping[str, Any]
    master_running: bool

    def summary(self) -> dict[str, Any]:
        """Counts of the durable state, JSON-ready."""
        p = self.projection
        return {
            "directory": self.directory,
            "epoch": p.epoch,
            "pending": len(p.front) + len(p.back),
            "in_flight": len(p.in_flight),
            "committed": len(p.committed),
            "deferred": len(p.deferred),
            "snapshot_generation": self.snapshot_generation,
            "journal_seq": self.journal_seq,
            "replayed_records": self.replayed_records,
            "duplicate_commits_in_journal": p.duplicate_commits,
            "master_running": self.master_running,
        }


def is_state_dir(directory: str | os.PathLike[str]) -> bool:
    """True when ``directory`` looks like a campaign state directory."""
    d = os.fspath(directory)
    return os.path.isdir(d) and (
        os.path.exists(os.path.join(d, STATE_JOURNAL))
        or any(n.startswith(SNAPSHOT_NAME + ".") and n.endswith(".snap") for n in os.listdir(d))
    )


def _master_running(d: str) -> bool:
    """True when a master holds ``d``; creates and changes nothing (S10).

    A master holds a ``flock`` on ``master.lock`` (filelock's backend) and one on its state
    journal file itself (S12, which holds when an operator deleted the lock file). A shared,
    non-blocking ``flock`` on a read-only descriptor fails exactly while a writer holds either.
    """
    return any(_locked(os.path.join(d, name)) for name in (LOCK_NAME, STATE_JOURNAL))


def _locked(path: str) -> bool:
    """True when another open file holds an exclusive ``flock`` on ``path`` (never created)."""
    import fcntl

    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also lets go of the shared flock
    return False


def view_state(directory: str | os.PathLike[str]) -> StateView:
    """Replay a state directory read-only (it may have a running master).

    Raises:
        UsageError: not a state directory.
        JournalCorruptError, SnapshotCorruptError: damage found.
    """
    from .errors import UsageError
    from .storage.journal import read_journal

    d = os.fspath(directory)
    if not is_state_dir(d):
        raise UsageError(f"{d} is not a durable-dispatch state directory")
    _store, snap = _load_snapshot(d)
    base = snap.value if snap is not None else {}
    after = int(base.get("journal_seq", -1))
    proj = Projection(base.get("state"))
    n, last = 0, after
    jpath = os.path.join(d, STATE_JOURNAL)
    if os.path.exists(jpath):
        for rec in read_journal(jpath, from_seq=after + 1):
            _fold(proj, rec.payload, jpath, seq=rec.seq)
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
    )


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


def _take_master_lock(d: str, *, create: bool = False) -> filelock.BaseFileLock:
    """Take state directory ``d``'s single-master lock (S5, S9); ``create`` makes ``d`` first."""
    path = os.path.join(d, LOCK_NAME)
    lock = filelock.FileLock(path, timeout=0, mode=0o600, thread_local=False)
    try:
        if create and not os.path.isdir(d):
            _fs.makedirs(d)
        lock.acquire()
    except filelock.Timeout:
        raise LockHeldError("a master holds this state directory", path=path) from None
    except OSError as e:
        # S9: without the lock nothing is read, so nothing may be changed either.
        raise StorageError(
            f"cannot create or lock the state directory: {e.strerror or e}; nothing was changed",
            path=getattr(e, "filename", None) or path,
            op="lock",
            errno=e.errno,
        ) from e
    return lock


@contextmanager
def _master_locked(directory: str | os.PathLike[str]) -> Iterator[str]:
    """Hold the master lock of ``directory`` for an offline operation; yields the path."""
    d = os.fspath(directory)
    lock = _take_master_lock(d)
    try:
        yield d
    finally:
        lock.release()


def compact_state(
    directory: str | os.PathLike[str],
    *,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> CompactReport:
    """Fold the state journal into a new snapshot and start a fresh journal (S6).

    Order: (1) replay snapshot + journal, streaming; (2) save the folded state as a new snapshot
    generation (atomic); (3) replace the journal by an empty one whose numbering continues
    (temp file, fsync, rename, directory fsync). A crash before (2) leaves the old snapshot and the
    old journal; between (2) and (3) the new snapshot and the old journal, whose records it already
    holds (replay skips them); after (3) the new pair. Memory is bounded by the live set (the
    projection), not the journal's size. Committed results are never dropped (U6): before (2)
    every committed record not moved yet is appended to the results journal (``results.jsonl``)
    with its sequence number, and fsynced; a compaction interrupted after that moves nothing
    twice.

    The journal is read once: the open's verifying scan hands each run of records to the fold
    (``Journal.open(visit=...)``); only if the open had to repair damage first are the records
    read again. ``progress(bytes_done, bytes_total)`` is called as the journal is read.

    Raises:
        LockHeldError: a master is running on the directory.
        UsageError: not a state directory.
        JournalCorruptError: the journal holds damage the open does not repair, or an intact
            record whose payload is not JSON.
    """
    from .errors import UsageError

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
            j, proj, _n = _open_and_fold(
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
        with j:
            before = j.recovery.records
            last = j.next_seq - 1
            if dry_run:
                est = len(Header(new_salt(), last + 1).frame())
                return CompactReport(jpath, before, 0, size, est, None, True)
            delivered = int(base.get("delivered_seq", base.get("journal_seq", -1)))
            body = {
                "journal_seq": last,
                "delivered_seq": max(delivered, proj.delivered),
                "state": proj.to_snapshot(),
                "stats": base.get("stats", {}),
            }
            gen = snaps.save(body)
            j.replace_contents([], first_seq=last + 1)
        after_size = os.path.getsize(jpath)
        return CompactReport(jpath, before, 0, size, after_size, gen, False)


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


class _ResultsMover:
    """Compaction's half of the results store: append each committed record of the state journal
    that the results journal does not hold yet (by sequence number) to it."""

    def __init__(self, d: str) -> None:
        from .results import RESULTS_JOURNAL

        self.moved = -1

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
        if seq > self.moved and ev.get("event") == "committed":
            self.journal.append({**ev, "event": "result", "seq": seq})
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


def requeue_deferred(directory: str | os.PathLike[str], work_ids: Iterable[str]) -> list[str]:
    """Put deferred items back into the frontier durably (the next master run picks them up).

    Journals ``requeued_deferred`` in the state journal and resolves each item as ``requeued``
    in the defer journal. Returns the IDs requeued.

    Raises:
        LockHeldError: a master is running. UsageError: an ID that is not deferred.
    """
    from .errors import UsageError

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
                j.append({"event": "requeued_deferred", "work_id": w})
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
    from .errors import UsageError

    with _master_locked(directory) as d:
        ids = list(work_ids)
        with DeferJournal.open(d) as dj:
            for w in ids:
                if w not in dj:
                    raise UsageError(f"{w!r} is not a listed deferred item")
            for w in ids:
                dj.resolve(w, "dropped")
        return ids
