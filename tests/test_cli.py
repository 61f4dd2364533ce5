"""Tests of the durable-dispatch command, through a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_dispatch", *args], capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "name,code,problem",
    [
        ("valid.jsonl", 0, None),
        ("torn_tail.jsonl", 1, "torn record (no newline)"),
        ("corrupt_middle.jsonl", 1, "checksum mismatch"),
        ("wrong_version.jsonl", 1, "unsupported format version 2"),
        ("campaign.000000000001.snap", 0, None),
    ],
)
def test_verify_fixtures(name: str, code: int, problem: str | None) -> None:
    before = (FIXTURES / name).read_bytes()
    out = run("verify", str(FIXTURES / name), "--json")
    assert out.returncode == code, out.stderr
    res = json.loads(out.stdout)
    assert res["problem"] == problem
    assert (FIXTURES / name).read_bytes() == before  # verify never modifies


def test_verify_empty_missing_and_unreadable(tmp_path: Path) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    assert run("verify", str(empty)).returncode == 1
    out = run("verify", str(tmp_path / "missing.jsonl"))
    assert out.returncode == 2 and out.stderr.startswith("Error:")
    noperm = tmp_path / "n.jsonl"
    noperm.write_bytes((FIXTURES / "valid.jsonl").read_bytes())
    noperm.chmod(0)
    for cmd in ("verify", "inspect"):
        if os.geteuid() != 0:
            out = run(cmd, str(noperm))
            assert out.returncode == 2 and "Permission denied" in out.stderr
        else:  # root reads anything: make the read fail with EACCES through the fs seam
            import contextlib
            import errno
            import io

            from durable_dispatch.cli import main
            from durable_dispatch.testing import inject_faults

            err = io.StringIO()
            with inject_faults() as f, contextlib.redirect_stderr(err):
                f.fail("read", errno.EACCES, path=str(noperm))
                assert main([cmd, str(noperm)]) == 2
            assert err.getvalue().startswith("Error:") and "Permission denied" in err.getvalue()


def test_verify_a_state_directory_with_a_journal_whose_creation_stopped(tmp_path: Path) -> None:
    """The torture harness's finding (seed 1582496828: a full disk, the master killed, then
    compaction): results.jsonl existed with 0 bytes, since a journal's file exists from the
    moment its writer locks it, before its header. Journal.open takes such a file as new;
    verify called the directory damaged (exit 1). A single empty file given to verify is
    still not intact (test_verify_empty_missing_and_unreadable)."""
    from durable_dispatch import CampaignState, WorkItem

    state = tmp_path / "s"
    with CampaignState.open(state) as st:
        st.submit([WorkItem("a")])
    (state / "results.jsonl").write_bytes(b"")
    out = run("verify", str(state), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["intact"], out.stdout
    files = json.loads(run("inspect", str(state), "--json").stdout)["files"]
    (row,) = [f for f in files if f["path"].endswith("results.jsonl")]
    assert row["intact"] and "no header yet" in row["note"]
    with CampaignState.open(state):  # and the next open takes it as it is
        pass
    assert run("verify", str(state)).returncode == 0


def test_inspect_counts_kinds() -> None:
    out = run("inspect", str(FIXTURES / "valid.jsonl"), "--json")
    assert out.returncode == 0
    res = json.loads(out.stdout)
    assert res["records"] == 5 and res["kinds"] == {
        "dispatched": 2,
        "committed": 2,
        "rolled_back": 1,
    }
    torn = json.loads(run("inspect", str(FIXTURES / "torn_tail.jsonl"), "--json").stdout)
    assert torn["torn_tail"] and torn["torn_tail_bytes"] > 0


def test_usage_error_exit_code_and_help_examples() -> None:
    assert run("nonsense").returncode == 2
    for cmd in ("verify", "inspect"):
        out = run(cmd, "--help")
        assert out.returncode == 0 and "Example:" in out.stdout


# ------------------------------------------------------------------------ state directories
def _state_dir(tmp_path: Path, n: int = 12, defer: tuple[str, ...] = ("w3",)) -> Path:
    from durable_dispatch import CampaignState
    from durable_dispatch.core import RetryPolicy, WatchdogConfig, WorkItem

    from .helpers import fake_campaign

    d = tmp_path / "state"
    with CampaignState.open(d, ranks=(1, 2), watchdog=WatchdogConfig(5), retry=RetryPolicy(0)) as s:
        s.submit(WorkItem(f"w{i}", {"i": i}) for i in range(n))
        fake_campaign(s, behave=lambda send: "malformed" if send.work.work_id in defer else "ok")
    return d


def test_commands_on_a_state_directory(tmp_path: Path) -> None:
    d = _state_dir(tmp_path)
    out = run("verify", str(d), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["intact"]
    ins = json.loads(run("inspect", str(d), "--json").stdout)
    assert ins["kind"] == "state-directory" and ins["state"]["committed"] == 11
    j = json.loads(run("inspect", str(d / "events.jsonl"), "--json").stdout)
    assert j["first_ts"] is not None and j["kinds"]["epoch"] == 1 and j["kinds"]["committed"] == 11
    st = json.loads(run("stats", str(d), "--json").stdout)
    assert st["deferred"] == 1 and st["master_statistics"]["core"]["commits"] == 11
    lst = json.loads(run("deferred", "list", str(d), "--json").stdout)
    assert [r["work_id"] for r in lst] == ["w3"] and lst[0]["kinds"] == ["malformed-result"]
    show = json.loads(run("deferred", "show", str(d), "w3", "--json").stdout)
    assert show["item"]["payload"] == {"i": 3}
    assert run("deferred", "show", str(d), "nope").returncode == 1
    no_id = run("deferred", "show", str(d))  # a usage error: exit 2, as docs/cli.md says
    assert no_id.returncode == 2 and no_id.stderr.startswith("Error:"), no_id
    assert run("deferred", "requeue", str(d)).returncode == 2
    req = run("deferred", "requeue", str(d), "w3", "--json")
    assert req.returncode == 0, req.stderr
    assert json.loads(run("deferred", "list", str(d), "--json").stdout) == []
    st = json.loads(run("stats", str(d), "--json").stdout)
    assert st["pending"] == 1 and st["deferred"] == 0


def test_drop_deferred(tmp_path: Path) -> None:
    d = _state_dir(tmp_path)
    assert run("deferred", "drop", str(d), "w3").returncode == 0
    assert json.loads(run("deferred", "list", str(d), "--json").stdout) == []


def test_compact_state_directory_and_dry_run(tmp_path: Path) -> None:
    d = _state_dir(tmp_path)
    before = json.loads(run("stats", str(d), "--json").stdout)
    dry = json.loads(run("compact", str(d), "--dry-run", "--json").stdout)
    assert dry["dry_run"] and dry["records_before"] > 0
    size = (d / "events.jsonl").stat().st_size
    assert size == dry["bytes_before"]  # a dry run changes nothing
    rep = json.loads(run("compact", str(d), "--json").stdout)
    assert rep["records_after"] == 0 and rep["bytes_after"] < rep["bytes_before"]
    after = json.loads(run("stats", str(d), "--json").stdout)
    for k in ("committed", "deferred", "pending", "epoch"):
        assert after[k] == before[k], k
    assert run("verify", str(d)).returncode == 0
    # The journal's numbering continues after the compaction.
    from durable_dispatch import CampaignState

    with CampaignState.open(d, ranks=(1,)) as s:
        assert s.core.committed() == frozenset(f"w{i}" for i in range(12) if i != 3)


def test_compact_defer_journal(tmp_path: Path) -> None:
    d = _state_dir(tmp_path, defer=("w1", "w2", "w3"))
    assert run("deferred", "requeue", str(d), "w1").returncode == 0
    rep = json.loads(run("compact", str(d / ".dispatch_protocol_deferred.jsonl"), "--json").stdout)
    assert (rep["records_before"], rep["records_after"]) == (4, 2)
    lst = json.loads(run("deferred", "list", str(d), "--json").stdout)
    assert sorted(r["work_id"] for r in lst) == ["w2", "w3"]


def test_commands_refuse_while_a_master_runs(tmp_path: Path) -> None:
    from durable_dispatch import CampaignState

    d = _state_dir(tmp_path)
    with CampaignState.open(d, ranks=(1,)):
        out = run("compact", str(d))
        assert out.returncode == 1 and out.stderr.startswith("Error:") and "master" in out.stderr
        queued = run("deferred", "requeue", str(d), "w3", "--no-wait")  # (issue 52: retry)
        assert queued.returncode == 0 and "queued" in queued.stdout, queued
        st = json.loads(run("stats", str(d), "--json").stdout)  # reading is fine
        assert st["master_running"] is True


def test_not_a_state_directory(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    for args in (
        ["stats", str(tmp_path / "x")],
        ["deferred", "list", str(tmp_path / "x")],
        ["verify", str(tmp_path / "x")],
        ["compact", str(tmp_path / "x")],
        ["inspect", str(tmp_path / "missing")],
    ):
        out = run(*args)
        assert out.returncode == 2 and out.stderr.startswith("Error:"), args


def test_every_command_has_help_and_docs() -> None:
    from durable_dispatch.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    names = sorted(sub.choices)  # type: ignore[union-attr]
    assert names == [
        "cancel",
        "compact",
        "deferred",
        "demo",
        "drain",
        "inspect",
        "joblog",
        "launch",
        "output",
        "report",
        "results",
        "retry",
        "run",
        "stats",
        "submit",
        "verify",
        "watch",
    ]
    docs = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    for name in names:
        out = run(name, "--help")
        assert out.returncode == 0 and "Example:" in out.stdout, name
        assert f"## `{name}" in docs, name
    assert run("--help").returncode == 0


_COMPACT_CHILD = r"""
import sys
from durable_dispatch.campaign.admin import compact_state
compact_state(sys.argv[1])
"""


def test_compaction_killed_at_random_points_loses_nothing(tmp_path: Path) -> None:
    """SIGKILL `compact` at random moments (15 times): open and verify after each. (Every crash
    point of a compaction, one by one, is test_crash_consistency's; this one kills the real
    command, its process and its threads, where they happen to be.)"""
    import random
    import signal
    import time

    from durable_dispatch import CampaignState
    from durable_dispatch.campaign.admin import view_state
    from durable_dispatch.storage import Journal

    d = tmp_path / "state"
    with CampaignState.open(d, ranks=(1,)):
        pass
    expected: set[str] = set()

    def grow(n: int) -> None:  # committed work IDs, most records obsolete after compaction
        epoch = view_state(d).projection.epoch  # each open (compaction's too) starts an epoch
        with Journal.open(d / "events.jsonl", sync="batch") as j:
            for _ in range(n):
                w = f"w{len(expected)}"
                t = f"e{epoch}-{len(expected) + 1}"  # a real journal dispatches, then commits
                j.append({"event": "submitted", "items": [{"work_id": w}]})
                j.append({"event": "dispatched", "work_id": w, "token": t, "rank": 1})
                j.append({"event": "committed", "work_id": w, "token": t, "result": 1})
                expected.add(w)

    grow(25_000)
    rnd = random.Random(99)
    kills = finished = 0
    while kills < 15:
        p = subprocess.Popen([sys.executable, "-c", _COMPACT_CHILD, str(d)])
        time.sleep(rnd.uniform(0.05, 0.75))
        p.send_signal(signal.SIGKILL)
        p.wait()
        kills += p.returncode == -signal.SIGKILL
        v = view_state(d)
        assert v.projection.committed == expected, "a compaction crash lost or invented work"
        assert v.projection.duplicate_commits == 0
        if p.returncode == 0:  # finished before the kill: give the next one work again
            finished += 1
            grow(10_000)
        if kills % 5 == 0:
            with CampaignState.open(d, ranks=(1,)) as s:  # the next open handles the crash
                assert s.core.committed() == expected
    assert subprocess.run([sys.executable, "-c", _COMPACT_CHILD, str(d)]).returncode == 0
    assert view_state(d).projection.committed == expected
    assert run("verify", str(d)).returncode == 0
    print(f"compaction: {kills} SIGKILLs, {finished} runs finished first, {len(expected)} IDs kept")


def _stderr_on_a_terminal(*args: str) -> str:
    """Run the command with standard error on a pseudo-terminal; returns what it wrote there."""
    from .helpers import on_a_terminal

    rc, shown, _ = on_a_terminal([sys.executable, "-m", "durable_dispatch", *args])
    assert rc == 0
    return shown


def test_compact_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    from durable_dispatch import Journal

    path = tmp_path / ".dispatch_protocol_deferred.jsonl"
    with Journal.open(path, sync="never") as j:  # about 10 MB: over the 8 MB threshold
        for i in range(50_000):
            j.append({"event": "deferred", "work_id": f"w{i}", "item": {"pad": "x" * 120}})
            if i % 2:
                j.append({"event": "resolved", "work_id": f"w{i}", "how": "dropped"})
        j.sync_now()
    assert path.stat().st_size > 8 << 20
    shown = _stderr_on_a_terminal("compact", str(path), "--dry-run")
    assert "compacting:" in shown and "%" in shown
    plain = run("compact", str(path))
    assert plain.returncode == 0 and "compacting" not in plain.stderr
    assert (
        json.loads(run("compact", str(path), "--dry-run", "--json").stdout)["records_after"]
        == 25_000
    )


def test_reading_commands_create_nothing(tmp_path: Path) -> None:
    """Issue 13, example 8: inspect, stats and verify created master.lock (0666 under umask 0)."""
    from durable_dispatch import CampaignState

    d = _state_dir(tmp_path)
    (d / "master.lock").unlink()
    before = sorted(p.name for p in d.iterdir())
    for cmd in ("inspect", "stats", "verify"):
        out = run(cmd, str(d), "--json")
        assert out.returncode == 0, (cmd, out.stderr)
        assert sorted(p.name for p in d.iterdir()) == before, cmd
    with CampaignState.open(d, ranks=(1,)):  # a running master is still seen
        assert json.loads(run("stats", str(d), "--json").stdout)["master_running"]
    assert not json.loads(run("stats", str(d), "--json").stdout)["master_running"]


# ------------------------------------------------------------- conventions (issue 18)
def _error_of(out: subprocess.CompletedProcess[str]) -> dict[str, object]:
    body = json.loads(out.stdout)
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "exit_code"}
    assert body["error"]["exit_code"] == out.returncode
    return body["error"]


def test_every_subcommands_error_paths_exit_right_and_speak_json(tmp_path: Path) -> None:
    """Usage errors exit 2, findings 1; with --json every error is one JSON object on stdout
    of one shape, and nothing else is printed there."""
    state = tmp_path / "state"
    from durable_dispatch import CampaignState, WorkItem

    with CampaignState.open(state, ranks=[1]) as s:
        s.submit([WorkItem("w1")])
    code = tmp_path / "code.py"
    code.write_text("print('hello')\n")
    cases = [
        (["stats", "/nonexistent"], 2, "no such directory"),
        (["stats", str(code)], 2, "not a directory"),
        (["results", "/nonexistent"], 2, "no such directory"),
        (["verify", str(code)], 2, "not a journal"),
        (["inspect", str(code)], 2, "not a journal"),
        (["verify", "/nonexistent"], 2, "no such file"),
        (["compact", "/nonexistent"], 2, "no such file"),
        (["deferred", "show", str(state)], 2, "exactly one work ID"),
        (["deferred", "requeue", str(state)], 2, "at least one work ID"),
        (["deferred", "drop", str(state)], 2, "at least one work ID"),
        (["deferred", "show", str(state), "w-none"], 1, "is not deferred"),
        (["deferred", "requeue", str(state), "w-none"], 2, "is not deferred"),
        (["deferred", "list", str(tmp_path)], 2, "not a durable-dispatch state directory"),
    ]
    for argv, rc, words in cases:
        out = run(*argv, "--json")
        assert out.returncode == rc, (argv, out.stdout, out.stderr)
        err = _error_of(out)
        assert words in str(err["message"]), (argv, err)
        text = run(*argv)
        assert text.returncode == rc and text.stdout == "" and words in text.stderr, argv


def test_text_output_has_no_python_reprs_and_help_shows_defaults(tmp_path: Path) -> None:
    from durable_dispatch import CampaignState, RetryPolicy, WorkItem

    state = tmp_path / "state"
    with CampaignState.open(state, ranks=[1], retry=RetryPolicy(0)) as s:
        s.submit([WorkItem("w1")])
        x = s.next_send(0.0)
        assert x is not None
        s.sent(x.token, 0.0)
        s.on_results(1, str(x.token), None, 0.0, failure="garbled")
        s.on_ready(1, str(x.token), 0.0)
        s.tick(0.0)
    listed = run("deferred", "list", str(state))
    assert listed.returncode == 0 and "w1" in listed.stdout
    for bad in ("None", "['", "{'", "True", "False"):
        assert bad not in listed.stdout, listed.stdout
    verified = run("verify", str(state))
    assert verified.returncode == 0 and "None" not in verified.stdout, verified.stdout
    assert json.loads(run("verify", str(state), "--json").stdout)["records"] > 0
    for cmd in ("verify", "inspect", "compact", "results", "stats", "deferred", "demo"):
        shown = run(cmd, "--help").stdout
        assert "Example:" in shown, cmd
        # an option with a value shows its default; a flag says in words what it changes
        assert ("(default:" in shown) == (cmd in ("deferred", "demo")), cmd
        assert "(default: False)" not in shown and "(default: True)" not in shown, cmd


# ------------------------------------------------------------------ watch (issue 18)
LIVE_CAMPAIGN = """
import sys, time
from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers

