"""The wire protocol's message bodies, and the worker's RESULT for a multi-item dispatch."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from durable_dispatch.core import ItemFailure
from durable_dispatch.mpi import protocol as P
from durable_dispatch.mpi.context import ItemOutcome, WorkContext, call_work_function
from durable_dispatch.mpi.protocol import result_message


def test_a_result_body_reads_as_results_and_per_item_errors() -> None:
    body, err = P.decode(P.encode({"token": "e1-1", "results": [1, None], "errors": {"1": "x"}}))
    assert err is None
    assert P.read_result(body, None) == ([1, None], {1: "x"}, None)
    assert P.read_result({"token": "e1-1", "results": [1]}, None) == ([1], None, None)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (None, "not JSON"),
        ({"token": "e1-1", "error": "boom"}, "boom"),
        ({"token": "e1-1"}, "without a results list"),
        ({"token": "e1-1", "results": {"0": 1}}, "without a results list"),
        ({"token": "e1-1", "results": [1], "errors": ["x"]}, "not an object"),
        ({"token": "e1-1", "results": [1], "errors": {"-1": "x"}}, "not a number"),
        ({"token": "e1-1", "results": [1], "errors": {"one": "x"}}, "not a number"),
        ({"token": "e1-1", "results": [1], "errors": {"\u0661": "x"}}, "not a number"),
    ],
)
def test_a_result_body_that_cannot_be_read_gives_a_reason_never_an_exception(
    body: dict[str, Any] | None, reason: str
) -> None:
    results, errors, why = P.read_result(body, "not JSON: bad" if body is None else None)
    assert results is None and errors is None and why is not None and reason in why


def _outcomes(fn: Any, payloads: list[Any], max_result: int = 1 << 20) -> list[ItemOutcome]:
    ctx = WorkContext("w", 0, None, 1.0)
    return [call_work_function(fn, "payload", p, ctx, max_result) for p in payloads]


def _work(p: dict[str, Any]) -> Any:
    if p["x"] == 2:
        raise RuntimeError("injected failure in the work function")
    if p["x"] == 3:
        return {1, 2}  # a set: JSON cannot hold it
    if p["x"] == 5:
        return "y" * 100
    return p["x"] * 10


def test_the_worker_runs_each_item_and_reports_failures_per_item_with_their_kind() -> None:
    """Issue 14: a function that raised and a result JSON cannot hold were both reported as
    malformed results; each now has its own kind (and so its own retry budget)."""
    payloads = [{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}, {"x": 5}]
    msg = orjson.loads(result_message("e1-7", _outcomes(_work, payloads, max_result=50), None))
    assert msg["token"] == "e1-7"
    assert msg["results"] == [10, None, None, 40, None]
    assert {i: e["kind"] for i, e in msg["errors"].items()} == {
        "1": "error",
        "2": "malformed-result",
        "4": "result-too-large",
    }
    assert "RuntimeError: injected failure" in msg["errors"]["1"]["reason"]
    _results, errors, _ = P.read_result(msg, None)
    assert errors is not None and errors[1] == ItemFailure(
        "error", msg["errors"]["1"]["reason"], traceback=msg["errors"]["1"]["traceback"]
    )
    assert errors[1].traceback.endswith("RuntimeError: injected failure in the work function")
    assert errors[2].final and not errors[1].final and not errors[4].final  # a refused value


def test_a_clean_result_has_no_errors_entry() -> None:
    raw = result_message("e1-1", _outcomes(str, [1, 2]), None)
    assert orjson.loads(raw) == {"token": "e1-1", "results": ["1", "2"]}


def test_a_dispatch_that_failed_as_a_whole_reads_as_one_failure_with_its_kind() -> None:
    raw = result_message("e1-2", [], ItemOutcome(None, "timeout", "w: deadline passed"))
    assert P.read_result(orjson.loads(raw), None) == (
        None,
        None,
        ItemFailure("timeout", "w: deadline passed"),
    )


def test_results_that_would_overfill_the_message_become_result_too_large() -> None:
    big = ItemOutcome(b'"' + b"z" * (P.MAX_MESSAGE // 2) + b'"')
    msg = orjson.loads(result_message("e1-3", [big, big], None))
    assert msg["results"][0] is not None and msg["results"][1] is None
    assert msg["errors"]["1"]["kind"] == "result-too-large"


def test_a_work_message_names_the_own_timeout_of_each_item_that_has_one() -> None:
    """In a dispatch of several items, the entry of an item with its own timeout carries it (the
    isolating worker applies it to that item alone); the others carry none, and a dispatch of
    one item never does (its deadline is its own)."""
    from durable_dispatch.core import Dispatcher, Send, WatchdogConfig, WorkItem

    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10.0), ranks=(1, 2))
    d.submit([WorkItem("a", 1), WorkItem("b", {"x": 2}, timeout=3.5), WorkItem("c", None)])
    d.submit([WorkItem("alone", 4, timeout=2.0)])
    s = d.reserve(0.0, 3)
    assert isinstance(s, Send)
    body = orjson.loads(P.work_message(s))
    assert body["items"] == [
        {"work_id": "a", "payload": 1, "attempt": 0},
        {"work_id": "b", "payload": {"x": 2}, "attempt": 0, "timeout": 3.5},
        {"work_id": "c", "payload": None, "attempt": 0},
    ]
    one = d.reserve(0.0, 3)
    assert isinstance(one, Send) and len(one.items) == 1
    assert orjson.loads(P.work_message(one))["items"] == [
        {"work_id": "alone", "payload": 4, "attempt": 0}
    ]


def test_a_results_costs_are_a_table_when_its_items_were_measured_alike() -> None:
    """Several items, each measured, all the same way: one column each, in the order of
    ``ids`` (the master keeps it as it comes); one item, or items measured differently or
    not at all, by work ID."""
    child = {"cpu": 0.5, "rss": 3, "by": "child"}
    ended = {"cpu": 0.25, "rss": None, "by": "child-ended"}

    def costs(*cs: dict[str, Any] | None) -> Any:
        outcomes = [ItemOutcome(b"1", cost=c) for c in cs]
        ids = [f"w{i}" for i in range(len(cs))]
        return orjson.loads(result_message("e1-1", outcomes, None, ids)).get("costs")

    assert costs(child, {**child, "cpu": 1.5}) == {
        "ids": ["w0", "w1"],
        "cpu": [0.5, 1.5],
        "rss": [3, 3],
        "by": "child",
    }
    assert costs(child) == {"w0": child}
    assert costs(child, ended) == {"w0": child, "w1": ended}
    assert costs(child, None) == {"w0": child}
    assert costs(None, None) is None


def test_a_results_costs_and_outputs_never_take_it_over_its_bound_nor_displace_a_result() -> None:
    """A batch of 2,000 items whose results nearly fill the RESULT, each with its cost and some
    output: the message stays within its bound (a RESULT over it is refused as malformed and
    the whole batch's results are lost), every result that fit without costs and outputs is
    still there, and the outputs take only the room the results left."""
    n = 2000
    cost = {"cpu": 0.125, "rss": 21 << 20, "by": "child"}
    said = {"stdout": b"x" * 4000, "stderr": b"", "dropped": (0, 0)}
    each = (P.MAX_MESSAGE - (64 << 10)) // n - 8  # the results alone fit, with a little to spare
    outcomes = [
        ItemOutcome(b'"' + b"r" * (each - 2) + b'"', cost=cost, output=said) for _ in range(n)
    ]
    ids = [f"item-{i:06d}" for i in range(n)]
    raw = result_message("e1-4", outcomes, None, ids)
    assert len(raw) <= P.MAX_MESSAGE, len(raw) - P.MAX_MESSAGE
    msg = orjson.loads(raw)
    assert all(r is not None for r in msg["results"]), msg.get("errors", {}).get("0")
    line = {"stdout": b"y" * 100, "stderr": b"", "dropped": (0, 0)}
    small = [ItemOutcome(b"1", cost=cost, output=line) for _ in range(n)]
    msg = orjson.loads(result_message("e1-5", small, None, ids))  # room enough: all kept
    table = msg["costs"]  # (several items measured alike: one column each, campaign/costs.py)
    assert table == {"ids": ids, "cpu": [0.125] * n, "rss": [21 << 20] * n, "by": "child"}
    assert len(msg["outputs"]) == n


def test_a_work_message_reads_back_as_the_master_sent_it() -> None:
    """WORK both ways in protocol.py: what ``work_message`` encodes, ``read_work`` reads."""
    from durable_dispatch.core import Dispatcher, Send, WatchdogConfig, WorkItem

    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(30.0), ranks=(1,))
    d.submit([WorkItem("a", 1), WorkItem("b", 2)])
    s = d.reserve(0.0, 2)
    assert isinstance(s, Send)
    work = P.read_work(P.decode(P.work_message(s, ahead=True))[0])
    assert work is not None
    assert (work.token, work.seconds, work.lease) == (str(s.token), s.seconds, s.lease)
    assert work.ahead
    assert [(w["work_id"], w["payload"]) for w in work.items] == [("a", 1), ("b", 2)]
    assert P.read_work(None) is None and P.read_work({"items": [1]}) is None
    odd = P.read_work({"token": "e1-1", "items": [{}], "seconds": -1, "lease": "x", "ahead": 1})
    assert odd == P.Work("e1-1", [{}], None, 0.0, False)  # one item: never ahead
    assert P.read_work({"items": [], "seconds": 2}) == P.Work(None, [], 2.0, 2.0, False)


def test_a_part_is_a_result_with_its_work_ids_first() -> None:
    raw = P.part_message("e1-9", [ItemOutcome(b"7")], ["w1"])
    assert raw.startswith(b'{"ids":["w1"],"token":"e1-9"')
    assert orjson.loads(raw)["results"] == [7]
