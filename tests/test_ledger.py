"""The ledger and its events (issue 16): one model of the durable facts, one encoding per event."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_dispatch.core import Dispatcher, RetryPolicy, WatchdogConfig, WorkItem
from durable_dispatch.core.decisions import Defer, Requeue, Send
from durable_dispatch.core.events import (
    Committed,
    Deferred,
    Delivered,
    Dispatched,
    EpochStarted,
    Requeued,
    RequeuedDeferred,
    Submitted,
    decode,
    encode,
    of_decision,
)
from durable_dispatch.core.ledger import COMPACT_FORM, Frontier, Ledger, Runs
from durable_dispatch.schema import Invalid
from durable_dispatch.tokens import Token

from .helpers import each_commit, examples

T1, T2, T3, T4 = Token(1, 1), Token(1, 2), Token(1, 3), Token(1, 4)
EVENTS = [
    EpochStarted(3, 1.5),
    Submitted((WorkItem("a", {"x": 1}, 2.0, {"t": "k"}, ("in",), True), WorkItem("b"))),
    Dispatched(T1, 4, ("a",)),
    Dispatched(T2, 5, ("a", "b")),
    Committed(T1, 4, ("a",), ({"r": 1},), 9.0),
    Committed(T2, 5, ("a", "b"), (1, [2]), None),
    Requeued("a", T1, "watchdog-timeout", "timeout", 2, "deadline passed"),
    Requeued("a", T2, "rank-lost", "lost-rank", 0, "", split=True),
    Requeued("a", T2, "master-restart", "master-restart", 0, ""),
    Deferred("a", T1, "invalid-result", 3, ("error", "crash"), "boom"),
    RequeuedDeferred("a"),
    Delivered(41),
]


@pytest.mark.parametrize("ev", EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_decodes_to_itself(ev: Any) -> None:
    assert decode(encode(ev)) == ev


def test_an_event_of_a_later_version_decodes_to_none_and_a_bad_one_is_invalid() -> None:
    assert decode({"event": "from-the-future", "x": 1}) is None
    for rec, field in [
        ({"event": "dispatched", "token": "t1", "rank": 1, "work_id": "a"}, "token"),
        ({"event": "dispatched", "token": "e1-1", "rank": "1", "work_id": "a"}, "rank"),
        ({"event": "committed", "token": "e1-1"}, "work_id"),
        ({"event": "deferred", "work_id": "a", "attempts": 1}, "kinds"),
        ([], "(record)"),
    ]:
        with pytest.raises(Invalid) as ei:
            decode(rec)
        assert ei.value.field == field


def test_the_event_of_a_decision_is_the_one_the_core_applied() -> None:
    item = WorkItem("a")
    assert of_decision(Send(1, T1, (item,))) == Dispatched(T1, 1, ("a",))
    req = Requeue("a", T1, "watchdog-timeout", "timeout", 1, "late", split=True)
    assert of_decision(req) == Requeued("a", T1, "watchdog-timeout", "timeout", 1, "late", True)
    d = Defer(item, T1, "invalid-result", 2, ("error", "error"), "boom")
    assert of_decision(d) == Deferred("a", T1, "invalid-result", 2, ("error", "error"), "boom")
    assert of_decision("not a decision") is None


def test_the_frontier_keeps_order_and_removes_anywhere() -> None:
    f = Frontier()
    for w in "bcd":
        f.append(w)
    f.appendleft("a")
    assert list(f) == ["a", "b", "c", "d"] and f.head() == "a" and len(f) == 4
    f.remove("c")  # from the middle
    f.remove("a")  # the head
    f.remove("zzz")  # not there: nothing happens
    assert list(f) == ["b", "d"] and "c" not in f and "b" in f
    f.remove("b")
    f.remove("d")
    assert not f and f.head() is None


def test_a_work_id_is_in_one_place_through_every_event() -> None:
    led = Ledger(1)
    led.apply(Submitted((WorkItem("a"), WorkItem("b"))))
    led.apply(Submitted((WorkItem("a", "resubmitted"),)))  # known: ignored
    assert list(led.frontier) == ["a", "b"] and led.items["a"].payload is None
    led.apply(Dispatched(T1, 3, ("a", "b")))
    assert not led.frontier and led.in_flight == {"a": (T1, 3), "b": (T1, 3)}
    assert led.counter == 1
    led.apply(Requeued("b", T1, "watchdog-timeout", "timeout", 0, "", split=True))
    led.apply(Requeued("a", T1, "watchdog-timeout", "timeout", 0, "", split=True))
    assert list(led.frontier) == ["a", "b"] and led.solo == {"a", "b"} and not led.attempts
    led.apply(Dispatched(T2, 3, ("a",)))
    led.apply(Deferred("a", T2, "watchdog-timeout", 1, ("timeout",), "deadline passed"))
    assert set(led.deferred) == {"a"} and "a" not in led.solo and led.attempts == {"a": 1}
    led.apply(RequeuedDeferred("a"))
    assert list(led.frontier) == ["b", "a"] and not led.deferred and not led.attempts
    led.apply(Dispatched(T3, 3, ("a",)))
    led.apply(Committed(T3, 3, ("a",)))
    led.apply(Committed(T3, 3, ("a",)))  # a second commit of a work ID is counted, ignored
    assert led.committed == {"a"} and "a" not in led.items and led.duplicate_commits == 1
    assert list(led.frontier) == ["b"]
    led.apply(Dispatched(T4, 3, ("b",)))
    led.apply(Committed(T4, 3, ("b", "b")))  # twice in one record: the second is counted too
    assert led.committed == {"a", "b"} and led.duplicate_commits == 2 and not led.in_flight
    led.apply(Delivered(7))
    led.apply(Delivered(5))
    assert led.delivered == 7
    led.apply(EpochStarted(2))
    assert led.epoch == 2 and led.counter == 0


def test_a_requeue_or_deferral_of_an_unknown_work_id_is_invalid() -> None:
    led = Ledger(1)
    led.apply(Submitted((WorkItem("a"),)))
    led.apply(Dispatched(T1, 1, ("a",)))
    led.apply(Committed(T1, 1, ("a",)))
    for ev in (
        Requeued("zzz", T1, "watchdog-timeout", "timeout", 1, ""),
        Requeued("a", T1, "watchdog-timeout", "timeout", 1, ""),  # committed: not open
        Deferred("zzz", T1, "watchdog-timeout", 1, ("timeout",), ""),
    ):
        with pytest.raises(Invalid):
            led.apply(ev)


@pytest.mark.parametrize(
    "forged",
    [
        Dispatched(T2, 1, ("ghost",)),  # never submitted (issue 29: a KeyError at open)
        Dispatched(T2, 1, ("a",)),  # already in flight
        Dispatched(Token(2, 1), 1, ("b",)),  # a token of another epoch
        Committed(T2, 1, ("ghost",)),  # a commit of an item never submitted
        Committed(T2, 1, ("b",)),  # a commit of a pending item
        Committed(T2, 1, ("a",)),  # in flight, but under another token
        RequeuedDeferred("ghost"),
    ],
    ids=repr,
)
def test_an_event_that_names_what_the_ledger_has_not_is_invalid(forged: Any) -> None:
    """S11 covers references too: a checksummed record naming an item that is not where the
    event needs it is a damaged journal, not a KeyError or a silent new item."""
    led = Ledger(1)
    led.apply(Submitted((WorkItem("a"), WorkItem("b"))))
    led.apply(Dispatched(T1, 1, ("a",)))
    before = led.to_snapshot()
    with pytest.raises(Invalid):
        led.apply(forged)
    assert led.to_snapshot() == before  # refused before anything changed


def test_a_snapshot_round_trips_and_drops_an_in_flight_entry_that_is_elsewhere() -> None:
    led = Ledger(1)
    led.apply(Submitted(tuple(WorkItem(w, w) for w in "abcd")))
    led.apply(Dispatched(T1, 2, ("a", "b")))
    led.apply(Committed(T1, 2, ("a",)))
    snap = led.to_snapshot()
    assert Ledger.from_snapshot(snap) == led
    assert led.to_snapshot(committing={"b"})["committed"] == ["a", "b"]
    snap["in_flight"].append({"token": "e1-3", "rank": 2, "work": WorkItem("c").to_json()})
    back = Ledger.from_snapshot(snap)  # c is pending: the pending fact wins
    assert "c" in back.frontier and "c" not in back.in_flight
    snap["in_flight"][-1]["token"] = "not-a-token"
    with pytest.raises(Invalid):
        Ledger.from_snapshot(snap)


@settings(max_examples=examples(60), deadline=None)
@given(
    ops=st.lists(
        st.sampled_from(["send", "send3", "ok", "fail", "ready", "sweep", "tick", "lost"]),
        max_size=80,
    ),
    ranks=st.one_of(st.integers(1, 40), st.sampled_from([2_000, 10_000])),
)
def test_replaying_the_cores_events_rebuilds_its_ledger(ops: list[str], ranks: int) -> None:
    """The core's decisions, encoded and decoded as the shell and replay do, rebuild its ledger
    exactly, at every step (the in-memory twin of the journal test in test_state.py), and so
    does its compact snapshot form with the submissions store, with up to 10,000 ranks."""
    d = Dispatcher(1, WatchdogConfig(10), RetryPolicy(1), ranks=range(1, ranks + 1))
    items = [WorkItem(f"w{i}", i) for i in range(12)]
    d.submit(items)
    records = [encode(EpochStarted(1)), encode(Submitted(tuple(items)))]

    def journal(out: list[Any]) -> None:
        for x in out:
            ev = of_decision(x)
            if ev is not None:
                records.append(encode(ev))

    now, sent = 0.0, []
    for op in ops:
        if op in ("send", "send3"):
            x = d.reserve(now, 3 if op == "send3" else 1)
            if x is not None and not isinstance(x, Send):
                d.snapshot_persisted()
                x = d.reserve(now, 3 if op == "send3" else 1)
            if isinstance(x, Send):
                journal([x])
                d.mark_dispatched(x.token, now)
                sent.append(x)
        elif op in ("ok", "fail") and sent:
            x = sent[-1]
            errors = {0: "raised"} if op == "fail" else None
            out = each_commit(
                d.on_results(x.rank, str(x.token), [1] * len(x.items), now, errors=errors)
            )
            journal(out)
            for c in [o for o in out if type(o).__name__ == "Commit"][-1:]:
                wids = tuple(o.work_id for o in out if type(o).__name__ == "Commit")
                records.append(encode(Committed(c.token, c.rank, wids, (1,) * len(wids))))
                d.commit_done(c.token)
        elif op == "ready" and sent:
            x = sent.pop()
            journal(d.on_ready(x.rank, str(x.token), now))
            journal(d.join_invalid(now))
        elif op == "sweep":
            journal(d.sweep(now))
        elif op == "lost" and d.live_ranks():
            journal(d.rank_lost(d.live_ranks()[-1], now))
        else:
            now += 7.0
        replayed = Ledger()
        for rec in records:
            replayed.apply_record(rec)
        assert replayed == d.ledger
        compact, tail = Ledger.from_compact(d.ledger.to_compact(), _store_of(d.ledger))
        assert compact == d.ledger and not tail


# ------------------------------------------------------------------ the compact form (issue 17)
@settings(max_examples=examples(80), deadline=None)
@given(st.lists(st.integers(0, 60), max_size=120))
def test_runs_are_the_set_they_were_given(values: list[int]) -> None:
    r, seen = Runs(), set()
    for v in values:
        assert r.add(v) is (v not in seen)
        seen.add(v)
    assert set(r) == set(values) and len(r) == len(set(values))
    runs = r.runs()
    assert all(a < b for a, b in runs)
    assert all(b1 < a2 for (_a1, b1), (a2, _b2) in zip(runs, runs[1:], strict=False))  # no touching
    assert all((v in r) == (v in values) for v in range(-1, 62))
    assert set(Runs.of_runs(runs)) == set(values)
    assert "a" not in r


def test_runs_refuse_what_is_not_sorted_and_disjoint() -> None:
    for bad in ([[3, 3]], [[4, 2]], [[0, 2], [1, 3]], [[0, 2], [2, 3]]):
        with pytest.raises(Invalid):
            Runs.of_runs(bad)


@settings(max_examples=examples(80), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["append", "appendleft", "remove"]), st.integers(0, 30)),
        max_size=100,
    )
)
def test_the_frontier_is_the_list_it_models(ops: list[tuple[str, int]]) -> None:
    """Runs of indices behave as the plain ordered list (with set membership) they replace."""
    f, model = Frontier(), []
    for op, n in ops:
        w = f"w{n}"
        if op == "remove":
            f.remove(w)
            if w in model:
                model.remove(w)
        elif w not in model:
            getattr(f, op)(w)
            model.append(w) if op == "append" else model.insert(0, w)
        assert list(f) == model and len(f) == len(model) and f.head() == (model or [None])[0]
        assert all((f"w{k}" in f) == (f"w{k}" in model) for k in range(31))
    assert len(f.runs()) <= len(model)


@settings(max_examples=examples(120), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "appendleft", "remove"]),
            st.integers(0, 30),
            st.sampled_from([0, 0, 1, -2, 7]),
        ),
        max_size=120,
    )
)
def test_the_frontier_with_priorities_is_the_list_it_models(
    ops: list[tuple[str, int, int]],
) -> None:
    """G2 (issue 31): higher priority first, first in first out within one, and an item put
    back at the front goes to the front of its own priority; the model is a list per level."""
    f, model = Frontier(), {}  # level -> list of work IDs
    where: dict[str, int] = {}
    for op, n, level in ops:
        w = f"w{n}"
        if op == "remove":
            f.remove(w)
            if w in where:
                model[where.pop(w)].remove(w)
        elif w not in where:
            getattr(f, op)(w, level)
            where[w] = level
            at = model.setdefault(level, [])
            at.append(w) if op == "append" else at.insert(0, w)
        flat = [w for k in sorted(model, reverse=True) for w in model[k]]
        assert list(f) == flat and len(f) == len(flat) and f.head() == (flat or [None])[0]
        assert f.first(3) == flat[:3]
        assert all((f"w{k}" in f) == (f"w{k}" in where) for k in range(31))
    back = Frontier.of_runs(f._ids, f.runs(), [(k, f.runs(k)) for k in f.levels()])
    assert list(back) == list(f)


def test_priorities_order_the_ledger_and_survive_both_snapshot_forms() -> None:
    """G2: a submission of mixed priorities is served highest first; a failed item goes back
    to the front of its own priority, a deferred one put back to its back; both snapshot forms
    load the same order back, and the compact form names the levels' runs only."""
    led = Ledger(1)
    items = [WorkItem("l0"), WorkItem("h0", 1, priority=5), WorkItem("l1"), WorkItem("m0", 2)]
    items += [WorkItem("h1", 3, priority=5), WorkItem("n0", priority=-1), WorkItem("m1", 4)]
    led.apply(Submitted(tuple(items)))
    assert list(led.frontier) == ["h0", "h1", "l0", "l1", "m0", "m1", "n0"]
    led.apply(Dispatched(T1, 2, ("h0",)))
    led.apply(Requeued("h0", T1, "watchdog-timeout", "timeout", 1, "late"))
    led.apply(Dispatched(T2, 3, ("h1",)))
    led.apply(Requeued("h1", T2, "watchdog-timeout", "timeout", 1, "late"))  # front of 5
    led.apply(Dispatched(T3, 2, ("n0",)))
    led.apply(Deferred("n0", T3, "invalid-result", 2, ("error", "error"), "boom"))
    led.apply(RequeuedDeferred("n0"))
    assert list(led.frontier) == ["h1", "h0", "l0", "l1", "m0", "m1", "n0"]
    snap = led.to_compact()
    assert snap["frontier"] == [[0, 1], [2, 4], [6, 7]]
    assert snap["priorities"] == [[5, [[4, 5], [1, 2]]], [-1, [[5, 6]]]]
    back, _tail = Ledger.from_compact(snap, _store_of(led))
    assert list(back.frontier) == list(led.frontier) and back == led
    assert list(Ledger.from_snapshot(led.to_snapshot()).frontier) == list(led.frontier)
    plain = Ledger(1)
    plain.apply(Submitted((WorkItem("a"),)))
    assert "priorities" not in plain.to_compact()  # the form of earlier versions


