"""One view of a campaign (issue 46, V1): ``stats``, ``watch``, ``report``, ``joblog``,
``results``, ``MasterReport`` and the demo's summary show the same numbers under the same
names, before and after ``compact``, with and without a running master; ``stats`` is short;
errors point at the fix."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_dispatch import CampaignState, RetryPolicy, WatchdogConfig, WorkItem
from durable_dispatch.campaign.admin import compact_state
from durable_dispatch.campaign.results import read_results
from durable_dispatch.cli import main
from durable_dispatch.views.joblog import read_joblog

from .helpers import fake_campaign

ROOT = Path(__file__).resolve().parent.parent

#: the numbers every face shows (the ages and the time of reading differ between two reads)
NUMBERS = (
    "state",
    "master_running",
    "epoch",
    "work_items",
    "committed",
    "deferred",
    "pending",
    "in_flight",
    "interrupted",
    "failures_by_kind",
    "failed_items",
    "duplicate_commits",
    "rate_per_s",
    "eta_seconds",
    "parked_ranks",
    "busy_ranks",
    "lost_ranks",
    "watchdog_expiries",
    "storage",
    "commits_in_memory",
    "master_host",
    "master_pid",
    "finished",
)


def cli(*args: str) -> tuple[int, str, str]:
    """The command in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_dispatch", *args], capture_output=True, text=True
    )


def faces(d: Path) -> dict[str, dict[str, Any]]:
    """The numbers of ``stats --json``, ``watch --once --json`` and the report, by face."""
    from durable_dispatch.views.report import report_series

    code, out, err = cli("stats", str(d), "--json")
    assert code == 0, err
    stats = json.loads(out)
    code, out, err = cli("watch", str(d), "--once", "--json")
    assert code == 0, err
    frame = json.loads(out)
    report = report_series(d)
    return {"stats": stats, "watch": frame, "report": report["view"], "series": report}


def assert_agree(d: Path) -> dict[str, Any]:
    """Every face shows the same numbers, and they add up; returns them."""
    f = faces(d)
    s = f["stats"]
    for face in ("watch", "report"):
        for k in NUMBERS:
            assert f[face][k] == s[k], (face, k, f[face][k], s[k])
    assert s["work_items"] == s["committed"] + s["deferred"] + s["pending"] + s["in_flight"]
    if not s["master_running"]:
        assert s["in_flight"] == 0  # a master that is not running has nothing in flight
    results = list(read_results(d))
    assert len(results) == s["committed"]
    statuses = Counter(r.status for r in read_joblog(d))
    assert statuses["committed"] == s["committed"] and statuses["deferred"] == s["deferred"]
    assert statuses["pending"] == s["pending"] and statuses["in flight"] == s["in_flight"]
    series = f["series"]
    assert sum(len(r["kinds"]) for r in series["failures"]) == sum(s["failures_by_kind"].values())
    assert len(series["failures"]) == s["failed_items"]
    assert len(series["deferred_items"]) == s["deferred"]
    if series["times"]:
        assert series["committed"][-1] == s["committed"]
        assert series["deferred"][-1] == s["deferred"]
    return s


# ----------------------------------------------------------------------- the property (V1)
def _drive(state: CampaignState, behaviours: list[str], turns: int, now: float) -> float:
    """Up to ``turns`` turns of a fake transport (as ``fake_campaign``), leaving what is in
    flight in flight; ``behaviours`` answers each WORK in turn (cycled)."""
    k = 0
    for _ in range(turns):
        if state.done:
            break
        answers = []
        while (s := state.next_send(now, 2)) is not None:
            state.sent(s.token, now)
            how = behaviours[k % len(behaviours)]
            k += 1
            if how == "ok":
                answers.append((s.rank, str(s.token), [{"ok": w.work_id} for w in s.items], None))
            elif how == "error":
                answers.append((s.rank, str(s.token), [None] * len(s.items), {0: "it raised"}))
            elif how == "malformed":
                answers.append((s.rank, str(s.token), None, None))
            # "silent": never answered; the watchdog rolls it back and parks the rank
        for rank, token, values, errors in answers:
            state.on_results(rank, token, values, now, errors=errors)
            state.on_ready(rank, token, now)
        now += 1.0
        state.tick(now)
    return now


