"""Work that waits for work (issue 51, G4): ``WorkItem(after=)``, the durable waiting set,
failure kind ``"dependency"`` and ``ctx.dependencies``.

In process over ``testing.LocalWorkers``, in a subprocess master SIGKILLed at random moments,
under a real ``mpiexec`` (its whole job SIGKILLed), and as a hypothesis model of the ready,
waiting and deferred sets against the ledger (live, replayed and reloaded from the compact
snapshot).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_dispatch import CampaignState, RetryPolicy, WorkItem
from durable_dispatch.campaign.admin import requeue_deferred, view_state
from durable_dispatch.campaign.results import read_results
from durable_dispatch.campaign.statedir import STATE_JOURNAL
from durable_dispatch.core.events import (
    Committed,
    Deferred,
    Dispatched,
    RequeuedDeferred,
    Submitted,
)
from durable_dispatch.core.ledger import Ledger
from durable_dispatch.errors import UsageError
from durable_dispatch.mpi import run_master
from durable_dispatch.storage.journal import read_journal
from durable_dispatch.testing import LocalWorkers
from durable_dispatch.tokens import Token

sys.path.insert(0, str(Path(__file__).parent / "children"))
import dag_campaign as dag  # noqa: E402

DAG = Path(__file__).parent / "children" / "dag_campaign.py"


def _echo(payload: Any, ctx: Any) -> Any:
    if payload == "fail":
        raise ValueError("boom")
    return {"id": ctx.work_id, "deps": dict(ctx.dependencies)}


def _run(items: Any, state: Path, fn: Any = _echo, **kw: Any) -> Any:
    kw.setdefault("retry", RetryPolicy(retries=0))
    return run_master(items, state, comm=LocalWorkers(fn, 2, context=True), **kw)


# ------------------------------------------------------------------ in process
def test_dependents_run_after_their_dependencies_with_their_results(tmp_path: Path) -> None:
    items = [
        WorkItem("c", 3, after=("b",)),  # submitted before what it waits for
        WorkItem("a", 1),
        WorkItem("b", 2, after=["a"]),  # a list is taken as given
        WorkItem("r", 0, after=("a", "b", "c", "a")),  # a fan-in (a named twice)
    ]
    report = _run(items, tmp_path / "s")
    assert report.finished
    got = {r.work_id: r for r in read_results(tmp_path / "s")}
    assert set(got) == {"a", "b", "c", "r"}
    assert got["b"].result["deps"] == {"a": got["a"].result}
    assert got["c"].result["deps"] == {"b": got["b"].result}
    assert set(got["r"].result["deps"]) == {"a", "b", "c"}
    assert got["a"].seq < got["b"].seq < got["c"].seq < got["r"].seq


def test_a_failed_dependency_defers_its_dependents_transitively(tmp_path: Path) -> None:
    items = [
        WorkItem("f", "fail"),
        WorkItem("g", 0, after=("f",)),
        WorkItem("h", 0, after=("g", "ok")),
        WorkItem("ok", 0),
        WorkItem("m", 0, after=("nope",)),  # never submitted
        WorkItem("x", 0, after=("y",)),  # a cycle
        WorkItem("y", 0, after=("x",)),
        WorkItem("z", 0, after=("z",)),  # names itself
    ]
    report = _run(items, tmp_path / "s")
    assert report.finished and report.reason is None
    led = view_state(tmp_path / "s").projection
    assert set(led.committed) == {"ok"}
    assert set(led.deferred) == {"f", "g", "h", "m", "x", "y", "z"}
    assert led.kinds["f"] == ["error"]
    for w in ("g", "h", "m", "x", "y", "z"):
        assert led.kinds[w] == ["dependency"], w
    assert "'f'" in led.last_error["g"] and "'f'" in led.last_error["h"]
    assert "'nope'" in led.last_error["m"] and "never submitted" in led.last_error["m"]
    assert report.stats["core"]["deferred_now"] == 7


def test_requeue_of_the_dependency_then_its_commit_releases_the_dependents(tmp_path: Path) -> None:
    state = tmp_path / "s"
    items = [WorkItem("f", "fail"), WorkItem("g", 0, after=("f",)), WorkItem("h", 1, after=("g",))]
    assert _run(items, state).finished
    assert set(view_state(state).projection.deferred) == {"f", "g", "h"}
    assert requeue_deferred(state, ["f"]) == ["f"]

    def healed(payload: Any, ctx: Any) -> Any:
        return _echo("healed" if payload == "fail" else payload, ctx)

    report = _run(items, state, healed)
    assert report.finished
    led = view_state(state).projection
    assert set(led.committed) == {"f", "g", "h"} and not led.deferred
    got = {r.work_id: r.result for r in read_results(state)}
    assert got["h"]["deps"] == {"g": got["g"]}
    from durable_dispatch.storage import DeferJournal

    with DeferJournal.open(os.fspath(state)) as dj:
        assert len(dj) == 0  # each released item's defer record is resolved


def _send_and_answer(st: CampaignState, *, fail: bool) -> str:
    s = st.next_send(0.0)
    assert s is not None
    st.sent(s.token, 0.0)
    st.on_results(
        s.rank, str(s.token), None if fail else [1], 0.0, failure="boom" if fail else None
    )
    st.on_ready(s.rank, str(s.token), 0.0)
    st.deliver(wait=True)
    st.tick(0.0)
    return s.items[0].work_id


def test_an_item_deferred_for_a_dependency_stays_registered_under_it_however_deferred(
    tmp_path: Path,
) -> None:
    """Deferred with its dependency (``g``) or submitted after it and deferred at once
    (``late``, by an ``on_defer`` hook that the close runs), an item deferred for a dependency
    is registered under what it misses: in memory, replayed and reopened alike; the
    dependency's requeue and commit release it."""
    from tests.test_reopen_machine import _relations

    state = tmp_path / "s"
    st = CampaignState.open(state, ranks=[1], retry=RetryPolicy(retries=0))

    def on_defer(d: Any) -> None:
        if d.work.work_id == "f":
            st.submit([WorkItem("late", 0, after=("f",))])

    st.on_defer = on_defer
    st.submit([WorkItem("f", 0), WorkItem("ok", 0), WorkItem("g", 0, after=("f", "ok"))])
    assert _send_and_answer(st, fail=True) == "f"  # f deferred, g with it; its hooks wait
    st.close()  # which runs them: late is submitted, and deferred at once
    led = st.core.ledger
    assert list(led.deferred) == ["f", "g", "late"]
    assert led.kinds["g"] == led.kinds["late"] == ["dependency"]
    assert led.missing == {"g": 2, "late": 1}
    assert list(led.dependents_of("f")) == ["g", "late"]
    assert _relations(view_state(state).projection) == _relations(led)
    with CampaignState.open(state, ranks=[1]) as again:
        assert _relations(again.core.ledger) == _relations(led)
    requeue_deferred(state, ["f"])
    with CampaignState.open(state, ranks=[1]) as st:
        assert _send_and_answer(st, fail=False) == "ok"  # (f was requeued to the back)
        led = st.core.ledger
        assert led.missing == {"g": 1, "late": 1} and list(led.deferred) == ["g", "late"]
        assert _send_and_answer(st, fail=False) == "f"
        assert list(led.frontier) == ["g", "late"] and not led.deferred and not led.missing


