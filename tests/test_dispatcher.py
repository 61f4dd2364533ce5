"""Unit tests of the sans-I/O dispatch core, one group per invariant W1-W9 (virtual time)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_dispatch.core import (
    Classification,
    Commit,
    Defer,
    Dispatcher,
    Park,
    PersistSnapshot,
    Quarantine,
    Release,
    Requeue,
    RetryPolicy,
    Send,
    Token,
    TxState,
    WatchdogConfig,
    WorkItem,
    WorkStatus,
)
from durable_dispatch.errors import UsageError
from durable_dispatch.mpi import protocol

from .helpers import each_commit, examples


def make(
    n_items: int = 3, ranks: tuple[int, ...] = (1, 2), seconds: float = 10.0, **kw
) -> Dispatcher:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(seconds), ranks=ranks, **kw)
    d.submit(WorkItem(f"w{i}", {"i": i}) for i in range(n_items))
    return d


def dispatch(d: Dispatcher, now: float) -> Send:
    s = d.reserve(now)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, now)
    return s


def finish(d: Dispatcher, s: Send, now: float, result: object = "ok") -> None:
    (c,) = d.on_result(s.rank, str(s.token), result, now)
    assert isinstance(c, Commit)
    d.commit_done(s.token)
    assert d.on_ready(s.rank, str(s.token), now) == []


def kinds(decisions: list) -> list[str]:
    return [type(x).__name__ for x in decisions]


def test_happy_path_commits_everything_once_and_stats_are_clean() -> None:
    d = make(5)
    now = 0.0
    while not d.done:
        sends = []
        while (s := d.reserve(now)) is not None:
            assert isinstance(s, Send)
            d.mark_dispatched(s.token, now)
            sends.append(s)
        for s in sends:
            finish(d, s, now + 1)
        now += 2
    assert d.committed() == {f"w{i}" for i in range(5)}
    st = d.statistics()
    assert (st.dispatches, st.commits) == (5, 5)
    for name in (
        "dispatch_watchdog_timeouts",
        "watchdog_worker_recoveries",
        "protocol_requeued_dispatches",
        "protocol_deferred_dispatches",
        "deferred_in_memory",
        "duplicate_commits_ignored",
        "parked_ranks_now",
    ):
        assert getattr(st, name) == 0, name
    assert st.stale == {} and st.unowned == {} and st.malformed == {}


def test_tokens_are_unique_and_carry_the_epoch() -> None:
    d = make(4, ranks=(1, 2, 3, 4))
    tokens = [dispatch(d, 0).token for _ in range(4)]
    assert len(set(tokens)) == 4 and all(t.epoch == 1 for t in tokens)
    assert Token.parse(str(tokens[0])) == tokens[0]
    for bad in (None, 5, "", "e1", "e1-", "x1-2", "e01-2", "e1-2 ", "e-1-2", ["e1-2"]):
        assert Token.parse(bad) is None


# W1 ------------------------------------------------------------------------------------------
def test_w1_deadline_starts_only_when_send_returned_preparing_never_times_out() -> None:
    d = make(1)
    s = d.reserve(0.0)
    assert isinstance(s, Send)
    assert d.transaction(s.token).state is TxState.PREPARING  # type: ignore[union-attr]
    assert d.expired(10**6) == [] and d.sweep(10**6) == []
    d.mark_dispatched(s.token, 100.0)
    assert d.expired(109.999) == []
    assert d.expired(110.0) == [(s.rank, s.token)]


def test_w1_committing_is_never_timed_out_and_closed_never_again() -> None:
    d = make(1)
    s = dispatch(d, 0.0)
    (c,) = d.on_result(s.rank, str(s.token), "r", 1.0)
    assert isinstance(c, Commit)
    assert d.transaction(s.token).state is TxState.COMMITTING  # type: ignore[union-attr]
    assert d.sweep(1000.0) == []
    d.commit_done(s.token)
    assert d.sweep(2000.0) == []


# W2 ------------------------------------------------------------------------------------------
def test_w2_deadlines_are_never_persisted() -> None:
    d = make(2)
    dispatch(d, 5.0)
    snap = d.snapshot()
    assert "deadline" not in str(snap)


# W3 ------------------------------------------------------------------------------------------
def test_w3_a_current_ready_blocks_wall_clock_rollback() -> None:
    d = make(1)
    s = dispatch(d, 0.0)
    d.on_ready(s.rank, str(s.token), 5.0)  # READY seen, RESULT not yet drained this turn
    assert d.expired(100.0) == []
    assert d.sweep(100.0) == []


def test_w3_result_drained_before_sweep_commits_even_past_deadline() -> None:
    d = make(1)
    s = dispatch(d, 0.0)
    # The turn order drains RESULT before the sweep, so a result that arrived in time commits.
    assert kinds(d.on_result(s.rank, str(s.token), "late-but-here", 50.0)) == ["Commit"]
    assert d.sweep(50.0) == []


def test_w3_invalid_result_join_recovers_the_task_and_frees_the_rank() -> None:
    d = make(1, ranks=(1,))
    s = dispatch(d, 0.0)
    q = d.on_result(1, str(s.token), None, 1.0, valid=False, error="not JSON")
    assert isinstance(q[0], Quarantine) and q[0].classification is Classification.MALFORMED
    assert d.join_invalid(1.0) == []  # no READY yet: wait
    d.on_ready(1, str(s.token), 2.0)
    out = d.join_invalid(2.0)
    assert kinds(out) == ["Requeue", "PersistSnapshot"]
    r = out[0]
    assert isinstance(r, Requeue) and r.source == "invalid-result" and r.kind == "malformed-result"
    assert d.idle_ranks() == [1] and d.parked_ranks() == {}
    assert d.statistics().invalid_result_rollbacks == 1


def test_w3_ready_without_result_is_a_missing_result() -> None:
    d = make(1, ranks=(1,))
    s = dispatch(d, 0.0)
    d.on_ready(1, str(s.token), 1.0)
    out = d.join_invalid(1.0)
    assert isinstance(out[0], Requeue) and out[0].kind == "missing-result"


# W4 ------------------------------------------------------------------------------------------
def test_w4_timeout_rolls_back_only_the_exact_rank_and_token() -> None:
    d = make(2)
    a = dispatch(d, 0.0)
    b = dispatch(d, 5.0)
    out = d.sweep(10.0)
    assert kinds(out) == ["Park", "Requeue", "PersistSnapshot"]
    assert out[0] == Park(a.rank, a.token, "watchdog-timeout")
    assert d.transaction(b.token) is not None and d.transaction(a.token) is None
    assert d.status("w0") is WorkStatus.PENDING and d.status("w1") is WorkStatus.IN_FLIGHT


def test_w4_send_failure_uses_the_same_compensation_path() -> None:
    d = make(1, ranks=(1, 2))
    s = d.reserve(0.0)
    assert isinstance(s, Send)
    out = d.send_failed(s.token, 0.0, "MPI_ERR_OTHER")
    assert kinds(out) == ["Park", "Requeue", "PersistSnapshot"]
    assert d.statistics().send_failures == 1
    assert d.pending() == ["w0"]


def test_w4_s8_rollback_requires_a_snapshot_before_the_next_dispatch() -> None:
    d = make(3)
    dispatch(d, 0.0)
    d.sweep(100.0)
    assert d.snapshot_required
    p = d.reserve(100.0)
    assert isinstance(p, PersistSnapshot)
    assert isinstance(d.reserve(100.0), PersistSnapshot)  # still, until confirmed
    d.snapshot_persisted()
    assert isinstance(d.reserve(100.0), Send)


def test_s8_rollback_clears_every_side_table_the_rank_owned() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10), ranks=(1, 2))
    d.submit(
        [
            WorkItem("a", leases={"target": "png", "strategy": "havoc"}),
            WorkItem("b", leases={"target": "png"}),
            WorkItem("c", leases={"target": "zlib"}),
        ]
    )
    s1 = dispatch(d, 0.0)
    s2 = dispatch(d, 0.0)
    assert (s1.work.work_id, s2.work.work_id) == ("a", "c")  # "b" waits for the png lease
    assert d.lease_holder("target", "png") == s1.token
    assert d.lease_holder("strategy", "havoc") == s1.token
    d.sweep(10.0)
    assert d.lease_holder("target", "png") is None and d.lease_holder("strategy", "havoc") is None
    assert d.lease_holder("target", "zlib") is None  # s2 timed out too (same deadline)
    assert d.in_flight() == {}


# W5 ------------------------------------------------------------------------------------------
def test_w5_retries_are_counted_per_work_id_never_per_token() -> None:
    d = make(1, ranks=(1, 2, 3))
    s1 = dispatch(d, 0.0)
    out = d.sweep(10.0)
    assert isinstance(out[1], Requeue) and out[1].attempts == 1
    d.snapshot_persisted()
    s2 = dispatch(d, 10.0)
    assert s2.work.work_id == s1.work.work_id and s2.token != s1.token
    out = d.sweep(20.0)
    df = out[1]
    assert isinstance(df, Defer)
    assert (
        df.attempts == 2 and df.kinds == ("timeout", "timeout") and df.source == "watchdog-timeout"
    )
    assert d.status("w0") is WorkStatus.DEFERRED
    d.defer_recorded("w0", persisted=False)
    st = d.statistics()
    assert st.deferred_in_memory == 1 and st.protocol_deferred_dispatches == 0
    assert st.protocol_requeued_dispatches == 1
    d.defer_persisted_later(1)
    st = d.statistics()
    assert st.deferred_in_memory == 0 and st.protocol_deferred_dispatches == 1


def test_w5_first_failure_goes_to_the_front_of_the_frontier() -> None:
    d = make(3, ranks=(1,))
    dispatch(d, 0.0)
    d.sweep(10.0)
    assert d.pending() == ["w0", "w1", "w2"]


def test_w5_budgets_per_failure_kind_and_shared_path_for_both_sources() -> None:
    d = make(1, ranks=(1, 2, 3, 4), retry=RetryPolicy(retries=1, per_kind={"timeout": 3}))
    for now in (0.0, 10.0, 20.0):
        dispatch(d, now)
        out = d.sweep(now + 10)
        assert isinstance(out[1], Requeue)
        d.snapshot_persisted()
    s = dispatch(d, 30.0)
    d.on_ready(s.rank, str(s.token), 31.0)  # missing result: budget 1, fourth failure
    out = d.join_invalid(31.0)
    assert isinstance(out[0], Defer) and out[0].kinds == (
        "timeout",
        "timeout",
        "timeout",
        "missing-result",
    )


# W6 / W7 ---------------------------------------------------------------------------------------
def test_w6_timed_out_rank_is_parked_and_never_receives_work() -> None:
    d = make(3, ranks=(1,))
    s = dispatch(d, 0.0)
    d.sweep(10.0)
    d.snapshot_persisted()
    assert d.parked_ranks() == {1: s.token} and d.idle_ranks() == []
    assert d.reserve(11.0) is None


@pytest.mark.parametrize(
    "token,counter",
    [
        (None, "parked_ready_missing"),
        ("garbage", "parked_ready_malformed"),
        ({"t": 1}, "parked_ready_malformed"),
        ("e1-999", "parked_ready_other_token"),
    ],
)
def test_w7_only_the_exact_retired_token_releases(token: object, counter: str) -> None:
    d = make(2, ranks=(1,))
    s = dispatch(d, 0.0)
    d.sweep(10.0)
    d.snapshot_persisted()
    q = d.on_ready(1, token, 11.0)
    assert isinstance(q[0], Quarantine)
    assert d.parked_ranks() == {1: s.token}
    assert getattr(d.statistics(), counter) == 1
    out = d.on_ready(1, str(s.token), 12.0)
    assert out == [Release(1, s.token)]
    assert d.idle_ranks() == [1] and d.statistics().watchdog_worker_recoveries == 1


# W8 --------------------------------------------------------------------------------------------
def test_w8_late_result_from_parked_rank_is_stale_and_cannot_commit() -> None:
    d = make(2, ranks=(1, 2))
    s = dispatch(d, 0.0)
    d.sweep(10.0)
    d.snapshot_persisted()
    s2 = dispatch(d, 10.0)  # the same work moved to rank 2
    assert s2.work.work_id == s.work.work_id and s2.rank == 2
    q = d.on_result(1, str(s.token), "late", 12.0)
    assert q == [Quarantine(1, "RESULT", Classification.STALE, "older token")]
    assert d.lease_holder("work", s.work.work_id) is None
    finish(d, s2, 13.0)
    assert d.committed() == {"w0"} and d.statistics().commits == 1


def test_w8_false_suspicion_slow_worker_then_exact_ready_then_new_work() -> None:
    d = make(2, ranks=(1,))
    s = dispatch(d, 0.0)
    d.sweep(10.0)
    d.snapshot_persisted()
    # The slow worker finishes: its RESULT is stale, its exact READY releases it.
    assert d.on_result(1, str(s.token), "slow", 15.0)[0].classification is Classification.STALE  # type: ignore[union-attr]
    assert d.on_ready(1, str(s.token), 15.0) == [Release(1, s.token)]
    s2 = dispatch(d, 16.0)
    assert s2.rank == 1 and s2.work.work_id == "w0"
    # A second late copy of the old RESULT after the new dispatch cannot touch it either.
    assert d.on_result(1, str(s.token), "slow", 17.0)[0].classification is Classification.STALE  # type: ignore[union-attr]
    finish(d, s2, 18.0)
    assert d.committed() == {"w0"}


def test_classification_unowned_malformed_duplicate() -> None:
    d = make(2, ranks=(1, 2))
    s = dispatch(d, 0.0)
    assert d.on_result(2, str(s.token), "x", 1)[0].classification is Classification.UNOWNED  # type: ignore[union-attr]
    assert d.on_result(9, str(s.token), "x", 1)[0].classification is Classification.UNOWNED  # type: ignore[union-attr]
    assert d.on_result(1, "bad", "x", 1)[0].classification is Classification.MALFORMED  # type: ignore[union-attr]
    assert d.on_result(1, "e0-1", "x", 1)[0].classification is Classification.STALE  # type: ignore[union-attr]
    d.on_result(1, str(s.token), "x", 1)
    assert d.on_result(1, str(s.token), "x", 1)[0].classification is Classification.DUPLICATE  # type: ignore[union-attr]
    st = d.statistics()
    assert (
        st.unowned == {"RESULT": 2} and st.malformed == {"RESULT": 1} and st.stale == {"RESULT": 1}
    )


def test_a_committed_work_id_is_committed_once() -> None:
    d = make(1, ranks=(1,))
    s = dispatch(d, 0.0)
    finish(d, s, 1.0)
    # Force a second dispatch of the same work ID the only way a user could: requeue by hand.
    with pytest.raises(UsageError):
        d.submit([WorkItem("w0")])
    assert d.statistics().commits == 1


# Heartbeats -------------------------------------------------------------------------------------
def test_current_heartbeat_extends_the_deadline_stale_is_counted() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10, heartbeat_lease=30), ranks=(1,))
    d.submit([WorkItem("w")])
    s = dispatch(d, 0.0)
    assert d.on_heartbeat(1, str(s.token), 8.0) == []
    assert d.expired(20.0) == []
    assert d.expired(38.0) == [(1, s.token)]
    q = d.on_heartbeat(1, "e1-77", 9.0)
    assert q[0].classification is Classification.UNOWNED  # type: ignore[union-attr]
    assert d.statistics().heartbeats == 1


def test_the_deadline_heap_holds_the_dispatches_in_flight_not_every_deadline_of_the_period() -> (
    None
):
    """Issue 34: each dispatch and heartbeat pushes a deadline, and an entry left only when it
    came due, so a master kept one entry per deadline of the last watchdog period (4.8 million
    at 40,000 dispatches/s under the default 120 s). The heap is rebuilt from the open
    dispatches as stale entries pile up; a hung dispatch and one its heartbeats keep alive
    still get their deadlines."""
    from durable_dispatch.core.dispatch_base import HEAP_SLACK

    n = 3 * HEAP_SLACK
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(100, heartbeat_lease=100), ranks=(1, 2, 3))
    d.submit([WorkItem("hung"), WorkItem("beating")])
    d.submit(WorkItem(f"w{i}") for i in range(n))
    hung, beating = dispatch(d, 0.0), dispatch(d, 0.0)
    assert (hung.rank, beating.rank) == (1, 2)
    most = 0
    for i in range(n):
        now = i * 0.01
        s = dispatch(d, now)
        assert s.rank == 3
        assert d.on_heartbeat(2, str(beating.token), now) == []  # (a new deadline each time)
        finish(d, s, now)
        most = max(most, len(d._deadlines))
    assert d.committed() == {f"w{i}" for i in range(n)}
    assert most <= 2 * 3 + HEAP_SLACK + 1  # (three open dispatches at most)
    last = (n - 1) * 0.01
    assert d.expired(99.0) == []
    assert d.expired(100.0) == [(1, hung.token)]  # the hung one: its deadline from the send
    assert d.expired(last + 99.0) == [(1, hung.token)]
    assert d.expired(last + 100.0) == [(1, hung.token), (2, beating.token)]  # its last beat
    assert kinds(d.sweep(last + 100.0)).count("Park") == 2


def test_per_item_timeout_overrides_the_default() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(100), ranks=(1, 2))
    d.submit([WorkItem("short", timeout=1.0), WorkItem("long")])
    a = dispatch(d, 0.0)
    dispatch(d, 0.0)
    assert d.expired(1.0) == [(a.rank, a.token)]


# The adaptive rule (issue 19) ------------------------------------------------------------------
def adaptive(ranks: tuple[int, ...] = (1,), **kw: Any) -> Dispatcher:
    cfg = {"quantile": 0.5, "multiple": 4.0, "floor": 0.5, "min_samples": 3, **kw}
    return Dispatcher(epoch=1, watchdog=WatchdogConfig(100, **cfg), ranks=ranks)


def run_for(d: Dispatcher, now: float, seconds: float, item: WorkItem | None = None) -> float:
    """Submit (unless given) and run one item that takes ``seconds``; the time it ended."""
    d.submit([item or WorkItem(f"m{now}")])
    s = dispatch(d, now)
    finish(d, s, now + seconds)
    return now + seconds


def test_adaptive_deadline_is_the_cap_until_measured_then_a_multiple_of_the_quantile() -> None:
    d = adaptive()
    now = 0.0
    for took in (1.0, 2.0):
        now = run_for(d, now, took)
        assert d.deadline_seconds() == 100  # fewer than min_samples: the fixed deadline
    now = run_for(d, now, 3.0)
    assert d.deadline_seconds() == 4 * 2.0  # 4 x the median of 1, 2, 3
    assert d.statistics().watchdog_deadline_now == 8.0
    d.submit([WorkItem("hangs")])
    s = dispatch(d, now)
    assert d.expired(now + 7.9) == []
    assert d.expired(now + 8.0) == [(1, s.token)]  # 8 s, not the 100 s cap
    rq = [x for x in d.sweep(now + 8.0) if isinstance(x, Requeue)]
    assert [x.kind for x in rq] == ["timeout"]


def test_adaptive_deadline_keeps_within_floor_and_cap_and_follows_the_window() -> None:
    d = adaptive(floor=0.5)
    now = 0.0
    for _ in range(3):
        now = run_for(d, now, 0.001)
    assert d.deadline_seconds() == 0.5  # 4 ms fitted: the floor
    for _ in range(5):
        now = run_for(d, now, 40.0)
    assert d.deadline_seconds() == 100  # 160 s fitted: the cap
    assert adaptive().lease_seconds() == 100


def test_adaptive_rule_leaves_own_timeouts_alone_and_does_not_measure_them() -> None:
    d = adaptive()
    now = 0.0
    for _ in range(5):
        now = run_for(d, now, 50.0, WorkItem(f"own{now}", timeout=60.0))
    assert d.deadline_seconds() == 100  # nothing measured: every item had its own timeout
    for _ in range(3):
        now = run_for(d, now, 1.0)
    assert d.allowed_seconds([WorkItem("own", timeout=60.0)]) == 60.0
    assert d.allowed_seconds([WorkItem("a"), WorkItem("b")]) == 8.0  # 4 s for each
    assert d.allowed_seconds([WorkItem("x")] * 30) == 100  # never more than the cap in all
    assert d.allowed_seconds([WorkItem("own", timeout=60.0), WorkItem("a")]) == 64.0


def test_adaptive_heartbeat_lease_is_the_fitted_deadline_unless_one_is_configured() -> None:
    d = adaptive()
    now = 0.0
    for _ in range(3):
        now = run_for(d, now, 1.0)
    d.submit([WorkItem("beats")])
    s = dispatch(d, now)
    assert d.lease_seconds() == 4.0
    d.on_heartbeat(1, str(s.token), now + 3.0)
    assert d.expired(now + 6.9) == []
    assert d.expired(now + 7.0) == [(1, s.token)]  # pushed to heartbeat + 4 s
    fixed = adaptive(heartbeat_lease=30.0)
    assert fixed.lease_seconds() == 30.0


def test_adaptive_first_fit_tightens_dispatches_sent_under_the_cap_unless_they_beat() -> None:
    d = adaptive(ranks=(1, 2, 3))
    d.submit([WorkItem("hang"), WorkItem("alive")])
    hang, alive = dispatch(d, 0.0), dispatch(d, 0.0)  # both under the 100 s cap
    d.on_heartbeat(alive.rank, str(alive.token), 0.5)  # pushed to 100.5: it said it is alive
    now = 0.0
    for _ in range(3):
        now = run_for(d, now, 1.0)  # the third measurement fits 4 s
    assert d.expired(3.9) == []
    assert d.expired(4.0) == [(hang.rank, hang.token)]  # sent at 0: 0 + 4 s, not 100 s
    assert d.expired(100.0) == [(hang.rank, hang.token)]
    assert d.expired(100.5) == [(hang.rank, hang.token), (alive.rank, alive.token)]


def test_the_fixed_rule_is_unchanged_by_measurements() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(100), ranks=(1,))
    now = 0.0
    for _ in range(30):
        now = run_for(d, now, 0.01)
    assert d.deadline_seconds() == 100 and d.lease_seconds() == 100
    assert d.allowed_seconds([WorkItem("a"), WorkItem("b")]) == 100


# W9 --------------------------------------------------------------------------------------------
def test_w9_disabled_watchdog_never_expires_and_says_so() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig.build(0), ranks=(1,))
    d.submit([WorkItem("w")])
    dispatch(d, 0.0)
    assert d.sweep(10.0**9) == []
    st = d.statistics()
    assert st.watchdog_enabled is False and st.watchdog_seconds == 0


def test_w9_config_corrections_are_observable_in_stats() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig.build("nan", task_timeout=60))
    st = d.statistics()
    assert st.config_corrections == 1 and st.watchdog_seconds == 240


# Restart and rank loss ---------------------------------------------------------------------------
def test_restart_rolls_back_in_flight_without_charging_a_retry() -> None:
    d = make(3, ranks=(1, 2))
    a = dispatch(d, 0.0)
    dispatch(d, 0.0)
    finish(d, a, 1.0)
    state = d.snapshot()
    d2, out = Dispatcher.restore(state, epoch=2, ranks=(1, 2))
    assert [type(x).__name__ for x in out] == ["Requeue"]
    assert out[0].source == "master-restart"  # type: ignore[attr-defined]
    assert d2.pending() == ["w1", "w2"] and d2.attempts("w1") == 0
    assert d2.committed() == {"w0"}
    # A late message of the old epoch is stale by the token rules.
    assert d2.on_result(2, "e1-2", "late", 0.0)[0].classification is Classification.STALE  # type: ignore[union-attr]
    s = dispatch(d2, 0.0)
    assert s.token.epoch == 2
    with pytest.raises(UsageError):
        Dispatcher.restore(state, epoch=1)


def test_rank_lost_rolls_back_at_once_and_removes_the_rank() -> None:
    d = make(2, ranks=(1, 2))
    s = dispatch(d, 0.0)
    out = d.rank_lost(s.rank, 1.0)
    assert kinds(out) == ["Requeue", "PersistSnapshot"]
    assert out[0].source == "rank-lost"  # type: ignore[attr-defined]
    assert d.idle_ranks() == [2] and d.statistics().ranks_lost == 1


def test_misuse_raises_usage_errors() -> None:
    d = make(1)
    with pytest.raises(UsageError):
        d.add_rank(1)
    with pytest.raises(UsageError):
        d.add_rank(-1)
    with pytest.raises(UsageError):
        d.mark_dispatched(Token(1, 99), 0)
    s = dispatch(d, 0)
    with pytest.raises(UsageError):
        d.mark_dispatched(s.token, 0)
    with pytest.raises(UsageError):
        d.commit_done(s.token)
    with pytest.raises(UsageError):
        d.submit([WorkItem("w0")])
    with pytest.raises(UsageError):
        Dispatcher(epoch=-1)


# ------------------------------------------------------------------ multi-item dispatches
def test_a_multi_item_dispatch_has_one_token_and_a_deadline_for_all_its_items() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10.0), ranks=(1,))
    d.submit([WorkItem("a", timeout=3.0), WorkItem("b"), WorkItem("c", timeout=4.0), WorkItem("e")])
    s = d.reserve(0.0, max_items=3)
    assert isinstance(s, Send) and [w.work_id for w in s.items] == ["a", "b", "c"]
    assert s.items[0].work_id == "a"  # Send.work refuses a multi-item dispatch (issue 21)
    d.mark_dispatched(s.token, 0.0)
    tx = d.transaction(s.token)
    assert tx is not None and tx.deadline == 3.0 + 4.0 + 10.0  # own timeouts + watchdog once
    assert d.in_flight() == {"a": s.token, "b": s.token, "c": s.token}
    out = d.on_results(1, str(s.token), [1, 2, 3], 1.0)
    assert kinds(out) == ["Commits"]  # all committed: one decision, the dispatch's columns
    assert [(c.work_id, c.result) for c in each_commit(out) if isinstance(c, Commit)] == [
        ("a", 1),
        ("b", 2),
        ("c", 3),
    ]
    d.commit_done(s.token)
    d.on_ready(1, str(s.token), 1.0)
    st = d.statistics()
    assert (st.dispatches, st.dispatched_items, st.commits) == (1, 3, 3)
    assert d.committed() == {"a", "b", "c"} and d.pending() == ["e"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", None, True])
def test_reserve_refuses_a_bad_item_count(bad: object) -> None:
    with pytest.raises(UsageError, match="max_items"):
        make().reserve(0.0, max_items=bad)  # type: ignore[arg-type]


def test_a_multi_item_dispatch_stops_at_an_item_whose_lease_is_taken() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10.0), ranks=(1, 2))
    d.submit(
        [
            WorkItem("a", leases={"target": "png"}),
            WorkItem("b"),
            WorkItem("c", leases={"target": "png"}),
            WorkItem("e"),
        ]
    )
    s = d.reserve(0.0, max_items=4)
    assert isinstance(s, Send) and [w.work_id for w in s.items] == ["a", "b"]
    assert d.lease_holder("target", "png") == s.token


def test_item_errors_charge_only_those_items_and_the_rest_commit() -> None:
    d = make(3, ranks=(1,), retry=RetryPolicy(1))
    s = d.reserve(0.0, max_items=3)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, 0.0)
    out = d.on_results(1, str(s.token), [None, "ok", None], 1.0, errors={0: "boom", 2: "bad"})
    assert kinds(out) == ["Commit", "Requeue", "Requeue", "PersistSnapshot"]
    assert [x.work_id for x in out if isinstance(x, Requeue)] == ["w0", "w2"]
    assert all(x.attempts == 1 and not x.split for x in out if isinstance(x, Requeue)) and (
        d.attempts("w0"),
        d.attempts("w1"),
    ) == (1, 0)
    assert d.status("w0") is WorkStatus.PENDING and d.status("w1") is WorkStatus.IN_FLIGHT
    d.snapshot_persisted()
    d.commit_done(s.token)
    assert d.on_ready(1, str(s.token), 1.0) == []
    assert d.idle_ranks() == [1] and d.committed() == {"w1"}
    assert d.statistics().item_failures == 2 and d.statistics().invalid_result_rollbacks == 0


@pytest.mark.parametrize(
    ("values", "errors"),
    [
        ([1, 2], None),
        ([1, 2, 3, 4], None),
        ([1, 2, 3], {5: "x"}),
        ([1, 2, 3], {-1: "x"}),
    ],
)
def test_a_result_that_does_not_fit_the_dispatch_is_malformed_and_splits_it(
    values: list[int], errors: dict[int, str] | None
) -> None:
    d = make(3, ranks=(1,), retry=RetryPolicy(0))
    s = d.reserve(0.0, max_items=3)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, 0.0)
    (q,) = d.on_results(1, str(s.token), values, 1.0, errors=errors)
    assert isinstance(q, Quarantine) and q.classification is Classification.MALFORMED
    d.on_ready(1, str(s.token), 1.0)
    out = d.join_invalid(1.0)
    # Which item was bad is unknown: each goes back uncharged, even with no retries at all.
    assert kinds(out) == ["Requeue", "Requeue", "Requeue", "PersistSnapshot"]
    assert all(x.split and x.attempts == 0 for x in out if isinstance(x, Requeue))
    assert d.pending() == ["w0", "w1", "w2"] and d.idle_ranks() == [1]
    assert d.statistics().batch_splits == 3


def test_a_multi_item_dispatch_whose_items_all_failed_charges_each_and_frees_the_rank() -> None:
    d = make(2, ranks=(1,), retry=RetryPolicy(0))
    s = d.reserve(0.0, max_items=2)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, 0.0)
    out = d.on_results(1, str(s.token), [None, None], 1.0, errors={0: "x", 1: "y"})
    assert kinds(out) == ["Defer", "Defer", "PersistSnapshot"]  # known failures: no split
    d.snapshot_persisted()
    assert d.on_ready(1, str(s.token), 1.0) == [] and d.idle_ranks() == [1]
    assert d.join_invalid(1.0) == [] and d.done and d.statistics().batch_splits == 0


def test_a_split_item_runs_alone_and_a_second_failure_is_charged_to_it() -> None:
    d = make(3, ranks=(1, 2), retry=RetryPolicy(0))
    s = d.reserve(0.0, max_items=3)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, 0.0)
    out = d.sweep(100.0)  # the whole dispatch timed out: the rank is parked, the items split
    assert kinds(out) == ["Park", "Requeue", "Requeue", "Requeue", "PersistSnapshot"]
    assert d.reserve(100.0, max_items=3) == PersistSnapshot(out[-1].reason)
    d.snapshot_persisted()
    alone = d.reserve(100.0, max_items=3)
    assert isinstance(alone, Send) and [w.work_id for w in alone.items] == ["w0"]
    assert alone.rank == 2  # rank 1 stays parked (W6)
    d.mark_dispatched(alone.token, 100.0)
    (defer, snap) = d.sweep(200.0)[1:]
    assert isinstance(defer, Defer) and defer.work.work_id == "w0" and defer.attempts == 1
    assert isinstance(snap, PersistSnapshot)
    assert d.snapshot()["solo"] == ["w1", "w2"]  # durable: a restart keeps them alone
    restored, _ = Dispatcher.restore(d.snapshot(), epoch=2, ranks=(3,))
    again = restored.reserve(0.0, max_items=3)
    assert isinstance(again, Send) and len(again.items) == 1


def test_a_multi_item_dispatch_lost_with_its_rank_splits_and_restores_per_item() -> None:
    d = make(4, ranks=(1, 2))
    s = d.reserve(0.0, max_items=3)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, 0.0)
    snap = d.snapshot()
    assert [t["work"]["work_id"] for t in snap["in_flight"]] == ["w0", "w1", "w2"]
    restored, out = Dispatcher.restore(snap, epoch=2, ranks=(1, 2))
    assert kinds(out) == ["Requeue"] * 3 and restored.pending() == ["w0", "w1", "w2", "w3"]
    out = d.rank_lost(1, 1.0)
    assert kinds(out) == ["Requeue"] * 3 + ["PersistSnapshot"]
    assert d.live_ranks() == [2] and d.statistics().batch_splits == 3


def test_a_refused_commit_retries_only_that_item() -> None:
    d = make(3, ranks=(1,), retry=RetryPolicy(1))
    s = d.reserve(0.0, max_items=3)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, 0.0)
    assert kinds(each_commit(d.on_results(1, str(s.token), [0, 1, 2], 1.0))) == ["Commit"] * 3
    with pytest.raises(UsageError, match="not committing"):
        d.commit_refused(s.token, "w9", "too large")
    out = d.commit_refused(s.token, "w1", "result too large")
    assert kinds(out) == ["Requeue", "PersistSnapshot"]
    assert out[0].work_id == "w1" and out[0].attempts == 1 and not out[0].split
    d.snapshot_persisted()
    d.commit_done(s.token)
    assert d.committed() == {"w0", "w2"} and d.pending() == ["w1"]
    assert d.statistics().commits == 2 and d.statistics().invalid_result_rollbacks == 1
    with pytest.raises(UsageError, match="not COMMITTING"):
        d.commit_refused(s.token, "w0", "late")


def test_refusing_every_commit_of_a_dispatch_closes_it_and_frees_the_rank() -> None:
    d = make(1, ranks=(1,), retry=RetryPolicy(0))
    s = dispatch(d, 0.0)
    d.on_result(1, str(s.token), "huge", 1.0)
    assert d.on_ready(1, str(s.token), 1.0) == []  # READY seen while COMMITTING
    out = d.commit_refused(s.token, "w0", "result too large")
    assert kinds(out) == ["Defer", "PersistSnapshot"]
    assert d.idle_ranks() == [1] and d.transaction(s.token) is None and d.done


# ------------------------------------------------------------- failure kinds (U2, issue 14)
def test_each_failure_kind_a_worker_reports_is_charged_under_its_own_budget() -> None:
    """Issue 14: a function that raised, a crash and an oversized result were all charged as
    malformed-result, so they shared one budget; each kind now has its own."""
    from durable_dispatch.core import ItemFailure

    d = make(3, ranks=(1,), retry=RetryPolicy(1, per_kind={"crash": 0}))
    s = d.reserve(0.0, max_items=3)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, 0.0)
    errors = {
        0: ItemFailure("crash", "killed by SIGSEGV"),
        1: ItemFailure("error", "ValueError: bad"),
        2: ItemFailure("made-up", "a kind no worker may report"),
    }
    out = d.on_results(1, str(s.token), [None, None, None], 1.0, errors=errors)
    by_id = {x.work_id if isinstance(x, Requeue) else x.work.work_id: x for x in out[:3]}
    assert isinstance(by_id["w0"], Defer) and by_id["w0"].kinds == ("crash",)  # budget 0
    assert isinstance(by_id["w1"], Requeue) and by_id["w1"].kind == "error"
    assert isinstance(by_id["w2"], Requeue) and by_id["w2"].kind == "malformed-result"
    assert "made-up" in (by_id["w2"].error or "")


@pytest.mark.parametrize("kind", ["timeout", "error", "crash", "result-too-large"])
def test_a_one_item_dispatch_the_worker_failed_is_joined_with_its_kind(kind: str) -> None:
    """A worker that says why its item failed is not a malformed RESULT: no quarantine is
    counted, and the READY that follows rolls the item back under that kind, freeing the rank."""
    from durable_dispatch.core import ItemFailure

    d = make(1, ranks=(1,), retry=RetryPolicy(1))
    s = dispatch(d, 0.0)
    assert d.on_results(1, str(s.token), None, 1.0, failure=ItemFailure(kind, "why")) == []
    assert d.statistics().malformed == {}
    d.on_ready(1, str(s.token), 1.0)
    (r, p) = d.join_invalid(1.0)
    assert isinstance(r, Requeue) and r.kind == kind and r.attempts == 1 and r.error == "why"
    assert isinstance(p, PersistSnapshot) and d.idle_ranks() == [1] and d.parked_ranks() == {}


def test_a_plain_string_error_is_kind_error_and_a_whole_message_one_is_malformed() -> None:
    d = make(2, ranks=(1, 2), retry=RetryPolicy(1))
    a, b = dispatch(d, 0.0), dispatch(d, 0.0)
    d.on_results(a.rank, str(a.token), [None], 1.0, errors={0: "boom"})
    (q,) = d.on_results(b.rank, str(b.token), None, 1.0, failure="not JSON")
    assert isinstance(q, Quarantine) and q.classification is Classification.MALFORMED
    for s in (a, b):
        d.on_ready(s.rank, str(s.token), 1.0)
    kinds_ = sorted(x.kind for x in d.join_invalid(1.0) if isinstance(x, Requeue))
    assert kinds_ == ["error", "malformed-result"]


def test_retry_policy_knows_every_kind_and_refuses_the_unchargeable_one() -> None:
    from durable_dispatch.core.config import FAILURE_KINDS, WORKER_FAILURE_KINDS

    assert set(WORKER_FAILURE_KINDS) <= set(FAILURE_KINDS)
    assert {"timeout", "error", "crash", "result-too-large", "lost-rank"} <= set(FAILURE_KINDS)
    assert RetryPolicy(per_kind={"rank-lost": 3}).retries_for("lost-rank") == 3  # the old name
    RetryPolicy(per_kind={k: 0 for k in FAILURE_KINDS})
    with pytest.raises(Exception, match="unknown failure kind 'master-restart'"):
        RetryPolicy(per_kind={"master-restart": 1})


# ------------------------------------------------------------------ message fuzzing
FUZZED: dict[str, int] = {}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=examples(500), deadline=None)
@given(
    msgs=st.lists(
        st.tuples(
            st.sampled_from(["RESULT", "READY", "HEARTBEAT"]),
            st.integers(-3, 6),
            st.one_of(json_values, st.sampled_from(["e1-1", "e1-2", "e0-1", "e1-99"])),
            st.booleans(),
        ),
        max_size=25,
    ),
    wire=st.binary(max_size=60),
)
def _message_classifier_never_raises(msgs: list[Any], wire: bytes) -> None:
    FUZZED["wire"] = FUZZED.get("wire", 0) + 1
    body, err = protocol.decode(wire)
    assert (body is None) != (err is None)
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(5), ranks=(1, 2))
    d.submit([WorkItem("a"), WorkItem("b")])
    for _ in range(2):
        s = d.reserve(0.0)
        assert isinstance(s, Send)
        d.mark_dispatched(s.token, 0.0)
    commits = 0
    for kind, rank, token, valid in msgs:
        if kind == "RESULT":
            out = d.on_result(rank, token, {"x": 1}, 1.0, valid=valid)
            for c in out:
                if type(c).__name__ == "Commit":
                    commits += 1
                    d.commit_done(c.token)  # type: ignore[attr-defined]
        elif kind == "READY":
            d.on_ready(rank, token, 1.0)
        else:
            d.on_heartbeat(rank, token, 1.0)
        d.join_invalid(1.0)
        d.sweep(2.0 if valid else 10.0)
    st_ = d.statistics()
    assert st_.commits == commits <= 2
    assert st_.duplicate_commits_ignored == 0
    assert not math.isnan(st_.watchdog_seconds)


def test_message_classifier_never_raises() -> None:
    """Any sequence of RESULT, READY and HEARTBEAT with any token from any rank, and any wire
    bytes, is classified without an exception and never commits twice (moved here from
    test_format.py: it tests the dispatcher; issue 21)."""
    before = FUZZED.get("wire", 0)
    _message_classifier_never_raises()
    assert FUZZED["wire"] - before >= examples(100)


def test_send_work_refuses_a_multi_item_dispatch_instead_of_dropping_items() -> None:
    """Issue 21: Send.work silently returned the first item of a multi-item dispatch."""
    d = make(3, ranks=(1, 2))
    one = d.reserve(0.0)
    assert isinstance(one, Send) and one.work.work_id == "w0"
    many = d.reserve(0.0, max_items=2)
    assert isinstance(many, Send) and len(many.items) == 2
    with pytest.raises(UsageError, match="use Send.items"):
        _ = many.work


# ------------------------------------------------------------ structure (issue 21)
def test_a_transaction_changes_state_only_through_the_transition_table() -> None:
    """One table of allowed transitions and one advance that raises on any other; no other
    code assigns a transaction's state."""
    import inspect

    from durable_dispatch.core import dispatcher
    from durable_dispatch.core import transactions as mod

    assert inspect.getsource(mod).count(".state = ") == 1  # the one in advance
    assert inspect.getsource(dispatcher).count(".state = ") == 0
    d = Dispatcher(1, WatchdogConfig(10), ranks=(1,))
    d.submit([WorkItem("a")])
    s = d.reserve(0.0)
    assert isinstance(s, Send)
    with pytest.raises(UsageError, match="is PREPARING, not COMMITTING"):
        d.commit_done(s.token)
    d.mark_dispatched(s.token, 0.0)
    with pytest.raises(UsageError, match="is DISPATCHED, not PREPARING"):
        d.mark_dispatched(s.token, 1.0)
    d.on_result(1, str(s.token), "r", 1.0)
    d.commit_done(s.token)
    with pytest.raises(UsageError, match="is CLOSED, not COMMITTING"):
        d.commit_done(s.token)  # a second commit_done
    d.on_ready(1, str(s.token), 1.0)
    with pytest.raises(UsageError, match="no open transaction"):
        d.commit_done(s.token)  # CLOSED and READY seen: it left the open set
    finals = {to for (_, _), to in mod._TX_TRANSITIONS.items()} - {
        frm for frm, _ in mod._TX_TRANSITIONS
    }
    assert finals == {mod.TxState.CLOSED, mod.TxState.ROLLED_BACK}