def _settle(state: CampaignState) -> None:
    """Wait until what the master appended is on disk: under ``sync="batch"`` the group commit's
    thread writes it a moment later, and a reader sees only what was written (one face read
    before the write and the next after it, and they differed: a flaky property, not a view
    bug)."""
    for j in (state.journal, state.submissions, state.defer.journal):
        if j.next_seq > 0:
            j.wait_durable(j.next_seq - 1, timeout=60)


runs_strategy = st.lists(
    st.tuples(
        st.integers(1, 12),  # items submitted in this run (the first ones of a fixed list)
        st.lists(st.sampled_from(["ok", "ok", "silent", "error", "malformed"]), min_size=1),
        st.integers(0, 12),  # turns
        st.booleans(),  # compact after the run
    ),
    min_size=1,
    max_size=3,
)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(runs=runs_strategy, retries=st.integers(0, 2))
def test_every_face_shows_the_same_numbers_for_any_campaign_history(
    tmp_path_factory: Any, runs: list[tuple[int, list[str], int, bool]], retries: int
) -> None:
    d = tmp_path_factory.mktemp("view") / "state"
    items = [WorkItem(f"w{i:02d}", i) for i in range(12)]
    now = 0.0
    for n, behaviours, turns, compact in runs:
        state = CampaignState.open(
            d, ranks=(1, 2, 3), watchdog=WatchdogConfig(3), retry=RetryPolicy(retries)
        )
        try:
            state.submit(items[:n])
            now = _drive(state, behaviours, turns, now)
            state.publish_statistics(force=True)
            _settle(state)
            running = assert_agree(d)  # with a running master
            assert running["master_running"] and running["state"] == "running"
        finally:
            state.close()
        stopped = assert_agree(d)  # without one
        assert not stopped["master_running"] and stopped["in_flight"] == 0
        if compact:
            compact_state(d)
            after = assert_agree(d)  # compaction keeps what the views show
            for k in NUMBERS:
                assert after[k] == stopped[k], k


# ------------------------------------------------------------------- the cases of issue 46
def _two_runs(d: Path, compact: bool) -> None:
    """Run 1: silent workers (timeouts) and a deferral; run 2: all well."""
    n = {"k": 0}

    def behave(send: Any) -> str:
        n["k"] += 1
        return "silent" if n["k"] % 4 == 0 else "ok"

    items = [WorkItem(f"w{i:02d}", i) for i in range(20)]
    with CampaignState.open(
        d, ranks=(1, 2, 3), watchdog=WatchdogConfig(5), retry=RetryPolicy(0)
    ) as s:
        s.submit(items[:10])
        fake_campaign(s, behave=behave)
    if compact:
        compact_state(d)
    with CampaignState.open(d, ranks=(1, 2, 3)) as s:
        s.submit(items)
        fake_campaign(s)


def test_watch_shows_the_timeouts_of_the_campaign_not_a_second_count(tmp_path: Path) -> None:
    """watch said 'timeouts 0' beside 'failures by kind: timeout 3' (the second run's watchdog
    count beside the campaign's failures): one number, one name."""
    d = tmp_path / "state"
    _two_runs(d, compact=False)
    code, out, _ = cli("watch", str(d), "--once")
    assert code == 0
    frame = json.loads(cli("watch", str(d), "--once", "--json")[1])
    timeouts = frame["failures_by_kind"]["timeout"]
    assert timeouts > 0 and f"timeout {timeouts}" in out
    assert "timeouts 0" not in out and "timeouts" not in frame
    assert assert_agree(d)["failures_by_kind"]["timeout"] == timeouts


def test_after_compact_the_report_keeps_the_failures_deferrals_and_runs(tmp_path: Path) -> None:
    """After compact the report said '0 deferred, 0 master runs' and 'Failures by kind: None'
    while stats showed the deferred items."""
    from durable_dispatch.views.report import render_report, report_series

    d = tmp_path / "state"
    _two_runs(d, compact=True)
    s = assert_agree(d)
    assert s["deferred"] > 0 and s["epoch"] == 2 and s["failures_by_kind"]["timeout"] > 0
    series = report_series(d)
    page = render_report(series, "t")
    assert f"Deferred items ({s['deferred']} items" in page and "None deferred" not in page
    assert f"timeout {s['failures_by_kind']['timeout']}" in page
    assert "master runs</th><td>2 " in page