def test_children_of_a_commit_may_wait_for_their_siblings(tmp_path: Path) -> None:
    def on_commit(work_id: str, result: Any) -> list[WorkItem]:
        if work_id != "root":
            return []
        maps = [WorkItem(f"map{i}", i) for i in range(5)]
        return [*maps, WorkItem("reduce", -1, after=tuple(w.work_id for w in maps))]

    def fn(payload: Any, ctx: Any) -> Any:
        return sum(ctx.dependencies.values()) if payload == -1 else payload * 10

    report = run_master(
        [WorkItem("root", 0)], tmp_path / "s", on_commit, comm=LocalWorkers(fn, 3, context=True)
    )
    assert report.finished
    got = {r.work_id: r.result for r in read_results(tmp_path / "s")}
    assert got["reduce"] == 100


def test_a_ready_item_takes_its_priority(tmp_path: Path) -> None:
    """G2: released items are served by priority, not in the order they were released."""
    order: list[str] = []

    def fn(payload: Any, ctx: Any) -> Any:
        order.append(ctx.work_id)
        return payload

    items = [WorkItem("gate", 0)] + [
        WorkItem(f"w{i}", i, after=("gate",), priority=i % 3) for i in range(9)
    ]
    report = run_master(items, tmp_path / "s", comm=LocalWorkers(fn, 1, context=True))
    assert report.finished
    released = order[1:]
    assert [int(w[1:]) % 3 for w in released] == sorted((i % 3 for i in range(9)), reverse=True)


