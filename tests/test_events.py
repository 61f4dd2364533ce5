"""``core.events``: each event class is the whole of its event (name, schema, encode, decode),
and the module's ``encode``/``decode``/``check_event`` are those of the classes."""

from __future__ import annotations

import pytest

from durable_dispatch.core.decisions import WorkItem
from durable_dispatch.core.events import (
    EVENTS,
    Cancelled,
    CommandApplied,
    Committed,
    Deferred,
    Delivered,
    Dispatched,
    EpochStarted,
    Requeued,
    RequeuedDeferred,
    Submitted,
    WorkerHost,
    check_event,
    decode,
    decode_moved,
    encode,
    record_costs,
    record_time,
)
from durable_dispatch.schema import Invalid
from durable_dispatch.tokens import Token

T = Token(3, 7)
SAMPLES = [
    EpochStarted(3, 12.5),
    Submitted((WorkItem("a", {"x": 1}), WorkItem("b", priority=2)), 4),
    Dispatched(T, 2, ("a",)),
    Dispatched(T, 2, ("a", "b")),
    Committed(T, 2, ("a",), ({"r": 1},), 99.0),
    Committed(T, 2, ("a", "b"), (1, None), 99.0),
    Requeued("a", T, "watchdog-timeout", "timeout", 1, "late"),
    Requeued("a", T, "watchdog-timeout", "timeout", 0, "late", split=True),
    Deferred("a", T, "invalid-result", 3, ("error", "error", "timeout"), "boom"),
    RequeuedDeferred("a"),
    Delivered(41),
    WorkerHost(2, "node-7", 12.5),
    Cancelled("a", "cmd-1"),
    Cancelled("a"),
    CommandApplied("cmd-1", "cancel", {"work_ids": {"a": "cancelled"}, "ok": True}),
]


def test_every_event_class_is_sampled_and_names_itself_once() -> None:
    assert {type(s) for s in SAMPLES} == set(EVENTS)
    assert len({c.NAME for c in EVENTS}) == len(EVENTS)


@pytest.mark.parametrize("ev", SAMPLES, ids=lambda e: type(e).__name__)
def test_an_event_decodes_from_its_encoding_under_its_name(ev: object) -> None:
    rec = encode(ev)  # type: ignore[arg-type]
    assert rec["event"] == type(ev).NAME  # type: ignore[attr-defined]
    check_event(rec)
    assert decode(rec) == ev


@pytest.mark.parametrize("cls", EVENTS, ids=lambda c: c.NAME)
def test_a_record_without_a_required_member_is_refused_naming_it(cls: type) -> None:
    ev = next(s for s in SAMPLES if type(s) is cls)
    rec = encode(ev)
    for member in cls.REQUIRED:
        broken = {k: v for k, v in rec.items() if k != member}
        with pytest.raises(Invalid) as e:
            decode(broken)
        assert e.value.field == member


def test_the_rules_an_event_adds_to_its_members() -> None:
    with pytest.raises(Invalid, match="work_id"):  # a dispatch names its work
        decode({"event": "dispatched", "token": "e1-1", "rank": 1})
    with pytest.raises(Invalid, match="token"):  # parsed, so checked
        decode({"event": "dispatched", "token": "e1-x", "rank": 1, "work_id": "a"})
    with pytest.raises(Invalid, match="attempts"):  # a charged requeue says how many
        decode({"event": "requeued", "work_id": "a", "source": "watchdog-timeout"})
    assert decode({"event": "requeued", "work_id": "a", "source": "master-restart"}) is not None
    with pytest.raises(Invalid, match="count"):  # a stored submission of nothing
        decode({"event": "submitted", "first": 0, "count": 0}, lambda f, c: [])
    with pytest.raises(Invalid, match="submissions store"):
        decode({"event": "submitted", "first": 0, "count": 1})


def test_a_later_versions_event_passes_and_decodes_to_none() -> None:
    assert decode({"event": "from-the-future", "x": 1}) is None
    with pytest.raises(Invalid):
        check_event({"no": "event"})
    with pytest.raises(TypeError):
        encode("not an event")  # type: ignore[arg-type]


def test_a_moved_result_decodes_as_its_committed_record_with_where_it_came_from() -> None:
    rec = {**encode(Committed(T, 2, ("a", "b"), (1, None), 99.0)), "event": "result"}
    m = decode_moved({**rec, "seq": 41, "started": 98, "host": "n1"})
    assert (m.seq, m.commit, m.started, m.host) == (
        41,
        decode({**rec, "event": "committed"}),
        98.0,
        "n1",
    )
    assert decode_moved({**rec, "seq": 1}).started is None
    with pytest.raises(Invalid, match="seq"):
        decode_moved(rec)
    with pytest.raises(Invalid, match="rank"):
        decode_moved({**rec, "seq": 1, "rank": "2"})


def test_a_records_costs_and_time_are_read_in_one_place() -> None:
    c = {"cpu": 0.5, "rss": 10, "by": "child"}
    assert record_costs({"cost": c}, ("a",)) == {"a": c}
    table = {"cpu": [0.5, None], "rss": [10, None], "by": "child"}
    assert record_costs({"cost_table": table}, ("a", "b")) == {
        "a": c,
        "b": {"cpu": None, "rss": None, "by": "child"},
    }
    assert record_costs({"costs": [None, c]}, ("a", "b")) == {"b": c}
    assert record_costs({}, ("a",)) is None
    assert record_time({"ts": 3}) == 3.0 and record_time({"ts": True}) is None
    assert record_time({}) is None
