"""Items sent ahead of their dispatch's RESULT (issue 48): a worker reports the outcomes of a
multi-item dispatch's finished items while a slow item still runs; the master commits them
durably at once, and the dispatch goes on with the items left. The core in virtual time, then
the campaign state on a real journal (reopened: replay agrees)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from durable_dispatch import CampaignState
from durable_dispatch.core import (
    Classification,
    Commit,
    Dispatcher,
    ItemFailure,
    PersistSnapshot,
    Quarantine,
    Requeue,
    Send,
    WatchdogConfig,
    WorkItem,
)
from durable_dispatch.mpi import protocol

from .helpers import each_commit


def three(d: Dispatcher) -> Send:
    d.submit(WorkItem(f"w{i}", {"i": i}) for i in range(3))
    s = d.reserve(0.0, 3)
    assert isinstance(s, Send) and len(s.items) == 3
    d.mark_dispatched(s.token, 0.0)
    return s


def test_a_part_commits_its_items_and_the_result_carries_the_rest() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10.0), ranks=(1,))
    s = three(d)
    out = d.on_part(1, str(s.token), ["w0"], ["a"], 0.1)
    assert out == [Commit(1, s.token, "w0", "a", part=True)]
    d.part_done(s.token, 1, ["w0"])
    assert "w0" in d.ledger.committed and d.statistics().commits == 1
    out = d.on_results(1, str(s.token), ["b", "c"], 0.2)  # the items left, in order
    assert [c.work_id for c in each_commit(out) if isinstance(c, Commit)] == ["w1", "w2"]
    d.commit_done(s.token)
    assert d.on_ready(1, str(s.token), 0.2) == [] and d.done


def test_a_failed_item_in_a_part_takes_the_retry_path_alone() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10.0), ranks=(1,))
    s = three(d)
    out = d.on_part(1, str(s.token), ["w1"], [None], 0.1, errors={0: ItemFailure("crash", "x")})
    assert isinstance(out[0], Requeue) and out[0].work_id == "w1" and out[0].attempts == 1
    assert isinstance(out[-1], PersistSnapshot)
    assert [w.work_id for w in d.ledger.items.of(d.ledger.frontier)] == ["w1"]


def test_a_timeout_after_a_part_rolls_back_only_the_items_left() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10.0), ranks=(1,))
    s = three(d)
    d.on_part(1, str(s.token), ["w0"], ["a"], 0.1)
    d.part_done(s.token, 1, ["w0"])
    out = d.sweep(100.0)
    assert sorted(r.work_id for r in out if isinstance(r, Requeue)) == ["w1", "w2"]
    assert "w0" in d.ledger.committed


def test_a_part_that_names_the_wrong_items_is_quarantined_and_changes_nothing() -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10.0), ranks=(1, 2))
    s = three(d)
    t = str(s.token)
    for ids, results in (
        (["w9"], ["x"]),  # not in the dispatch
        (["w0", "w0"], ["x", "y"]),  # twice
        (["w0", "w1", "w2"], ["x", "y", "z"]),  # all of them: that is the RESULT's job
        (["w0"], ["x", "y"]),  # entries that do not match
        ("w0", ["x"]),  # not a list
    ):
        (q,) = d.on_part(1, t, ids, results, 0.1)
        assert isinstance(q, Quarantine) and q.classification is Classification.MALFORMED
    (q,) = d.on_part(2, t, ["w0"], ["x"], 0.1)  # another rank's
    assert isinstance(q, Quarantine)
    assert len(d.ledger.in_flight) == 3 and not d.ledger.committed


def test_the_wire_form_of_a_part_is_sorted_apart_from_results() -> None:
    part = (
        b'{"ids":["w0"],"token":"e1-1","results":[1],"errors":{"0":{"kind":"error","reason":"r"}}}'
    )
    inbox = protocol.sort(
        [(1, protocol.RESULT, part), (1, protocol.RESULT, b'{"token":"e1-1","results":[2]}')]
    )
    assert inbox.parts == [(1, "e1-1", ["w0"], [1], {0: ItemFailure("error", "r")})]
    assert inbox.results == [(1, "e1-1", [2], None, None)]


def test_a_part_is_durable_before_its_callback_and_replay_agrees(tmp_path: Path) -> None:
    """On a real journal: the part's commit reaches the callback once durable, a timeout of the
    rest requeues only the rest, and a reopened state holds the part committed and the rest
    pending (their results readable)."""
    from durable_dispatch import read_results

    seen: list[tuple[str, Any]] = []
    root = tmp_path / "s"
    st = CampaignState.open(
        root,
        ranks=(1,),
        watchdog=WatchdogConfig(10.0),
        on_commit=lambda w, r: seen.append((w, r)),
    )
    try:
        st.submit(WorkItem(f"w{i}", {"i": i}) for i in range(3))
        s = st.next_send(0.0, 3)
        assert s is not None and len(s.items) == 3
        st.sent(s.token, 0.0)
        st.on_part(1, str(s.token), ["w0", "w1"], [{"v": 0}, {"v": 1}], 0.1, errors=None)
        st.tick(0.2)
        st.deliver(wait=True)
        assert seen == [("w0", {"v": 0}), ("w1", {"v": 1})]
        st.tick(100.0)  # the last item is late: only it goes back
        assert list(st.core.ledger.frontier) == ["w2"]
    finally:
        st.close()
    with CampaignState.open(root, ranks=(1,)) as again:
        assert sorted(again.core.ledger.committed) == ["w0", "w1"]
        assert list(again.core.ledger.frontier) == ["w2"]
    assert [(r.work_id, r.result) for r in read_results(root)] == [
        ("w0", {"v": 0}),
        ("w1", {"v": 1}),
    ]


def test_batch_auto_counts_the_items_sent_ahead_in_the_dispatchs_time() -> None:
    """The sizer measures a dispatch by all its items: 3 items in 0.03 s is 10 ms each (5 to a
    dispatch), not 30 ms for the one left in the RESULT (which would shrink dispatches to 1)."""
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10.0), ranks=(1,))
    s = three(d)
    d.on_part(1, str(s.token), ["w0", "w1"], ["a", "b"], 0.01)
    d.on_results(1, str(s.token), ["c"], 0.03)
    assert d.auto_batch() == 5


def test_only_auto_sized_dispatches_let_the_worker_send_items_ahead() -> None:
    """A fixed batch keeps one RESULT per dispatch (its counts, splits and lies as the user
    chose them); batch="auto" marks its multi-item WORK ``ahead``."""
    import orjson

    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10.0), ranks=(1,))
    s = three(d)
    assert orjson.loads(protocol.work_message(s, ahead=True))["ahead"] is True
    assert "ahead" not in orjson.loads(protocol.work_message(s))