def test_every_counter_is_a_statistic_and_duplicates_are_reported() -> None:
    """The counters are a dataclass whose fields are DispatchStats fields (a mistyped name
    fails); duplicate READYs and RESULTs used to be counted under keys no statistic showed."""
    from dataclasses import fields

    from durable_dispatch.core import stats as mod

    stats = {f.name for f in fields(mod.DispatchStats)}
    assert {f.name for f in fields(mod.Counters)} <= stats
    d = Dispatcher(1, WatchdogConfig(10), ranks=(1,))
    d.submit([WorkItem("a")])
    s = d.reserve(0.0)
    assert isinstance(s, Send)
    d.mark_dispatched(s.token, 0.0)
    d.on_result(1, str(s.token), "r", 1.0)
    d.on_result(1, str(s.token), "r", 1.0)
    d.on_ready(1, str(s.token), 1.0)
    d.on_ready(1, str(s.token), 1.0)
    assert d.statistics().duplicate == {"RESULT": 1, "READY": 1}
    with pytest.raises(AttributeError):
        d._n.dispatchs += 1  # type: ignore[attr-defined]


# ---------------------------------------------------------------- U7: a paused master (issue 29)
def test_u7_a_pause_of_the_master_is_not_counted_and_its_backlog_commits_first() -> None:
    """The shell reads its clock through core.clock: 7 s between two turns (the master was
    stopped) count as 0.25 s, and nothing is swept until a drain read what arrived meanwhile."""
    d = make(3, ranks=(1, 2, 3), seconds=3.0)
    clock = d.clock
    now = clock.observe(1000.0)
    sends = [dispatch(d, now) for _ in range(3)]
    now = clock.observe(1007.0)  # SIGSTOP/SIGCONT of the master: its RESULTs waited
    assert now == pytest.approx(1000.25) and clock.hold
    assert d.sweep(clock.observe(1007.001)) == []  # before the drain nothing is judged
    for s in sends[:2]:
        finish(d, s, now)
    clock.drained()
    assert d.sweep(clock.observe(1007.002)) == []  # the third is within its deadline still
    assert d.statistics().dispatch_watchdog_timeouts == 0
    assert d.statistics().master_pauses == 1
    assert d.statistics().master_paused_seconds == pytest.approx(6.75)
    raw, later = 1007.002, now
    while later < 1000.0 + 3.0:  # a paused *worker* still times out, in observed time
        raw += 0.2
        later = clock.observe(raw)
        clock.drained()
    assert raw == pytest.approx(1009.802)  # 2.75 s of observed time after the pause
    assert sorted(kinds(d.sweep(later))) == ["Park", "PersistSnapshot", "Requeue"]
    assert d.statistics().dispatch_watchdog_timeouts == 1 and sends[2].rank in d.parked_ranks()


