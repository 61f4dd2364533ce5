"""Operator commands through the state directory (issue 52, O1): ``durable-dispatch cancel``,
``retry``, ``drain`` and ``submit``, with a master running (in-process and under a real
``mpiexec`` with isolated workers) and without one; applied once across a SIGKILL; bad
command files and bad submissions refused with nothing applied."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from durable_dispatch import CampaignState, WorkItem
from durable_dispatch.campaign.admin import compact_state, view_state
from durable_dispatch.campaign.control import (
    CONTROL_DIR,
    Inbox,
    pending_commands,
    read_ack,
    write_command,
)
from durable_dispatch.campaign.statedir import STATE_JOURNAL
from durable_dispatch.core import Dispatcher
from durable_dispatch.core.decisions import Park, Requeue
from durable_dispatch.errors import UsageError
from durable_dispatch.mpi import Feed, run_master
from durable_dispatch.storage.journal import read_journal
from durable_dispatch.testing import LocalWorkers


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_dispatch", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
    )


def _state(tmp_path: Path, n: int = 5) -> Path:
    d = tmp_path / "state"
    with CampaignState.open(d, ranks=(1,)) as s:
        s.submit([WorkItem(f"w{i}", {"i": i}) for i in range(n)])
    return d


def _events(d: Path, kind: str) -> list[dict[str, Any]]:
    return [r.payload for r in read_journal(d / STATE_JOURNAL) if r.payload["event"] == kind]


# ----------------------------------------------------------------------- the core
def test_cancel_in_flight_rolls_the_dispatch_back_and_parks_its_rank_until_its_exact_ready() -> (
    None
):
    core = Dispatcher(1, ranks=[1])
    core.submit([WorkItem("a"), WorkItem("b"), WorkItem("c")])
    send = core.reserve(0.0, max_items=2)
    core.mark_dispatched(send.token, 0.0)  # type: ignore[union-attr]
    what, out, stop = core.cancel("a", "cmd")
    assert what == "cancelled in flight" and stop == (1, send.token)  # type: ignore[union-attr]
    assert any(isinstance(d, Park) for d in out)
    assert [d.work_id for d in out if isinstance(d, Requeue)] == ["b"]  # uncharged, alone
    assert core.ledger.cancelled.keys() == {"a"} and core.attempts("b") == 0
    assert core.status("a").name == "CANCELLED"  # type: ignore[union-attr]
    # its late RESULT is stale and commits nothing (W8); the exact READY releases the rank
    assert core.on_results(1, str(send.token), [1, 2], 1.0) != []  # type: ignore[union-attr]
    assert "a" not in core.ledger.committed
    core.on_ready(1, str(send.token), 1.0)  # type: ignore[union-attr]
    assert core.parked_rank_count() == 0
    assert core.cancel("a")[0] == "already cancelled" and core.cancel("zz")[0] == "unknown"
    assert core.retry_item("a") == "requeued" and core.ledger.frontier
    assert core.retry_item("a") == "pending"


def test_cancelled_and_applied_commands_survive_snapshots_replay_and_compaction(
    tmp_path: Path,
) -> None:
    d = _state(tmp_path)
    assert cli("cancel", str(d), "w1", "w2").returncode == 0
    before = view_state(d).projection
    assert set(before.cancelled) == {"w1", "w2"} and len(before.commands) == 1
    compact_state(d)
    after = view_state(d).projection
    assert set(after.cancelled) == {"w1", "w2"} and after.commands == before.commands
    with CampaignState.open(d, ranks=(1,)) as s:
        assert set(s.core.ledger.cancelled) == {"w1", "w2"}
        assert len(s.core.ledger.frontier) == 3
        assert s.core.ledger.to_snapshot()["cancelled"][0]["work_id"] == "w1"
    st = json.loads(cli("stats", str(d), "--json").stdout)
    assert st["cancelled"] == 2 and st["work_items"] == 5 and st["pending"] == 3
    rows = [json.loads(x) for x in cli("joblog", str(d), "--jsonl").stdout.splitlines()]
    assert {r["work_id"] for r in rows if r["status"] == "cancelled"} == {"w1", "w2"}


# --------------------------------------------------------------- with no master
def test_each_command_without_a_master_is_applied_at_once_and_says_so(tmp_path: Path) -> None:
    d = _state(tmp_path)
    out = cli("cancel", str(d), "w0", "w4", "nope", "--json")
    body = json.loads(out.stdout)
    assert out.returncode == 1 and body["applied_by"] == "opened", out  # an unknown ID: 1
    assert body["work_ids"] == {"w0": "cancelled", "w4": "cancelled", "nope": "unknown"}
    assert "no master was running" in body["message"]
    again = json.loads(cli("cancel", str(d), "w0", "--json").stdout)
    assert again["work_ids"] == {"w0": "already cancelled"}
    sub = cli("submit", str(d), "-", stdin='{"work_id": "n1", "payload": [1]}\n\n'
              '{"work_id": "w1", "payload": {"i": 1}, "priority": 3}\n')  # fmt: skip
    assert sub.returncode == 0 and "1 added, 1 already known" in sub.stdout, sub
    ret = json.loads(cli("retry", str(d), "--all", "--json").stdout)
    assert ret["requeued"] == 2 and ret["applied_by"] == "opened"
    drain = cli("drain", str(d))
    assert drain.returncode == 1 and "no master is running" in drain.stderr, drain
    assert cli("retry", str(d)).returncode == 2  # neither IDs nor --all
    v = view_state(d).projection
    assert not v.cancelled and len(v.frontier) == 6 and "n1" in v.frontier
    assert pending_commands(str(d)) == []  # every command acknowledged and removed
    assert sorted(os.listdir(d / CONTROL_DIR)) == []
    assert (d / CONTROL_DIR).stat().st_mode & 0o777 == 0o700


def test_a_committed_item_is_left_alone_with_a_message(tmp_path: Path) -> None:
    d = tmp_path / "state"
    with CampaignState.open(d, ranks=(1,), starting=False) as s:
        s.submit([WorkItem("a")])
        x = s.next_send(0.0)
        assert x is not None
        s.sent(x.token, 0.0)
        s.on_results(1, str(x.token), [1], 0.0)
        s.tick(0.0)
    out = json.loads(cli("cancel", str(d), "a", "--json").stdout)
    assert out["work_ids"] == {"a": "committed"} and out["ok"] and "committed: a" in out["message"]
    assert "a" in view_state(d).projection.committed


# -------------------------------------------------------------------- bad input
def test_bad_submissions_are_refused_whole_with_nothing_applied(tmp_path: Path) -> None:
    d = _state(tmp_path)
    seq = list(read_journal(d / STATE_JOURNAL))[-1].seq
    bad = '{"work_id": "n1", "payload": 1}\n{"work_id": "n2", "payload": 2\n'
    out = cli("submit", str(d), "-", stdin=bad)
    assert out.returncode == 2 and "line 2" in out.stderr, out
    for text in ('{"work_id": 3, "payload": 1}\n', '{"work_id": "x"}\n', "[1]\n",
                 '{"work_id": "x", "payload": 1, "after": "w1"}\n'):  # fmt: skip
        assert cli("submit", str(d), "-", stdin=text).returncode == 2, text
    twice = '{"work_id": "n1", "payload": 1}\n{"work_id": "n1", "payload": 2}\n'
    out = cli("submit", str(d), "-", stdin=twice)
    assert out.returncode == 1 and "'n1'" in out.stderr, out
    assert list(read_journal(d / STATE_JOURNAL))[-1].seq == seq  # nothing written at all
    conflict = '{"work_id": "n1", "payload": 1}\n{"work_id": "w2", "payload": {"i": 99}}\n'
    path = tmp_path / "c.jsonl"
    path.write_text(conflict)
    out = cli("submit", str(d), str(path), "--json")
    body = json.loads(out.stdout)
    assert out.returncode == 1 and body["work_id"] == "w2" and body["conflict"], out
    led = view_state(d).projection
    assert not led.known("n1") and not _events(d, "submitted")[1:]  # nothing of the file
    ok = cli("submit", str(d), "-", stdin='{"work_id": "n9", "payload": null, "after": ["w1"]}')
    assert ok.returncode == 0, ok  # "after" is accepted (dependencies: issue 51)


def test_a_command_file_that_is_a_link_or_of_another_owner_is_refused_and_left_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = _state(tmp_path)
    ctl = d / CONTROL_DIR
    ctl.mkdir(mode=0o700)
    real = tmp_path / "elsewhere.json"
    real.write_bytes(orjson.dumps({"id": "0-link", "op": "cancel", "args": {"work_ids": ["w1"]}}))
    (ctl / "0-link.cmd").symlink_to(real)
    other = ctl / "1-other.cmd"
    other.write_bytes(orjson.dumps({"id": "1-other", "op": "cancel", "args": {"work_ids": ["w2"]}}))
    chowned = os.geteuid() == 0
    if chowned:
        os.chown(other, 4242, 4242)
    fifo = ctl / "2-fifo.cmd"
    os.mkfifo(fifo)
    with CampaignState.open(d, ranks=(1,)) as s:
        assert not s.core.ledger.cancelled and not s.core.ledger.commands
    assert (ctl / "0-link.cmd").is_symlink() and real.exists()
    assert fifo.exists() and other.exists()
    assert not (ctl / "0-link.ack").exists() and not (ctl / "1-other.ack").exists()
    assert "refused and left untouched" in caplog.text
    if chowned:
        assert other.stat().st_uid == 4242
        assert "owned by uid 4242" in caplog.text


# ------------------------------------------------------------ exactly once
_KILLER = r"""
import os, signal, sys
from durable_dispatch import CampaignState
from durable_dispatch.campaign import control
where = sys.argv[2]
if where == "before-ack":
    control._acknowledge = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