KILLED = """
import os, signal, sys
from durable_dispatch import CampaignState, WatchdogConfig, WorkItem
s = CampaignState.open(sys.argv[1], ranks=(1, 2, 3), watchdog=WatchdogConfig(60), sync="always")
s.submit([WorkItem(f"w{i:02d}", i) for i in range(10)])
for _ in range(3):
    x = s.next_send(0.0)
    s.sent(x.token, 0.0)
s.publish_statistics(force=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_master_has_nothing_in_flight_and_its_downtime_is_a_gap(tmp_path: Path) -> None:
    """The report of a job that died and was resumed drew 3 items in flight through the hours
    the job was dead; stats counted them in flight with no master running."""
    from durable_dispatch.views.report import report_series

    d = tmp_path / "state"
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    res = subprocess.run([sys.executable, str(script), str(d)], capture_output=True, text=True)
    assert res.returncode == -9, res.stderr
    killed = assert_agree(d)
    assert killed["state"] == "stopped" and killed["in_flight"] == 0
    assert killed["interrupted"] == 3 and killed["pending"] == 10
    assert killed["master_ended"] == "killed"
    code, out, _ = cli("stats", str(d))
    assert "3 of the pending were in flight when the master stopped" in out
    assert "ended without closing" in out
    time.sleep(1.5)  # the job is dead for a while
    with CampaignState.open(d, ranks=(1, 2, 3)) as s:
        fake_campaign(s)
    series = report_series(d)
    assert len(series["runs"]) == 2 and len(series["gaps"]) == 1
    g0, g1 = series["gaps"][0]
    assert g1 - g0 >= 1.4
    run1_end = series["runs"][0]["end"]
    at_end = [v for t, v in zip(series["times"], series["in_flight"], strict=True) if t <= run1_end]
    assert at_end[-1] == 0  # what the dead master left in flight ended with its run
    assert not [t for t in series["times"] if g0 < t < g1]  # nothing is drawn in the gap
    assert series["timeline"] and any(
        seg[2] == "interrupted" for segs in series["timeline"].values() for seg in segs
    )
    assert assert_agree(d)["state"] == "finished"


def test_stats_is_a_short_summary_and_every_number_is_behind_verbose_and_json(
    tmp_path: Path,
) -> None:
    """stats printed 146 lines in three blocks whose committed counts disagreed."""
    d = tmp_path / "state"
    _two_runs(d, compact=False)
    code, out, _ = cli("stats", str(d))
    lines = out.splitlines()
    assert code == 0 and len(lines) <= 10, out
    for label in ("state", "progress", "rate", "failures", "ranks", "storage", "master"):
        assert any(x.startswith(label) for x in lines), (label, out)
    assert "20 of 20 committed" not in out  # some were deferred
    s = json.loads(cli("stats", str(d), "--json")[1])
    assert f"{s['committed']} of {s['work_items']} committed" in out
    verbose = cli("stats", str(d), "--verbose")[1]
    assert len(verbose.splitlines()) > 30 and "master_statistics" in verbose
    assert s["master_statistics"]["core"]["commits"] >= 0


def test_the_demo_summary_says_left_for_work_not_done_yet(tmp_path: Path) -> None:
    """After a clean drain the demo said 'lost 159' for items not done yet."""
    from durable_dispatch.cli.demo import summarize

    d = tmp_path / "state"
    items = [WorkItem(f"w{i:02d}", i) for i in range(10)]
    with CampaignState.open(d, ranks=(1, 2)) as s:
        s.submit(items)
        x = s.next_send(0.0)
        assert x is not None
        s.sent(x.token, 0.0)
        s.on_results(x.rank, str(x.token), [1], 0.0)
        s.on_ready(x.rank, str(x.token), 0.0)
        s.tick(1.0)
    out = summarize(str(d), {i.work_id for i in items})
    assert out["lost"] == 0 and out["left"] == 9 and out["committed"] == 1, out
    assert out["state"] == "stopped"


def test_master_report_carries_the_view_stats_shows(tmp_path: Path) -> None:
    from durable_dispatch.mpi import run_master
    from durable_dispatch.testing import LocalWorkers

    def work(p: int) -> int:
        if p == 3:
            raise ValueError("three")
        return p

    d = tmp_path / "state"
    items = [WorkItem(f"w{i}", i) for i in range(8)]
    r = run_master(items, d, comm=LocalWorkers(work, 2), retry=RetryPolicy(1), linger=0)
    assert r.view is not None
    s = assert_agree(d)
    for k in NUMBERS:
        if k not in ("master_pid", "master_host"):  # the same process and host here
            assert r.view.as_dict()[k] == s[k], k
    assert r.view.failures_by_kind == {"error": 2} and r.view.deferred == 1


# ---------------------------------------------------------------- errors that point at the fix
def _many_results(d: Path, n: int = 3000) -> None:
    with CampaignState.open(d, ranks=(1, 2, 3)) as s:
        s.submit(WorkItem(f"w{i:05d}", "x" * 40) for i in range(n))
        fake_campaign(s)


def test_results_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`results STATE --jsonl | head` printed 'Error: [Errno 32] Broken pipe', exit 2."""
    d = tmp_path / "state"
    _many_results(d)
    for cmd in (["results", str(d), "--jsonl"], ["joblog", str(d), "--jsonl"]):
        p = subprocess.Popen(
            [sys.executable, "-m", "durable_dispatch", *cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert p.stdout is not None and p.stderr is not None
        assert json.loads(p.stdout.readline())["work_id"] == "w00000"
        p.stdout.close()  # as head does after its lines
        err = p.stderr.read().decode()
        assert p.wait(timeout=60) == 0 and err == "", err


def test_report_to_a_missing_directory_names_it(tmp_path: Path) -> None:
    """report -o /missing/dir/r.html said "No such file or directory: '.../r.html.tmp'"."""
    d = tmp_path / "state"
    _two_runs(d, compact=False)
    out = tmp_path / "missing" / "dir" / "r.html"
    res = run("report", str(d), "-o", str(out))
    assert res.returncode == 2 and ".tmp" not in res.stderr
    assert f"the directory {out.parent} does not exist" in res.stderr, res.stderr
    res = run("report", str(d), "-o", str(out), "--json")
    err = json.loads(res.stdout)["error"]
    assert err["type"] == "UsageError" and str(out.parent) in err["message"]


def test_stats_on_a_futures_runners_state_dir_names_the_executor_directories(
    tmp_path: Path,
) -> None:
    """stats D on a futures runner's --state-dir said only 'is not a durable-dispatch state
    directory'."""
    for name in ("executor-1", "executor-2"):
        with CampaignState.open(tmp_path / name, ranks=(1,)):
            pass
    for cmd in ("stats", "watch", "report", "results", "joblog"):
        res = run(cmd, str(tmp_path))
        assert res.returncode == 2
        assert "executor-1, executor-2" in res.stderr, res.stderr
        assert str(tmp_path / "executor-1") in res.stderr


def test_the_hint_on_a_directory_of_state_directories_fits_what_it_holds(tmp_path: Path) -> None:
    """Plain campaigns' state directories side by side are not a futures runner's --state-dir:
    the hint names them and says to pass one, and speaks of executors only for ``executor-<k>``."""
    for name in ("state-a", "state-b"):
        with CampaignState.open(tmp_path / "plain" / name, ranks=(1,)):
            pass
    with CampaignState.open(tmp_path / "runner" / "executor-1", ranks=(1,)):
        pass
    res = run("stats", str(tmp_path / "plain"))
    assert res.returncode == 2 and "state-a, state-b" in res.stderr, res.stderr
    assert "futures" not in res.stderr and "executor" not in res.stderr, res.stderr
    assert str(tmp_path / "plain" / "state-a") in res.stderr, res.stderr
    res = run("stats", str(tmp_path / "runner"))
    assert res.returncode == 2 and "futures runner" in res.stderr, res.stderr


def test_every_cli_error_is_json_under_json(tmp_path: Path) -> None:
    for args in (
        ["stats", str(tmp_path / "nope"), "--json"],
        ["stats", "--json"],  # a missing argument: argparse's error
        ["joblog", str(tmp_path), "--status", "bogus", "--json"],
        ["watch", str(tmp_path), "--interval", "x", "--json"],
    ):
        res = run(*args)
        assert res.returncode == 2, (args, res)
        body = json.loads(res.stdout)
        assert body["error"]["exit_code"] == 2 and body["error"]["message"], body
    res = run("stats")
    assert res.returncode == 2 and "usage:" in res.stderr and "Error:" in res.stderr


# --------------------------------------------------------------------------------- joblog
def test_the_joblog_lists_every_item_with_its_tries_failure_start_and_rank(
    tmp_path: Path,
) -> None:
    d = tmp_path / "state"
    _two_runs(d, compact=False)
    rows = [json.loads(x) for x in cli("joblog", str(d), "--jsonl")[1].splitlines()]
    assert [r["work_id"] for r in rows] == [f"w{i:02d}" for i in range(20)]
    assert set(rows[0]) == {
        "work_id",
        "status",
        "tries",
        "last_failure_kind",
        "last_failure",
        "started",
        "seconds",
        "rank",
        "host",
        "call",
        "signal",
        "traceback",
        "cpu_seconds",
        "max_rss",
        "cost_measured",
    }
    assert all(r["host"] is None for r in rows)  # (no worker here named its host)
    assert all(r["traceback"] is None for r in rows)  # (timeouts: no function raised)
    deferred = [r for r in rows if r["status"] == "deferred"]
    assert deferred and all(r["last_failure_kind"] == "timeout" for r in deferred)
    assert all(r["tries"] == 1 and r["last_failure"] for r in deferred)
    done = [r for r in rows if r["status"] == "committed"]
    assert all(r["started"] and r["rank"] in (1, 2, 3) and r["seconds"] >= 0 for r in done)
    assert rows[5]["call"] == "5"
    code, table, _ = cli("joblog", str(d), "--status", "deferred")
    assert code == 0 and len(table.splitlines()) == len(deferred) + 1
    compact_state(d)
    again = [json.loads(x) for x in cli("joblog", str(d), "--jsonl")[1].splitlines()]
    for a, b in zip(rows, again, strict=True):  # compaction keeps what the joblog shows,
        if a["status"] != "committed":  # but the times of dispatches that did not commit
            a = {**a, "started": None, "seconds": None, "rank": None}
        assert a == b


def test_the_joblog_names_the_host_of_the_rank_that_ran_each_item_across_runs_and_compact(
    tmp_path: Path,
) -> None:
    """Issue 46: the joblog had a rank but no host (workers never said where they run). Each
    worker's first READY names its host; the master journals it once per rank per run; the
    joblog shows the host of the rank of each item's newest dispatch, in that run (a rank may
    run on another node in the next run), and compaction keeps it for committed items."""
    from durable_dispatch.core.events import check_event
    from durable_dispatch.mpi import run_master
    from durable_dispatch.storage.journal import read_journal
    from durable_dispatch.testing import LocalWorkers

    d = tmp_path / "state"
    first = {1: "node-a", 2: "node-b"}
    items = [WorkItem(f"w{i:02d}", i) for i in range(12)]
    r = run_master(items[:6], d, comm=LocalWorkers(abs, 2, hosts=first), linger=0)
    assert r.finished
    run_master(items, d, comm=LocalWorkers(abs, 2, hosts={1: "node-c", 2: "node-d"}), linger=0)
    hosts = [rec.payload for rec in read_journal(d / "events.jsonl")]
    hosts = [p for p in hosts if p["event"] == "host"]
    for p in hosts:
        check_event(p)  # (schema-checked: S11)
    assert [(p["rank"], p["host"]) for p in hosts] == [
        (1, "node-a"),
        (2, "node-b"),
        (1, "node-c"),
        (2, "node-d"),
    ]  # once per rank per run
    rows = [json.loads(x) for x in cli("joblog", str(d), "--jsonl")[1].splitlines()]
    assert len(rows) == 12 and all(x["status"] == "committed" for x in rows)
    by_run = {"w00": first, "w11": {1: "node-c", 2: "node-d"}}
    for row in rows:
        if row["work_id"] in by_run:
            assert row["host"] == by_run[row["work_id"]][row["rank"]], row
        assert row["host"] in ("node-a", "node-b", "node-c", "node-d")
    runs = {x["work_id"]: x["host"] for x in rows}
    assert {runs[f"w{i:02d}"] for i in range(6)} <= {"node-a", "node-b"}
    assert {runs[f"w{i:02d}"] for i in range(6, 12)} <= {"node-c", "node-d"}
    code, table, _ = cli("joblog", str(d))
    assert code == 0 and "host" in table.splitlines()[0]
    assert all(f" {runs[line.split()[0]]} " in line for line in table.splitlines()[1:])
    assert json.loads(cli("joblog", str(d), "--json")[1]) == rows
    compact_state(d)  # the host moves with each result
    assert [json.loads(x) for x in cli("joblog", str(d), "--jsonl")[1].splitlines()] == rows


@pytest.mark.mpi
def test_under_mpiexec_each_worker_names_its_host_in_the_joblog(tmp_path: Path) -> None:
    """The real worker loop (run_worker) sends its host name in its first READY."""
    import socket

    from .helpers import run_demo

    d = tmp_path / "state"
    res, summary = run_demo(d, "--items", "12", "--ms", "5", "--faults", "none", n=3)
    assert not res.timed_out and summary is not None, res.stderr[-3000:]
    rows = [json.loads(x) for x in cli("joblog", str(d), "--jsonl")[1].splitlines()]
    assert len(rows) == 12 and {x["rank"] for x in rows} <= {1, 2}
    assert all(x["status"] == "committed" for x in rows)
    assert {x["host"] for x in rows} == {socket.gethostname()}


def test_a_futures_call_shows_its_function_and_arguments_never_unpickled(
    tmp_path: Path,
) -> None:
    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    code = (
        "from durable_dispatch.futures import MPIPoolExecutor\n"
        "with MPIPoolExecutor() as ex:\n"
        "    print(sum(ex.map(abs, range(-4, 0))))\n"
    )
    cmd = [sys.executable, "-m", "durable_dispatch.futures", "--state-dir", str(tmp_path)]
    res = run_mpiexec(mpiexec_command(2, [*cmd, "-c", code]), timeout=120)
    assert res.returncode == 0 and "10" in res.stdout, res.stderr[-2000:]
    assert "executor-1" in run("stats", str(tmp_path)).stderr
    rows = [
        json.loads(x)
        for x in run("joblog", str(tmp_path / "executor-1"), "--jsonl").stdout.splitlines()
    ]
    assert sorted(r["call"] for r in rows) == [f"builtins:abs({i})" for i in (-1, -2, -3, -4)]
    assert all(r["status"] == "committed" for r in rows)


def test_the_joblog_table_shortens_long_work_ids_and_json_keeps_them_whole(
    tmp_path: Path,
) -> None:
    """Work IDs of 80+ characters (futures digests) broke the table's columns: the table shows
    each shortened to its column (start and end kept, so they stay distinct), ``--json`` and
    ``--jsonl`` whole."""
    d = tmp_path / "state"
    ids = [f"call-{'f' * 60}-{i:02d}-{'0123456789abcdef' * 2}{i}" for i in range(3)]
    with CampaignState.open(d, ranks=(1,)) as s:
        s.submit([WorkItem(w, {"x": i}) for i, w in enumerate(ids)])
    code, table, _ = cli("joblog", str(d))
    assert code == 0, table
    lines = table.splitlines()
    status_at = {line.index(" pending ") for line in lines[1:]}
    assert len(status_at) == 1 and status_at.pop() <= 26, table  # one column, as wide as before
    shown = [line.split()[0] for line in lines[1:]]
    assert len(set(shown)) == 3 and all(len(w) <= 24 for w in shown), shown
    assert all(w[:8] == i[:8] and w[-4:] == i[-4:] for w, i in zip(shown, ids, strict=True))
    rows = [json.loads(x) for x in cli("joblog", str(d), "--jsonl")[1].splitlines()]
    assert [r["work_id"] for r in rows] == ids
    assert [r["work_id"] for r in json.loads(cli("joblog", str(d), "--json")[1])] == ids


def test_stats_on_a_futures_state_directory_says_the_total_is_so_far_and_gives_no_eta(
    tmp_path: Path,
) -> None:
    """``stats`` on a futures executor's directory said "94 of 103 committed, ETA 1s" for a
    300-call script: the items are what the script submitted so far, and while it runs it may
    submit more, so there is no ETA. A plain campaign keeps its total and its ETA."""
    from durable_dispatch.futures._seal import load_or_create_key

    texts = {}
    for kind in ("futures", "plain"):
        d = tmp_path / kind
        s = CampaignState.open(d, ranks=(1,))
        try:
            if kind == "futures":
                load_or_create_key(str(d))
            s.submit([WorkItem(f"w{i}", {"x": i}) for i in range(10)])
            for _ in range(3):
                x = s.next_send(time.time())
                assert x is not None
                s.sent(x.token, time.time())
                s.on_results(1, str(x.token), [x.items[0].payload], time.time())
                s.deliver(wait=True)
                s.on_ready(1, str(x.token), time.time())
                s.tick(time.time())
            time.sleep(0.01)  # (a rate needs the statistics to be younger than the start)
            assert s.publish_statistics(force=True)
            texts[kind] = cli("stats", str(d))[1]
            view = json.loads(cli("stats", str(d), "--json")[1])
            from durable_dispatch.views.report import render_report, report_series

            page = render_report(report_series(d), "t")
            assert ("submitted so far" in page) is (kind == "futures"), page[:2000]
            assert ("no ETA" in page) is (kind == "futures"), page[:2000]
        finally:
            s.close()
        assert view["open_ended"] is (kind == "futures"), view
        assert (view["eta_seconds"] is None) is (kind == "futures"), view
    assert "3 of 10 submitted so far committed" in texts["futures"], texts["futures"]
    assert "no ETA (the script may submit more)" in texts["futures"], texts["futures"]
    assert "ETA -" not in texts["futures"] and "ETA 0" not in texts["futures"]
    assert "3 of 10 committed" in texts["plain"] and "ETA" in texts["plain"], texts["plain"]


def test_the_joblog_names_a_crashs_signal_in_a_column_of_its_own(tmp_path: Path) -> None:
    """A crash's signal (SIGSEGV, SIGKILL ...) was only inside the failure's text: the joblog
    has it in a column of its own, in the table and in ``--json``; other failures have none."""
    from durable_dispatch.core.decisions import ItemFailure

    d = tmp_path / "state"
    fails = {
        "seg": ItemFailure("crash", "the work function's process killed by SIGSEGV"),
        "oom": ItemFailure("crash", "the work function's process killed by SIGKILL"),
        "err": ItemFailure("error", "ValueError: SIGSEGV is only a word here"),
    }
    with CampaignState.open(d, ranks=(1,), retry=RetryPolicy(0)) as s:
        s.submit([WorkItem(w, {}) for w in fails])
        while (x := s.next_send(0.0)) is not None:
            s.sent(x.token, 0.0)
            s.on_results(1, str(x.token), None, 0.0, failure=fails[x.items[0].work_id])
            s.on_ready(1, str(x.token), 0.0)
            s.tick(0.0)
    rows = {r["work_id"]: r for r in json.loads(cli("joblog", str(d), "--json")[1])}
    assert {w: r["signal"] for w, r in rows.items()} == {
        "seg": "SIGSEGV",
        "oom": "SIGKILL",
        "err": None,
    }
    code, table, _ = cli("joblog", str(d))
    head, *lines = table.splitlines()
    at = head.index("signal")
    assert {x.split()[0]: x[at:].split()[0] for x in lines} == {
        "seg": "SIGSEGV",
        "oom": "SIGKILL",
        "err": "-",
    }