# ------------------------------------------------- U9: an item's own timeout (issue 29)
def test_u9_a_heartbeat_never_extends_an_item_with_its_own_timeout() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(120, heartbeat_lease=120), ranks=(1, 2))
    d.submit([WorkItem("own", timeout=2.0), WorkItem("plain")])
    own, plain = dispatch(d, 0.0), dispatch(d, 0.0)
    assert d.lease_for(own.items) == 0.0 and d.lease_for(plain.items) == 120.0
    assert d.on_heartbeat(own.rank, str(own.token), 1.5) == []
    assert d.on_heartbeat(plain.rank, str(plain.token), 1.5) == []
    assert d.statistics().heartbeats == 2  # counted, both
    assert d.expired(2.0) == [(own.rank, own.token)]  # at its own 2 s, not at 121.5 s
    assert d.expired(121.0) == [(own.rank, own.token)]  # the plain one was pushed to 121.5


def test_u9_a_reported_failure_leaves_the_watchdogs_seconds_for_the_ready() -> None:
    """An isolating worker that killed its item at the deadline restarts its child before its
    READY: the RESULT that reported the timeout moves the deadline for that READY, so the
    restart never parks the rank."""
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(30), ranks=(1,))
    d.submit([WorkItem("own", timeout=2.0)])
    s = dispatch(d, 0.0)
    body = {"token": str(s.token), "error": "killed", "kind": "timeout"}
    failure = protocol.read_result(body, None)
    assert d.on_results(s.rank, str(s.token), failure[0], 1.95, failure=failure[2]) == []
    assert d.expired(3.0) == []  # the child restarts meanwhile
    out = d.on_ready(s.rank, str(s.token), 3.5)
    out += d.join_invalid(3.5)
    assert "Requeue" in kinds(out) and d.idle_ranks() == [1]
    assert d.statistics().dispatch_watchdog_timeouts == 0 and d.attempts("own") == 1


