"""The wire protocol's message bodies, and the worker's RESULT for a multi-item dispatch."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def test_a_work_message_is_columns_with_each_own_timeout_by_work_id() -> None:
    """The WORK carries its items as columns (no object per item; ``attempts`` only when one
    is not 0); in a dispatch of several, the own timeout of each item that has one is in the
    sparse ``timeouts``, by work ID (the isolating worker applies it to that item alone); a
    dispatch of one item never carries it (its deadline is its own)."""
    from durable_dispatch.core import Dispatcher, Send, WatchdogConfig, WorkItem

    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10.0), ranks=(1, 2))
    d.submit([WorkItem("a", 1), WorkItem("b", {"x": 2}, timeout=3.5), WorkItem("c", None)])
    d.submit([WorkItem("alone", 4, timeout=2.0)])
    s = d.reserve(0.0, 3)
    assert isinstance(s, Send)
    body = orjson.loads(P.work_message(s))
    assert body == {
        "token": str(s.token),
        "ids": ["a", "b", "c"],
        "payloads": [1, {"x": 2}, None],
        "timeouts": {"b": 3.5},
        "seconds": s.seconds,
        "lease": s.lease,
    }
    one = d.reserve(0.0, 3)
    assert isinstance(one, Send) and len(one.items) == 1
    body = orjson.loads(P.work_message(one))
    assert body["ids"] == ["alone"] and body["payloads"] == [4]
    assert "timeouts" not in body and "attempts" not in body


def test_a_work_message_of_64_trivial_items_stays_under_the_eager_limit() -> None:
    """Open MPI sends a message of up to 4 KB eagerly (a blocking Send above it waits for the
    receiver): 64 trivial items in columns take well under it (as objects they took ~3.5 KB)."""
    from durable_dispatch.core import Send, WorkItem

    items = tuple(WorkItem(f"task-{i:05d}", {"i": i}) for i in range(64))
    raw = P.work_message(Send(1, "e12-123456", items, 30.0, 30.0, (0,) * 64))
    assert len(raw) < 2048, len(raw)


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
    """WORK both ways in protocol.py: what ``work_message`` encodes, ``read_work`` reads, as
    the columns the worker's runners consume."""
    from durable_dispatch.core import Dispatcher, Send, WatchdogConfig, WorkItem

    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(30.0), ranks=(1,))
    d.submit([WorkItem("a", 1), WorkItem("b", 2, timeout=4.0)])
    s = d.reserve(0.0, 2)
    assert isinstance(s, Send)
    raw = P.work_message(s, ahead=True, dependencies={"b": {"a0": [1.5]}})
    work = P.read_work(P.decode(raw)[0], raw)
    assert work is not None
    assert (work.token, work.seconds, work.lease) == (str(s.token), s.seconds, s.lease)
    assert work.ahead
    items = work.items
    assert (items.ids, items.payloads, items.attempts) == (["a", "b"], [1, 2], None)
    assert items.timeouts == {"b": 4.0} and [items.timeout(i) for i in (0, 1)] == [None, 4.0]
    assert items.dependencies == {"b": {"a0": [1.5]}}
    assert not items.tagged  # (no stored form in the message: nothing restored per item)
    odd = P.read_work({"token": "e1-1", "ids": ["w"], "payloads": [0], "seconds": -1,
                       "lease": "x", "ahead": 1})  # fmt: skip
    assert odd is not None and (odd.seconds, odd.lease, odd.ahead) == (None, 0.0, False)
    empty = P.read_work({"ids": [], "payloads": [], "seconds": 2})
    assert empty is not None and (empty.seconds, empty.lease, len(empty.items)) == (2.0, 2.0, 0)


