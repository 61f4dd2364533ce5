"""The sans-I/O dispatch core: reservations, tokens, watchdog, parked-rank gate, retry ledger.

Theory of operation. The core never reads a clock, a file, the environment or MPI: the shell passes
``now`` (a monotonic float) and the messages it received, and the core returns :mod:`decisions
<durable_dispatch.core.decisions>`. One loop turn of the shell is::

    for rank, token in readies:   decisions += core.on_ready(rank, token, now)        # 1. READY
    while (d := core.reserve(now)) is not None:                                       # 2. dispatch
        if isinstance(d, PersistSnapshot): persist(); core.snapshot_persisted(); continue
        ok = send(d.rank, d.token, d.items)           # then, once the send returned:
        decisions += core.mark_dispatched(d.token, now) if ok else core.send_failed(d.token, now)
    for rank, token, result in results: decisions += core.on_result(rank, token, result, now)  # 3.
    decisions += core.join_invalid(now)                                               # 4. join
    decisions += core.sweep(now)                                                      # 5. sweep

Each dispatch is a reservation transaction ``PREPARING -> DISPATCHED -> COMMITTING -> CLOSED`` (or
``ROLLED_BACK``). Its deadline starts only at ``mark_dispatched`` (once the send returned) and
lives in a heap, so a sweep with nothing expired costs the same at 10 or 100,000 transactions in
flight. A timeout is a suspicion: the task moves at once (requeued or deferred under its work
ID), but the rank is parked until a READY with its exact retired token proves the old generation
is over. Late messages are classified (current, stale, unowned, malformed, duplicate) and only a
current RESULT can commit. Every rollback sets "snapshot required", and
:meth:`Dispatcher.reserve` returns :class:`PersistSnapshot` before any further :class:`Send`
until the shell confirms it.

Multi-item dispatches (``reserve(now, max_items=k)``) carry up to k items under one token, one
deadline (their timeouts added up) and one RESULT with an entry per item, so per-message and
per-record costs are paid once per dispatch. The invariants above hold per dispatch. When a
multi-item dispatch fails as a whole (timeout, missing or malformed RESULT, send failure, lost
rank), no one knows which item was at fault: each item is requeued uncharged and dispatched alone
from then on, where a failure is charged to it alone. An item the worker reports as failed inside
an otherwise good RESULT is charged at once and the rest commit.

Ordering assumption: messages from one rank arrive in the order it sent them (the MPI shell receives
with ``ANY_TAG``, which MPI's non-overtaking rule orders per sender), so when the turn's join step
sees a current READY without a RESULT, the RESULT is missing, not late.

Reading order. The dispatcher is built in parts, one job each: this module (set-up, dispatch,
messages and commits), :mod:`rollback <durable_dispatch.core.rollback>` (join, sweep, lost
ranks, deferrals, the restart, and the two shared paths every failure takes:
``Rollbacks._roll_back`` and ``Rollbacks._retry_or_defer``), :mod:`queries
<durable_dispatch.core.queries>` (queries, statistics, the snapshot), over :mod:`dispatch_base
<durable_dispatch.core.dispatch_base>` (the state they share). A transaction's states and the
one table of their transitions are in :mod:`transactions <durable_dispatch.core.transactions>`,
the counters and :class:`DispatchStats` in :mod:`stats <durable_dispatch.core.stats>`.
A rank's state (starting, idle, suspect, busy, parked, lost) is
:class:`~durable_dispatch.core.ranks.RankState` in :mod:`ranks <durable_dispatch.core.ranks>`
(which ranks are suspect too); the hosts of the ranks, and which ranks a loss makes suspect, are
:mod:`domains <durable_dispatch.core.domains>`; the watchdog's deadlines are a
:class:`~durable_dispatch.core.watchdog.DeadlineHeap`; the durable facts are a
:class:`~durable_dispatch.core.ledger.Ledger`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from ..errors import UsageError
from ..tokens import Token
from .config import WORKER_FAILURE_KINDS
from .decisions import (
    SOURCE_INVALID_RESULT,
    SOURCE_SEND_FAILURE,
    Classification,
    Commit,
    Commits,
    Decision,
    ItemFailure,
    PersistSnapshot,
    Release,
    Send,
    WorkItem,
    failure_source,
)
from .events import Committed, Dispatched, Submitted
from .queries import Queries
from .ranks import RankState
from .rollback import Rollbacks
from .stats import DispatchStats
from .transactions import Transaction, TxEvent, TxState, WorkStatus, advance

__all__ = [
    "Dispatcher",
    "TxState",
    "TxEvent",
    "Transaction",
    "DispatchStats",
    "WorkStatus",
    "RankState",
]


_work_id = attrgetter("work_id")
_leases = attrgetter("leases")


# ------------------------------------------------------------------------------ the core
class Dispatcher(Rollbacks, Queries):
    """The dispatch state machine. See the module docs for the turn order.

    Its durable state is a :class:`~durable_dispatch.core.ledger.Ledger` (:attr:`ledger`), changed
    only by the events of its decisions (``events.of_decision``), which the shell journals: replay
    folds the same events into the same model. The rest (ranks, transactions, leases, deadlines,
    counters) lives only in memory.

    Args:
        epoch: this master run's epoch (from durable state; increases at every start).
        watchdog: deadlines (``WatchdogConfig()`` by default).
        retry: retry budgets (``RetryPolicy()`` by default).
        ranks: worker ranks that start idle.
        starting: the ranks start STARTING instead: none gets work until its first READY
            without a token says it is up (an MPI worker sends it once its isolated child is
            running), so no deadline runs while a worker starts.
    """

    # ----------------------------------------------------------------- set-up
    def submit(
        self, items: Iterable[WorkItem], *, first: int | None = None, checked: bool = False
    ) -> int:
        """Append work items to the back of the frontier; returns how many were added.

        ``first``: the dense index of the first item (the shell's submissions store numbering;
        default: the ledger's next index). It may skip indices, never reuse one. ``checked``:
        the caller already made sure every item is a new :class:`WorkItem`, once (the campaign
        state's ``submit`` does), so they are not checked again.

        Raises:
            UsageError: a work ID that is already pending, in flight, committed or deferred
                (a work ID lives in exactly one place), or twice in ``items``; nothing is added.
        """
        new = tuple(items)
        seen: set[str] = set()
        for item in () if checked else new:
            if not isinstance(item, WorkItem) or not isinstance(item.work_id, str):
                raise UsageError(f"expected a WorkItem with a str work_id, got {item!r}")
            wid = item.work_id
            if wid in seen or self.ledger.known(wid):
                raise UsageError(f"work ID {wid!r} is already {self.status(wid) or 'PENDING'}")
            seen.add(wid)
        if first is not None and first < len(self.ledger.ids):
            raise UsageError(f"index {first} is already numbered ({len(self.ledger.ids)} are)")
        self._apply(Submitted(new, first))
        return len(new)

    # --------------------------------------------------------------- dispatch
    def reserve(self, now: float, max_items: int = 1) -> Send | PersistSnapshot | None:
        """Reserve the next dispatch: the lowest idle rank and the first frontier item whose
        leases are free. Returns :class:`PersistSnapshot` first if a rollback is not yet persisted,
        or None when nothing can be dispatched now.

        Args:
            now: the master's monotonic clock.
            max_items: up to this many items go in one dispatch (one token, one WORK message, one
                RESULT): after the first, the items that follow it at the head of the frontier,
                as long as their leases are free. An item that failed in a multi-item dispatch
                (see :class:`Requeue` ``split``) always goes alone.

        Raises:
            UsageError: ``max_items`` is not an integer >= 1.
        """
        if type(max_items) is not int or max_items < 1:
            raise UsageError(f"max_items must be an integer >= 1, got {max_items!r}")
        if self._snapshot_required is not None:
            return PersistSnapshot(self._snapshot_required)
        ledger = self.ledger
        ranks = self._ranks
        if ranks.suspect_until and ranks.expire_due(now):  # their window passed
            ranks.expire(now)
        rank = ranks.lowest_idle()
        frontier = ledger.frontier
        if rank is None or not frontier:
            return None
        head: WorkItem = ledger.items[frontier.head()]  # type: ignore[index]
        first = head if not head.leases else self._first_free_item()  # (most lease nothing)
        if first is None:
            return None
        token = Token(ledger.epoch, ledger.counter + 1)
        if first.leases:
            self._lease(first, token)
        chosen: tuple[WorkItem, ...] = (first,)
        if max_items > 1 and first.work_id not in ledger.solo:
            # the items that follow at the head of the frontier (none when ``first`` was found
            # behind a head whose lease is taken: that head stops the run at once)
            items = [first]
            solo = ledger.solo
            heads = ledger.items.of(frontier.first(max_items + 1))
            if heads[0] is first and not solo and not any(map(_leases, heads)):
                heads = heads[:max_items]  # the usual run: nothing leased, none alone (C-level)
                items = heads
                heads = []
            for head in heads:
                if len(items) == max_items:
                    break
                if head is first:
                    continue
                if (solo and head.work_id in solo) or (head.leases and not self._leases_free(head)):
                    break
                if head.leases:
                    self._lease(head, token)
                items.append(head)
            chosen = tuple(items)
        wire = str(token)  # the wire form, made once
        tx = Transaction(token, rank, chosen, wire=wire)
        self._ranks.start(rank, tx)
        self._open[wire] = tx
        c = self._n
        c.dispatches += 1
        c.dispatched_items += len(chosen)
        policy = self.policy
        if policy.enabled:
            tx.seconds = self.allowed_seconds(chosen)  # (the one way a dispatch gets its time)
        attempts = ledger.attempts
        # The event the core applies now and the shell journals (one model, made once).
        ev = Dispatched(token, rank, tuple(map(_work_id, chosen)))
        ledger.apply(ev)
        return Send(
            rank,
            token,
            chosen,
            tx.seconds,
            policy.lease_for(chosen),
            tuple([attempts.get(w.work_id, 0) for w in chosen]) if attempts else (0,) * len(chosen),
            ev,
        )

    def _first_free_item(self) -> WorkItem | None:
        """The first frontier item whose leases are free (it stays in the frontier until the
        dispatch's event takes it out)."""
        items = self.ledger.items
        for wid in self.ledger.frontier:
            if self._leases_free(items[wid]):
                return items[wid]
        return None

    def _leases_free(self, item: WorkItem) -> bool:
        return all((k, v) not in self._leases for k, v in item.leases.items())

    def _lease(self, item: WorkItem, token: Token) -> None:
        for k, v in item.leases.items():
            self._leases[(k, v)] = token

    def mark_dispatched(self, token: Token, now: float) -> list[Decision]:
        """The WORK send for ``token`` returned: the deadline starts now."""
        tx = self._open_tx(token)
        advance(tx, TxEvent.SENT)
        tx.sent_at = now
        if self.policy.enabled:
            seconds = tx.seconds if tx.seconds is not None else self.allowed_seconds(tx.items)
            tx.deadline = now + seconds  # what the Send told the worker
            self._push_deadline(tx.deadline, token)
        return []

    def send_failed(self, token: Token, now: float, error: str = "send failed") -> list[Decision]:
        """The WORK send for ``token`` failed: the same compensation path as a timeout.

        A shell whose send completes later (a non-blocking send, reported with
        :meth:`mark_dispatched` when it was posted) reports its failure here too: the dispatch
        is rolled back the same way while nothing of its worker came under its token (no
        RESULT, part, READY or HEARTBEAT); once something came, the worker evidently had the
        WORK, and a failure reported after it changes nothing (returns ``[]``), as does one
        for a dispatch no longer open.

        Raises:
            UsageError: ``token`` was never reserved.
        """
        tx = self._open.get(str(token))
        if tx is None:
            if (token.epoch, token.n) > (self.ledger.epoch, self.ledger.counter):
                raise UsageError(f"no transaction has token {token}")
            return []  # it ended already (rolled back, or its worker answered)
        if tx.state is not TxState.PREPARING:
            answered = tx.ready_seen or tx.beaten or tx.ahead or tx.failure is not None
            if tx.state is not TxState.DISPATCHED or answered:
                return []
        self._n.send_failures += 1
        return self._roll_back(tx, SOURCE_SEND_FAILURE, "send-failure", error, RankState.PARKED)

    def snapshot_persisted(self) -> None:
        """The shell wrote the snapshot a :class:`PersistSnapshot` asked for."""
        self._snapshot_required = None

    def current_token(self, rank: int, token: object) -> Token | None:
        """The token of the dispatch ``rank`` runs under the wire ``token`` now (its RESULT
        would be current), or None; a question only, nothing counted."""
        tx = self._open.get(token) if type(token) is str else None
        return tx.token if tx is not None and tx.rank == rank else None

    # -------------------------------------------------------------- messages
    def _resolve(self, rank: int, token: object, message: str) -> Transaction | list[Decision]:
        """The one token resolver: the transaction ``rank`` currently runs under the wire
        ``token``, or the :class:`Quarantine` of a message that names none (unowned, malformed,
        stale). The caller checks the transaction's state."""
        tx = self._open.get(token) if type(token) is str else None
        if tx is not None and tx.rank == rank:
            return tx  # the fast path: an exact wire match
        if not self._ranks.is_live(rank):
            return self._quarantine(rank, message, Classification.UNOWNED, "unknown rank")
        t = Token.parse(token)
        if t is None:
            reason = "bad heartbeat" if message == "HEARTBEAT" else "bad token"
            return self._quarantine(rank, message, Classification.MALFORMED, reason)
        tx = self._ranks.current(rank)
        if tx is not None and tx.token == t:
            return tx
        return self._classify_not_current(rank, t, message)

    def on_ready(self, rank: int, token: object, now: float) -> list[Decision]:
        """A READY arrived from ``rank`` carrying ``token`` (any wire value; None if absent)."""
        if self._ranks.suspect_until:  # a message from a suspect rank clears it
            self._ranks.heard(rank)
        tx = self._open.get(token) if type(token) is str else None
        if tx is None or tx.rank != rank:  # (else the fast path: an exact wire match)
            if self._ranks.is_live(rank):
                state = self._ranks.state(rank)
                if state is RankState.PARKED:
                    return self._parked_ready(rank, token)
                if token is None:  # a worker announcing itself at start (no token yet)
                    if state is RankState.STARTING:
                        self._ranks.announce(rank)
                    return []
            found = self._resolve(rank, token, "READY")
            if not isinstance(found, Transaction):
                return found
            tx = found
        if tx.ready_seen:
            return self._quarantine(tx.rank, "READY", Classification.DUPLICATE, "second READY")
        tx.ready_seen = True
        if tx.state is TxState.PREPARING:
            advance(tx, TxEvent.READY)  # never time out a generation that said READY
        if tx.state is TxState.DISPATCHED:  # no valid RESULT yet: joined at the turn's end
            self._joinable[tx.wire] = tx
        return self._free_rank_if_done(tx)

    def _parked_ready(self, rank: int, token: object) -> list[Decision]:
        """A READY from a parked rank: only its exact retired token releases it (W6, W7)."""
        retired = self._ranks.parked_token(rank)
        t = Token.parse(token)
        if t == retired:
            released = self._ranks.release(rank)
            self._n.watchdog_worker_recoveries += 1
            return [Release(rank, released)]
        if token is None:
            self._n.parked_ready_missing += 1
            return self._quarantine(rank, "READY", Classification.MALFORMED, "parked: no token")
        if t is None:
            self._n.parked_ready_malformed += 1
            return self._quarantine(rank, "READY", Classification.MALFORMED, "parked: malformed")
        self._n.parked_ready_other_token += 1
        return self._quarantine(rank, "READY", Classification.STALE, "parked: other token")

    def on_result(
        self,
        rank: int,
        token: object,
        result: Any,
        now: float,
        *,
        valid: bool = True,
        error: str | None = None,
    ) -> list[Decision]:
        """A RESULT for a one-item dispatch. ``valid=False`` (with ``error``) when its payload
        failed to decode or the worker reported an error.

        Only a current RESULT with a valid payload commits (it returns :class:`Commit`). The same
        as :meth:`on_results` with ``[result]``.
        """
        return self.on_results(rank, token, [result] if valid else None, now, failure=error)

    def on_results(
        self,
        rank: int,
        token: object,
        results: Sequence[Any] | None,
        now: float,
        *,
        errors: Mapping[int, str | ItemFailure] | None = None,
        failure: str | ItemFailure | None = None,
    ) -> list[Decision]:
        """A RESULT: ``results`` holds one entry per item of the dispatch, in its order.

        ``results`` is None (with ``failure``) when the message as a whole is invalid or the
        worker failed the whole dispatch: an :class:`ItemFailure` such as a ``timeout``; a plain
        string is ``malformed-result``.

        ``errors`` maps the index of each item the worker could not do to an
        :class:`ItemFailure` (a plain string is kind ``error``: the function failed); a kind the
        worker may not report counts as ``malformed-result``. In a multi-item dispatch those
        items leave it at once through the retry path (``source=invalid-result``, charged one
        attempt under their kind); the others commit: one :class:`Commit` each, next to each
        other (one :class:`Commits` of them all, its columns, when every item of several
        succeeded: the usual RESULT). A one-item dispatch with an error, and a RESULT whose
        entries do not match the dispatch, fail as a whole: the READY that follows rolls back
        the whole dispatch with that kind (:meth:`join_invalid`).
        """
        if self._ranks.suspect_until:  # a message from a suspect rank clears it
            self._ranks.heard(rank)
        found = self._resolve(rank, token, "RESULT")
        if not isinstance(found, Transaction):
            return found
        tx = found
        if tx.state in (TxState.COMMITTING, TxState.CLOSED):
            return self._quarantine(rank, "RESULT", Classification.DUPLICATE, "second RESULT")
        whole = (
            None  # the usual RESULT: one value per item, nothing failed
            if failure is None and not errors and results is not None
            and len(results) == len(tx.items)
            else _whole_failure(len(tx.items), results, errors, failure)
        )  # fmt: skip
        if whole is not None:
            tx.failure = whole
            if whole.kind == "malformed-result" and not whole.final:
                return self._quarantine(rank, "RESULT", Classification.MALFORMED, whole.reason)
            # The worker said why it failed: the READY that follows rolls it back. It may first
            # restart its isolated child, so its deadline is now the watchdog's for that READY.
            if self.watchdog.enabled and tx.state is TxState.DISPATCHED:
                tx.deadline = now + self.watchdog.seconds
                self._push_deadline(tx.deadline, tx.token)
            return []
        assert results is not None
        advance(tx, TxEvent.RESULT)
        if tx.sent_at is not None and self.policy.observe(
            tx.ahead + tx.items if tx.ahead else tx.items, now - tx.sent_at
        ):  # (the dispatch's time was spent on the items sent ahead too)
            self._fit_open_deadlines()
        flying, committed = self.ledger.in_flight, self.ledger.committed
        if not errors and len(tx.items) > 1:  # the usual RESULT of several: every item in
            wids = tuple(map(_work_id, tx.items))  # flight (none committed), none failed: one
            if all(map(flying.__contains__, wids)):  # Commits, its columns (C-level passes)
                return [Commits(rank, tx.token, wids, results), *self._free_rank_if_done(tx)]
        out: list[Decision] = []
        keep: list[WorkItem] = []
        failed: list[tuple[WorkItem, ItemFailure]] = []
        dups: list[WorkItem] = []
        for i, (item, value) in enumerate(zip(tx.items, results, strict=True)):
            bad = errors.get(i) if errors else None
            if bad is not None:
                failed.append((item, _failure(bad, "error")))
            elif item.work_id not in flying and item.work_id in committed:
                # (an item in flight is not committed: the ledger keeps one place per work ID,
                # so the cheaper question answers the usual case)
                dups.append(item)
            else:
                keep.append(item)
                out.append(Commit(rank, tx.token, item.work_id, value))
        if failed or dups:  # those items leave the dispatch now
            for item in (*(w for w, _ in failed), *dups):
                self._unlease(item, tx.token)
            tx.items = tuple(keep)
        if failed:  # (the usual RESULT: none failed, no call)
            out += self._items_failed(tx.token, failed)
        for _ in dups:
            self._n.duplicate_commits_ignored += 1
            out += self._quarantine(
                rank, "RESULT", Classification.DUPLICATE, "work ID already committed"
            )
        if not keep:
            advance(tx, TxEvent.EMPTIED)
        return out + self._free_rank_if_done(tx)  # READY already seen: the rank is free now

    def on_part(
        self,
        rank: int,
        token: object,
        work_ids: Any,
        results: Any,
        now: float,
        *,
        errors: Mapping[int, str | ItemFailure] | None = None,
    ) -> list[Decision]:
        """A partial RESULT: the outcomes of some items of a multi-item dispatch that still runs
        (the worker sends a finished item ahead instead of holding it behind a slow one).

        ``work_ids`` names the items, ``results`` holds their entries in that order and
        ``errors`` maps an index of ``work_ids`` to the failure of that item. Each named item
        leaves the dispatch now: a good one commits (a :class:`Commit` with ``part=True``;
        report ``part_done`` once it is journaled), a failed one takes the retry path as in
        :meth:`on_results`. The dispatch, its deadline and its rank go on; its RESULT then has
        entries for the items left, in order. A part that is not current, names an item that is
        not (or no longer) in the dispatch, names one twice, does not match its entries or
        would leave the dispatch empty is quarantined as malformed and changes nothing.
        """
        if self._ranks.suspect_until:  # a message from a suspect rank clears it
            self._ranks.heard(rank)
        found = self._resolve(rank, token, "RESULT")
        if not isinstance(found, Transaction):
            return found
        tx = found
        if tx.state not in (TxState.PREPARING, TxState.DISPATCHED) or tx.failure is not None:
            return self._quarantine(rank, "RESULT", Classification.DUPLICATE, "part after RESULT")
        mine = {w.work_id: w for w in tx.items}
        if (
            not isinstance(work_ids, list)
            or not isinstance(results, list)
            or not work_ids
            or len(results) != len(work_ids)
            or not all(type(w) is str and w in mine for w in work_ids)
            or len(set(work_ids)) != len(work_ids)
            or len(work_ids) >= len(tx.items)
            or (errors and not all(type(i) is int and 0 <= i < len(work_ids) for i in errors))
        ):
            return self._quarantine(rank, "RESULT", Classification.MALFORMED, "bad part")
        out: list[Decision] = []
        failed: list[tuple[WorkItem, ItemFailure]] = []
        for i, wid in enumerate(work_ids):
            bad = errors.get(i) if errors else None
            if bad is not None:
                failed.append((mine[wid], _failure(bad, "error")))
            else:
                out.append(Commit(rank, tx.token, wid, results[i], part=True))
        leaving = set(work_ids)
        tx.ahead += tuple([mine[w] for w in work_ids])
        tx.items = tuple([w for w in tx.items if w.work_id not in leaving])
        for item, _bad in failed:
            self._unlease(item, tx.token)
        return out + self._items_failed(tx.token, failed)

    def _items_failed(
        self, token: Token, failed: list[tuple[WorkItem, ItemFailure]]
    ) -> list[Decision]:
        """Retry or defer each unleased item that failed inside a RESULT or a part of one (its
        function raised, its value was refused), then require a snapshot, as one rollback."""
        out: list[Decision] = []
        for item, bad in failed:
            source = failure_source(bad.kind)
            if source == SOURCE_INVALID_RESULT:
                self._n.invalid_result_rollbacks += 1
            else:
                self._n.item_failures += 1
            out.append(self._retry_or_defer(item, token, source, bad.kind, bad.reason, failure=bad))
        if failed:
            out.append(self._require_snapshot(f"items of {token} failed"))
        return out

    def part_done(self, token: Token, rank: int, work_ids: Sequence[str]) -> None:
        """The shell journaled the :class:`Commit` ``part`` entries of ``work_ids`` (see
        :meth:`on_part`): they are committed, whatever became of their dispatch since."""
        if self._leases:  # (no item holds a lease in most campaigns)
            items = self.ledger.items
            for wid in work_ids:
                if wid in items:
                    self._unlease(items[wid], token)
        self.ledger.apply(Committed(token, rank, tuple(work_ids)))
        self._n.commits += len(work_ids)

    def part_refused(self, token: Token, work_id: str, error: str) -> list[Decision]:
        """The shell could not journal the ``part`` :class:`Commit` of ``work_id`` (its result is
        too large for a record): it takes the retry path (``source=invalid-result``, kind
        ``result-too-large``), as :meth:`commit_refused` does for a whole dispatch's item."""
        self._n.invalid_result_rollbacks += 1
        item = self.ledger.items[work_id]
        self._unlease(item, token)
        return [
            self._retry_or_defer(item, token, SOURCE_INVALID_RESULT, "result-too-large", error),
            self._require_snapshot(f"commit of {work_id} under {token} refused"),
        ]

    def commit_done(self, token: Token) -> list[Decision]:
        """The shell journaled the :class:`Commit` for ``token``: the work ID is committed."""
        tx = self._open_tx(token)
        advance(tx, TxEvent.COMMITTED)
        items = tx.items
        self.ledger.apply(Committed(token, tx.rank, tuple(map(_work_id, items))))
        self._n.commits += len(items)
        if self._leases:  # (no item holds a lease in most campaigns)
            for item in items:
                self._unlease(item, token)
        return self._free_rank_if_done(tx)

    def commit_refused(self, token: Token, work_id: str, error: str) -> list[Decision]:
        """The shell could not journal the :class:`Commit` of ``work_id`` (its result is too large
        for a journal record, say): the item leaves the dispatch through the retry path
        (``source=invalid-result``, kind ``result-too-large``, charged one attempt), as if the
        worker had reported it failed; the dispatch's other items are unaffected.

        Raises:
            UsageError: ``token`` is not COMMITTING, or ``work_id`` is not one of its items.
        """
        tx = self._open_tx(token)
        if tx.state is not TxState.COMMITTING:
            raise UsageError(f"{token} is {tx.state.value}, not COMMITTING")
        item = next((w for w in tx.items if w.work_id == work_id), None)
        if item is None:
            raise UsageError(f"{work_id!r} is not committing under {token}")
        self._unlease(item, token)
        tx.items = tuple(w for w in tx.items if w is not item)
        self._n.invalid_result_rollbacks += 1
        out = [
            self._retry_or_defer(item, token, SOURCE_INVALID_RESULT, "result-too-large", error),
            self._require_snapshot(f"commit of {work_id} under {token} refused"),
        ]
        if not tx.items:
            advance(tx, TxEvent.EMPTIED)
            out += self._free_rank_if_done(tx)
        return out

    def on_heartbeat(self, rank: int, token: object, now: float) -> list[Decision]:
        """A HEARTBEAT: a current one pushes the deadline to ``now + lease``."""
        if self._ranks.suspect_until:  # a message from a suspect rank clears it
            self._ranks.heard(rank)
        found = self._resolve(rank, token, "HEARTBEAT")
        if not isinstance(found, Transaction):
            return found
        tx = found
        if tx.state is not TxState.DISPATCHED or self._ranks.current(rank) is not tx:
            return self._classify_not_current(rank, tx.token, "HEARTBEAT")
        self._n.heartbeats += 1
        lease = self.lease_for(tx.items)
        if self.watchdog.enabled and lease > 0:  # U9: an item's own timeout is not extended
            deadline = now + lease
            if tx.deadline is None or deadline > tx.deadline:
                tx.deadline = deadline
                tx.beaten = True
                self._push_deadline(deadline, tx.token)
        return []

    def _fit_open_deadlines(self) -> None:
        """The adaptive rule has just fitted its first deadline: a dispatch sent under the cap
        gets the fitted deadline too (counted from its send), so a hang early in a campaign is
        recovered at a few task times, not at the cap. One whose heartbeat extended it keeps
        its deadline (it said it is alive). Once per master, O(dispatches in flight)."""
        for tx in self._ranks.busy().values():
            if tx.state is not TxState.DISPATCHED or tx.beaten or tx.sent_at is None:
                continue
            fitted = tx.sent_at + self.allowed_seconds(tx.items)
            if tx.deadline is not None and fitted < tx.deadline:
                tx.deadline = fitted
                self._push_deadline(fitted, tx.token)


def _whole_failure(
    n: int,
    results: Sequence[Any] | None,
    errors: Mapping[int, str | ItemFailure] | None,
    failure: str | ItemFailure | None,
) -> ItemFailure | None:
    """Why a RESULT for a dispatch of ``n`` items fails as a whole, or None when its good items
    can commit: no results (the worker's ``failure``, else a malformed payload), entries that do
    not match the dispatch, or the one item of a one-item dispatch failed."""
    malformed = "malformed-result"
    if results is None:
        return _failure(failure or "malformed result payload", malformed)
    if len(results) != n:
        return ItemFailure(malformed, f"{len(results)} result(s) for a dispatch of {n} item(s)")
    if errors and not all(type(i) is int and 0 <= i < n for i in errors):
        return ItemFailure(malformed, f"an error entry names no item of the {n}")
    if errors and n == 1:
        return _failure(errors[0], "error")  # failed alone: the READY joins it (W3)
    return None


def _failure(given: str | ItemFailure, kind: str) -> ItemFailure:
    """``given`` as an :class:`ItemFailure`: a plain string is of ``kind``; a kind a worker may
    not report is ``malformed-result`` (a worker cannot choose an unknown budget)."""
    if not isinstance(given, ItemFailure):
        return ItemFailure(kind, str(given))
    if given.kind not in WORKER_FAILURE_KINDS:
        return ItemFailure("malformed-result", f"unknown failure kind {given.kind!r}: {given}")
    return given