def test_dependency_results_too_large_fail_that_item_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import durable_dispatch.campaign.dependencies as deps

    monkeypatch.setattr(deps, "DEPENDENCIES_BYTES", 1000)

    def fn(payload: Any, ctx: Any) -> Any:
        return "x" * payload

    items = [
        WorkItem("big", 2000),
        WorkItem("small", 10),
        WorkItem("eats-big", 1, after=("big",)),
        WorkItem("eats-small", 1, after=("small",)),
        WorkItem("after-eater", 1, after=("eats-big",)),
    ]
    report = run_master(items, tmp_path / "s", comm=LocalWorkers(fn, 2, context=True))
    assert report.finished
    led = view_state(tmp_path / "s").projection
    assert set(led.committed) == {"big", "small", "eats-small"}
    assert set(led.deferred) == {"eats-big", "after-eater"}
    assert "over the bound" in led.last_error["eats-big"]
    assert led.kinds["after-eater"] == ["dependency"]


@pytest.mark.parametrize("after", ["a", ("a", 1)])
def test_after_must_name_work_ids(tmp_path: Path, after: Any) -> None:
    with CampaignState.open(tmp_path / "s") as state, pytest.raises(UsageError, match="after"):
        state.submit([WorkItem("b", 0, after=after)])


def test_the_waiting_set_is_in_the_compact_snapshot_and_reloads_exactly(tmp_path: Path) -> None:
    state = tmp_path / "s"
    with CampaignState.open(state) as st:
        st.submit([WorkItem(f"c{i}", i, after=(f"c{i - 1}",) if i else ()) for i in range(50)])
        st.save_snapshot("test")
        compact = st.core.ledger.to_compact()
        assert compact["waiting"] == [[1, 50]]
        before = st.core.ledger.to_snapshot()
    with CampaignState.open(state) as st:
        led = st.core.ledger
        assert list(led.waiting) == [f"c{i}" for i in range(1, 50)]
        assert list(led.frontier) == ["c0"]
        after = led.to_snapshot()
        assert after["waiting"] == before["waiting"]


# ---------------------------------------------------------------- the model
_IDS = [f"w{i}" for i in range(8)]


@st.composite
def _scripts(draw: Any) -> list[tuple[Any, ...]]:
    steps: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["submit", "commit", "defer", "requeue"]))
        wid = draw(st.sampled_from(_IDS))
        after = tuple(draw(st.lists(st.sampled_from([*_IDS, "ghost"]), max_size=3)))
        steps.append((kind, wid, after, draw(st.integers(0, 2))))
    return steps


class _Model:
    """What the ledger should hold: ready (pending), waiting, committed, deferred."""

    def __init__(self) -> None:
        self.after: dict[str, tuple[str, ...]] = {}
        self.committed: list[str] = []
        self.deferred: dict[str, str] = {}  # work ID -> "dependency" or "error"
        self.flight: set[str] = set()

    def place(self, w: str) -> str:
        if w in self.committed:
            return "committed"
        if w in self.deferred:
            return "deferred"
        if w in self.flight:
            return "in_flight"
        if all(d in self.committed for d in self.after[w]):
            return "pending"
        return "waiting"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scripts())
