"""The worker's own parts that need no MPI: the in-process runner's hand-over between the
worker's loop and the thread that runs the items, and the checks of ``run_worker``'s arguments
(before MPI is touched)."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from typing import Any

import orjson
import pytest

from durable_dispatch.core import ItemFailure
from durable_dispatch.errors import UsageError
from durable_dispatch.mpi.context import Batch, Outcomes, run_items
from durable_dispatch.mpi.isolation import IsolatedRunner, StopRequested
from durable_dispatch.mpi.protocol import read_result, result_message
from durable_dispatch.mpi.usage import InProcessMeter
from durable_dispatch.mpi.worker import _InProcessRunner, run_worker
from durable_dispatch.values import restore


def _items(*ids: str) -> Batch:
    return Batch(list(ids), list(ids))


def _run(runner: _InProcessRunner, batch: Batch, *args: Any) -> tuple[Outcomes, Any]:
    """``runner.run`` of ``batch`` into fresh outcomes (``deadline, lease, tick, beat``)."""
    out = Outcomes(len(batch))
    return out, runner.run(batch, out, *args)


def test_the_in_process_runner_forwards_each_heartbeat_and_sees_the_end() -> None:
    def beating(payload: Any, beat: Any) -> Any:
        for _ in range(3):
            beat()
        return payload.upper()

    runner = _InProcessRunner(beating, "beat", 1 << 20, 0.05)
    beats: list[int] = []
    outcomes, whole = _run(
        runner, _items("a", "b"), None, 0.0, lambda: False, lambda: beats.append(1)
    )
    assert whole is None and outcomes.raw == [b'"A"', b'"B"']
    assert len(beats) == 6  # every beat of both items, none lost, none twice
    assert outcomes.by == ["in-process"] * 2 and None not in outcomes.cpu + outcomes.rss


def test_a_dispatch_left_at_stop_does_not_end_the_next_one() -> None:
    """STOP while an item still runs: the loop leaves the dispatch (its thread runs on); when
    that item ends later, its end and its beats are not taken for the next dispatch's."""
    release, started = threading.Event(), threading.Event()

    def slow_then_quick(payload: Any, beat: Any) -> Any:
        if payload == "slow":
            started.set()
            release.wait(30)
            beat()
        return payload

    runner = _InProcessRunner(slow_then_quick, "beat", 1 << 20, 0.01)
    with pytest.raises(StopRequested):
        _run(runner, _items("slow"), None, 0.0, started.is_set, lambda: None)
    beats: list[int] = []
    quick = threading.Timer(0.05, release.set)  # the left item ends while the next one waits
    quick.start()
    try:
        outcomes, whole = _run(
            runner, Batch(["q"], ["quick"]), None, 0.0, lambda: False, lambda: beats.append(1)
        )
    finally:
        quick.cancel()
        release.set()
    assert whole is None and outcomes.raw == [b'"quick"']
    assert beats == []  # (the left item's beat was its own)


@pytest.mark.parametrize("poll", [-1, -0.001, math.nan, "0.1", None])
def test_run_worker_refuses_a_poll_that_is_not_seconds(poll: Any) -> None:
    with pytest.raises(UsageError, match="poll"):
        run_worker(lambda x: x, poll=poll)


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _costly(payload: Any) -> Any:
    if payload == "burn":
        _burn(0.05)
    if payload == "program":  # CPU spent by a process the item starts and waits for
        subprocess.run([sys.executable, "-c", "import time\nt=time.process_time()\n"
                        "while time.process_time() - t < 0.1: pass"], check=True)  # fmt: skip
    return payload


