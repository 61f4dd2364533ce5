"""Hypothesis state machine: random interleavings against the dispatch core, checked by a model.

The world: worker ranks that may be slow, silent, lying or late; a network that may deliver any
message any number of times; a clock that jumps. The reference model follows the decisions and
checks the invariants after every step: a parked rank never receives work; every work ID is exactly
one of pending, in flight, committed or deferred (never lost, never committed twice); at most one
current dispatch per work ID; the counters add up. Dispatches carry one to three items, RESULTs may
report errors for some of them or have the wrong number of entries; an item split out of a failed
multi-item dispatch is never charged for it and is dispatched alone afterwards.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from durable_dispatch.core import (
    Commit,
    Decision,
    Defer,
    Dispatcher,
    Park,
    PersistSnapshot,
    Release,
    Requeue,
    RetryPolicy,
    Send,
    Token,
    WatchdogConfig,
    WorkItem,
    WorkStatus,
)

from .helpers import each_commit

RANKS = (1, 2, 3)
WORK = [f"w{i}" for i in range(6)]


class DispatchMachine(RuleBasedStateMachine):
    @initialize(
        retries=st.integers(0, 2),
        seconds=st.sampled_from([0.0, 5.0, 10.0]),
        adaptive=st.booleans(),
    )
    def setup(self, retries: int, seconds: float, adaptive: bool) -> None:
        # The adaptive rule (issue 19) moves deadlines, never the invariants.
        fit = {"quantile": 0.5, "multiple": 2.0, "floor": 0.5, "min_samples": 2}
        wd = (
            WatchdogConfig(seconds, **fit)
            if adaptive
            else WatchdogConfig(seconds, heartbeat_lease=7.0 if seconds else None)
        )
        self.d = Dispatcher(
            epoch=1,
            watchdog=wd,
            retry=RetryPolicy(retries),
            ranks=RANKS,
        )
        self.d.submit(WorkItem(w) for w in WORK)
        self.now = 0.0
        # The model.
        self.parked: dict[int, Token] = {}
        self.committed: set[str] = set()
        self.deferred: set[str] = set()
        self.live: dict[str, Token] = {}  # work_id -> the one current token
        self.token_work: dict[Token, tuple[str, ...]] = {}
        self.token_rank: dict[Token, int] = {}
        self.preparing: list[Token] = []
        self.sent: list[Token] = []  # every token that reached a worker (messages may echo it)
        self.committing: list[list[Commit]] = []  # the Commits of one dispatch per entry
        self.rollbacks = 0
        self.requeues = 0
        self.splits = 0
        self.items_sent = 0
        self.solo: set[str] = set()
        self.charged: dict[str, int] = {}
        self.defers = 0

    # ----------------------------------------------------------------- the model
    def apply(self, decisions: list[Decision]) -> None:
        group: list[Commit] = []
        ended = False
        for x in each_commit(decisions):  # (a Commits: one Commit per item, in its place)
            if isinstance(x, Commit):
                assert x.work_id not in self.committed, "committed twice"
                pending = {c.work_id for g in self.committing for c in g}
                assert x.work_id not in pending, "two commits"
                assert self.live.get(x.work_id) == x.token, "commit of a non-current dispatch"
                if group:
                    assert group[-1].token == x.token, "Commits of two dispatches in one answer"
                    assert not ended, "the Commits of one dispatch are not next to each other"
                group.append(x)
                continue
            ended = bool(group)
            if isinstance(x, Park):
                assert x.rank not in self.parked
                self.parked[x.rank] = x.token
            elif isinstance(x, Release):
                assert self.parked.pop(x.rank) == x.token
            elif isinstance(x, (Requeue, Defer)):
                wid = x.work_id if isinstance(x, Requeue) else x.work.work_id
                assert self.live.get(wid) == x.token, "rollback of a non-current dispatch"
                del self.live[wid]
                self.rollbacks += 1
                if isinstance(x, Requeue) and x.split:
                    assert len(self.token_work[x.token]) > 1, "a one-item dispatch was split"
                    assert x.attempts == self.charged.get(wid, 0), "a split was charged"
                    self.splits += 1
                    self.solo.add(wid)
                    continue
                self.charged[wid] = self.charged.get(wid, 0) + 1
                assert x.attempts == self.charged[wid]
                if isinstance(x, Defer):
                    self.defers += 1
                    self.deferred.add(wid)
                    self.solo.discard(wid)
                    self.d.defer_recorded(wid, persisted=True)
                else:
                    self.requeues += 1
            elif isinstance(x, PersistSnapshot):
                pass
        if group:
            self.committing.append(group)  # made durable later (group commit)

    # --------------------------------------------------------------------- rules
    @rule(ok=st.booleans(), k=st.integers(1, 3))
    def dispatch(self, ok: bool, k: int) -> None:
        r = self.d.reserve(self.now, max_items=k)
        if isinstance(r, PersistSnapshot):
            self.d.snapshot_persisted()
            return
        if r is None:
            return
        assert isinstance(r, Send)
        assert r.rank not in self.parked, "a parked rank received work"
        assert 1 <= len(r.items) <= k
        wids = tuple(w.work_id for w in r.items)
        assert len(set(wids)) == len(wids)
        if len(wids) > 1:
            assert not self.solo & set(wids), "a split item went out with others"
        for wid in wids:
            assert wid not in self.committed and wid not in self.deferred
            assert wid not in self.live, "two current dispatches of one work ID"
            self.live[wid] = r.token
        self.items_sent += len(wids)
        self.token_work[r.token] = wids
        self.token_rank[r.token] = r.rank
        if ok:
            self.apply(self.d.mark_dispatched(r.token, self.now))
            self.sent.append(r.token)
        else:
            self.apply(self.d.send_failed(r.token, self.now))

    @precondition(lambda self: self.sent)
    @rule(
        i=st.integers(0, 10**6),
        valid=st.booleans(),
        from_rank=st.sampled_from((None, *RANKS)),
        errors=st.sets(st.integers(0, 3), max_size=3),
        extra=st.sampled_from([0, 0, 0, 1, -1]),
    )
    def result(
        self, i: int, valid: bool, from_rank: int | None, errors: set[int], extra: int
    ) -> None:
        token = self.sent[i % len(self.sent)]
        rank = self.token_rank[token] if from_rank is None else from_rank
        n = len(self.token_work[token]) + extra
        if n == 1 and not errors and not extra:
            self.apply(self.d.on_result(rank, str(token), {"r": 1}, self.now, valid=valid))
            return
        values = [{"r": j} for j in range(max(n, 0))] if valid else None
        errs = {j: f"item {j} failed" for j in errors}
        self.apply(self.d.on_results(rank, str(token), values, self.now, errors=errs))

    @precondition(lambda self: self.sent)
    @rule(i=st.integers(0, 10**6), how=st.sampled_from(["exact", "missing", "malformed", "other"]))
    def ready(self, i: int, how: str) -> None:
        token = self.sent[i % len(self.sent)]
        rank = self.token_rank[token]
        value: Any = {
            "exact": str(token),
            "missing": None,
            "malformed": "e?-1",
            "other": str(Token(1, token.n + 1000)),
        }[how]
        self.apply(self.d.on_ready(rank, value, self.now))

    @precondition(lambda self: self.sent)
    @rule(i=st.integers(0, 10**6))
    def heartbeat(self, i: int) -> None:
        token = self.sent[i % len(self.sent)]
        self.apply(self.d.on_heartbeat(self.token_rank[token], str(token), self.now))

    @precondition(lambda self: self.committing)
    @rule(k=st.integers(1, 3))
    def group_commit_durable(self, k: int) -> None:
        done, self.committing = self.committing[:k], self.committing[k:]
        for group in done:
            self.apply(self.d.commit_done(group[0].token))
            for c in group:
                self.committed.add(c.work_id)
                self.solo.discard(c.work_id)
                del self.live[c.work_id]

    @precondition(lambda self: self.committing)
    @rule(i=st.integers(0, 10**6), j=st.integers(0, 10**6))
    def commit_refused(self, i: int, j: int) -> None:
        """The shell could not journal one commit (say its result is too large): retried alone."""
        group = self.committing[i % len(self.committing)]
        c = group.pop(j % len(group))
        if not group:
            self.committing.remove(group)
        self.apply(self.d.commit_refused(c.token, c.work_id, "result too large"))

    @rule(dt=st.sampled_from([0.5, 3.0, 6.0, 11.0, 100.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule()
    def end_of_turn(self) -> None:
        self.apply(self.d.join_invalid(self.now))
        expired = self.d.expired(self.now)
        assert expired == sorted(expired)
        self.apply(self.d.sweep(self.now))

    @rule(garbage=st.one_of(st.none(), st.integers(), st.text(max_size=8), st.just("e1-1")))
    def garbage(self, garbage: Any) -> None:
        self.apply(self.d.on_result(2, garbage, None, self.now))
        self.apply(self.d.on_ready(99, garbage, self.now))

    # ---------------------------------------------------------------- invariants
    @invariant()
    def every_work_id_is_in_exactly_one_place(self) -> None:
        for w in WORK:
            s = self.d.status(w)
            if w in self.committed:
                assert s is WorkStatus.COMMITTED
            elif w in self.deferred:
                assert s is WorkStatus.DEFERRED
            elif w in self.live:
                assert s is WorkStatus.IN_FLIGHT
            else:
                assert s is WorkStatus.PENDING, (w, s)
        assert self.d.parked_ranks() == self.parked

    @invariant()
    def counts_add_up(self) -> None:
        stt = self.d.statistics()
        assert stt.commits == len(self.committed)
        assert stt.dispatches == len(self.token_work)
        assert stt.dispatched_items == self.items_sent
        assert stt.dispatched_items == stt.commits + self.rollbacks + len(self.live)
        assert stt.protocol_requeued_dispatches == self.requeues
        assert stt.batch_splits == self.splits
        assert stt.protocol_deferred_dispatches == self.defers
        assert stt.parked_ranks_now == len(self.parked)
        assert stt.in_flight_now == len(self.live)
        assert stt.duplicate_commits_ignored == 0


DispatchMachine.TestCase.settings = DispatchMachine.TestCase.settings  # profile from conftest
TestDispatchMachine = DispatchMachine.TestCase
