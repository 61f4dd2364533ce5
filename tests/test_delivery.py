"""delivery.py and the close of a degraded campaign: degraded honesty (issue 46). The commit
callback can tell a memory-only commit from a durable one, and NotDurableError names every
journal that holds records only in memory, the largest first."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import CampaignState, RetryPolicy, WorkItem
from durable_dispatch.errors import NotDurableError
from durable_dispatch.testing import inject_faults


def _run_one(st: CampaignState, *, fail: bool = False) -> None:
    """Dispatch the next item to rank 1 and answer it (a result, or a failure), READY too."""
    s = st.next_send(0.0)
    assert s is not None
    st.sent(s.token, 0.0)
    if fail:
        st.on_results(s.rank, str(s.token), None, 0.0, failure="boom")
    else:
        st.on_results(s.rank, str(s.token), [s.items[0].payload], 0.0)
    st.deliver(wait=True)
    st.on_ready(s.rank, str(s.token), 0.0)
    st.tick(0.0)


def test_the_callback_is_told_when_a_commit_is_memory_only(tmp_path: Path) -> None:
    """While the journal is degraded the campaign goes on and the callback is called for
    memory-only commits (by design); a callback with a ``durable`` parameter is told so, and a
    callback of two parameters keeps working."""
    told: list[tuple[str, bool]] = []
    plain: list[str] = []

    def on_commit(work_id: str, result: Any, durable: bool = True) -> None:
        told.append((work_id, durable))

    d = tmp_path / "s"
    with inject_faults() as faults:
        st = CampaignState.open(d, sync="always", ranks=[1], on_commit=on_commit)
        st.submit([WorkItem(f"w{i}", i) for i in range(6)])
        for _ in range(3):
            _run_one(st)
        faults.fail("fsync", errno.EIO, path=f"{d}/events.jsonl*")  # the disk is gone
        for _ in range(3):
            _run_one(st)
        assert st.statistics().commits_in_memory == 3
        assert told == [("w0", True), ("w1", True), ("w2", True)] + [
            (f"w{i}", False) for i in (3, 4, 5)
        ]
        faults.heal()
        st.close()
    # a callback of two parameters: called as before
    with CampaignState.open(d, ranks=[1], on_commit=lambda w, r: plain.append(w)) as st:
        st.submit([WorkItem("x", 1)])
        _run_one(st)
    assert plain == ["x"]


def test_not_durable_names_every_journal_held_in_memory_the_largest_first(
    tmp_path: Path,
) -> None:
    """The disk fails for good: the state journal holds the commits, the defer journal one
    deferral. The error used to name only the last journal closed (the defer journal's one
    record), the state journal's memory-only records two ``__context__`` links down."""
    d = tmp_path / "s"
    with inject_faults() as faults:
        st = CampaignState.open(d, sync="always", retry=RetryPolicy(0), ranks=[1])
        st.submit([WorkItem(f"w{i}", i) for i in range(8)])
        faults.fail("fsync", errno.EIO, path=f"{d}/*.jsonl*")
        for _ in range(6):
            _run_one(st)
        _run_one(st, fail=True)  # deferred: its record is held in the defer journal's memory
        assert st.defer.statistics().in_memory == 1
        with pytest.raises(NotDurableError) as e:
            st.close()
        faults.heal()
    msg = str(e.value)
    state_at = msg.index(str(d / "events.jsonl"))
    defer_at = msg.index(".dispatch_protocol_deferred.jsonl")
    assert state_at < defer_at  # the largest first
    assert e.value.path == str(d / "events.jsonl")
    held = int(msg[msg.index("memory (") + 8 :].split(" in ")[0])  # the state journal's
    assert held > 6 and e.value.pending is not None and e.value.pending > held


def test_a_callback_that_fails_on_redelivery_says_the_result_is_safe_and_what_to_do(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An ``on_commit`` that always raises for one item stops the run, and then every restart:
    the restart's message says that a committed result's callback failed on redelivery, that
    the result is safe in the state directory, and what to do (fix the callback, run again)."""
    import logging

    from durable_dispatch.mpi import run_master
    from durable_dispatch.testing import LocalWorkers

    def on_commit(work_id: str, result: Any) -> None:
        if work_id == "p0003":
            raise RuntimeError(f"bug in my on_commit for {work_id}")

    items = [WorkItem(f"p{i:04d}", {"x": i}) for i in range(6)]
    with pytest.raises(RuntimeError, match="bug in my on_commit"):
        run_master(items, tmp_path / "s", on_commit, comm=LocalWorkers(lambda p: p, 1))
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError, match="bug in my on_commit"):
        run_master(items, tmp_path / "s", on_commit, comm=LocalWorkers(lambda p: p, 1))
    text = "\n".join(r.getMessage() for r in caplog.records)
    said = [m for m in caplog.messages if "p0003" in m and "redeliver" in m]
    assert said, text
    assert "safe" in said[0] and "fix" in said[0] and "run again" in said[0], said[0]
    assert "results" in said[0], said[0]  # where to read it meanwhile