else:  # after the effects, before the command record
    real = control.CommandApplied
    def boom(*a, **k):
        os.kill(os.getpid(), signal.SIGKILL)
    control.CommandApplied = boom
CampaignState.open(sys.argv[1], ranks=(1,))
"""


@pytest.mark.parametrize("where", ["before-ack", "before-record"])
def test_a_master_sigkilled_while_applying_a_command_applies_it_once(
    tmp_path: Path, where: str
) -> None:
    d = _state(tmp_path)
    cancel = write_command(str(d), "cancel", {"work_ids": ["w1", "w3"]})
    submit = write_command(
        str(d), "submit", {"items": [{"work_id": "n1", "payload": 1, "priority": 0}]}
    )
    retry = write_command(str(d), "retry", {"work_ids": ["w3"]})
    dead = subprocess.run([sys.executable, "-c", _KILLER, str(d), where], timeout=120)
    assert dead.returncode == -signal.SIGKILL
    assert pending_commands(str(d)) == [cancel.id, submit.id, retry.id]  # none acknowledged
    with CampaignState.open(d, ranks=(1,)) as s:
        led = s.core.ledger
        assert set(led.cancelled) == {"w1"} and "w3" in led.frontier and "n1" in led.frontier
    assert pending_commands(str(d)) == []
    for c in (cancel, submit, retry):
        assert read_ack(str(d), c.id) is not None
    assert [e["work_id"] for e in _events(d, "cancelled")] == ["w1", "w3"]  # each once
    assert [e["work_id"] for e in _events(d, "requeued_deferred")] == ["w3"]
    assert sum(1 for e in _events(d, "submitted") if e.get("count") == 1) == 1
    ids = [e["id"] for e in _events(d, "command")]
    assert sorted(ids) == sorted({cancel.id, submit.id, retry.id}) and len(ids) == 3


# ------------------------------------------------- a running master (in-process)
class _Steered(Feed):
    """Submits its items, then writes commands while the master runs."""

    def __init__(self, d: Path, then: list[tuple[str, dict[str, Any]]], n: int = 6) -> None:
        self.d, self.then, self.n, self.turn = d, then, n, 0
        self.sent: list[Any] = []

    def refill(self) -> None:
        self.turn += 1
        if self.turn == 1:
            self.state.submit([WorkItem("h0")] + [WorkItem(f"a{i}") for i in range(self.n)])
        elif self.turn == 3:
            self.sent = [write_command(str(self.d), op, args) for op, args in self.then]
        elif self.sent and all(read_ack(str(self.d), c.id, remove=False) for c in self.sent):
            self.exhausted = True


def _slow(payload: Any) -> Any:
    time.sleep(0.2)  # (the commands are written after a few turns: some work is still pending)
    return payload


def test_a_running_master_cancels_in_flight_and_pending_items_and_takes_submissions(
    tmp_path: Path,
) -> None:
    d = tmp_path / "state"
    # rank 1 takes h0 and never answers (a hung function without isolation): it stays parked
    link = LocalWorkers(_slow, workers=2, answer=lambda r, t, ids: "h0" not in ids)
    then = [
        ("cancel", {"work_ids": ["h0", "a9"]}),
        ("submit", {"items": [{"work_id": "s1", "payload": 1}]}),
    ]
    feed = _Steered(d, then, n=10)
    report = run_master(feed, d, comm=link, linger=0)
    assert report.finished, report
    acks = [read_ack(str(d), c.id) for c in feed.sent]
    assert acks[0] is not None and acks[1] is not None
    assert acks[0]["work_ids"] == {"h0": "cancelled in flight", "a9": "cancelled"}
    assert acks[1]["added"] == 1
    assert report.view is not None and report.view.cancelled == 2
    assert report.view.committed == 10 and report.view.pending == 0
    assert report.stats["core"]["operator_cancelled_in_flight"] == 1
    assert any(e[0] == "send" and e[2] == "CANCEL" for e in link.log)
    led = view_state(d).projection
    assert "h0" not in led.committed and "s1" in led.committed
    assert set(led.cancelled) == {"h0", "a9"}


def test_drain_command_drains_a_running_master_as_sigusr1_does(tmp_path: Path) -> None:
    d = tmp_path / "state"
    link = LocalWorkers(lambda p: p, workers=2, answer=lambda r, t, ids: "h0" not in ids)
    feed = _Steered(d, [("drain", {})], n=2)
    start = time.monotonic()
    report = run_master(feed, d, comm=link, drain_seconds=0.5, linger=0)
    assert not report.finished and report.reason == "drain", report
    assert time.monotonic() - start < 60
    assert read_ack(str(d), feed.sent[0].id)["message"] == "the master is draining"  # type: ignore[index]


def test_a_drain_does_not_linger_for_a_parked_rank_even_when_the_work_is_done(
    tmp_path: Path,
) -> None:
    """A cancel in flight parks its rank (its worker never answers: a late READY), the rest is
    committed, then a drain: the run is finished, and it ends at once with the rank parked,
    however long ``linger`` is (the torture harness's check of parked ranks relies on this)."""
    d = tmp_path / "state"
    link = LocalWorkers(lambda p: p, workers=2, answer=lambda r, t, ids: "h0" not in ids)

    class Then(_Steered):  # (nothing more to come once the commands are written)
        def refill(self) -> None:
            super().refill()
            self.exhausted = self.exhausted or bool(self.sent)

    feed = Then(d, [("cancel", {"work_ids": ["h0"]}), ("drain", {})], n=2)
    start = time.monotonic()
    report = run_master(feed, d, comm=link, linger=60.0)
    assert time.monotonic() - start < 30
    assert report.finished and report.reason is None, report
    assert report.stats["core"]["parked_ranks_now"] == 1
    assert report.stats["core"]["operator_cancelled_in_flight"] == 1
    assert any(e[0] == "send" and e[2] == "CANCEL" for e in link.log)


def test_the_inbox_costs_one_stat_per_poll_and_lists_only_on_change(tmp_path: Path) -> None:
    d = _state(tmp_path)
    write_command(str(d), "retry", {"all": True})
    inbox = Inbox(str(d))
    assert [c.op for c in inbox.due(0.0)] == ["retry"]
    for k in range(1, 20):  # a stat every 0.5 s of the master's clock; no listing: no change
        assert inbox.due(k * 0.1) == []
    assert inbox.stats == {"stats": 4, "listings": 1}
    assert [c.op for c in inbox.due(6.0)] == ["retry"]  # the rescan, for coarse mtimes
    write_command(str(d), "cancel", {"work_ids": ["w1"]})
    assert [c.op for c in inbox.due(6.5)] == ["retry", "cancel"]


# ------------------------------------------------------ real mpiexec, isolation
CAMPAIGN = Path(__file__).parent / "children" / "steer_campaign.py"


def _wait(what: Any, timeout: float, every: float = 0.2) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = what()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"not within {timeout}s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


def test_steering_a_real_mpiexec_campaign_with_isolated_workers(tmp_path: Path) -> None:
    """Under mpiexec (3 isolated workers): three items of 120 s fill the ranks; cancel two of
    them (and two pending items) while the campaign runs: their children die within seconds
    and nothing of theirs commits; submit two items during the run; drain; the next run (no
    master at the time of the commands) retries a cancelled item and cancels the interrupted
    one, and finishes."""
    from durable_dispatch.mpi.launcher import (
        find_mpiexec,
        kill_session,
        launch_env,
        mpiexec_command,
    )

    if find_mpiexec() is None:
        raise RuntimeError("mpiexec not found: install the project with '.[test,mpi]'")
    d, marks = tmp_path / "state", tmp_path / "marks"
    marks.mkdir()
    cmd = mpiexec_command(4, [sys.executable, str(CAMPAIGN), str(d), str(marks), "8"])
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=launch_env(quiet=True), start_new_session=True,
    )  # fmt: skip
    try:
        pids = _wait(
            lambda: [
                int(t) for f in ("s0", "s1", "s2") if (t := _read(marks / f"pid-{f}"))
            ] if all((marks / f"pid-{f}").exists() for f in ("s0", "s1", "s2")) else None,
            90,
        )  # fmt: skip
        t0 = time.monotonic()
        out = cli("cancel", str(d), "s0", "s1", "p0", "p1", "--json")
        took = time.monotonic() - t0
        body = json.loads(out.stdout)
        assert out.returncode == 0 and body["applied_by"] == "master", out
        assert body["work_ids"] == {
            "s0": "cancelled in flight",
            "s1": "cancelled in flight",
            "p0": "cancelled",
            "p1": "cancelled",
        }
        _wait(lambda: not _alive(pids[0]) and not _alive(pids[1]), 30)
        stopped = time.monotonic() - t0
        print(f"cancel acknowledged in {took:.2f}s; children gone {stopped:.2f}s after")
        assert _alive(pids[2])  # s2 runs on
        sub = cli("submit", str(d), "-", stdin='{"work_id": "n0", "payload": {"name": "n0", '
                  f'"slow": false, "marks": "{marks}"}}}}\n')  # fmt: skip
        assert sub.returncode == 0 and "1 added" in sub.stdout, sub
        _wait(lambda: "n0" in view_state(d).projection.committed, 60)
        _wait(lambda: len(view_state(d).projection.committed) == 7, 60)  # p2..p7, n0
        drain = cli("drain", str(d))
        assert drain.returncode == 0 and "draining" in drain.stdout, drain
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            kill_session(proc)
            proc.communicate()
    assert proc.returncode == 3, stderr[-3000:]  # the resumable outcome
    report = json.loads(next(x for x in stdout.splitlines() if x.startswith("REPORT "))[7:])
    assert report["reason"] == "drain" and report["view"]["cancelled"] == 4
    led = view_state(d).projection
    assert not {"s0", "s1", "p0", "p1"} & set(led.committed)
    assert "s2" in led.in_flight  # interrupted by the drain: it runs again at the next start
    # the next run: commands while no master runs, then the campaign finishes
    (marks / "fast").write_text("")
    assert cli("retry", str(d), "s0", "p0").returncode == 0
    assert cli("cancel", str(d), "s2").returncode == 0
    from durable_dispatch.mpi.launcher import run_mpiexec

    res = run_mpiexec(cmd, timeout=150)
    assert not res.timed_out and res.returncode == 0, res.stderr[-3000:]
    led = view_state(d).projection
    assert {"s0", "p0"} <= set(led.committed) and set(led.cancelled) == {"s1", "p1", "s2"}
    assert len(led.committed) == 9 and not led.frontier and not led.in_flight


