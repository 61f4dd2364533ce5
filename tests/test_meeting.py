"""Where the features meet (issue 58): dependencies with children, operator commands, storage
faults, restarts and the futures face, tried together as a user's campaign combines them.

Each test is a reproducer that failed before its fix: the master crashed when a callback's child
named an item already deferred while other commits waited (one delivery point, R1); a reopen
forgot what a cancelled item waits for; a dependency committed while the disk refused the state
journal reached its dependent as nothing; a master killed while delivering a retried
dependency's commit left ``deferred list`` and ``stats`` disagreeing; the futures face failed a
dependent its retried dependency had brought back.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import CampaignState, RetryPolicy, WorkItem
from durable_dispatch.campaign.results import read_results
from durable_dispatch.core import Dispatcher
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers, inject_faults

ROOT = Path(__file__).resolve().parent.parent
CHILDREN = Path(__file__).parent / "children"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_dispatch", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _fails_on_bad(payload: Any, ctx: Any) -> Any:
    if payload == "bad" or payload == "fail":
        raise ValueError("fails for good")
    return {"id": ctx.work_id, "deps": dict(ctx.dependencies)}


# ----------------------------------------------------- (1) one delivery point
def test_children_naming_a_deferred_item_while_commits_wait_do_not_crash_the_master(
    tmp_path: Path,
) -> None:
    """200 items commit, "bad" fails for good; each commit's callback returns a child that waits
    for "bad". A child submitted from a callback deferred at once (its dependency is deferred)
    re-entered the delivery of the pending commits from submit: the master crashed with
    "no open transaction has token ..." or an IndexError."""

    def on_commit(wid: str, result: Any) -> Any:
        if wid.startswith("child-"):
            return None
        return [WorkItem("child-" + wid, {"of": wid}, after=["bad"])]

    items = [WorkItem(f"w{i}", i) for i in range(200)] + [WorkItem("bad", "bad")]
    report = run_master(
        items,
        tmp_path / "s",
        on_commit,
        comm=LocalWorkers(_fails_on_bad, 3, context=True),
        retry=RetryPolicy(retries=0),
    )
    assert report.finished
    assert report.view.committed == 200 and report.view.deferred == 201
    assert report.view.failures_by_kind == {"dependency": 200, "error": 1}
    with CampaignState.open(tmp_path / "s") as st:
        led = st.core.ledger
        assert set(led.deferred) == {"bad"} | {f"child-w{i}" for i in range(200)}
        assert all("'bad'" in led.last_error[f"child-w{i}"] for i in range(200))


def test_a_child_naming_a_cancelled_item_is_deferred_at_once_naming_it(tmp_path: Path) -> None:
    """Cancelled is final: an item that names a cancelled item is deferred when it is
    submitted, its last error naming the cancelled ID (it used to wait until nothing else could
    run, then say "a cycle, or a dependency upstream failed")."""
    d = tmp_path / "s"
    with CampaignState.open(d, ranks=(1,)) as st:
        st.submit([WorkItem("x", 1), WorkItem("y", 2)])
    assert cli("cancel", str(d), "x").returncode == 0
    with CampaignState.open(d, ranks=(1,)) as st:
        st.submit([WorkItem("later", 3, after=["x"])])
        led = st.core.ledger
        assert "later" in led.deferred and "later" not in led.waiting
        assert led.last_error["later"] == "dependency 'x' ended without a commit (cancelled)"
        assert led.kinds["later"] == ["dependency"]


def test_retry_of_a_waiting_item_says_it_waits() -> None:
    core = Dispatcher(1, ranks=[1])
    core.submit([WorkItem("a"), WorkItem("b", after=("a",))])
    assert core.retry_item("b") == "waiting" and core.retry_item("a") == "pending"


def test_the_joblog_counts_no_try_for_an_item_deferred_for_a_dependency(tmp_path: Path) -> None:
    """W waits for D, which fails for good: W never ran (it showed ``tries 1``)."""
    from durable_dispatch.views.joblog import read_joblog

    items = [WorkItem("D", "fail"), WorkItem("W", "w", after=["D"])]
    fn = LocalWorkers(_fails_on_bad, 1, context=True)
    assert run_master(items, tmp_path / "s", comm=fn, retry=RetryPolicy(retries=0)).finished
    rows = {r.work_id: r for r in read_joblog(tmp_path / "s")}
    assert (rows["D"].status, rows["D"].tries) == ("deferred", 1)
    assert (rows["W"].status, rows["W"].tries, rows["W"].last_failure_kind) == (
        "deferred",
        0,
        "dependency",
    )


def test_a_known_id_with_another_after_is_refused_like_a_changed_payload(tmp_path: Path) -> None:
    """The same payload with another ``after`` was skipped silently: the item would wait for
    what it named first, not what the caller names now."""
    from durable_dispatch.errors import ChangedPayloadError

    with CampaignState.open(tmp_path / "s") as st:
        st.submit([WorkItem("a", 1), WorkItem("b", 2, after=["a"])])
        assert st.submit([WorkItem("b", 2, after=["a"])]) == 0  # the same: skipped
        with pytest.raises(ChangedPayloadError, match="another after") as e:
            st.submit([WorkItem("b", 2, after=["c"])])
        assert e.value.work_id == "b"
        with pytest.raises(ChangedPayloadError, match="another after"):
            st.submit([WorkItem("a", 1, after=["b"])])
        with pytest.raises(ChangedPayloadError, match="another after"):
            st.submit([WorkItem("n", 3), WorkItem("n", 3, after=["a"])])
        assert not st.core.ledger.known("n")


# --------------------------------------------- (2) a reopen changes nothing
def test_a_reopen_keeps_what_a_cancelled_item_waits_for(tmp_path: Path) -> None:
    """D fails for good, W (after D) is deferred; ``cancel W`` then ``retry W`` with no master
    running (each command opens and closes the directory). The next run ran W with an empty
    ``ctx.dependencies`` and committed it although D never committed: the reload rebuilt the
    waiting links of waiting and deferred items only, not of cancelled ones."""
    d = tmp_path / "s"
    items = [WorkItem("D", "fail"), WorkItem("W", "w", after=["D"])]
    fn = LocalWorkers(_fails_on_bad, 2, context=True)
    assert run_master(items, d, comm=fn, retry=RetryPolicy(retries=0)).finished
    assert cli("cancel", str(d), "W").returncode == 0
    assert cli("retry", str(d), "W").returncode == 0
    with CampaignState.open(d, ranks=(1,)) as st:  # the reopen: W waits for D, deferred
        led = st.core.ledger
        assert "W" in led.deferred and led.missing.get("W") == 1
        assert led.last_error["W"] == "dependency 'D' ended without a commit (deferred)"
    again = LocalWorkers(_fails_on_bad, 2, context=True)
    report = run_master(items, d, comm=again, retry=RetryPolicy(retries=0))
    assert report.finished
    assert {r.work_id for r in read_results(d)} == set()  # W never ran: D never committed
    assert report.view.deferred == 2 and report.view.committed == 0


# ------------------------------- (3) a dependency's result is the committed one
def test_a_memory_only_dependency_reaches_a_dependent_submitted_later(tmp_path: Path) -> None:
    """The disk refuses the state journal; D commits (held in memory); its callback's child C
    names D. C was dispatched with no result of D (it was read from the disk, where a
    memory-only commit is not) and ran with an empty ``ctx.dependencies``."""
    d = tmp_path / "s"

    def on_commit(wid: str, result: Any) -> Any:
        return [WorkItem("C", "c", after=["D"])] if wid == "D" else None

    with inject_faults() as faults:
        st = CampaignState.open(d, sync="always", ranks=[1], on_commit=on_commit)
        st.submit([WorkItem("D", "d")])
        faults.fail("write", errno.EIO, path=f"{d}/events.jsonl*")
        faults.fail("fsync", errno.EIO, path=f"{d}/events.jsonl*")
        s = st.next_send(0.0)
        assert s is not None and [w.work_id for w in s.items] == ["D"]
        st.sent(s.token, 0.0)
        st.on_results(s.rank, str(s.token), [{"d": 42}], 0.0)
        st.on_ready(s.rank, str(s.token), 0.0)
        st.tick(0.0)
        st.deliver()  # the delivery point: D is delivered (memory-only), C submitted
        assert st.statistics().commits_in_memory == 1
        c = st.next_send(0.0)
        assert c is not None and [w.work_id for w in c.items] == ["C"]
        assert st.dependencies_of(c) == {"C": {"D": {"d": 42}}}
        faults.heal()
        st.close()


# ------------------- (5) a master killed while delivering a retried dependency
_KILLED_WHILE_DELIVERING = r"""
import os, signal, sys
from durable_dispatch import RetryPolicy, WorkItem
from durable_dispatch.campaign import delivery
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers

def fn(payload, ctx):
    return payload

def die(self):  # the dependency's commit released W; the master dies before it resolves W
    os.kill(os.getpid(), signal.SIGKILL)

delivery.Deliveries._resolve_released = die
items = [WorkItem("D", "fail"), WorkItem("W", "w", after=["D"])]  # (D passes now)
run_master(items, sys.argv[1], comm=LocalWorkers(fn, 1, context=True), retry=RetryPolicy(0))
"""


def test_deferred_list_and_stats_agree_after_a_master_killed_while_delivering(
    tmp_path: Path,
) -> None:
    """D fails for good and W (after D) is deferred; ``retry D``; the next master commits D and
    is killed while it delivers that commit (after the state journal's record, before the
    defer journal's). ``deferred list`` showed W deferred while ``stats`` said pending."""
    d = tmp_path / "s"
    items = [WorkItem("D", "fail"), WorkItem("W", "w", after=["D"])]
    assert run_master(
        items, d, comm=LocalWorkers(_fails_on_bad, 1, context=True), retry=RetryPolicy(0)
    ).finished
    assert cli("retry", str(d), "D").returncode == 0
    dead = subprocess.run(
        [sys.executable, "-c", _KILLED_WHILE_DELIVERING, str(d)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert dead.returncode == -9, dead.stderr[-2000:]
    listed = json.loads(cli("deferred", "list", str(d), "--json").stdout)
    stats = json.loads(cli("stats", str(d), "--json").stdout)
    assert [r["work_id"] for r in listed] == []
    assert stats["deferred"] == 0 and stats["pending"] == 1
    with CampaignState.open(d, ranks=(1,)) as st:  # the open resolves the stale record
        assert "W" not in st.defer and "W" in st.core.ledger.frontier
    assert json.loads(cli("deferred", "list", str(d), "--json").stdout) == []


# ------------------------------------------ (4) the futures face, after a retry
@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_a_retried_dependency_brings_its_dependents_future_back(tmp_path: Path) -> None:
    """A call crashes (deferred) and the call that took its future as an argument is deferred;
    ``retry`` of the failed call; the re-run (where it succeeds) failed the dependent's future
    at once with DependencyFailed, while its call ran and committed in that same run: the
    executor's attach took every item of the defer journal as failed."""
    pytest.importorskip("mpi4py")
    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    state, flag, mark = tmp_path / "state", tmp_path / "flag", tmp_path / "mark"
    script = str(CHILDREN / "futures_retry.py")
    cmd = mpiexec_command(
        2,
        [sys.executable, "-m", "durable_dispatch.futures", "--state-dir", str(state), script,
         str(flag), str(mark)],
    )  # fmt: skip
    first = run_mpiexec(cmd, timeout=240, cwd=ROOT)
    assert not first.timed_out and first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.splitlines() == ["dep TaskCrashed", "after DependencyFailed"]
    flag.write_text("now it works")
    out = cli("retry", str(state / "executor-1"), mark.read_text(), "--json")
    assert out.returncode == 0, out.stderr
    second = run_mpiexec(cmd, timeout=240, cwd=ROOT)
    assert not second.timed_out and second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.splitlines() == ["dep returned 5", "after returned 6"]