def test_withdrawn_items_leave_the_run_but_stay_pending_in_both_snapshot_forms() -> None:
    """Issue 48: ``withdraw`` takes the pending and waiting items (but those kept) out of the
    live frontier and waiting set, in memory only: both snapshot forms still hold them where the
    events put them (a ledger replayed from the same events); a waiting one released meanwhile
    is pending there, one an operator cancels is cancelled once; ``put_back`` returns them."""
    from durable_dispatch.core.events import Cancelled

    items = [WorkItem("a"), WorkItem("b"), WorkItem("h", priority=3), WorkItem("c")]
    items += [WorkItem("w", after=("a",)), WorkItem("v", after=("c",)), WorkItem("x")]
    events: list[Any] = [
        Submitted(tuple(items)),
        Dispatched(T1, 2, ("h",)),
        Dispatched(T2, 3, ("a", "b")),
        Requeued("b", T2, "rank-lost", "lost-rank", 0, "", split=True),  # sent, back: kept
    ]
    led, replay = Ledger(1), Ledger(1)
    for ev in events:
        led.apply(ev)
        replay.apply(ev)
    assert led.withdraw(keep={"b", "a"}) == 4  # c, x pending; w, v waiting (a is in flight)
    assert list(led.frontier) == ["b"] and not led.waiting and led.withdrawn is not None
    assert led.to_snapshot() == replay.to_snapshot() and led.to_compact() == replay.to_compact()
    for ev in (Committed(T2, 3, ("a",)), Cancelled("x", "cmd-1")):  # releases w; cancels x
        led.apply(ev)
        replay.apply(ev)
    assert list(led.frontier) == ["b"] and not led.waiting  # (w released, still withdrawn)
    assert led.to_compact() == replay.to_compact()
    back, _tail = Ledger.from_compact(led.to_compact(), _store_of(led))
    assert back == replay and set(back.frontier) == {"b", "c", "w"} and list(back.waiting) == ["v"]
    assert led.put_back("w") == 1 and led.put_back("w") == 0 and list(led.frontier) == ["b", "w"]
    assert led.withdraw_item("b") and not led.withdraw_item("b") and list(led.frontier) == ["w"]
    assert led.to_compact()["frontier"] == [[4, 5], [3, 4], [1, 2]]  # w, then c, b (withdrawn)
    assert led.put_back() == 3 and led.withdrawn is None and led.put_back() == 0
    assert set(led.frontier) == {"b", "c", "w"} and list(led.waiting) == ["v"]
    back, _tail = Ledger.from_compact(led.to_compact(), _store_of(led))
    assert back == led and set(back.frontier) == set(replay.frontier)