def _read(p: Path) -> str | None:
    try:
        return p.read_text() or None
    except FileNotFoundError:
        return None


def test_a_deferred_item_cancelled_leaves_the_deferred_list_and_retry_brings_it_back(
    tmp_path: Path,
) -> None:
    from durable_dispatch import RetryPolicy

    d = tmp_path / "state"
    with CampaignState.open(d, ranks=[1], retry=RetryPolicy(0)) as s:
        s.submit([WorkItem("w1", {"x": 1})])
        x = s.next_send(0.0)
        assert x is not None
        s.sent(x.token, 0.0)
        s.on_results(1, str(x.token), None, 0.0, failure="garbled")
        s.on_ready(1, str(x.token), 0.0)
        s.tick(0.0)
    assert [r["work_id"] for r in json.loads(cli("deferred", "list", str(d), "--json").stdout)]
    out = json.loads(cli("cancel", str(d), "w1", "--json").stdout)
    assert out["work_ids"] == {"w1": "cancelled"}, out
    assert json.loads(cli("deferred", "list", str(d), "--json").stdout) == []
    st = json.loads(cli("stats", str(d), "--json").stdout)
    assert (st["cancelled"], st["deferred"], st["finished"]) == (1, 0, True)
    assert cli("deferred", "requeue", str(d), "w1").returncode == 2  # not deferred: cancelled
    assert cli("retry", str(d), "w1").returncode == 0
    led = view_state(d).projection
    assert "w1" in led.frontier and not led.attempts.get("w1")  # a fresh budget


