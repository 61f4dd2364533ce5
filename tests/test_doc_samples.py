"""Every sample output in the docs is what the command prints: a test produces it for real and
compares it with the page.

A block of README.md or docs/**/*.md that shows output (a fenced ``text``, ``json`` or
unlabelled block, or a ``console`` block with a line that is not a ``$ `` command) is marked on
the line before it, in the comment that may also carry the launch tags of ``test_docs.py``:

- ``<!-- sample: NAME -->``: the output of a command, produced and compared by the test that
  :data:`SAMPLES` names (its source names the sample, ``"NAME"``);
- ``<!-- not output: REASON -->``: not a command's output (a file format, a formula, a figure
  measured on one run), with the reason.

A test reads the sample from the page at test time (:func:`sample`, :func:`session`) and
compares it with :func:`assert_same`: the two texts are equal once :func:`normalise` replaced,
in both, only what differs from run to run (durations, clock times, rates, PIDs, host names,
directories), each kind by one narrow pattern of :data:`VARIES`; a line ``...`` in a sample
stands for one or more lines left out. Anything else that differs, a word, a count, a column,
fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import WatchdogConfig, WorkItem
from durable_dispatch.core import RetryPolicy
from durable_dispatch.errors import UsageError
from durable_dispatch.testing import LocalWorkers

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts),
]

#: sample name -> the test that produces and compares it ("file.py::function")
SAMPLES = {
    "cli-error-json": "test_doc_samples.py::test_the_error_object_sample",
    "cli-output": (
        "test_mpi_attempts.py::"
        "test_an_isolated_items_output_is_kept_bounded_and_printed_by_the_output_command"
    ),
    "stats-running": "test_doc_samples.py::test_the_stats_samples_of_a_running_campaign",
    "stats-allocation": "test_doc_samples.py::test_the_stats_samples_of_a_running_campaign",
    "watch-json": "test_doc_samples.py::test_the_stats_samples_of_a_running_campaign",
    "joblog": "test_doc_samples.py::test_the_stats_samples_of_a_running_campaign",
    "stats-killed": "test_doc_samples.py::test_the_stats_sample_of_a_killed_master",
    "steer-cancel": "test_doc_samples.py::test_the_steering_samples",
    "steer-cancel-committed": "test_doc_samples.py::test_the_steering_samples",
    "steer-retry": "test_doc_samples.py::test_the_steering_samples",
    "steer-drain": "test_doc_samples.py::test_the_steering_samples",
    "steer-submit": "test_doc_samples.py::test_the_steering_samples",
    "laptop-print": "test_doc_samples.py::test_the_run_print_sample",
    "errors-tree": "test_doc_samples.py::test_the_error_hierarchy_sample",
    "tutorial-encode-error": "test_doc_samples.py::test_the_tutorials_refused_values_samples",
    "tutorial-malformed-result": "test_doc_samples.py::test_the_tutorials_refused_values_samples",
    "priorities": "test_doc_samples.py::test_the_how_to_script_samples",
    "pipeline": "test_doc_samples.py::test_the_how_to_script_samples",
    "pandas": "test_doc_samples.py::test_the_how_to_script_samples",
    "futures-reduce": (
        "test_docs.py::test_the_futures_reduce_example_waits_and_fails_with_its_cause"
    ),
    "tutorial-before": "test_docs.py::test_the_first_tutorial_runs_as_written",
    "tutorial-campaign": "test_docs.py::test_the_first_tutorial_runs_as_written",
    "tutorial-rerun": "test_docs.py::test_the_first_tutorial_runs_as_written",
    "tutorial-ctrl-c": "test_docs.py::test_the_first_tutorial_runs_as_written",
    "tutorial-watch": "test_docs.py::test_the_first_tutorial_runs_as_written",
    "tutorial-results": "test_docs.py::test_the_first_tutorial_runs_as_written",
    "tutorial-csv": "test_docs.py::test_the_first_tutorial_runs_as_written",
    "tutorial-faulty": "test_docs.py::test_the_first_tutorial_runs_as_written",
    "tutorial-deferred": "test_docs.py::test_the_first_tutorial_runs_as_written",
    "futures-before": "test_docs.py::test_the_futures_tutorial_resolves_from_the_record",
    "futures-first-run": "test_docs.py::test_the_futures_tutorial_resolves_from_the_record",
    "futures-second-run": "test_docs.py::test_the_futures_tutorial_resolves_from_the_record",
    "futures-watch": "test_docs.py::test_the_futures_tutorial_resolves_from_the_record",
}

# ---------------------------------------------------------------- reading samples from the pages
#: a fenced block, with the comment on the line before it (if any)
FENCED = re.compile(r"(?:^<!--([^\n]*)-->\n)?^```([^\n]*)\n(.*?)^```$", re.M | re.S)
#: the blocks that show output (a console block only when a line of it is not a command)
OUTPUT_LANGUAGES = ("text", "json", "", "console")


def tags_of(comment: str | None) -> dict[str, str]:
    """``key: value; key; ...`` of the comment before a block (``test_docs.launch_lines`` reads
    the same comments for its ``cwd``, ``mpi`` and ``root`` tags)."""
    out = {}
    for part in (comment or "").split(";"):
        key, _, value = part.strip().partition(":")
        if key:
            out[key.strip()] = value.strip()
    return out


def output_blocks(page: Path) -> Iterator[tuple[int, dict[str, str], str, str]]:
    """``(line, tags, language, text)`` of every block of ``page`` that shows output."""
    text = page.read_text()
    for m in FENCED.finditer(text):
        lang, body = m.group(2).strip(), m.group(3)
        if lang not in OUTPUT_LANGUAGES:
            continue
        if lang == "console" and all(x.startswith("$ ") for x in body.splitlines()):
            continue  # commands only
        yield text.count("\n", 0, m.start(2)) + 1, tags_of(m.group(1)), lang, body


def sample(page: str, name: str) -> str:
    """The text of the block ``page`` marks ``<!-- sample: NAME -->``."""
    found = [b for _, tags, _, b in output_blocks(ROOT / page) if tags.get("sample") == name]
    assert len(found) == 1, f"{page} marks {len(found)} blocks as sample {name}"
    return found[0]


def session(page: str, name: str) -> list[tuple[str, str]]:
    """``(command, output)`` of each ``$ `` line of the console sample ``name`` of ``page``."""
    out: list[tuple[str, str]] = []
    for line in sample(page, name).splitlines(keepends=True):
        if line.startswith("$ "):
            out.append((line[2:].rstrip("\n"), ""))
        else:
            assert out, f"{page}: sample {name} shows output before any command"
            out[-1] = (out[-1][0], out[-1][1] + line)
    return out


# ------------------------------------------------------------------ what varies from run to run
#: kind -> (pattern, placeholder); :func:`normalise` replaces only the kinds a test names
VARIES: dict[str, tuple[re.Pattern[str], str]] = {
    # the four forms of durable_dispatch.views.watch.duration: 7s, 1m 49s, 3h 05m, 2d 04h
    "duration": (re.compile(r"\b\d+(?:s|m \d\ds|h \d\dm|d \d\dh)\b"), "<duration>"),
    # joblog's seconds column: an attempt's duration, right-aligned in 8 columns after the time
    # it started
    "joblog seconds": (re.compile(r"(?<=\d\d:\d\d:\d\d) {1,8}\d+\.\d\d(?= )"), " <seconds>"),
    # a wall-clock time of day, as stats (local) and joblog (UTC) print one
    "clock": (re.compile(r"\b\d\d:\d\d:\d\d\b"), "<clock>"),
    # commits per second over a run
    "rate": (re.compile(r"\b\d[\d,]*\.\d(?= items/s\b)"), "<rate>"),
    # how many more allocations an ETA needs: its ETA over the time left, both durations
    "allocations": (re.compile(r"\bneeds about \d+ more allocations?\b"), "needs about <n>"),
    # a dispatch's token (epoch-counter): which dispatch an item got depends on the scheduling
    "token": (re.compile(r"(?<=\btoken=)e\d+-\d+\b"), "<token>"),
    # a process ID after "pid"
    "pid": (re.compile(r"(?<=\bpid )\d+\b"), "<pid>"),
    # the master's host on stats' master line ("master     HOST, pid ...")
    "master host": (re.compile(r"^(master +)[\w.-]+(?=, pid )", re.M), r"\1<host>"),
    # the directories of an absolute path (the file name stays)
    "directories": (re.compile(r"(?<![\w./])/(?:[\w.+-]+/)+(?=[\w.+-])"), "<dir>/"),
    # the interpreter's file name: python, python3 or python3.12, as its environment names it
    "python name": (re.compile(r"(?<=<dir>/)python3?(?:\.\d+)?\b"), "python"),
}


def normalise(text: str, kinds: tuple[str, ...]) -> str:
    """``text`` with each of ``kinds`` (keys of :data:`VARIES`) replaced by its placeholder, in
    the order of :data:`VARIES`."""
    unknown = set(kinds) - set(VARIES)
    assert not unknown, unknown
    for kind, (pattern, placeholder) in VARIES.items():
        if kind in kinds:
            text = pattern.sub(placeholder, text)
    return text


def fits(shown: str, out: str) -> bool:
    """True when ``out`` is ``shown``, where a line ``...`` of ``shown`` stands for one or more
    lines of ``out`` (blanks at the ends of lines aside)."""
    parts = [
        "(?:[^\n]*\n)+" if line == "..." else re.escape(line.rstrip(" ")) + "\n"
        for line in shown.splitlines()
    ]
    # (blanks at the end of a line are not compared: a page does not keep them reliably)
    out = "".join(x.rstrip(" ") + "\n" for x in out.splitlines())
    return re.fullmatch("".join(parts), out) is not None


def fits_any_order(shown: str, out: str) -> bool:
    """True when ``out`` has the lines of ``shown`` in some order (each as often), and no other
    line unless ``shown`` has a line ``...`` (blanks at the ends of lines aside)."""
    from collections import Counter

    want = Counter(x.rstrip(" ") for x in shown.splitlines() if x != "...")
    have = Counter(x.rstrip(" ") for x in out.splitlines())
    extra = have - want
    return not want - have and (not extra or "..." in shown.splitlines())


def assert_same(shown: str, out: str, *varies: str, any_order: bool = False) -> None:
    """Fail unless ``out`` (what the command printed) is the page's sample ``shown`` once both
    are normalised for ``varies``; with ``any_order`` (a page that says the order varies from
    run to run) the lines may come in any order."""
    a, b = normalise(shown, varies), normalise(out, varies)
    ok = fits_any_order(a, b) if any_order else fits(a, b)
    assert ok, f"the page shows:\n{shown}\nthe command printed:\n{out}\n(normalised: {varies})"


def test_the_comparison_fails_on_a_changed_word_and_passes_what_varies() -> None:
    """The normaliser replaces what it names and nothing else: the sample's words, counts and
    columns still count."""
    shown = "master     vm, pid 12822, up 7s, statistics 1s old\nrate       4.9 items/s, ETA 34s\n"
    out = "master     node-3.cluster, pid 4, up 1h 02m, statistics 0s old\n"
    out += "rate       1,204.5 items/s, ETA 2m 05s\n"
    kinds = ("duration", "rate", "pid", "master host")
    assert_same(shown, out, *kinds)
    for changed in (out.replace("up", "ran"), out.replace("ETA", "eta"), out + "x\n"):
        with pytest.raises(AssertionError):
            assert_same(shown, changed, *kinds)
    assert fits("a\n...\nd\n", "a\nb\nc\nd\n") and not fits("a\n...\nd\n", "a\nd\n")
    assert not fits("a\n...\n", "b\nc\n") and fits("a\n...\n", "a\nc\n")
    assert fits_any_order("a\n...\nd\n", "d\nb\na\n") and not fits_any_order("a\nd\n", "d\nb\na\n")
    assert not fits_any_order("a\na\n...\n", "a\nb\n")
    assert normalise("/home/me/.venv/bin/python3 x.py", ("directories", "python name")) == (
        "<dir>/python x.py"
    )


# ------------------------------------------------------------------------------ the registry
def test_every_output_block_of_the_docs_is_a_sample_a_test_compares() -> None:
    """Each block that shows output is marked: a sample, compared by the test :data:`SAMPLES`
    names, or not a command's output, with the reason; and no sample is shown indented (an
    indented block cannot be marked)."""
    seen: dict[str, str] = {}
    for page in PAGES:
        rel = str(page.relative_to(ROOT))
        for line, tags, _, _ in output_blocks(page):
            where = f"{rel}:{line}"
            if "not output" in tags:
                assert len(tags["not output"]) > 10, f"{where}: say why it is not output"
                continue
            name = tags.get("sample")
            assert name, f"{where}: an output block with neither a sample nor a not output mark"
            assert name not in seen, f"{where}: sample {name} is also at {seen[name]}"
            seen[name] = where
        indented = re.findall(
            r"(?:^\n)((?: {4}\$ [^\n]*\n)(?: {4}[^\n]*\n)*)", page.read_text(), re.M
        )
        assert not indented, f"{rel}: an indented console sample (fence and mark it): {indented}"
    assert set(seen) == set(SAMPLES), (set(seen) ^ set(SAMPLES), seen)
    for name, ref in SAMPLES.items():
        path, _, func = ref.partition("::")
        source = (ROOT / "tests" / path).read_text()
        body = source.split(f"def {func}(", 1)
        assert len(body) == 2, f"{ref} does not exist"
        own = body[1].split("\ndef ", 1)[0]
        assert f'"{name}"' in own, f"{ref} does not compare sample {name}"


# ------------------------------------------------------------------- campaigns to run commands on
def cli(*argv: str, capsys: Any) -> tuple[int, str]:
    """Run ``durable-dispatch ARGV`` in this process: its exit code and standard output."""
    from durable_dispatch.cli import main

    capsys.readouterr()
    code = main(list(argv))
    return code, str(capsys.readouterr().out)


def run_session(page: str, name: str, capsys: Any, *varies: str) -> None:
    """Run each ``durable-dispatch`` command of the console sample ``name`` here and compare
    what it prints with what the page shows (a ``cat FILE`` writes the file it shows: the
    command's input)."""
    for command, shown in session(page, name):
        argv = shlex.split(command)
        if argv[0] == "cat":
            Path(argv[1]).write_text(shown)
            continue
        assert argv[0] == "durable-dispatch", command
        code, out = cli(*argv[1:], capsys=capsys)
        assert code == 0, (command, out)
        assert_same(shown, out, *varies)


def _fails_once(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The demo's work, without its faults: seeds 3 and 11 fail their first attempt."""
    if payload["seed"] in (3, 11) and ctx.attempt == 0:
        raise ValueError(f"seed {payload['seed']} diverged")
    return {"seed": payload["seed"], "value": payload["seed"] * 7 % 100}


class HungAfter:
    """LocalWorkers' ``answer``: answers the first ``n`` dispatches, and leaves every later one
    unanswered (a worker that hangs), so the master runs on with those in flight."""

    def __init__(self, n: int) -> None:
        self.n, self.answered, self.hung = n, 0, 0

    def __call__(self, rank: int, token: str, work_ids: list[str]) -> bool:
        if self.answered >= self.n:
            self.hung += 1
            return False
        self.answered += 1
        return True


def settled(state: Path, hung: int = 3) -> bool:
    """True once ``state``'s master has ``hung`` items in flight and has published statistics
    that show the campaign as its ledger is now (every commit counted, every rank busy): with
    every rank hung nothing changes any more, so a command run now shows the final figures."""
    from durable_dispatch.campaign.admin import view_state
    from durable_dispatch.views.view import view_of_state

    try:
        v = view_state(state)
    except UsageError:  # the master has not made it a state directory yet
        return False
    view = view_of_state(v)
    commits = ((v.live.get("stats") or {}).get("core") or {}).get("commits")
    return view.in_flight == hung and view.busy_ranks == hung and commits == view.committed


@contextmanager
def running_master(
    state: Path, items: list[WorkItem], fn: Callable[..., Any], hang_after: int, **kw: Any
) -> Iterator[dict[str, Any]]:
    """A master on ``state`` in a thread of this process (3 LocalWorkers on hosts node017,
    node017 and node018) until the test drains it: it answers ``hang_after`` dispatches, then
    runs on with 3 in flight. Yields once its published statistics show those 3 in flight."""
    from durable_dispatch.campaign.statedir import _master_running
    from durable_dispatch.mpi import run_master

    comm = LocalWorkers(
        fn,
        3,
        context=True,
        answer=HungAfter(hang_after),
        hosts={1: "node017", 2: "node017", 3: "node018"},
    )
    out: dict[str, Any] = {}
    kw = {"watchdog": WatchdogConfig(600), "retry": RetryPolicy(3), "linger": 0, **kw}

    def master() -> None:
        out["report"] = run_master(items, state, comm=comm, drain_seconds=0.2, **kw)

    t = threading.Thread(target=master, daemon=True)
    t.start()
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            hung = comm.answer.hung == 3  # every rank hangs: nothing is dispatched any more
            if hung and _master_running(str(state)) and settled(state):
                break
            assert t.is_alive(), out
            time.sleep(0.02)
        else:
            raise AssertionError("the master did not reach 3 in flight in 60 s")
        yield out
    finally:
        if t.is_alive() and _master_running(str(state)):
            from durable_dispatch.cli import main

            main(["drain", str(state), "--no-wait"])
        t.join(60)
        assert not t.is_alive(), "the master did not end"


@pytest.fixture
def quick(monkeypatch: Any, tmp_path: Path) -> Path:
    """Run from ``tmp_path`` (the pages' commands name ``state/``), with the master publishing
    its statistics and reading its control directory every 20 ms instead of every 2 s and 0.5 s
    (how often, not what: the samples are the same)."""
    from durable_dispatch.campaign import control, publication

    monkeypatch.setattr(publication, "STATS_SECONDS", 0.02)
    monkeypatch.setattr(control, "POLL_SECONDS", 0.02)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------------------- docs/cli.md
def test_the_error_object_sample(capsys: Any) -> None:
    from durable_dispatch.cli import main

    shown = sample("docs/cli.md", "cli-error-json")
    assert main(["stats", "/nonexistent", "--json"]) == 2
    assert_same(shown, capsys.readouterr().out)


def test_the_stats_samples_of_a_running_campaign(quick: Path, capsys: Any) -> None:
    """docs/cli.md: ``stats`` on a running campaign (200 items on 3 workers, two of which fail
    once), the rate line and the ``watch --json`` frame of one that knows its allocation's end,
    and the joblog's table once drained."""
    import json

    page = "docs/cli.md"
    items = [WorkItem(f"demo-{i:04d}", {"seed": i}) for i in range(200)]
    with running_master(quick / "state", items, _fails_once, 34, campaign="demo"):
        code, out = cli("stats", "state/", capsys=capsys)
        assert code == 0
        varies = ("duration", "rate", "pid", "master host")
        assert_same(sample(page, "stats-running"), out, *varies)
        code, out = cli("drain", "state/", capsys=capsys)
        assert code == 0 and out == "the master is draining\n", out
    code, out = cli("joblog", "state/", capsys=capsys)
    assert code == 0
    assert_same(sample(page, "joblog"), out, "clock", "joblog seconds")

    import shutil

    from durable_dispatch.views.view import read_view

    shutil.rmtree(quick / "state")  # a campaign of its own, in state/ as the page shows it
    ends = time.time() + 20  # an allocation of 20 s, and 2,000 items
    items = [WorkItem(f"demo-{i:04d}", {"seed": i}) for i in range(2000)]
    with running_master(quick / "state", items, _fails_once, 34, ends_at=ends):
        end = time.monotonic() + 10  # the rate falls while 3 items hang: the ETA passes the end
        while not read_view(quick / "state").allocations_needed and time.monotonic() < end:
            time.sleep(0.02)
        code, out = cli("stats", "state/", capsys=capsys)
        rate = [x + "\n" for x in out.splitlines() if x.startswith("rate ")]
        varies = ("duration", "rate", "clock", "allocations")
        assert_same(sample(page, "stats-allocation"), "".join(rate), *varies)
        code, out = cli("watch", "state/", "--once", "--json", capsys=capsys)
        frame, shown = json.loads(out), json.loads(sample(page, "watch-json"))
        assert list(frame) == list(shown), (list(frame), list(shown))
        for key in (  # what varies from run to run: times, the host, the PID, the rate
            "allocation_ends_at",
            "allocation_left_seconds",
            "allocations_needed",
            "rate_per_s",
            "eta_seconds",
            "master_host",
            "master_pid",
            "master_started",
            "master_age_seconds",
            "heartbeat_age_seconds",
            "as_of",
        ):
            assert type(frame[key]) is type(shown[key]), (key, frame[key], shown[key])
            frame[key] = shown[key]
        assert frame == shown, (frame, shown)


KILLED = """
import sys, time
from durable_dispatch import WorkItem, WatchdogConfig
from durable_dispatch.core import RetryPolicy
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers
sys.path.insert(0, sys.argv[2])
from test_doc_samples import HungAfter, _fails_once
import durable_dispatch.campaign.publication as publication
publication.STATS_SECONDS = 0.02  # its statistics every 20 ms instead of 2 s (the quick fixture's)

items = [WorkItem(f"demo-{i:04d}", {"seed": i}) for i in range(200)]
comm = LocalWorkers(_fails_once, 3, context=True, answer=HungAfter(39))
run_master(items, sys.argv[1], comm=comm, watchdog=WatchdogConfig(600), retry=RetryPolicy(3),
           campaign="demo")
"""


def test_the_stats_sample_of_a_killed_master(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """docs/cli.md: ``stats`` after the master was SIGKILLed (a real process, killed while 3
    items were in flight)."""
    import signal
    import subprocess
    import sys

    from durable_dispatch.views.view import read_view

    script = tmp_path / "master.py"
    script.write_text(KILLED)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, str(script), "state", str(ROOT / "tests")], cwd=tmp_path, env=env
    )
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:  # 39 dispatches answered (2 failed), then 3 hang
            if settled(tmp_path / "state") and read_view(tmp_path / "state").committed == 37:
                break
            assert proc.poll() is None, proc.returncode
            time.sleep(0.02)
        else:
            raise AssertionError("the master did not reach 3 in flight in 60 s")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    monkeypatch.chdir(tmp_path)
    code, out = cli("stats", "state/", capsys=capsys)
    assert code == 0
    assert_same(sample("docs/cli.md", "stats-killed"), out, "duration", "pid", "master host")


# ------------------------------------------------------------------------ docs/how-to/steer.md
def _fails_always(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """w-4, w-9, w-12 and w-15 fail every attempt: deferred once their retries are spent."""
    if payload["x"] in (4, 9, 12, 15):
        raise ValueError(f"x={payload['x']} diverged")
    return {"y": payload["x"] * 2}


def test_the_steering_samples(quick: Path, capsys: Any) -> None:
    """docs/how-to/steer.md, each command of the page against a running master: cancel two
    pending items and a committed one, retry the deferred ones, submit the page's file (twice:
    the second adds nothing), drain."""
    page = "docs/how-to/steer.md"
    items = [WorkItem(f"w-{i}", {"x": i}) for i in range(40)]
    with running_master(quick / "state", items, _fails_always, 30, retry=RetryPolicy(2)) as got:
        for name in ("steer-cancel", "steer-cancel-committed", "steer-retry", "steer-submit"):
            run_session(page, name, capsys)
        code, out = cli("submit", "state/", "new.jsonl", capsys=capsys)
        assert out == "0 added, 2 already known with the same payload\n", out
        run_session(page, "steer-drain", capsys)
    assert got["report"].reason == "drain"


# -------------------------------------------------------------------------- docs/how-to/laptop.md
def test_the_run_print_sample(capsys: Any, monkeypatch: Any) -> None:
    """docs/how-to/laptop.md: ``run --print`` as root under Open MPI (the paths are the
    reader's: their directories vary)."""
    from durable_dispatch.mpi import launcher

    if launcher.find_mpiexec() is None or launcher.mpi_flavor() != "openmpi":
        pytest.skip("the sample is Open MPI's: this machine has another MPI or none")
    if os.geteuid() != 0:
        pytest.skip("the sample is root's (CI runs as root)")
    [(command, shown)] = session("docs/how-to/laptop.md", "laptop-print")
    for name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        monkeypatch.delenv(name, raising=False)  # as in a fresh shell
    code, out = cli(*shlex.split(command)[1:], capsys=capsys)
    assert code == 0
    assert_same(shown, out, "directories", "python name")


# ------------------------------------------------------------------------------ docs/errors.md
def test_the_error_hierarchy_sample() -> None:
    """docs/errors.md: the tree is the exception classes' (a built-in base in parentheses)."""
    from durable_dispatch import errors

    def tree(cls: type, prefix: str) -> list[str]:
        subs = [c for c in cls.__subclasses__() if c.__module__ == errors.__name__]
        lines = []
        for i, c in enumerate(subs):
            last = i == len(subs) - 1
            base = [b.__name__ for b in c.__bases__ if b.__module__ == "builtins"]
            lines.append(
                prefix
                + ("└── " if last else "├── ")
                + c.__name__
                + (f" ({base[0]})" if base else "")
            )
            lines += tree(c, prefix + ("    " if last else "│   "))
        return lines

    printed = "\n".join(["DurableDispatchError", *tree(errors.DurableDispatchError, "")]) + "\n"
    assert_same(sample("docs/errors.md", "errors-tree"), printed)


# ------------------------------------------------------------------ docs/tutorial/first-campaign.md
def test_the_tutorials_refused_values_samples(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """Section 8 of the first tutorial: a payload holding a datetime stops run_master with the
    error shown; a result holding a numpy array defers its item, as ``deferred list`` shows."""
    import datetime

    np = pytest.importorskip("numpy")
    from durable_dispatch.errors import RecordEncodeError
    from durable_dispatch.mpi import run_master

    page = "docs/tutorial/first-campaign.md"
    bad = WorkItem("w-7", {"runs": [{"at": datetime.datetime(2026, 12, 5)}]})
    with pytest.raises(RecordEncodeError) as e:
        run_master([bad], tmp_path / "a", comm=LocalWorkers(lambda p: p, 1))
    import traceback

    last = traceback.format_exception_only(e.type, e.value)[-1]  # what Python prints last
    assert_same(sample(page, "tutorial-encode-error"), last)

    def energy(payload: dict[str, Any]) -> dict[str, Any]:
        if payload["x"] == 3:
            return {"energy": np.array([0.1, 0.2])}
        return {"energy": [0.1 * payload["x"]]}

    items = [WorkItem(f"w{i}", {"x": i}) for i in range(6)]
    assert run_master(items, tmp_path / "state", comm=LocalWorkers(energy, 2)).finished
    [(command, shown)] = session(page, "tutorial-malformed-result")
    monkeypatch.chdir(tmp_path)
    code, out = cli(*shlex.split(command)[1:], capsys=capsys)
    assert code == 0
    assert_same(shown, out)


# --------------------------------------------------------------- scripts the how-to guides run
def test_the_how_to_script_samples(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """The outputs the how-to guides show for their example scripts: priorities.md and
    dependencies.md (the pipeline), and pandas.md on a campaign of 40 items on 3 workers."""
    import runpy
    import sys

    from durable_dispatch.mpi import run_master

    def run(path: str, *argv: str) -> str:
        capsys.readouterr()
        saved = sys.argv
        sys.argv = [path, *argv]
        try:
            runpy.run_path(str(ROOT / "examples" / path), run_name="__main__")
        finally:
            sys.argv = saved
        return str(capsys.readouterr().out)

    [(_, shown)] = session("docs/how-to/priorities.md", "priorities")
    assert_same(shown, run("priorities.py", str(tmp_path / "p")))
    [(_, shown)] = session("docs/how-to/dependencies.md", "pipeline")
    assert_same(shown, run("pipeline.py", str(tmp_path / "d")))
    pytest.importorskip("pandas", reason="pandas is not installed (the docs extra has it)")
    items = [WorkItem(f"w{i}", {"x": i}) for i in range(40)]
    worker = LocalWorkers(lambda p: {"answer": p["x"] * 2}, 3)
    assert run_master(items, tmp_path / "state", comm=worker).finished
    monkeypatch.chdir(tmp_path)
    assert_same(sample("docs/how-to/pandas.md", "pandas"), run("results_pandas.py", "state"))