def test_the_ledger_matches_the_model_live_replayed_and_reloaded(script: Any) -> None:
    led, model, events = Ledger(1), _Model(), []
    led.apply(ev0 := _epoch())
    events.append(ev0)
    n = 0

    def apply(ev: Any) -> None:
        led.apply(ev)
        events.append(ev)

    for kind, wid, after, _ in script:
        if kind == "submit" and wid not in model.after:
            apply(Submitted((WorkItem(wid, 0, after=after),)))
            model.after[wid] = after
        elif kind == "commit" and wid in model.after and model.place(wid) == "pending":
            n += 1
            tok = Token(1, n)
            apply(Dispatched(tok, 1, (wid,)))
            apply(Committed(tok, 1, (wid,)))
            model.committed.append(wid)
            # released from a dependency deferral: the ledger releases those whose last
            # missing dependency just committed
            for w, why in list(model.deferred.items()):
                if why == "dependency" and all(d in model.committed for d in model.after[w]):
                    del model.deferred[w]
        elif kind == "defer" and wid in model.after and model.place(wid) == "pending":
            apply(Deferred(wid, None, "test", 1, ("error",), "x"))
            model.deferred[wid] = "error"
            # the cascade (Dispatcher.ended_without_commit)
            for w in led.waiting_dependents(wid):
                apply(Deferred(w, None, "dependency", 0, ("dependency",), f"dependency {wid!r}"))
                model.deferred[w] = "dependency"
        elif kind == "requeue" and wid in model.deferred:
            apply(RequeuedDeferred(wid))
            del model.deferred[wid]
        # the model's places, against the ledger's
        for w in model.after:
            place = model.place(w)
            assert (w in led.frontier) == (place == "pending"), (w, place)
            assert (w in led.waiting) == (place == "waiting"), (w, place)
            assert (w in led.deferred) == (place == "deferred"), (w, place)
            assert (w in led.committed) == (place == "committed"), (w, place)
    # replay folds the same events into the same ledger; the compact snapshot reloads it
    again = Ledger(0)
    for ev in events:
        again.apply(ev)
    assert again == led
    order = [led.ids.ids[i] for i in range(len(led.ids))]
    stored = [(0, [led.items[w].to_json() if w in led.items else [w, 0] for w in order])]
    loaded, _ = Ledger.from_compact(led.to_compact(), stored)
    assert set(loaded.waiting) == set(led.waiting)
    assert set(loaded.frontier) == set(led.frontier)
    assert set(loaded.deferred) == set(led.deferred)
    assert set(loaded.committed) == set(led.committed)
    assert loaded.missing == led.missing


def _epoch() -> Any:
    from durable_dispatch.core.events import EpochStarted

    return EpochStarted(1)


# ------------------------------------------------------------- kills and DAGs
def _check_dag(state: Path) -> None:
    """The committed set and values, the deferred set and kinds equal the closure computed
    offline; each work ID committed once; every dependent dispatched after each of its
    dependencies' commit record."""
    values, deferred = dag.expected()
    led = view_state(state).projection
    assert led.duplicate_commits == 0
    assert set(led.committed) == set(values)
    assert {w: led.kinds[w][-1] for w in led.deferred} == deferred
    assert not led.waiting and not led.frontier
    got = {r.work_id: r.result for r in read_results(state)}
    assert got == values
    committed_before: set[str] = set()
    from durable_dispatch.campaign.replay import event_work_ids

    for rec in read_journal(state / STATE_JOURNAL):
        ev = rec.payload
        if ev.get("event") == "committed":
            committed_before.update(event_work_ids(ev))
        elif ev.get("event") == "dispatched":
            for w in event_work_ids(ev):
                missing = [d for d in dag.deps(int(w[1:])) if d not in committed_before]
                assert not missing, f"{w} dispatched before the commit of {missing}"