def test_a_command_whose_master_ends_before_it_looks_is_applied_by_the_command_line(
    tmp_path: Path,
) -> None:
    """The master closed (finished) without polling again: the waiting command line sees no
    master running any more and applies the command itself, instead of timing out."""
    d = _state(tmp_path)
    st = CampaignState.open(d, ranks=(1,))  # a master that never polls
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "durable_dispatch", "cancel", str(d), "w2", "--json"],
            stdout=subprocess.PIPE,
            text=True,
        )
        _wait(lambda: pending_commands(str(d)), 60)
    finally:
        st.close()
    stdout, _ = proc.communicate(timeout=120)
    body = json.loads(stdout)
    assert proc.returncode == 0 and body["applied_by"] == "opened", body
    assert set(view_state(d).projection.cancelled) == {"w2"}


# ------------------------------------------------- with dependencies (G4, issue 51)
def test_a_cancelled_item_defers_its_dependents_and_a_retry_then_its_commit_releases_them(
    tmp_path: Path,
) -> None:
    """The seam of issues 51 and 52: cancelling an item defers what waits for it, transitively
    (kind "dependency", the error naming it and "cancelled"), across a reopen; ``submit``'s
    ``after`` makes a new item wait; ``retry`` of the cancelled item, then its commit, releases
    its dependents, and the campaign ends with everything committed."""
    d = tmp_path / "state"
    with CampaignState.open(d, ranks=(1,)) as s:
        s.submit([WorkItem("a"), WorkItem("b", after=("a",)), WorkItem("c", after=("b",))])
    sub = cli("submit", str(d), "-", stdin='{"work_id": "z", "payload": 1, "after": ["c"]}\n')
    assert sub.returncode == 0, sub
    out = json.loads(cli("cancel", str(d), "a", "--json").stdout)
    assert out["work_ids"] == {"a": "cancelled"}, out
    v = view_state(d).projection
    assert set(v.cancelled) == {"a"} and set(v.deferred) == {"b", "c", "z"} and not v.waiting
    with CampaignState.open(d, ranks=(1,)) as s:  # the deferral is durable
        led = s.core.ledger
        assert set(led.deferred) == {"b", "c", "z"}
        assert led.kinds["b"][-1] == "dependency"
    rows = {
        r["work_id"]: r
        for r in map(json.loads, cli("joblog", str(d), "--jsonl").stdout.splitlines())
    }
    assert "'a'" in rows["b"]["last_failure"] and "cancelled" in rows["b"]["last_failure"]
    ret = json.loads(cli("retry", str(d), "a", "--json").stdout)
    assert ret["requeued"] == 1, ret
    seen: list[str] = []
    report = run_master(
        [],
        d,
        lambda wid, _r: seen.append(wid),
        comm=LocalWorkers(lambda p, ctx: p, 1, context=True),
    )
    assert report.finished and seen == ["a", "b", "c", "z"], (report, seen)


