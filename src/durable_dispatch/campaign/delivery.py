"""The core's decisions persisted before the shell acts, and the commits delivered once durable.

Every decision that changes the durable state is journaled before the shell acts on it: a
dispatch before its WORK is sent, a requeue, a deferral (also to the defer journal), a snapshot
the core asks for (S8). The Commits of one dispatch are journaled as one ``committed`` record (a
few when one would exceed the record bound; a result too large for any record is refused and
retried). Once an fsync covers a record, the delivery point (:meth:`Delivery._complete_commits`,
the one place user code runs, R1) closes the dispatch in the core and then hands its commits to the
callback: a work ID is committed once in the durable record, and delivered at least once. The
delivery point is kept in every snapshot and, between snapshots, in ``delivered`` events; after a
crash or a failed callback, :meth:`Delivery.redeliver` hands the commits after it to the callback
again. The work items a callback returns (a result that spawns work, G1) are submitted before the
delivery point passes their parent.

:class:`Delivery` is a part of :class:`~durable_dispatch.campaign.state.CampaignState`, which
provides the journals, the core and the fields it declares.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ..core import Commit, Decision, Defer, Dispatcher, PersistSnapshot, Requeue, Send, WorkItem
from ..core.events import Committed, Delivered, encode, of_decision
from ..core.records import fast_init
from ..errors import NotDurableError, RecordTooLargeError, StorageDegradedError, UsageError
from ..storage import DeferJournal, Journal
from ..tokens import Token
from ..values import restore
from .costs import CostTable
from .logs import log_decisions
from .results import read_results

__all__ = ["Delivery", "OnCommit"]

log = logging.getLogger("durable_dispatch.state")

#: ``on_commit(work_id, result)``: called once a commit is journaled, at least once (U6): once
#: an fsync covers it, or at once as a *memory-only* commit while the journal is degraded (a
#: disk fault: the campaign goes on; the commit becomes durable if the journal is restored, and
#: is lost with the process otherwise, so the item runs and is delivered again on the next run).
#: A callback with a parameter named ``durable`` is told which: ``on_commit(work_id, result,
#: durable=False)`` for a memory-only commit. It may return the work items the result spawns
#: (G1), which are submitted before it counts as delivered.
OnCommit = Callable[..., "Iterable[WorkItem] | None"]

_COMMIT = {Commit}
_token_of = attrgetter("token")

#: A ``delivered`` event records the delivery point between snapshots once it is this old or
#: this many records behind: after a crash at most about that much is delivered again.
DELIVERY_MARK_SECONDS = 0.25
DELIVERY_MARK_RECORDS = 256


@fast_init
@dataclass(frozen=True, slots=True)
class _PendingCommit:
    """A ``committed`` record journaled but not yet delivered (a group commit in progress)."""

    seq: int  # its journal sequence number
    token: Token  # the dispatch it belongs to
    commits: list[Commit]  # the Commits it holds
    callback: Callable[[Commit], None] | None  # who gets them once an fsync covers the record


class Delivery:
    """Commits journaled, delivered once durable, redelivered after a crash (see the module
    docs); a part of :class:`~durable_dispatch.campaign.state.CampaignState`."""

    directory: str
    journal: Journal
    core: Dispatcher
    # one entry per ``committed`` record; the records of one dispatch are next to each other
    # (several only when one would be too big)
    _pending_commits: list[_PendingCommit]
    _commits_in_memory: list[int]
    # U6: every commit journaled up to this sequence number was handed to the callback (which
    # returned). Kept in each snapshot body and, between snapshots, in ``delivered`` events at
    # most every DELIVERY_MARK_SECONDS.
    _delivered: int
    _delivered_marked: int
    _delivered_at: float
    _callback_failed: bool
    _on_commit: Callable[[Commit], None] | None  # the facade's callback
    #: (hook, argument) of each ``on_defer`` and ``on_cancel`` call that waits for the delivery
    #: point (R1: no user code runs while the library persists its decisions)
    _notices: list[tuple[Callable[[Any], None], Any]]
    #: work ID -> (journal seq, result) of each memory-only commit of an item that may be a
    #: dependency, until an fsync covers its record (dependencies.py)
    _held_results: dict[str, tuple[int, Any]]
    #: token -> work ID -> what that attempt cost, until its outcome is journaled
    _costs: dict[Token, dict[str, Any] | CostTable]

    #: While the commit callback runs: True when an fsync covers the commit being delivered,
    #: False for a memory-only commit (the journal is degraded). See :data:`OnCommit`.
    commit_durable: bool = True

    defer: DeferJournal
    _has_after: bool
    #: called with each :class:`Defer` once the defer journal took it (or kept it in memory):
    #: the item's retries are spent (the futures executor fails its future)
    on_defer: Callable[[Defer], None] | None
    #: called with the work ID of each item an operator cancelled (O1; the futures executor
    #: fails its future)
    on_cancel: Callable[[str], None] | None

    if TYPE_CHECKING:  # provided by CampaignState

        def submit(self, items: Iterable[WorkItem]) -> int: ...

        def _save_snapshot(self, reason: str = "") -> bool: ...

        def _defer_behind_ended(self, deps: Iterable[str]) -> None: ...

        def _note_commits(self, commits: Iterable[Commit]) -> None: ...

    # ------------------------------------------------------ persist before you act
    def _record_send(self, send: Send) -> None:
        """Journal a dispatch before its WORK is sent (persist before you send): one record for
        all its items."""
        self._journal_event_of(send)

    def _apply(
        self,
        decisions: Iterable[Decision],
        on_commit: Callable[[Commit], None] | None = None,
    ) -> list[Decision]:
        """Persist each decision that changes durable state, in order; returns them all. No
        user code runs here (R1): what a decision tells a callback waits for the delivery
        point (:meth:`_complete_commits`).

        * :class:`Commit`: journal it (the Commits of one dispatch, which the core returns next to
          each other, as one record). Once an fsync covers it, the delivery point closes it in
          the core and then calls ``on_commit`` (the master keeps dispatching while the group
          commit runs).
        * :class:`Requeue` / :class:`Defer`: journal it; a Defer is appended to the defer journal
          and its outcome (on disk or in memory) reported to the core.
        * :class:`PersistSnapshot`: write the snapshot now.
        """
        out = list(decisions)
        if not out:
            return out
        first = out[0]
        commits = type(first) is Commit and (
            len(out) == 1 or (set(map(type, out)) == _COMMIT and len(set(map(_token_of, out))) == 1)
        )  # (C-level passes: a RESULT of 64 items is 64 Commits)
        if commits:  # the usual answer to a RESULT: the Commits of one dispatch, one record
            refused = self._journal_commits(out, on_commit)  # type: ignore[arg-type]
        else:
            refused = self._persist_each(out, on_commit)
        log_decisions(out, quiet=commits)  # (Commits are logged at DEBUG)
        if refused:
            out += self._apply(refused)
        return out

    def _persist_each(
        self, out: list[Decision], on_commit: Callable[[Commit], None] | None
    ) -> list[Decision]:
        """:meth:`_apply`'s persist step for any mix of decisions; returns the decisions of
        the commits the journal refused (a result too large for a record)."""
        refused: list[Decision] = []
        group: list[Commit] = []
        for i, d in enumerate(out):
            if isinstance(d, Commit):
                group.append(d)
                nxt = out[i + 1] if i + 1 < len(out) else None
                if not isinstance(nxt, Commit) or nxt.token != d.token:
                    refused += self._journal_commits(group, on_commit)
                    group = []
            elif isinstance(d, Requeue):
                self._journal_event_of(d, self._cost_of(d.token, d.work_id))
            elif isinstance(d, Defer):
                w = d.work
                cost = self._cost_of(d.token, w.work_id)
                self._journal_event_of(d, cost)
                try:
                    rec = self.defer.defer(
                        w.work_id,
                        w.to_json(),
                        attempts=d.attempts,
                        kinds=d.kinds,
                        last_error=d.last_error,
                        inputs=w.inputs,
                        self_contained=w.self_contained,
                        traceback=d.traceback,
                        cost=cost,
                    )
                    persisted = rec.persisted
                except StorageDegradedError:
                    persisted = False
                self.core.defer_recorded(w.work_id, persisted)
                if self.on_defer is not None:  # (told at the delivery point)
                    self._notices.append((self.on_defer, d))
                # G4: what waits for it is deferred too, after it (persisted next, as refused
                # commits' decisions are)
                refused += self.core.ended_without_commit(w.work_id)
            elif isinstance(d, PersistSnapshot):
                self._save_snapshot(d.reason)
        return refused

    def _journal_event_of(self, d: Decision, cost: dict[str, Any] | None = None) -> None:
        """Journal the event the core applied to its ledger for decision ``d`` (one encoding:
        replay decodes it into the same ledger change), with the wall-clock time it happened
        (``ts``: informational, for ``durable-dispatch report``; replay ignores it) and what
        the attempt cost, when its worker said (``cost``: informational too)."""
        ev = of_decision(d)  # (a Send's own event: the one the core applied)
        assert ev is not None, d
        rec = ev.encode()
        rec["ts"] = time.time()
        if cost is not None:
            rec["cost"] = cost
        self.journal.append(rec)

    def _cost_of(self, token: Token | None, work_id: str) -> dict[str, Any] | None:
        """What the attempt of ``work_id`` under ``token`` cost (:meth:`note_usage`), taken."""
        if not self._costs or token is None:
            return None
        costs = self._costs.get(token)
        if costs is None:
            return None
        c: dict[str, Any] | None = costs.pop(work_id, None)
        if not costs:
            del self._costs[token]
        return c

    # ------------------------------------------------------------ the commits
    def _journal_commits(
        self, commits: list[Commit], on_commit: Callable[[Commit], None] | None
    ) -> list[Decision]:
        """One ``committed`` record for the Commits of one dispatch, or several when one would
        exceed the journal's record bound. A single result too large for any record is refused:
        the core retries that item (returns its decisions)."""
        first = commits[0]
        wids: tuple[str, ...]
        results: tuple[Any, ...]
        if len(commits) == 1:
            wids, results = (first.work_id,), (first.result,)
        else:
            wids, results = tuple([c.work_id for c in commits]), tuple([c.result for c in commits])
        ev = Committed(first.token, first.rank, wids, results, time.time())
        rec = ev.encode()
        costs = self._costs.get(first.token) if self._costs and first.token else None
        table = None
        if costs:  # what each attempt cost (note_usage): informational, replay ignores it
            if len(wids) == 1:
                if (c := costs.get(wids[0])) is not None:
                    rec["cost"] = c
            elif type(costs) is CostTable and (table := costs.columns_for(wids)) is not None:
                rec["cost_table"] = table  # (the worker's columns as they came: costs.py)
            else:
                rec["costs"] = [costs.get(w) for w in wids]
        try:
            try:
                r = self.journal.append(rec)
            except RecordTooLargeError:
                if len(commits) > 1 or rec.pop("cost", None) is None:
                    raise  # (several: split below, each half with its costs)
                # what it cost is the library's word, the result the user's: a record that
                # holds the result without it keeps the result (its cost reads blank)
                log.warning("commit of %s recorded without its cost (too large)", first.work_id)
                r = self.journal.append(rec)
        except RecordTooLargeError as e:
            if len(commits) > 1:
                half = len(commits) // 2
                return self._journal_commits(commits[:half], on_commit) + self._journal_commits(
                    commits[half:], on_commit
                )
            if first.part:
                return self._refuse_part(first, str(e))
            log.error("result of %s cannot be journaled: %s", first.work_id, e)
            return self.core.commit_refused(first.token, first.work_id, f"result too large: {e}")
        if costs:
            if table is None:
                for w in wids:
                    costs.pop(w, None)
            if table is not None or not costs:
                del self._costs[first.token]
        if self._has_after:  # G4: keep what a dependent needs (dependencies.py)
            self._note_commits(commits)
        self._pending_commits.append(_PendingCommit(r.seq, first.token, commits, on_commit))
        return []

    def _refuse_part(self, c: Commit, error: str) -> list[Decision]:
        """A result sent ahead of its dispatch (``Commit.part``) that no record can hold: the
        item takes the retry path (kind ``result-too-large``), as a refused commit does."""
        log.error("result of %s cannot be journaled: %s", c.work_id, error)
        return self.core.part_refused(c.token, c.work_id, f"result too large: {error}")

    def _complete_commits(self, *, wait: bool = False) -> int:
        """The delivery point (R1): close every journaled commit an fsync now covers in the core,
        then hand them to the callbacks. Returns how many work items were committed.

        Two steps, in this order. First the library's own: the covered records leave the list
        of pending commits, the core closes them (a commit releases what waits for it) and
        what follows is persisted; no user code runs meanwhile. Then the user's: each commit's
        callback, in commit order, and the notices that waited for this point (``on_defer``,
        ``on_cancel``); what a callback returns or does (children, a submit, a cancel) is a new
        input of its own, applied to a consistent state, and never re-enters the first step
        (it walks only the records it took). The delivery point passes a record once its
        callbacks returned and their children are submitted (G1).

        With ``wait=True`` it first waits for the newest pending commit to be durable. While
        the journal is degraded, pending commits are delivered as memory-only commits (counted
        in ``statistics().commits_in_memory``) so the campaign goes on.
        """
        pending = self._pending_commits
        if not pending:
            if self._notices:
                self._notify()
            return 0
        if wait:
            self._durable(pending[-1].seq)
        degraded = not self.journal.healthy
        durable = self.journal.durable_seq
        if not degraded and pending[0].seq > durable:
            if self._notices:
                self._notify()
            return 0  # no fsync covers the oldest yet (the usual answer during a group commit)
        n = 0
        while n < len(pending) and (degraded or pending[n].seq <= durable):
            n += 1
        ready = pending[:n]
        last = [k + 1 == n or ready[k + 1].token != p.token for k, p in enumerate(ready)]
        if n < len(pending) and pending[n].token == ready[-1].token:
            last[-1] = False  # the dispatch's last record is not covered yet
        del pending[:n]
        # 1. the library's step: no user code
        items = 0
        follow: list[Decision] = []
        for p, closes in zip(ready, last, strict=True):
            if p.seq > durable:
                self._commits_in_memory.extend([p.seq] * len(p.commits))
                self._hold_results(p.seq, p.commits)  # a dependency's result is here (G4)
            if p.commits[0].part:  # sent ahead: the dispatch goes on
                self.core.part_done(p.token, p.commits[0].rank, [c.work_id for c in p.commits])
            elif closes:
                follow += self.core.commit_done(p.token)  # the dispatch's last record is in
            items += len(p.commits)
        if follow:
            self._apply(follow)
        if self.core.ledger.released:
            self._resolve_released()
        # 2. the user's step: the callbacks, in commit order
        for p in ready:
            if p.callback is not None and not self._callback_failed:
                self.commit_durable = p.seq <= durable
                try:
                    for c in p.commits:
                        p.callback(c)
                except BaseException:
                    # U6: this record and every later one are delivered again on the next
                    # open; from now on nothing is handed to the callback (it failed).
                    self._callback_failed = True
                    raise
            if not self._callback_failed:
                self._delivered = max(self._delivered, p.seq)
        if self._notices:
            self._notify()
        self._mark_delivered()
        return items

    def _notify(self) -> None:
        """Hand the notices that waited for the delivery point to their hooks, in order."""
        notices, self._notices = self._notices, []
        for i, (hook, arg) in enumerate(notices):
            try:
                hook(arg)
            except BaseException:
                self._notices[:0] = notices[i + 1 :]
                raise

    def _hold_results(self, seq: int, commits: Iterable[Commit]) -> None:
        """Keep the results of memory-only commits (the journal degraded) until an fsync
        covers their record: a dependent dispatched meanwhile gets them from here, not from
        the disk, where they are not yet."""
        held = self._held_results
        for c in commits:
            held[c.work_id] = (seq, c.result)

    def _resolve_released(self) -> None:
        """Items deferred for a dependency that its commit released (G4) leave the defer
        journal (``resolved``, how ``"requeued"``: they are back in the queue)."""
        released, self.core.ledger.released = self.core.ledger.released, []
        for wid in released:
            if wid not in self.defer:
                continue
            try:
                self.defer.resolve(wid, "requeued")
            except StorageDegradedError:
                log.warning("defer journal: %s released, its record not resolved", wid)

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
            mark = Delivered(self._delivered)
            self.journal.append(encode(mark))
            self.core.ledger.apply(mark)
            self._delivered_marked, self._delivered_at = self._delivered, t

    @property
    def delivered_seq(self) -> int:
        """The delivery point (U6): every commit journaled up to this sequence number was handed
        to the callback, which returned."""
        return self._delivered

    def redeliver(self, on_commit: OnCommit | None) -> int:
        """Hand every commit after the delivery point to ``on_commit(work_id, result)`` again,
        in commit order (U6: at least once), and make it the callback of every later commit
        made through the facade (:meth:`on_results` ...). Call it after :meth:`open`, before
        dispatching; ``run_master`` does. Returns how many results it delivered.

        A commit is redelivered when the master crashed after it was durable but before its callback
        returned, or when the callback raised. A callback with a parameter named ``durable`` gets
        ``durable=False`` for a memory-only commit (see :data:`OnCommit`). The callback must be
        idempotent by work ID (an upsert keyed by work ID); see ``docs/state-format.md``. The work
        items it returns are submitted (known work IDs skipped) before the delivery point passes its
        commit (G1).

        Raises:
            UsageError: the callback returned something else than None or work items.
        """
        call = _caller(on_commit, self)
        if call is None:
            self._on_commit = None
        else:
            self._on_commit = lambda c: self._spawn(c.work_id, call(c.work_id, restore(c.result)))
        n = 0
        upto = self.journal.next_seq - 1
        for r in read_results(self.directory, after_seq=self._delivered):
            if r.seq > upto:
                break
            if call is not None:
                self.commit_durable = r.seq <= self.journal.durable_seq
                try:
                    children = call(r.work_id, r.result)
                except Exception as e:
                    log.error(
                        "on_commit raised on the redelivery of %s's result (%s: %s): the result "
                        "is safe, committed in %s, and is delivered again at the next start; fix "
                        "the callback and run again (durable-dispatch results %s shows it)",
                        r.work_id,
                        type(e).__name__,
                        e,
                        self.directory,
                        self.directory,
                    )
                    raise
                self._spawn(r.work_id, children)
            self._delivered = max(self._delivered, r.seq)
            n += 1
        if n:
            log.warning("redelivered %d committed result(s) to the callback (at least once)", n)
        self._delivered = max(self._delivered, upto)  # nothing after it is a commit yet
        self._mark_delivered(now=True)
        return n

    def _spawn(self, parent: str, children: Any) -> None:
        """G1: the work items a callback returned for ``parent``'s commit, submitted durably
        (their store records fsynced, their ``submitted`` record journaled) before the
        delivery point may pass that commit; known work IDs are skipped, so a callback run
        again after a crash submits nothing twice.

        Raises:
            UsageError: the callback returned something else than None or work items.
        """
        if children is None:
            return
        if isinstance(children, (str, bytes, dict)) or not hasattr(children, "__iter__"):
            raise UsageError(
                f"on_commit({parent!r}, ...) returned {type(children).__name__}: return None, "
                "or an iterable of WorkItem (the work this result spawns)"
            )
        items = list(children)
        bad = next((i for i in items if not isinstance(i, WorkItem)), None)
        if bad is not None:
            raise UsageError(
                f"on_commit({parent!r}, ...) returned {bad!r} among its children: each must be "
                "a WorkItem"
            )
        if items:
            self.submit(items)

    def _durable(self, seq: int) -> bool:
        try:
            self.journal.wait_durable(seq)
            return True
        except NotDurableError:
            return False


def _caller(on_commit: OnCommit | None, state: Delivery) -> Callable[[str, Any], Any] | None:
    """``on_commit`` as ``call(work_id, result)``: passing ``durable=state.commit_durable``
    when it has a parameter of that name (callbacks of two parameters keep working)."""
    if on_commit is None:
        return None
    try:
        params = inspect.signature(on_commit).parameters
    except (TypeError, ValueError):  # a callable without a signature: the two arguments
        return on_commit
    p = params.get("durable")
    if p is None or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
        return on_commit
    return lambda wid, result: on_commit(wid, result, durable=state.commit_durable)