def test_a_send_that_fails_after_it_was_reported_started_is_rolled_back_the_same_way() -> None:
    """A non-blocking send is reported started (``mark_dispatched``, its deadline runs) and may
    fail later: the same compensation path as a send that failed at once, while nothing of its
    worker came; a failure reported after the worker answered, or for a closed dispatch,
    changes nothing."""
    d = make(2, ranks=(1, 2))
    a, b = d.reserve(0.0), d.reserve(0.0)
    assert isinstance(a, Send) and isinstance(b, Send)
    d.mark_dispatched(a.token, 0.0)
    d.mark_dispatched(b.token, 0.0)
    out = d.send_failed(a.token, 1.0, "MPI_ERR_OTHER")
    assert kinds(out) == ["Park", "Requeue", "PersistSnapshot"]
    assert d.statistics().send_failures == 1 and d.transaction(a.token) is None
    assert d.send_failed(a.token, 2.0) == []  # reported twice: it is rolled back already
    d.on_results(b.rank, str(b.token), [b.items[0].payload], 2.0)
    assert d.send_failed(b.token, 3.0) == []  # its worker answered: it had the WORK
    assert d.statistics().send_failures == 1
    with pytest.raises(UsageError):
        d.send_failed(Token(a.token.epoch, a.token.n + 5), 3.0)  # never reserved
