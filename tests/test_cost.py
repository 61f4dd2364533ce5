"""``cost``: the one form of what an attempt cost, its table, and the one validator that the
master's intake and every record's reader share (what is written is what is read)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from durable_dispatch.campaign.costs import CostTable, cost_entries, record_members
from durable_dispatch.core.events import check_event, record_costs
from durable_dispatch.cost import BY_MAX, cost, is_cost, is_cost_table, wire_table
from durable_dispatch.schema import Invalid, check_defer_record

GOOD = {"cpu": 0.5, "rss": 1024, "by": "child"}


@pytest.mark.parametrize(
    "c",
    [
        GOOD,
        {"cpu": None, "rss": None, "by": "in-process"},
        {"cpu": 3, "rss": 0, "by": "x" * BY_MAX},
    ],
)
def test_a_cost_passes_at_intake_and_when_read(c: dict[str, Any]) -> None:
    assert is_cost(c) and cost_entries({"w": c}) == {"w": c}
    check_event({"event": "requeued", "work_id": "w", "source": "node-lost", "cost": c})
    check_defer_record({"event": "deferred", "work_id": "w", "cost": c})


@pytest.mark.parametrize(
    "c",
    [
        {**GOOD, "extra": 1},  # more than its three members
        {"cpu": 0.5, "by": "child"},  # fewer
        {**GOOD, "by": "x" * (BY_MAX + 1)},
        {**GOOD, "cpu": "lots"},
        {**GOOD, "cpu": True},
        {**GOOD, "rss": 1.5},
        {**GOOD, "by": None},
        [0.5, 1024, "child"],
    ],
)
def test_what_is_no_cost_is_refused_at_intake_and_when_read(c: Any) -> None:
    assert not is_cost(c) and cost_entries({"w": c}) is None
    with pytest.raises(Invalid, match="cost"):
        check_event({"event": "requeued", "work_id": "w", "source": "node-lost", "cost": c})
    with pytest.raises(Invalid, match="cost"):
        check_defer_record({"event": "deferred", "work_id": "w", "cost": c})


def test_cost_rounds_to_the_microsecond_and_never_goes_below_zero() -> None:
    assert cost(1.23456789, 7, "child") == {"cpu": 1.234568, "rss": 7, "by": "child"}
    assert [cost(c, None, "x")["cpu"] for c in (-1.0, -0.0, math.nan, None)] == [0.0] * 3 + [None]


def _columns(costs: list[dict[str, Any] | None]) -> tuple[list[Any], list[Any], list[Any]]:
    """The worker's cost columns of ``costs`` (None: an item not measured)."""
    return (
        [None if c is None else c["cpu"] for c in costs],
        [None if c is None else c["rss"] for c in costs],
        [None if c is None else c["by"] for c in costs],
    )


def test_the_table_a_worker_sends_is_the_one_the_master_holds_and_the_record_keeps() -> None:
    costs = [cost(0.5, 1, "child"), cost(1.0, None, "child")]
    table = wire_table(["a", "b"], *_columns(costs))
    assert table == {"ids": ["a", "b"], "cpu": [0.5, 1.0], "rss": [1, None], "by": "child"}
    held = cost_entries(table)
    assert isinstance(held, CostTable)
    record = held.columns_for(("a", "b"))
    assert record is not None and is_cost_table(record)
    assert held.get("b") == costs[1]
    assert not is_cost_table({**record, "by": "x" * (BY_MAX + 1)})
    assert not is_cost_table({**record, "rss": [1]})


def test_a_table_is_only_for_several_costs_all_measured_alike() -> None:
    one, other = cost(0.5, 1, "child"), cost(0.5, 1, "child-ended")
    assert wire_table(["a"], *_columns([one])) is None
    assert wire_table(["a", "b"], *_columns([one, None])) is None
    assert wire_table(["a", "b"], *_columns([one, other])) is None
    assert wire_table(["a", 2], *_columns([one, one])) is None


def test_what_a_record_carries_of_its_costs_reads_back_by_work_id() -> None:
    """``record_members`` writes a record's cost members, ``events.record_costs`` reads them."""
    a, b = cost(0.5, 1, "child"), cost(1.0, None, "child")
    table = cost_entries(wire_table(["a", "b"], *_columns([a, b])) or {})
    assert table is not None
    for held, ids, members in [
        ({"a": a}, ("a",), {"cost": a}),
        ({"a": a}, ("z",), {}),
        (table, ("a", "b"), {"cost_table": {"cpu": [0.5, 1.0], "rss": [1, None], "by": "child"}}),
        (table, ("b", "a"), {"costs": [b, a]}),  # not the table's order: one per item
        ({"a": a}, ("a", "z"), {"costs": [a, None]}),
    ]:
        assert record_members(held, ids) == members
        want = {w: c for w, c in (("a", a), ("b", b)) if w in ids and held.get(w) is not None}
        assert (record_costs(members, ids) or {}) == want
