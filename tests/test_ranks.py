"""Worker ranks and their states (issue 21): one registry, one place that changes a state."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from durable_dispatch.core import Dispatcher, Send, WatchdogConfig, WorkItem
from durable_dispatch.core.ranks import Ranks, RankState, _IdleRanks
from durable_dispatch.errors import UsageError
from durable_dispatch.tokens import Token

from .helpers import examples

T1, T2 = Token(1, 1), Token(1, 2)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "discard", "pop"]), st.integers(0, 6))))
def test_idle_ranks_hand_out_the_lowest_idle_rank_like_min_of_a_set(ops: list) -> None:
    """Issue 17: reserve took min() of the idle set, O(ranks) per dispatch; the heap that
    replaces it must give the same rank every time."""
    idle, ref = _IdleRanks(), set()
    for op, rank in ops:
        if op == "add":
            idle.add(rank)
            ref.add(rank)
        elif op == "discard":
            idle.discard(rank)
            ref.discard(rank)
        else:
            assert idle.lowest() == (min(ref) if ref else None)
            if ref:
                idle.discard(min(ref))
                ref.discard(min(ref))
        assert len(idle) == len(ref) and sorted(idle) == sorted(ref)


def test_a_rank_moves_only_along_the_diagram() -> None:
    r: Ranks[str] = Ranks()
    r.add(1)
    r.add(2)
    assert r.state(1) is RankState.IDLE and r.lowest_idle() == 1 and r.state(9) is None
    r.start(1, "tx1")
    assert r.state(1) is RankState.BUSY and r.current(1) == "tx1" and r.lowest_idle() == 2
    r.park(1, T1)
    assert r.state(1) is RankState.PARKED and r.parked() == {1: T1} and r.current(1) is None
    assert r.retired(1, T1) and not r.retired(1, T2)
    assert r.release(1) == T1 and r.state(1) is RankState.IDLE and not r.parked()
    r.start(1, "tx2")
    r.finish(1, T2)
    assert r.state(1) is RankState.IDLE and r.retired(1, T2)
    r.lose(2)
    assert r.state(2) is RankState.LOST and r.live() == [1] and r.idle() == [1]
    assert r.count(RankState.LOST) == 1 and r.count(RankState.IDLE) == 1
    for illegal in (
        lambda: r.park(1, T1),  # IDLE -> PARKED: only a busy rank's dispatch is rolled back
        lambda: r.finish(1, T1),  # IDLE -> IDLE
        lambda: r.release(2),  # LOST: not parked
        lambda: r.start(2, "tx"),  # LOST -> BUSY
        lambda: r.add(1),  # IDLE -> IDLE
    ):
        with pytest.raises((UsageError, KeyError)):
            illegal()
    r.add(2)  # a lost rank may be added again
    assert r.state(2) is RankState.IDLE


def test_the_core_reports_each_ranks_state() -> None:
    d = Dispatcher(1, WatchdogConfig(10), ranks=(1, 2, 3))
    d.submit([WorkItem("a"), WorkItem("b")])
    a = d.reserve(0.0)
    b = d.reserve(0.0)
    d.mark_dispatched(a.token, 0.0)
    d.mark_dispatched(b.token, 0.0)
    assert [d.rank_state(r) for r in (1, 2, 3)] == [RankState.BUSY] * 2 + [RankState.IDLE]
    d.sweep(20.0)
    assert d.rank_state(1) is RankState.PARKED and d.rank_state(2) is RankState.PARKED
    d.rank_lost(3, 20.0)
    assert d.rank_state(3) is RankState.LOST and d.rank_state(4) is None
    d.on_ready(1, str(a.token), 21.0)
    assert d.rank_state(1) is RankState.IDLE


def test_in_flight_counts_items_and_busy_ranks_count_ranks() -> None:
    """Issue 18: the demo's line said 'in flight 4' with 3 workers: in_flight_now counts items
    (here a dispatch of 3 on one rank, and an item whose commit is being made durable while its
    rank works on the next); busy_ranks_now counts ranks and never exceeds them."""
    d = Dispatcher(1, WatchdogConfig(10), ranks=(1, 2))
    d.submit(WorkItem(f"w{i}") for i in range(6))
    a = d.reserve(0.0, 3)
    assert isinstance(a, Send)
    d.mark_dispatched(a.token, 0.0)
    st = d.statistics()
    assert (st.in_flight_now, st.busy_ranks_now) == (3, 1)
    d.on_results(1, str(a.token), [1, 2, 3], 1.0)  # committing: not yet commit_done
    d.on_ready(1, str(a.token), 1.0)  # the rank is free while the group commit runs
    b = d.reserve(1.0)
    c = d.reserve(1.0)
    assert isinstance(b, Send) and isinstance(c, Send)
    st = d.statistics()
    assert st.in_flight_now == 5 and st.busy_ranks_now == 2  # 5 items, 2 ranks


def test_a_starting_rank_gets_work_only_after_its_first_ready() -> None:
    """Issue 29.4: the master sent work to a rank before it was up, the item's deadline ran
    while the worker started its isolated child, and its first READY then reached a parked rank
    (counted malformed and parked_ready_missing)."""
    d = Dispatcher(1, WatchdogConfig(10), ranks=(1, 2), starting=True)
    d.submit([WorkItem("a"), WorkItem("b")])
    assert d.rank_state(1) is RankState.STARTING and d.starting_ranks() == 2
    assert d.reserve(0.0) is None  # nobody is up: nothing is sent, no deadline runs
    assert d.statistics().starting_ranks_now == 2
    assert d.on_ready(2, None, 5.0) == []
    s = d.reserve(5.0)
    assert isinstance(s, Send) and s.rank == 2 and d.reserve(5.0) is None
    d.mark_dispatched(s.token, 5.0)
    assert d.sweep(14.0) == [] and d.rank_state(2) is RankState.BUSY
    assert d.on_ready(1, None, 20.0) == [] and d.rank_state(1) is RankState.IDLE
    st = d.statistics()
    assert st.malformed == {} and st.parked_ready_missing == 0 and st.starting_ranks_now == 0
    d.rank_lost(1, 21.0)  # a rank that never came up can be lost, and added again starting
    d.add_rank(1, starting=True)
    assert d.rank_state(1) is RankState.STARTING


def test_a_starting_rank_moves_only_to_idle_or_lost() -> None:
    r: Ranks[str] = Ranks()
    r.add(1, starting=True)
    assert r.state(1) is RankState.STARTING and r.is_live(1) and r.lowest_idle() is None
    for illegal in (lambda: r.start(1, "tx"), lambda: r.park(1, T1), lambda: r.release(1)):
        with pytest.raises((UsageError, KeyError)):
            illegal()
    r.announce(1)
    assert r.state(1) is RankState.IDLE and r.lowest_idle() == 1
    with pytest.raises(UsageError):
        r.announce(1)  # IDLE -> IDLE


def test_suspicion_is_a_state_of_the_rank() -> None:
    """A suspect rank gets no new work until it answers or its window passes: an IDLE one is
    SUSPECT (a row of the diagram), a busy or parked one keeps its state and lands in SUSPECT,
    not IDLE, while suspect; a lost rank is suspect no more."""
    r: Ranks[str] = Ranks()
    for k in (1, 2, 3, 4):
        r.add(k)
    r.start(2, "tx2")
    r.start(3, "tx3")
    r.suspect([1, 2, 3, 9], 10.0)  # 9: never added, not suspect
    assert r.suspects() == [1, 2, 3] and r.suspect_count() == 3
    assert r.state(1) is RankState.SUSPECT and r.lowest_idle() == 4 and r.idle() == [4]
    assert r.state(2) is RankState.BUSY and r.current(2) == "tx2"  # it runs on
    with pytest.raises(UsageError):
        r.start(1, "tx")  # SUSPECT -> BUSY: no new work
    r.finish(2, T1)
    assert r.state(2) is RankState.SUSPECT  # its dispatch ended, still suspect
    r.park(3, T2)
    assert r.release(3) == T2 and r.state(3) is RankState.SUSPECT
    assert r.count(RankState.SUSPECT) == 3 and r.count(RankState.IDLE) == 1
    assert r.heard(1) and not r.heard(1) and r.state(1) is RankState.IDLE
    assert not r.expire_due(9.0) and r.expire(9.0) == []
    assert r.expire_due(10.0) and r.expire(10.0) == [2, 3]
    assert r.idle() == [1, 2, 3, 4] and r.suspect_count() == 0
    r.suspect([4], 20.0)
    r.lose(4)
    assert not r.is_suspect(4) and r.suspects() == []
    r.add(4)  # added again: not suspect
    assert r.state(4) is RankState.IDLE


def test_the_core_shows_a_suspect_idle_rank_as_suspect() -> None:
    d = Dispatcher(1, WatchdogConfig(10), ranks=(1, 2, 3))
    for k, host in ((1, "a"), (2, "a"), (3, "b")):
        d.note_host(k, host)
    d.submit([WorkItem("a")])
    d.rank_lost(1, 0.0)
    assert d.rank_state(2) is RankState.SUSPECT and d.idle_ranks() == [3]
    st = d.statistics()
    assert (st.suspect_ranks_now, st.idle_ranks_now) == (1, 1)
    s = d.reserve(0.0)
    assert isinstance(s, Send) and s.rank == 3
    d.on_ready(2, None, 1.0)  # it answered
    assert d.rank_state(2) is RankState.IDLE and d.statistics().suspect_ranks_now == 0


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "add",
                    "add_starting",
                    "announce",
                    "start",
                    "finish",
                    "park",
                    "release",
                    "lose",
                    "suspect",
                    "heard",
                    "expire",
                ]
            ),
            st.integers(1, 5),
        )
    )
)
@example(ops=[("add", 1), ("suspect", 1), ("add", 1)])  # (a suspect rank added again: SUSPECT)
def test_every_count_is_the_number_of_ranks_in_that_state(ops: list) -> None:
    """Issue 34: the master asks for the live, parked and starting counts every turn; they are
    kept as the ranks move (O(1)), and must equal counting the states one by one. Suspicion is
    one record: a SUSPECT rank is suspect, an IDLE one never is, and only live ranks are."""
    r: Ranks[str] = Ranks()
    now = 0.0
    for op, rank in ops:
        now += 1.0
        try:
            if op == "suspect":
                r.suspect([rank, rank + 1], now + 3.0)
            elif op == "heard":
                r.heard(rank)
            elif op == "expire":
                r.expire(now)
            elif op == "add":
                r.add(rank)
            elif op == "add_starting":
                r.add(rank, starting=True)
            elif op == "announce":
                r.announce(rank)
            elif op == "start":
                r.start(rank, f"tx{rank}")
            elif op == "finish":
                r.finish(rank, T1)
            elif op == "park":
                r.park(rank, T2)
            elif op == "release":
                r.release(rank)
            else:
                r.lose(rank)
        except (UsageError, KeyError):
            pass  # a move the diagram does not have changes nothing
        states = [r.state(k) for k in range(1, 7)]
        for s in RankState:
            assert r.count(s) == states.count(s), (s, states)
        assert r.live_count() == len(r.live())
        assert r.idle() == [k for k in range(1, 7) if r.state(k) is RankState.IDLE]
        suspects = r.suspects()
        assert r.suspect_count() == len(suspects) and set(suspects) <= set(r.live())
        for k in range(1, 7):
            if r.state(k) is RankState.SUSPECT:
                assert r.is_suspect(k)
            if r.state(k) is RankState.IDLE:
                assert not r.is_suspect(k)
        assert r.expire_due(now) == any(r.suspect_until[k] <= now for k in suspects)


def test_the_masters_turn_never_lists_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: stop_reason and the join of invalid results run at every turn of the master's
    loop; they listed and sorted every live rank, and every busy one (about 1 ms a turn each at
    10,000 ranks). Now the counts are O(1), and the join looks only at the dispatches whose
    READY came before a valid RESULT."""
    import tempfile

    from durable_dispatch import CampaignState, RetryPolicy
    from durable_dispatch.core import Requeue

    def listed(self: object) -> None:
        raise AssertionError("a turn listed the ranks")

    with tempfile.TemporaryDirectory() as d:
        s = CampaignState.open(
            d, watchdog=WatchdogConfig(10), retry=RetryPolicy(3), ranks=range(1, 4)
        )
        try:
            s.submit([WorkItem("a"), WorkItem("b"), WorkItem("c")])
            sends = [s.next_send(0.0) for _ in range(3)]
            for x in sends:
                s.sent(x.token, 0.0)
            monkeypatch.setattr(Ranks, "live", listed)
            monkeypatch.setattr(Ranks, "parked", listed)
            monkeypatch.setattr(Ranks, "busy", listed)
            assert s.stop_reason(0.0, grace=5.0) is None
            assert s.tick(0.0) == []
            a, b, _ = sends
            s.on_ready(a.rank, str(a.token), 1.0)  # a READY without its RESULT: joined
            s.on_results(b.rank, str(b.token), [1], 1.0)
            s.on_ready(b.rank, str(b.token), 1.0)  # RESULT then READY: committed
            out = s.tick(1.0)
            requeues = [(x.work_id, x.kind) for x in out if isinstance(x, Requeue)]
            assert requeues == [("a", "missing-result")]
            assert s.tick(2.0) == []  # joined once
            assert s.core.status("b").value == "COMMITTED"
        finally:
            monkeypatch.undo()
            s.close()