def test_each_in_process_item_is_charged_its_own_cpu_and_that_of_the_programs_it_waited_for() -> (
    None
):
    """One reading of the CPU clock between two items: an item's CPU is its own (not its
    batch-mates'), and the CPU of a program it started and waited for is its own too."""
    batch = Batch(["a", "b", "c", "d"], ["x", "burn", "program", "y"])
    out = Outcomes(len(batch))
    meter = InProcessMeter()
    meter.rebase()
    run_items(_costly, "payload", batch, None, 0.0, lambda: None, 1 << 20, out, meter=meter)
    meter.settle(out)
    cpu = out.cpu
    assert out.raw == [b'"x"', b'"burn"', b'"program"', b'"y"'] and out.done == 4
    assert all(type(c) is float for c in cpu), cpu
    assert cpu[1] >= 0.05 and cpu[2] >= 0.1, cpu  # (the program's CPU: the item's)
    assert cpu[0] < 0.05 and cpu[3] < 0.05, cpu
    assert out.by == ["in-process"] * 4 and len(set(out.rss)) == 1 and out.rss[0] > 0
    msg = orjson.loads(result_message("e1-1", out, None, batch.ids))
    assert msg["costs"] == {"ids": batch.ids, "cpu": cpu, "rss": out.rss, "by": "in-process"}


def _values(payload: Any) -> Any:
    if type(payload) is not str:
        return payload
    return {"set": {1, 2}, "nan": [1.0, math.nan], "tuple": (1, 2)}.get(payload, payload)


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("bad", ["set", "tuple"])
def test_a_value_json_would_change_fails_only_its_own_item_for_good(
    isolate: bool, bad: str
) -> None:
    """A result JSON cannot hold as given (a set, a tuple) in item 3 of 5: only item 3 fails,
    ``malformed-result`` and final (it would fail again); a NaN in another item is kept
    exactly (the stored form), and the plain items around them come back as they were."""
    payloads = [1, "nan", bad, {"k": [1, 2]}, "s"]
    batch = Batch([f"w{i}" for i in range(5)], payloads, tagged=False)
    out = Outcomes(5)
    if isolate:
        r = IsolatedRunner(_values, "payload", 1 << 20, None, subreaper=False)
        try:
            assert r.run(batch, out, None, 1.0, lambda: False, lambda: None) is None
        finally:
            r.close()
    else:
        run_items(_values, "payload", batch, None, 0.0, lambda: None, 1 << 20, out)
    results, errors, failure = read_result(orjson.loads(result_message("e1-2", out, None)), None)
    assert failure is None and errors is not None and list(errors) == [2]
    assert isinstance(errors[2], ItemFailure) and errors[2].kind == "malformed-result"
    assert errors[2].final and type(_values(bad)).__name__ in errors[2].reason
    assert results is not None and results[2] is None
    assert [results[0], results[3], results[4]] == [1, {"k": [1, 2]}, "s"]
    nan = restore(results[1])
    assert nan[0] == 1.0 and math.isnan(nan[1])


def test_an_isolated_item_of_several_is_killed_at_its_own_timeout_and_the_rest_run() -> None:
    """The own timeout travels in the sparse ``timeouts`` column: past it, the child is
    killed, that item alone fails with kind ``timeout``, the items after it run in a fresh
    child."""
    batch = Batch(["a", "b", "c"], ["x", "hang", "y"], timeouts={"b": 0.5}, tagged=False)
    out = Outcomes(3)
    r = IsolatedRunner(_hangs, "payload", 1 << 20, None, subreaper=False)
    try:
        t = time.monotonic()
        whole = r.run(batch, out, t + 60, 0.0, lambda: False, lambda: None)
        took = time.monotonic() - t
    finally:
        r.close()
    assert whole is None and took < 30
    assert out.raw[0] == b'"x"' and out.raw[2] == b'"y"' and out.raw[1] is None
    assert out.errors[1].kind == "timeout" and "own timeout" in (out.errors[1].reason or "")
    assert out.by[1] == "child-ended" and out.by[0] == out.by[2] == "child"


def _hangs(payload: Any) -> Any:
    if payload == "hang":
        while True:
            time.sleep(3600)
    return payload
