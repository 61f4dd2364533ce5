"""The sans-I/O dispatch core: reservations, tokens, watchdog, parked-rank gate, retry ledger.

Theory of operation. The core never reads a clock, a file, the environment or MPI: the shell passes
``now`` (a monotonic float) and the messages it received, and the core returns :mod:`decisions
<durable_dispatch.core.decisions>`. One loop turn of the shell (W3) is::

    for rank, token in readies:   decisions += core.on_ready(rank, token, now)        # 1. READY
    while (d := core.reserve(now)) is not None:                                       # 2. dispatch
        if isinstance(d, PersistSnapshot): persist(); core.snapshot_persisted(); continue
        ok = send(d.rank, d.token, d.items)           # then, once the send returned:
        decisions += core.mark_dispatched(d.token, now) if ok else core.send_failed(d.token, now)
    for rank, token, result in results: decisions += core.on_result(rank, token, result, now)  # 3.
    decisions += core.join_invalid(now)                                               # 4. join
    decisions += core.sweep(now)                                                      # 5. sweep

Each dispatch is a reservation transaction ``PREPARING -> DISPATCHED -> COMMITTING -> CLOSED`` (or
``ROLLED_BACK``). Its deadline starts only at ``mark_dispatched`` (W1) and lives in a heap, so a
sweep with nothing expired costs the same at 10 or 100,000 transactions in flight. A timeout is a
suspicion: the task moves at once (requeued or deferred under its work ID, W5), but the rank is
parked until a READY with its exact retired token proves the old generation is over (W6, W7). Late
messages are classified (current, stale, unowned, malformed, duplicate) and only a current RESULT
can commit (W8). Every rollback sets "snapshot required", and :meth:`Dispatcher.reserve` returns
:class:`PersistSnapshot` before any further :class:`Send` until the shell confirms it (S8).

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
Reading order. This module is :class:`Dispatcher`: set-up, dispatch, messages, join and sweep,
and the two shared paths every failure takes (:meth:`Dispatcher._roll_back` and
:meth:`Dispatcher._retry_or_defer`). A transaction's states and the one table of their
transitions are in :mod:`transactions <durable_dispatch.core.transactions>`, the counters and
:class:`DispatchStats` in :mod:`stats <durable_dispatch.core.stats>`.
A rank's state (idle, busy, parked, lost) is :class:`~durable_dispatch.core.ranks.RankState` in
:mod:`ranks <durable_dispatch.core.ranks>`; the watchdog's deadlines are a
:class:`~durable_dispatch.core.watchdog.DeadlineHeap`; the durable facts are a
:class:`~durable_dispatch.core.ledger.Ledger`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from ..errors import UsageError
from ..tokens import Token
from .config import WORKER_FAILURE_KINDS, RetryPolicy, WatchdogConfig
from .deadlines import DeadlinePolicy
from .decisions import (
    SOURCE_INVALID_RESULT,
    SOURCE_MASTER_RESTART,
    SOURCE_RANK_LOST,
    SOURCE_SEND_FAILURE,
    SOURCE_WATCHDOG,
    Classification,
    Commit,
    Decision,
    Defer,
    ItemFailure,
    Park,
    PersistSnapshot,
    Quarantine,
    Release,
    Requeue,
    Send,
    WorkItem,
)
from .events import (
    Committed,
    Dispatched,
    EpochStarted,
    Event,
    RequeuedDeferred,
    Submitted,
    of_decision,
)
from .ledger import Ledger
from .ranks import Ranks, RankState
from .stats import Counters, DispatchStats
from .transactions import Transaction, TxEvent, TxState, WorkStatus, advance
from .watchdog import DeadlineHeap, ObservedClock

__all__ = [
    "Dispatcher",
    "TxState",
    "TxEvent",
    "Transaction",
    "DispatchStats",
    "WorkStatus",
    "RankState",
]


_D = TypeVar("_D", bound=Decision)


# ------------------------------------------------------------------------------ the core
class Dispatcher:
    """The dispatch state machine. See the module docs for the turn order.

    Its durable state is a :class:`~durable_dispatch.core.ledger.Ledger` (:attr:`ledger`), changed
    only by the events of its decisions (``events.of_decision``), which the shell journals: replay
    folds the same events into the same model. The rest (ranks, transactions, leases, deadlines,
    counters) lives only in memory (W2).

    Args:
        epoch: this master run's epoch (from durable state; increases at every start).
        watchdog: deadlines (``WatchdogConfig()`` by default).
        retry: retry budgets (``RetryPolicy()`` by default).
        ranks: worker ranks that start idle.
        starting: the ranks start STARTING instead: none gets work until its first READY
            without a token says it is up (an MPI worker sends it once its isolated child is
            running), so no deadline runs while a worker starts.
    """

    def __init__(
        self,
        epoch: int = 1,
        watchdog: WatchdogConfig | None = None,
        retry: RetryPolicy | None = None,
        ranks: Iterable[int] = (),
        *,
        starting: bool = False,
    ) -> None:
        if not isinstance(epoch, int) or epoch < 0:
            raise UsageError(f"epoch must be an integer >= 0, got {epoch!r}")
        for name, value, want in (
            ("watchdog", watchdog, WatchdogConfig),
            ("retry", retry, RetryPolicy),
        ):
            if value is not None and not isinstance(value, want):
                raise UsageError(
                    f"{name} must be a {want.__name__} (or None), got {type(value).__name__}"
                )
        self.watchdog = watchdog or WatchdogConfig()
        self.retry = retry or RetryPolicy()
        #: the durable facts (frontier, in flight, committed, deferred, failures, solo marks)
        self.ledger = Ledger(epoch)
        self._ranks: Ranks[Transaction] = Ranks()
        self._open: dict[str, Transaction] = {}  # wire form of the token -> open transaction
        self._leases: dict[tuple[str, str], Token] = {}
        self._deadlines = DeadlineHeap()
        #: the shell reads its monotonic clock through this (U7: a master pause is not held
        #: against the workers); the core never reads a clock itself
        self.clock = ObservedClock()
        self._snapshot_required: str | None = None
        self._n = Counters()
        #: the deadline policy: a dispatch's time, the heartbeat lease, the adaptive rule
        self.policy = DeadlinePolicy(self.watchdog)
        for r in ranks:
            self.add_rank(r, starting=starting)

    @property
    def epoch(self) -> int:
        """This master run's epoch."""
        return self.ledger.epoch

    # ----------------------------------------------------------------- set-up
    def add_rank(self, rank: int, *, starting: bool = False) -> None:
        """Make ``rank`` a worker that starts idle, or STARTING (``starting``: it gets work
        once its first READY without a token arrives)."""
        if not isinstance(rank, int) or rank < 0:
            raise UsageError(f"rank must be an integer >= 0, got {rank!r}")
        if self._ranks.is_live(rank):
            raise UsageError(f"rank {rank} was already added")
        self._ranks.add(rank, starting=starting)

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
        rank = self._ranks.lowest_idle()
        if rank is None or not ledger.frontier:
            return None
        first = self._first_free_item()
        if first is None:
            return None
        token = Token(self.epoch, ledger.counter + 1)
        if first.leases:
            self._lease(first, token)
        items = [first]
        if max_items > 1 and first.work_id not in ledger.solo:
            # the items that follow at the head of the frontier (none when ``first`` was found
            # behind a head whose lease is taken: that head stops the run at once)
            for wid in ledger.frontier.first(max_items + 1):
                if len(items) == max_items:
                    break
                if wid == first.work_id:
                    continue
                head = ledger.items[wid]
                if wid in ledger.solo or (head.leases and not self._leases_free(head)):
                    break
                if head.leases:
                    self._lease(head, token)
                items.append(head)
        chosen = tuple(items)
        wire = str(token)
        tx = Transaction(token, rank, chosen, wire=wire)
        self._ranks.start(rank, tx)
        self._open[wire] = tx
        n = self._n
        n.dispatches += 1
        n.dispatched_items += len(chosen)
        policy = self.policy
        if policy.enabled:
            tx.seconds = self.allowed_seconds(chosen)
        attempts = ledger.attempts
        # The event the core applies now and the shell journals (one model, made once).
        ev = Dispatched(token, rank, tuple([w.work_id for w in chosen]))
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
        head = items[self.ledger.frontier.head()]  # type: ignore[index]
        if not head.leases:
            return head
        for wid in self.ledger.frontier:
            if self._leases_free(items[wid]):
                return items[wid]
        return None

    def _leases_free(self, item: WorkItem) -> bool:
        return all((k, v) not in self._leases for k, v in item.leases.items())

    def _lease(self, item: WorkItem, token: Token) -> None:
        for k, v in item.leases.items():
            self._leases[(k, v)] = token

    def _unlease(self, item: WorkItem, token: Token) -> None:
        """``item`` no longer holds its leases (its ledger entry moves with its event)."""
        for k, v in item.leases.items():
            if self._leases.get((k, v)) == token:
                del self._leases[(k, v)]

    def mark_dispatched(self, token: Token, now: float) -> list[Decision]:
        """The WORK send for ``token`` returned: the deadline starts now (W1)."""
        tx = self._open_tx(token)
        advance(tx, TxEvent.SENT)
        tx.sent_at = now
        if self.watchdog.enabled:
            seconds = tx.seconds if tx.seconds is not None else self.allowed_seconds(tx.items)
            tx.deadline = now + seconds  # what the Send told the worker
            self._deadlines.push(tx.deadline, token)
        return []

    def auto_batch(self) -> int:
        """How many items the next dispatch carries under ``batch="auto"``
        (:meth:`DeadlinePolicy.auto_batch`)."""
        return self.policy.auto_batch()

    def allowed_seconds(self, items: Sequence[WorkItem]) -> float:
        """A dispatch's time (:meth:`DeadlinePolicy.allowed_seconds`); the shell sends it with
        the WORK."""
        return self.policy.allowed_seconds(items)

    def deadline_seconds(self) -> float:
        """The deadline an item without its own timeout gets now
        (:meth:`DeadlinePolicy.deadline_seconds`)."""
        return self.policy.deadline_seconds()

    def lease_seconds(self) -> float:
        """How far a HEARTBEAT pushes a deadline now (:meth:`DeadlinePolicy.lease_seconds`)."""
        return self.policy.lease_seconds()

    def lease_for(self, items: Sequence[WorkItem]) -> float:
        """How far a HEARTBEAT pushes the deadline of a dispatch of ``items``
        (:meth:`DeadlinePolicy.lease_for`); the shell sends it with the WORK."""
        return self.policy.lease_for(items)

    def send_failed(self, token: Token, now: float, error: str = "send failed") -> list[Decision]:
        """The WORK send for ``token`` failed: the same compensation path as a timeout (W4)."""
        tx = self._open_tx(token)
        if tx.state is not TxState.PREPARING:
            raise UsageError(f"{token} is {tx.state.value}, not PREPARING")
        self._n.send_failures += 1
        return self._roll_back(tx, SOURCE_SEND_FAILURE, "send-failure", error, RankState.PARKED)

    def snapshot_persisted(self) -> None:
        """The shell wrote the snapshot a :class:`PersistSnapshot` asked for."""
        self._snapshot_required = None

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
        tx = self._open.get(token) if type(token) is str else None
        if (tx is None or tx.rank != rank) and self._ranks.is_live(rank):
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
        other. A one-item dispatch with an error, and a RESULT whose entries do not match the
        dispatch, fail as a whole: the READY that follows rolls back the whole dispatch with
        that kind (:meth:`join_invalid`).
        """
        found = self._resolve(rank, token, "RESULT")
        if not isinstance(found, Transaction):
            return found
        tx = found
        if tx.state in (TxState.COMMITTING, TxState.CLOSED):
            return self._quarantine(rank, "RESULT", Classification.DUPLICATE, "second RESULT")
        whole = _whole_failure(len(tx.items), results, errors, failure)
        if whole is not None:
            tx.failure = whole
            if whole.kind == "malformed-result":
                return self._quarantine(rank, "RESULT", Classification.MALFORMED, whole.reason)
            # The worker said why it failed: the READY that follows rolls it back. It may first
            # restart its isolated child, so its deadline is now the watchdog's for that READY.
            if self.watchdog.enabled and tx.state is TxState.DISPATCHED:
                tx.deadline = now + self.watchdog.seconds
                self._deadlines.push(tx.deadline, tx.token)
            return []
        assert results is not None
        advance(tx, TxEvent.RESULT)
        if tx.sent_at is not None and self.policy.observe(tx.items, now - tx.sent_at):
            self._fit_open_deadlines()
        out: list[Decision] = []
        keep: list[WorkItem] = []
        failed: list[tuple[WorkItem, ItemFailure]] = []
        dups: list[WorkItem] = []
        flying, committed = self.ledger.in_flight, self.ledger.committed
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
        for item, bad in failed:
            self._n.invalid_result_rollbacks += 1
            out.append(
                self._retry_or_defer(item, tx.token, SOURCE_INVALID_RESULT, bad.kind, bad.reason)
            )
        if failed:
            out.append(
                self._require_snapshot(f"items of {tx.token} failed ({SOURCE_INVALID_RESULT})")
            )
        for _ in dups:
            self._n.duplicate_commits_ignored += 1
            out += self._quarantine(
                rank, "RESULT", Classification.DUPLICATE, "work ID already committed"
            )
        if not keep:
            advance(tx, TxEvent.EMPTIED)
        return out + self._free_rank_if_done(tx)  # READY already seen: the rank is free now

    def commit_done(self, token: Token) -> list[Decision]:
        """The shell journaled the :class:`Commit` for ``token``: the work ID is committed."""
        tx = self._open_tx(token)
        advance(tx, TxEvent.COMMITTED)
        items = tx.items
        self.ledger.apply(Committed(token, tx.rank, tuple([w.work_id for w in items])))
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
                self._deadlines.push(deadline, tx.token)
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
                self._deadlines.push(fitted, tx.token)

    # ------------------------------------------------------- join and sweep
    def join_invalid(self, now: float) -> list[Decision]:
        """Roll back every generation whose current READY came without a valid RESULT (W3 step 4).

        The worker finished (READY) but its result was lost or broken: the task is recovered through
        the shared retry path with ``source=invalid-result`` and the rank goes back to idle.
        """
        out: list[Decision] = []
        busy = self._ranks.busy()
        for rank in sorted(busy):
            tx = busy[rank]
            if tx.ready_seen and tx.state is TxState.DISPATCHED:
                f = tx.failure or ItemFailure("missing-result", "READY without RESULT")
                self._n.invalid_result_rollbacks += 1
                out += self._roll_back(tx, SOURCE_INVALID_RESULT, f.kind, f.reason, RankState.IDLE)
        return out

    def expired(self, now: float) -> list[tuple[int, Token]]:
        """A sorted snapshot of ``(rank, exact token)`` of dispatches past their deadline.

        Generations whose current READY was already seen are not included (W3). Cost: O(1) when
        nothing expired, O(k log n) for k expired entries.
        """
        out: list[tuple[int, Token]] = []
        for token in self._deadlines.due(now, self._deadline_stands):
            tx = self._open[str(token)]
            if not tx.ready_seen:
                out.append((tx.rank, token))
        return sorted(out)

    def _deadline_stands(self, token: Token, deadline: float) -> bool:
        tx = self._open.get(str(token))
        return tx is not None and tx.state is TxState.DISPATCHED and tx.deadline == deadline

    def sweep(self, now: float) -> list[Decision]:
        """Roll back every expired dispatch and park its rank (W3 step 5, W4, W6).

        Nothing is judged while :attr:`clock` holds (U7: after a master pause, until the shell
        has drained what arrived during it)."""
        out: list[Decision] = []
        if self.clock.hold:
            return out
        for _rank, token in self.expired(now):
            tx = self._open[str(token)]
            self._n.dispatch_watchdog_timeouts += 1
            out += self._roll_back(
                tx, SOURCE_WATCHDOG, "timeout", "deadline passed", RankState.PARKED
            )
        return out

    def rank_lost(self, rank: int, now: float, error: str = "rank lost") -> list[Decision]:
        """The runtime reported ``rank`` dead (ULFM): roll back its dispatch now, drop the rank."""
        if not self._ranks.is_live(rank):
            raise UsageError(f"unknown rank {rank}")
        out: list[Decision] = []
        tx = self._ranks.current(rank)
        self._n.ranks_lost += 1
        if tx is not None and tx.state in (TxState.PREPARING, TxState.DISPATCHED):
            out += self._roll_back(tx, SOURCE_RANK_LOST, "lost-rank", error, RankState.LOST)
        else:
            self._ranks.lose(rank)
        return out

    # ------------------------------------------------ deferral bookkeeping
    def defer_recorded(self, work_id: str, persisted: bool) -> None:
        """Report the outcome of a :class:`Defer`: on disk, or held in memory after a fault."""
        if work_id not in self.ledger.deferred:
            raise UsageError(f"{work_id!r} is not deferred")
        if persisted:
            self._n.protocol_deferred_dispatches += 1
        else:
            self._n.deferred_in_memory += 1

    def defer_persisted_later(self, count: int = 1) -> None:
        """``count`` deferrals held in memory were since written durably (after a restore)."""
        count = min(count, self._n.deferred_in_memory)
        self._n.deferred_in_memory -= count
        self._n.protocol_deferred_dispatches += count

    def requeue_deferred(self, work_id: str) -> None:
        """Put a deferred item back at the end of the frontier (an operator's decision)."""
        if work_id not in self.ledger.deferred:
            raise UsageError(f"{work_id!r} is not deferred")
        self._apply(RequeuedDeferred(work_id))

    # ------------------------------------------- the paths every failure takes
    def _roll_back(
        self, tx: Transaction, source: str, kind: str, error: str, then: RankState
    ) -> list[Decision]:
        """The one compensation path: timeout, invalid result, send failure, rank lost (W4, S8).

        The rank goes to ``then``: PARKED (timeout, send failure: only its exact READY proves
        the old generation over), IDLE (it said READY) or LOST.
        """
        advance(tx, TxEvent.ROLLED_BACK)
        for item in tx.items:
            self._unlease(item, tx.token)
        del self._open[tx.wire]
        out: list[Decision] = []
        if then is RankState.PARKED:
            self._ranks.park(tx.rank, tx.token)
            out.append(Park(tx.rank, tx.token, source))
        elif then is RankState.IDLE:
            self._ranks.finish(tx.rank, tx.token)
        else:
            self._ranks.lose(tx.rank)
        if len(tx.items) == 1:
            out.append(self._retry_or_defer(tx.items[0], tx.token, source, kind, error))
        else:  # which item failed is unknown: each goes back uncharged, to run alone (W5)
            # last item first: each goes to the front, so the frontier keeps the dispatch's
            # order (and replay, applying the journaled events in this order, gets the same)
            out += [
                self._requeue_alone(w, tx.token, source, kind, error) for w in reversed(tx.items)
            ]
        out.append(self._require_snapshot(f"rollback of {tx.token} ({source})"))
        return out

    def _requeue_alone(
        self, item: WorkItem, token: Token, source: str, kind: str, error: str
    ) -> Decision:
        """Requeue one item of a failed multi-item dispatch at the front, uncharged; from now on
        it is dispatched alone, where a failure is charged to it."""
        wid = item.work_id
        self._n.batch_splits += 1
        attempts = self.ledger.attempts.get(wid, 0)
        return self._record(Requeue(wid, token, source, kind, attempts, error, split=True))

    def _retry_or_defer(
        self, item: WorkItem, token: Token, source: str, kind: str, error: str
    ) -> Decision:
        """The shared retry path (W5): requeue at the front, or defer after the budget."""
        wid = item.work_id
        ledger = self.ledger
        if source == SOURCE_MASTER_RESTART:
            self._n.master_restart_rollbacks += 1
            return self._record(Requeue(wid, token, source, kind, ledger.attempts.get(wid, 0)))
        n = ledger.attempts.get(wid, 0) + 1
        if n <= self.retry.retries_for(kind):
            self._n.protocol_requeued_dispatches += 1
            return self._record(Requeue(wid, token, source, kind, n, error))
        kinds = (*ledger.kinds.get(wid, ()), kind)
        return self._record(Defer(item, token, source, n, kinds, error))

    def _require_snapshot(self, reason: str) -> PersistSnapshot:
        """No dispatch until the shell persisted a snapshot (S8)."""
        self._snapshot_required = reason
        return PersistSnapshot(reason)

    # ----------------------------------------------------------- internals
    def _record(self, d: _D) -> _D:
        """Apply the durable event of decision ``d`` to the ledger (the shell journals the same
        event); returns ``d``."""
        ev = of_decision(d)
        assert ev is not None, d
        self.ledger.apply(ev)
        return d

    def _apply(self, ev: Event) -> None:
        self.ledger.apply(ev)

    def _open_tx(self, token: Token) -> Transaction:
        tx = self._open.get(str(token))
        if tx is None:
            raise UsageError(f"no open transaction has token {token}")
        return tx

    def _quarantine(
        self, rank: int, message: str, cls: Classification, reason: str
    ) -> list[Decision]:
        self._n.by_class(cls)[message] += 1
        return [Quarantine(rank, message, cls, reason)]

    def _classify_not_current(self, rank: int, t: Token, message: str) -> list[Decision]:
        """A well-formed token that names no current transaction of ``rank``: stale when it is
        older (an earlier epoch, or retired by the rank), else unowned."""
        if t.epoch < self.epoch or self._ranks.retired(rank, t):
            return self._quarantine(rank, message, Classification.STALE, "older token")
        return self._quarantine(rank, message, Classification.UNOWNED, "no transaction owns it")

    def _free_rank_if_done(self, tx: Transaction) -> list[Decision]:
        """A generation whose READY was seen frees its rank as soon as its result was accepted.

        The endpoint is free even while the commit is still being made durable (``COMMITTING``):
        the work ID stays leased to the transaction until ``commit_done``, but the rank may take
        new work, so a group commit never stalls the workers.
        """
        if not tx.ready_seen or tx.state not in (TxState.COMMITTING, TxState.CLOSED):
            return []
        if self._ranks.current(tx.rank) is tx:
            self._ranks.finish(tx.rank, tx.token)
        if tx.state is TxState.CLOSED:
            self._open.pop(tx.wire, None)
        return []

    # ------------------------------------------------------------- queries
    def status(self, work_id: str) -> WorkStatus | None:
        """Where ``work_id`` is, or None if the core never saw it."""
        ledger = self.ledger
        if work_id in ledger.committed:
            return WorkStatus.COMMITTED
        if work_id in ledger.in_flight:
            return WorkStatus.IN_FLIGHT
        if work_id in ledger.deferred:
            return WorkStatus.DEFERRED
        if work_id in ledger.frontier:
            return WorkStatus.PENDING
        return None

    @property
    def done(self) -> bool:
        """True when nothing is pending or in flight (everything committed or deferred)."""
        return not self.ledger.frontier and not self.ledger.in_flight

    @property
    def snapshot_required(self) -> bool:
        """True while a rollback waits for its snapshot (no dispatch until then)."""
        return self._snapshot_required is not None

    def live_ranks(self) -> list[int]:
        """Every worker rank not lost (idle, busy or parked), sorted."""
        return self._ranks.live()

    def idle_ranks(self) -> list[int]:
        """Idle ranks, sorted."""
        return self._ranks.idle()

    def starting_ranks(self) -> int:
        """How many ranks have not said their first READY yet (STARTING)."""
        return self._ranks.count(RankState.STARTING)

    def parked_ranks(self) -> dict[int, Token]:
        """Parked ranks and the exact token that releases each."""
        return self._ranks.parked()

    def rank_state(self, rank: int) -> RankState | None:
        """Where ``rank`` is (idle, busy, parked, lost), or None for a rank never added."""
        return self._ranks.state(rank)

    def in_flight(self) -> dict[str, Token]:
        """Work ID -> token of every open transaction."""
        return {w: t for w, (t, _) in self.ledger.in_flight.items()}

    def transaction(self, token: Token) -> Transaction | None:
        """The open transaction with ``token`` (for inspection; do not mutate)."""
        return self._open.get(str(token))

    def lease_holder(self, table: str, key: str) -> Token | None:
        """The token holding side-table entry ``table[key]``, or None."""
        return self._leases.get((table, key))

    def committed(self) -> frozenset[str]:
        """Committed work IDs."""
        return frozenset(self.ledger.committed)

    def deferred(self) -> dict[str, WorkItem]:
        """Deferred work items by work ID."""
        return dict(self.ledger.deferred)

    def pending(self) -> list[str]:
        """Pending work IDs in frontier order."""
        return list(self.ledger.frontier)

    def attempts(self, work_id: str) -> int:
        """Failures charged to ``work_id`` so far."""
        return self.ledger.attempts.get(work_id, 0)

    def statistics(self) -> DispatchStats:
        """An immutable snapshot of every counter and gauge."""
        return DispatchStats(
            **self._n.values(),
            parked_ranks_now=self._ranks.count(RankState.PARKED),
            starting_ranks_now=self._ranks.count(RankState.STARTING),
            idle_ranks_now=self._ranks.count(RankState.IDLE),
            busy_ranks_now=self._ranks.count(RankState.BUSY),
            in_flight_now=len(self.ledger.in_flight),
            pending_now=len(self.ledger.frontier),
            deferred_now=len(self.ledger.deferred),
            auto_batch_now=self.auto_batch(),
            watchdog_enabled=self.watchdog.enabled,
            watchdog_seconds=self.watchdog.seconds,
            watchdog_deadline_now=self.deadline_seconds() if self.watchdog.enabled else 0.0,
            config_corrections=len(self.watchdog.corrections),
            master_pauses=self.clock.pauses,
            master_paused_seconds=self.clock.paused_seconds,
        )

    # ------------------------------------------------------ durable state
    def snapshot(self, committing: Iterable[str] = ()) -> dict[str, Any]:
        """The durable part of the state as a JSON-ready dict (deadlines are never saved, W2):
        :meth:`Ledger.to_snapshot <durable_dispatch.core.ledger.Ledger.to_snapshot>`.

        In-flight dispatches are saved with their work so that :meth:`restore` can roll them back.
        """
        return self.ledger.to_snapshot(frozenset(committing))

    @classmethod
    def restore(
        cls,
        state: Mapping[str, Any] | Ledger,
        *,
        epoch: int,
        watchdog: WatchdogConfig | None = None,
        retry: RetryPolicy | None = None,
        ranks: Iterable[int] = (),
        starting: bool = False,
    ) -> tuple[Dispatcher, list[Decision]]:
        """Rebuild a core for a new master ``epoch`` from :meth:`snapshot` output or from a
        ledger that replay built (which it takes over).

        Every dispatch that was in flight is rolled back to the front of the frontier without
        charging a retry (the fault was the master's); its token's epoch is older than ``epoch``,
        so any late message from it is stale.

        Raises:
            UsageError: ``epoch`` is not greater than the saved one.
        """
        ledger = state if isinstance(state, Ledger) else Ledger.from_snapshot(state)
        if epoch <= ledger.epoch:
            raise UsageError(f"new epoch {epoch} must be greater than {ledger.epoch}")
        d = cls(epoch, watchdog, retry, ranks, starting=starting)
        d.ledger = ledger
        ledger.apply(EpochStarted(epoch))
        out: list[Decision] = []
        for wid, (token, _rank) in reversed(list(ledger.in_flight.items())):
            item = ledger.items[wid]
            restart = SOURCE_MASTER_RESTART
            out.append(d._retry_or_defer(item, token, restart, "master-restart", "restart"))
        return d, out


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
