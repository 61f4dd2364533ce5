"""Campaigns that grow (issue 31, G1 and G3): work that makes work, durably and exactly once.

In-process over ``testing.LocalWorkers`` and under a real ``mpiexec`` whose whole job is
SIGKILLed at random moments, also inside the callback, with compaction between runs.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import WorkItem
from durable_dispatch.campaign.admin import view_state
from durable_dispatch.errors import UsageError
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers

sys.path.insert(0, str(Path(__file__).parent / "children"))
import graph_campaign as graph  # noqa: E402

CAMPAIGN = Path(__file__).parent / "children" / "graph_campaign.py"


def _node(payload: dict[str, int]) -> list[int]:
    return graph.children(payload["node"])


def test_children_returned_by_the_callback_run_once_each(tmp_path: Path) -> None:
    """G1 in-process: the committed set is the graph's closure, each node committed once, a
    child that several parents name is one item, and the campaign ends when it is done."""
    delivered: list[str] = []

    def on_commit(work_id: str, result: list[int]) -> list[WorkItem]:
        delivered.append(work_id)
        return [WorkItem(f"n{c}", {"node": c}) for c in result]

    report = run_master(
        [WorkItem("n0", {"node": 0})], tmp_path / "s", on_commit, comm=LocalWorkers(_node, 3)
    )
    want = {f"n{n}" for n in graph.closure()}
    assert report.finished and sorted(delivered) == sorted(want)
    p = view_state(tmp_path / "s").projection
    assert set(p.committed) == want and p.duplicate_commits == 0 and not p.deferred


def test_a_callback_that_fails_is_run_again_and_spawns_nothing_twice(tmp_path: Path) -> None:
    """At least once (U6) and exactly-once children: a callback that raised after it returned
    children for some commits stops the job; the next run delivers from where it stopped,
    and each child is one item however often its parent's callback ran."""
    calls = {"n": 0}

    def flaky(work_id: str, result: list[int]) -> list[WorkItem]:
        calls["n"] += 1
        if calls["n"] == 40:
            raise RuntimeError("the user's callback failed")
        return [WorkItem(f"n{c}", {"node": c}) for c in result]

    start = [WorkItem("n0", {"node": 0})]
    with pytest.raises(RuntimeError, match="callback failed"):
        run_master(start, tmp_path / "s", flaky, comm=LocalWorkers(_node, 3))
    report = run_master(start, tmp_path / "s", flaky, comm=LocalWorkers(_node, 3))
    assert report.finished
    p = view_state(tmp_path / "s").projection
    assert set(p.committed) == {f"n{n}" for n in graph.closure()} and p.duplicate_commits == 0