# -------------------------------------------------------- a full disk (real ENOSPC)
def test_a_command_the_full_disk_refuses_says_nothing_was_sent_and_leaves_no_file(
    tmp_path: Path,
) -> None:
    """The torture harness's seed 607701747 (CI): ``cancel`` while the state directory's
    filesystem was full printed only ``[Errno 28] No space left on device``, which does not
    tell the operator whether the cancel took, and left its temporary file in ``control/``.
    On a real tmpfs (root; CI runs it): exit 2 (an I/O error, docs/cli.md), the message says
    the command was not written, nothing is left in ``control/`` and nothing was cancelled; once
    there is room the same command works."""
    from .helpers import Tmpfs

    with Tmpfs(tmp_path / "m", size=1 << 20, inodes=256) as m:
        d = _state(m.path)
        (d / CONTROL_DIR).mkdir(mode=0o700)  # as after an earlier command
        m.fill()
        try:
            out = cli("cancel", str(d), "w1", "--json")
            assert out.returncode == 2, out
            err = json.loads(out.stdout)["error"]
            assert err["type"] == "OSError" and "No space left on device" in err["message"], err
            assert "not written" in err["message"] and "nothing was sent" in err["message"]
            assert os.listdir(d / CONTROL_DIR) == []
            plain = cli("cancel", str(d), "w1")
            assert plain.returncode == 2 and "nothing was sent" in plain.stderr, plain
        finally:
            m.free()
        assert not view_state(d).projection.cancelled
        again = json.loads(cli("cancel", str(d), "w1", "--json").stdout)
        assert again["work_ids"] == {"w1": "cancelled"}, again
        assert set(view_state(d).projection.cancelled) == {"w1"}