@pytest.mark.parametrize(
    "body",
    [
        None,
        {"token": "e1-1"},
        {"token": "e1-1", "items": [{"work_id": "a", "payload": 1, "attempt": 0}]},
        {"token": "e1-1", "ids": ["a"], "payloads": []},
        {"token": "e1-1", "ids": "a", "payloads": [1]},
        {"token": "e1-1", "ids": ["a"], "payloads": {"a": 1}},
        {"token": "e1-1", "ids": ["a"], "payloads": [1], "attempts": [0, 1]},
        {"token": "e1-1", "ids": ["a"], "payloads": [1], "attempts": ["1"]},
        {"token": "e1-1", "ids": ["a"], "payloads": [1], "attempts": [True]},
        {"token": "e1-1", "ids": ["a"], "payloads": [1], "timeouts": [3.0]},
        {"token": "e1-1", "ids": ["a"], "payloads": [1], "timeouts": {"a": "3"}},
        {"token": "e1-1", "ids": ["a"], "payloads": [1], "timeouts": {"a": -1}},
        {"token": "e1-1", "ids": ["a"], "payloads": [1], "dependencies": ["x"]},
    ],
)
def test_a_malformed_work_message_is_none_and_the_worker_waits_for_the_next(body: Any) -> None:
    """Columns that are not lists of one length, attempts that are not integers, a sparse
    member of the wrong shape: nothing the runners could trip on gets through (the worker
    ignores the message, as it ignores one that is not JSON)."""
    assert P.read_work(body) is None


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=8),
            st.recursive(
                st.none()
                | st.booleans()
                | st.integers(-(2**63), 2**63 - 1)
                | st.floats()
                | st.text(max_size=5),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3)
                ),
                max_leaves=6,
            ),
            st.integers(0, 5),
            st.none() | st.floats(0.001, 1e6),
        ),
        min_size=1,
        max_size=12,
        unique_by=lambda t: t[0],
    ),
    st.none() | st.floats(0.001, 1e6),
    st.booleans(),
)
def test_any_dispatch_round_trips_through_its_work_message(
    rows: list[tuple[str, Any, int, float | None]], seconds: float | None, ahead: bool
) -> None:
    """Whatever the items (payloads with NaN and the infinities in stored form, attempts,
    own timeouts), ``read_work`` gives back what ``work_message`` was given, and the worker's
    runner restores each payload to the user's value exactly."""
    from durable_dispatch.core import Send, WorkItem
    from durable_dispatch.mpi.context import Outcomes, run_items
    from durable_dispatch.values import stored

    items = tuple(WorkItem(w, stored(p), timeout=t) for w, p, _, t in rows)
    attempts = tuple(n for _, _, n, _ in rows)
    send = Send(1, "e3-9", items, seconds, 2.5, attempts)
    raw = P.work_message(send, ahead=ahead)
    work = P.read_work(P.decode(raw)[0], raw)
    assert work is not None and work.token == "e3-9" and work.ahead == (ahead and len(rows) > 1)
    assert (work.seconds, work.lease) == (seconds, 2.5)
    batch = work.items
    assert batch.ids == [w for w, _, _, _ in rows]
    assert batch.payloads == [w.payload for w in items]
    assert (batch.attempts or [0] * len(rows)) == list(attempts)
    if len(rows) > 1:
        assert [batch.timeout(i) for i in range(len(rows))] == [t for _, _, _, t in rows]
    seen: list[Any] = []
    out = Outcomes(len(batch))
    run_items(lambda p, ctx: seen.append((ctx.work_id, ctx.attempt, p)), "context", batch,
              None, 1.0, lambda: None, 1 << 20, out)  # fmt: skip
    assert [(w, n) for w, n, _ in seen] == [(w, n) for w, _, n, _ in rows]
    for (_, _, got), (_, want, _, _) in zip(seen, rows, strict=True):
        assert orjson.dumps(got) == orjson.dumps(want) or got == want or _same_nan(got, want)


def _same_nan(a: Any, b: Any) -> bool:
    """Equal, NaN counted equal to NaN (a payload of NaN comes back as NaN)."""
    import math

    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_nan(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_nan(a[k], b[k]) for k in a)
    return bool(a == b)


def test_a_part_is_a_result_with_its_work_ids_first() -> None:
    raw = P.part_message("e1-9", [ItemOutcome(b"7")], ["w1"])
    assert raw.startswith(b'{"ids":["w1"],"token":"e1-9"')
    assert orjson.loads(raw)["results"] == [7]