@pytest.mark.parametrize("bad", ["n1", {"n1": 1}, 7, [WorkItem("ok"), "n2"]], ids=repr)
def test_a_callback_that_returns_something_else_is_a_usage_error(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(UsageError, match="on_commit"):
        run_master(
            [WorkItem("n0", {"node": 0})],
            tmp_path / "s",
            lambda w, r: bad,
            comm=LocalWorkers(_node, 1),
        )


def test_a_generator_source_is_consumed_as_the_frontier_drains(tmp_path: Path) -> None:
    """G3: run_master takes a generator and never holds it whole: it is read in chunks while
    the campaign runs, and iterated again on a resumed run with known IDs skipped."""
    from durable_dispatch.mpi import master

    taken = {"n": 0, "most_pending": 0}
    n = 3 * master._Source.CHUNK + 100

    def source() -> Iterator[WorkItem]:
        for i in range(n):
            taken["n"] += 1
            yield WorkItem(f"g{i}", i)

    pending: list[int] = []

    def fn(payload: int) -> int:
        return payload

    def watch(stats: dict[str, Any]) -> None:
        pending.append(stats["core"]["pending_now"])

    report = run_master(
        source(),
        tmp_path / "s",
        comm=LocalWorkers(fn, 3),
        batch=64,
        progress=watch,
        progress_interval=0.0,
    )
    assert report.finished and taken["n"] == n
    assert max(pending) <= master._Source.CHUNK + master._Source.LOW  # never all of it at once
    assert len(view_state(tmp_path / "s").projection.committed) == n
    again = run_master(source(), tmp_path / "s", comm=LocalWorkers(fn, 3))
    assert again.finished and again.stats["core"]["dispatches"] == 0


@pytest.mark.loop
def test_a_growing_campaign_killed_at_random_moments_commits_the_closure_once(
    tmp_path: Path,
) -> None:
    """Issue 31 under mpiexec: the whole job SIGKILLed at 8 random moments (half of them
    inside the callback), compaction between some runs. The committed set equals the closure
    computed offline, each work ID is committed once, every committed ID reached the sink at
    least once, and the last run finished."""
    from durable_dispatch.campaign.admin import compact_state
    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    state, sink = tmp_path / "state", tmp_path / "sink.txt"
    rnd = random.Random(31)
    kills = 0
    for run in range(8):
        kill = f"callback:{rnd.randint(20, 300)}" if run % 2 else f"after:{rnd.uniform(0.5, 2)}"
        cmd = mpiexec_command(4, [sys.executable, str(CAMPAIGN), str(state), str(sink), kill])
        res = run_mpiexec(cmd, timeout=120)
        assert not res.timed_out, res.stderr[-3000:]
        kills += "REPORT" not in res.stdout
        if run % 3 == 2 and state.exists():
            compact_state(state)
    cmd = mpiexec_command(4, [sys.executable, str(CAMPAIGN), str(state), str(sink), "none"])
    res = run_mpiexec(cmd, timeout=180)
    assert "REPORT True" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    want = {f"n{n}" for n in graph.closure()}
    p = view_state(state).projection
    assert set(p.committed) == want and p.duplicate_commits == 0 and not p.deferred
    assert set(sink.read_text().split()) == want  # each delivered at least once
    assert kills >= 6, kills
    print(f"{kills} job SIGKILLs; {len(want)} nodes in the closure")


PRIORITY = Path(__file__).parent / "children" / "priority_campaign.py"


def _dispatch_order_after_the_children(state: Path, first: int) -> list[str]:
    """The work IDs of every dispatch journaled after the submission of indices ``first``..."""
    from durable_dispatch.campaign.replay import event_work_ids
    from durable_dispatch.campaign.statedir import STATE_JOURNAL
    from durable_dispatch.storage.journal import read_journal

    out: list[str] | None = None
    for rec in read_journal(state / STATE_JOURNAL):
        ev = rec.payload
        if ev.get("event") == "submitted" and ev.get("first") == first:
            out = []
        elif ev.get("event") == "dispatched" and out is not None:
            out += event_work_ids(ev)
    assert out is not None, "the children's submission was not journaled"
    return out


@pytest.mark.parametrize("batch", ["1", "8"])
def test_urgent_children_overtake_a_low_priority_backlog_under_mpiexec(
    tmp_path: Path, batch: str
) -> None:
    """G2 (issue 31) under a real mpiexec: children of priority 10, returned by a callback
    while 100-odd items of priority 0 wait, are the next items dispatched (alone or in the
    head of a multi-item dispatch); every item commits once."""
    import priority_campaign as prio

    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    state = tmp_path / "state"
    cmd = mpiexec_command(4, [sys.executable, str(PRIORITY), str(state), batch])
    res = run_mpiexec(cmd, timeout=120)
    assert not res.timed_out and "REPORT True" in res.stdout, res.stderr[-3000:]
    after = _dispatch_order_after_the_children(state, 120)
    assert after[:6] == prio.URGENT, after[:12]
    p = view_state(state).projection
    assert len(p.committed) == 126 and p.duplicate_commits == 0


def test_priorities_in_process_over_local_workers(tmp_path: Path) -> None:
    """G2 with testing.LocalWorkers: the same campaign as the mpiexec test, in-process."""
    import priority_campaign as prio

    def on_commit(work_id: str, result: int) -> list[WorkItem]:
        if work_id != "low-010":
            return []
        return [WorkItem(w, i, priority=10) for i, w in enumerate(prio.URGENT)]

    items = [WorkItem(f"low-{i:03d}", i) for i in range(120)]
    report = run_master(items, tmp_path / "s", on_commit, comm=LocalWorkers(lambda x: x, 3))
    assert report.finished
    assert _dispatch_order_after_the_children(tmp_path / "s", 120)[:6] == prio.URGENT
