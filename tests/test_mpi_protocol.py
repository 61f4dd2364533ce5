"""The wire protocol's message bodies, and the worker's RESULT for a multi-item dispatch."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from durable_dispatch.mpi import protocol as P
from durable_dispatch.mpi.worker import _result_message, _work


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


def test_the_worker_runs_each_item_and_reports_failures_per_item() -> None:
    import queue

    box: dict[str, Any] = {}
    plan = [({"x": 1}, None), ({"x": 2}, "raise"), ({"x": 3}, "unencodable"), ({"x": 4}, None)]
    _work(lambda p: p["x"] * 10, plan, 0.0, False, queue.SimpleQueue(), box)
    msg = orjson.loads(_result_message("e1-7", box))
    assert msg["token"] == "e1-7"
    assert msg["results"] == [10, None, None, 40]
    assert set(msg["errors"]) == {"1", "2"}
    assert "RuntimeError" in msg["errors"]["1"] and "JSON" in msg["errors"]["2"]
    assert P.read_result(msg, None)[1] == {1: msg["errors"]["1"], 2: msg["errors"]["2"]}


def test_a_clean_result_has_no_errors_entry() -> None:
    import queue

    box: dict[str, Any] = {}
    _work(str, [(1, None), (2, None)], 0.0, False, queue.SimpleQueue(), box)
    assert orjson.loads(_result_message("e1-1", box)) == {"token": "e1-1", "results": ["1", "2"]}