def _store_of(led: Ledger) -> list[tuple[int, list[Any]]]:
    """The submissions store a shell would have written for ``led``'s indices."""
    from durable_dispatch.campaign.admin import _store_records

    return [(r["first"], r["items"]) for r in _store_records(led, 0, len(led.ids), chunk=5)]


def test_the_compact_form_names_indices_and_runs_and_loads_back() -> None:
    led = Ledger(1)
    led.apply(Submitted(tuple(WorkItem(w, {"p": w}) for w in "abcdef")))
    led.apply(Dispatched(T1, 2, ("a", "b")))
    led.apply(Committed(T1, 2, ("a",)))
    led.apply(Requeued("b", T1, "watchdog-timeout", "timeout", 1, "late"))
    led.apply(Dispatched(T2, 3, ("c",)))
    led.apply(Deferred("c", T2, "invalid-result", 2, ("error", "error"), "boom"))
    snap = led.to_compact()
    assert snap["form"] == COMPACT_FORM and snap["size"] == 6
    assert snap["frontier"] == [[1, 2], [3, 6]] and snap["committed"] == [[0, 1]]
    assert snap["deferred"] == [2] and snap["in_flight"] == []
    back, tail = Ledger.from_compact(snap, _store_of(led))
    assert back == led and tail == {} and back.ids.ids == led.ids.ids
    assert led.to_compact(committing={"b"})["committed"] == [[0, 2]]