def work(p):
    time.sleep(0.05)
    if p == 3:
        raise ValueError("three")
    return p

items = [WorkItem(f"w{i}", i) for i in range(int(sys.argv[2]))]
open(sys.argv[1] + ".started", "w").close()
r = run_master(items, sys.argv[1], comm=LocalWorkers(work, 2), linger=0)
print("REPORT", r.finished, flush=True)
"""


def _live_campaign(tmp_path: Path, n: int) -> tuple[subprocess.Popen[str], Path]:
    import time

    script = tmp_path / "live.py"
    script.write_text(LIVE_CAMPAIGN)
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(state), str(n)], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait for the first published statistics
        if list(state.glob("master-stats.*.snap")) if state.exists() else []:
            break
        time.sleep(0.05)
    return proc, state


def test_stats_and_watch_beside_a_running_master_say_how_old_their_figures_are(
    tmp_path: Path,
) -> None:
    """Issue 18: 'stats' beside a running master showed 'committed: 10' next to
    'master_stats.core.commits: 0' without saying how old either was. The master now publishes
    its statistics every 2 s; 'stats' and 'watch --once --json' show them with their age and
    agree with each other."""
    proc, state = _live_campaign(tmp_path, 200)
    try:
        stats = json.loads(run("stats", str(state), "--json").stdout)
        frame = json.loads(run("watch", str(state), "--once", "--json").stdout)
        assert stats["master_running"] is True and frame["master_running"] is True
        assert 0 <= stats["heartbeat_age_seconds"] < 10 and frame["heartbeat_age_seconds"] < 10
        assert frame["committed"] >= stats["committed"]  # read after it
        assert frame["pending"] + frame["in_flight"] + frame["committed"] + frame["deferred"] == (
            200
        )
        assert frame["state"] == "running" and not frame["finished"]
        assert frame["deadline_seconds"] > 0  # the deadline an item gets now (issue 19)
    finally:
        out, _ = proc.communicate(timeout=120)
    assert "REPORT True" in out
    done = json.loads(run("watch", str(state), "--once", "--json").stdout)
    assert done["finished"] and done["committed"] + done["deferred"] == 200
    assert done["failures_by_kind"] == {"error": 2}  # w3 raised on each of its 2 tries (1 retry)
    assert json.loads(run("stats", str(state), "--json").stdout)["master_running"] is False


def test_watch_draws_in_a_terminal_until_the_campaign_ends(tmp_path: Path) -> None:
    """The live view on a pseudo-terminal: frames redrawn from the top of the screen while the
    master runs; it exits by itself (0) when the campaign ends, its last frame FINISHED."""
    from .helpers import on_a_terminal

    proc, state = _live_campaign(tmp_path, 60)
    try:
        watch = [sys.executable, "-m", "durable_dispatch", "watch", str(state), "--interval", "0.2"]
        rc, text, _ = on_a_terminal(watch, stdout_too=True, timeout=60)
        assert rc == 0
    finally:
        proc.communicate(timeout=120)
    assert text.count("\x1b[H\x1b[J") >= 2, text[-500:]  # redrawn in place
    last = text[text.rindex("\x1b[H\x1b[J") :]
    assert "FINISHED" in last and "committed" in last, last


def test_an_error_message_holds_no_control_character(tmp_path: Path) -> None:
    """A control character in a message (a NUL from the MPI library's version string, an
    escape in a path) made ``grep`` call the job's log a binary file: errors print printable
    text only."""
    res = run("stats", str(tmp_path / "no\x01such\x1b[2Jdir"))
    assert res.returncode == 2 and "Error:" in res.stderr, res.stderr
    assert all(c.isprintable() or c == "\n" for c in res.stderr), repr(res.stderr)