def test_a_dag_in_process_with_master_sigkills_commits_the_closure_once(tmp_path: Path) -> None:
    """A random DAG of 2000 items (fan-in and fan-out, failing items, a missing ID, a cycle),
    its master process SIGKILLed at random moments, then run to the end."""
    state = tmp_path / "s"
    rnd = random.Random(5151)
    kills = 0
    for _ in range(5):
        res = subprocess.run(
            [sys.executable, str(DAG), str(state), f"after:{rnd.uniform(0.4, 2.0)}", "local"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        kills += res.returncode == -signal.SIGKILL
        assert res.returncode in (0, -signal.SIGKILL), res.stderr[-3000:]
    res = subprocess.run(
        [sys.executable, str(DAG), str(state), "none", "local"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "REPORT True" in res.stdout, res.stderr[-3000:]
    assert kills >= 3, kills
    _check_dag(state)


@pytest.mark.slow
@pytest.mark.loop
def test_a_dag_under_mpiexec_with_job_sigkills_commits_the_closure_once(tmp_path: Path) -> None:
    """The same DAG under a real mpiexec (its own session, killed after a timeout), the whole
    job SIGKILLed at random moments."""
    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    state = tmp_path / "s"
    rnd = random.Random(52)
    for _ in range(4):
        kill = f"after:{rnd.uniform(1.0, 3.0)}"
        cmd = mpiexec_command(4, [sys.executable, str(DAG), str(state), kill, "mpi"])
        res = run_mpiexec(cmd, timeout=180)
        assert not res.timed_out, res.stderr[-3000:]
    cmd = mpiexec_command(4, [sys.executable, str(DAG), str(state), "none", "mpi"])
    res = run_mpiexec(cmd, timeout=300)
    assert "REPORT True" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    _check_dag(state)


# --------------------------------------------------------------- the one view
def test_stats_watch_report_and_joblog_show_waiting_items(tmp_path: Path) -> None:
    from durable_dispatch.cli import main
    from durable_dispatch.views.joblog import read_joblog
    from durable_dispatch.views.report import report_series
    from durable_dispatch.views.view import STOPPED, read_view
    from durable_dispatch.views.watch import stats_text

    state = tmp_path / "s"
    with CampaignState.open(state) as st:
        st.submit([WorkItem(f"c{i}", i, after=(f"c{i - 1}",) if i else ()) for i in range(5)])
        assert st.core.statistics().waiting_now == 4
    v = read_view(state)
    assert (v.pending, v.waiting, v.work_items, v.state) == (1, 4, 5, STOPPED)
    assert v.left == 5 and v.as_dict()["waiting"] == 4
    assert any("4 waiting for dependencies" in line for line in stats_text(v, {}, False))
    rows = {r.work_id: r.status for r in read_joblog(state)}
    assert rows == {"c0": "pending", **{f"c{i}": "waiting" for i in range(1, 5)}}
    assert main(["joblog", str(state), "--status", "waiting", "--jsonl"]) == 0
    series = report_series(state)
    assert series["view"]["waiting"] == 4


def test_what_waits_is_not_settled_while_a_closed_commit_waits_for_its_callback(
    tmp_path: Path,
) -> None:
    """The end of a turn closes a commit (``tick``) and its callback runs at the delivery point
    (``deliver``): an item waiting for the child that callback returns is not deferred as
    waiting for an ID never submitted in between (the campaign is not settled until every
    hook ran)."""

    def on_commit(wid: str, _result: Any) -> Any:
        return [WorkItem("C", "c")] if wid == "P" else None

    with CampaignState.open(tmp_path / "s", ranks=[1], on_commit=on_commit) as st:
        st.submit([WorkItem("P", "p"), WorkItem("W", "w", after=["C"])])
        s = st.next_send(0.0)
        assert s is not None and [w.work_id for w in s.items] == ["P"]
        st.sent(s.token, 0.0)
        st.on_results(s.rank, str(s.token), [1], 0.0)
        st.on_ready(s.rank, str(s.token), 0.0)
        st.journal.sync_now()
        st.tick(0.0)  # P is closed; its callback waits for the delivery point
        assert st.settle_waiting() == 0  # not yet: P's callback may submit what W waits for
        st.deliver()  # C is submitted
        assert st.settle_waiting() == 0 and "W" in st.core.ledger.waiting
        assert not st.core.deferred()