def test_items_after_the_snapshot_wait_for_their_journal_record() -> None:
    led = Ledger(1)
    led.apply(Submitted((WorkItem("a"),)))
    snap = led.to_compact()
    led.apply(Submitted((WorkItem("b", 7), WorkItem("c")), first=1, stored=True))
    back, tail = Ledger.from_compact(snap, _store_of(led))
    assert list(back.frontier) == ["a"] and sorted(tail) == [1, 2] and tail[1].payload == 7


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s, st_: s.update(size=9), "size"),  # the store holds fewer indices
        (lambda s, st_: s.update(frontier=[[0, 2], [1, 3]]), "frontier"),  # an index twice
        (lambda s, st_: s.update(deferred=[1], frontier=[[0, 3]]), "deferred"),
        (lambda s, st_: s.update(frontier=[[0, 4]]), "frontier"),  # outside the size
        (lambda s, st_: s.update(form=99), "form"),  # a later version's form
        (lambda s, st_: st_.__setitem__(0, (1, st_[0][1])), "first"),  # a record out of place
        (lambda s, st_: st_[0][1].__setitem__(1, None), "items"),  # void where one is pending
        (lambda s, st_: st_[0][1].__setitem__(1, ["a", None]), "work_id"),  # an ID at two indices
        (lambda s, st_: st_[0][1].__setitem__(1, [7, None]), "items"),  # not a work item
    ],
)
def test_a_compact_snapshot_the_store_does_not_match_is_invalid(change: Any, field: str) -> None:
    led = Ledger(1)
    led.apply(Submitted(tuple(WorkItem(w) for w in "abc")))
    snap, store = led.to_compact(), _store_of(led)
    change(snap, store)
    with pytest.raises(Invalid) as ei:
        Ledger.from_compact(snap, store)
    assert ei.value.field == field