def test_a_drain_whose_master_ends_before_it_is_sent_is_a_finding_not_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The torture harness (seed 801225434): ``drain`` saw the master running, the master
    ended, and the command's own check then raised a usage error: exit 2, against docs/cli.md's
    "exit 1 when no master runs". Both checks now give the same finding; nothing is written."""
    from durable_dispatch import cli
    from durable_dispatch.campaign import statedir
    from durable_dispatch.cli import steering as steer
    from durable_dispatch.errors import NoMasterError

    d = _state(tmp_path)
    answers = iter([True])  # running at the command line's check, gone at the send's
    monkeypatch.setattr(statedir, "_master_running", lambda _d: next(answers, False))
    monkeypatch.setattr(steer, "_master_running", statedir._master_running)
    assert cli.main(["drain", str(d), "--json"]) == 1
    err = json.loads(capsys.readouterr().out)["error"]
    assert err == {
        "type": "NotFound",
        "message": f"no master is running on {d}: nothing to drain",
        "exit_code": 1,
    }, err
    assert not (d / CONTROL_DIR).exists() or os.listdir(d / CONTROL_DIR) == []
    with pytest.raises(NoMasterError) as e:  # the API's
        steer.send(str(d), "drain", {})
    assert e.value.path == str(d) and isinstance(e.value, UsageError)


def test_retry_selects_the_deferred_or_the_cancelled_and_all_takes_both(tmp_path: Path) -> None:
    """``retry --all`` also revived items an operator cancelled on purpose: ``--deferred`` and
    ``--cancelled`` select one set each, ``--all`` takes both and its help says so."""
    from durable_dispatch import RetryPolicy

    d = tmp_path / "state"
    with CampaignState.open(d, ranks=[1], retry=RetryPolicy(0)) as s:
        s.submit([WorkItem(w, {"x": i}) for i, w in enumerate(["f1", "f2", "c1", "ok"])])
        for _ in range(2):  # f1 and f2 fail once: deferred
            x = s.next_send(0.0)
            assert x is not None
            s.sent(x.token, 0.0)
            s.on_results(1, str(x.token), None, 0.0, failure="garbled")
            s.on_ready(1, str(x.token), 0.0)
            s.tick(0.0)
    assert cli("cancel", str(d), "c1").returncode == 0
    led = view_state(d).projection
    assert (sorted(led.deferred), sorted(led.cancelled)) == (["f1", "f2"], ["c1"])
    out = json.loads(cli("retry", str(d), "--deferred", "--json").stdout)
    assert sorted(out["work_ids"]) == ["f1", "f2"], out
    led = view_state(d).projection
    assert not led.deferred and sorted(led.cancelled) == ["c1"]  # cancelled on purpose: kept
    out = json.loads(cli("retry", str(d), "--cancelled", "--json").stdout)
    assert sorted(out["work_ids"]) == ["c1"], out
    assert not view_state(d).projection.cancelled
    assert cli("retry", str(d), "--deferred", "f1").returncode == 2  # IDs or a selection
    helptext = " ".join(cli("retry", "--help").stdout.split())
    assert "--all" in helptext and "both" in helptext, helptext


def test_deferred_list_prints_one_line_per_item_and_long_every_field(tmp_path: Path) -> None:
    """``deferred list`` printed 7-line blocks (427 lines for 61 items) with fields a user
    cannot read (``self_contained``, ``inputs``, ``seq``): one line per item by default, the
    last error's last line shortened; ``--long`` and ``--json`` keep every field."""
    from durable_dispatch import RetryPolicy

    d = tmp_path / "state"
    n = 5
    with CampaignState.open(d, ranks=[1], retry=RetryPolicy(0)) as s:
        s.submit([WorkItem(f"w{i}", {"x": i}) for i in range(n)])
        for i in range(n):
            x = s.next_send(0.0)
            assert x is not None
            s.sent(x.token, 0.0)
            trace = "Traceback (most recent call last):\n  ...\n" + "ValueError: diverged " * 20
            s.on_results(1, str(x.token), None, 0.0, failure=f"{trace} {i}")
            s.on_ready(1, str(x.token), 0.0)
            s.tick(0.0)
    res = cli("deferred", "list", str(d))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == n + 1 and lines[0].startswith("work ID"), res.stdout
    for i, line in enumerate(lines[1:]):
        assert line.startswith(f"w{i} ") and "ValueError: diverged" in line, line
        assert len(line) <= 100 and line.endswith("..."), line
    for field in ("self_contained", "inputs", "seq"):
        assert field not in res.stdout
    long = cli("deferred", "list", str(d), "--long").stdout
    assert long.count("self_contained") == n and "Traceback" not in res.stdout
    rows = json.loads(cli("deferred", "list", str(d), "--json").stdout)
    assert len(rows) == n and all("seq" in r and "Traceback" in r["last_error"] for r in rows)
