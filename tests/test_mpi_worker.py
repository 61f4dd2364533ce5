"""The worker's own parts that need no MPI: the in-process runner's hand-over between the
worker's loop and the thread that runs the items, and the checks of ``run_worker``'s arguments
(before MPI is touched)."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

from durable_dispatch.errors import UsageError
from durable_dispatch.mpi.isolation import StopRequested
from durable_dispatch.mpi.worker import _InProcessRunner, run_worker


def _items(*ids: str) -> list[dict[str, Any]]:
    return [{"work_id": w, "payload": w, "attempt": 0} for w in ids]


def test_the_in_process_runner_forwards_each_heartbeat_and_sees_the_end() -> None:
    def beating(payload: Any, beat: Any) -> Any:
        for _ in range(3):
            beat()
        return payload.upper()

    runner = _InProcessRunner(beating, "beat", 1 << 20, 0.05)
    beats: list[int] = []
    outcomes, whole = runner.run(
        _items("a", "b"), None, 0.0, lambda: False, lambda: beats.append(1)
    )
    assert whole is None and [o.raw for o in outcomes] == [b'"A"', b'"B"']
    assert len(beats) == 6  # every beat of both items, none lost, none twice
    assert all(o.cost is not None and o.cost["by"] == "in-process" for o in outcomes)


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
        runner.run(_items("slow"), None, 0.0, started.is_set, lambda: None)
    beats: list[int] = []
    quick = threading.Timer(0.05, release.set)  # the left item ends while the next one waits
    quick.start()
    try:
        outcomes, whole = runner.run(
            [{"work_id": "q", "payload": "quick", "attempt": 0}],
            None,
            0.0,
            lambda: False,
            lambda: beats.append(1),
        )
    finally:
        quick.cancel()
        release.set()
    assert whole is None and [o.raw for o in outcomes] == [b'"quick"']
    assert beats == []  # (the left item's beat was its own)


@pytest.mark.parametrize("poll", [-1, -0.001, math.nan, "0.1", None])
def test_run_worker_refuses_a_poll_that_is_not_seconds(poll: Any) -> None:
    with pytest.raises(UsageError, match="poll"):
        run_worker(lambda x: x, poll=poll)