def test_a_submission_numbers_from_its_first_index_and_never_reuses_one() -> None:
    led = Ledger(1)
    led.apply(Submitted((WorkItem("a"),), first=2))  # 0 and 1 are void
    led.apply(Submitted((WorkItem("a"), WorkItem("b"))))  # a is known: index 3 is void
    assert led.ids.ids == [None, None, "a", None, "b"] and list(led.frontier) == ["a", "b"]
    with pytest.raises(Invalid):
        led.apply(Submitted((WorkItem("c"),), first=4))
    stored = Submitted((WorkItem("c"),), first=5, stored=True)
    rec = encode(stored)
    assert rec == {"event": "submitted", "first": 5, "count": 1}
    assert decode(rec, lambda first, count: [WorkItem("c")]) == stored
    with pytest.raises(Invalid):
        decode(rec)  # without the store
    for bad in ({"event": "submitted", "first": -1, "count": 1}, {"event": "submitted"}):
        with pytest.raises(Invalid):
            decode(bad, lambda first, count: [])


def test_the_compact_form_costs_the_same_at_every_campaign_size() -> None:
    """S8: a snapshot's size does not grow with the queue (the same history on 100 and on
    100,000 pending items gives the same compact form, but for its size)."""
    import orjson

    forms = []
    for n in (100, 100_000):
        led = Ledger(1)
        led.apply(
            Submitted(tuple(WorkItem(f"w{i}", {"seed": i, "pad": "x" * 40}) for i in range(n)))
        )
        for k in range(1, 25):  # 24 dispatches: 12 commit, 6 time out, 2 defer, 4 stay out
            w = f"w{k - 1}"
            led.apply(Dispatched(Token(1, k), k % 8, (w,)))
            if k <= 12:
                led.apply(Committed(Token(1, k), k % 8, (w,)))
            elif k <= 18:
                led.apply(Requeued(w, Token(1, k), "watchdog-timeout", "timeout", 1, "late"))
            elif k <= 20:
                led.apply(Deferred(w, Token(1, k), "invalid-result", 3, ("error",) * 3, "boom"))
        snap = led.to_compact()
        # each requeue went to the front: 6 runs of one, then the rest in one run
        assert snap["size"] == n and len(snap["frontier"]) == 7 and len(snap["in_flight"]) == 4
        snap["size"] = 0
        snap["frontier"][-1][1] -= n
        forms.append(orjson.dumps(snap))
    assert forms[0] == forms[1]
