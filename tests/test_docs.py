"""Code that claims to run, runs (issue 30, as sqlite-utils checks its docs by test).

Every ``python`` block of README.md and docs/**/*.md is one of:

- ``<!-- example: examples/FILE.py -->`` (or ``FILE.py#NAME``, the region between the file's
  ``# --8<-- [start:NAME]`` and ``# --8<-- [end:NAME]`` marks) on the line before it: the block
  is that file's text (region dedented) to the letter, and the file runs in a test here;
- ``<!-- not run: REASON -->``: a fragment, with the reason it cannot run alone;
- anything else: it runs as it is, in a fresh namespace and an empty working directory.

The pages of the docs site show example files with ``literalinclude``; every file under
``examples/`` is run by a test (``RUN_BY``). Every command line the README, the tutorial and the
how-to guides give to start ranks (``durable-dispatch run ...``, ``mpiexec ...``) runs here as
written, on this machine's 2 cores and with whichever MPI is installed (CI runs these tests under
Open MPI, MPICH and Intel MPI), as root and, where the machine allows, as an unprivileged user
(issue 47). The site itself builds with warnings as errors, and its command reference is the
parser's (``test_the_site_builds_with_warnings_as_errors``).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import WorkItem
from durable_dispatch.campaign.admin import view_state
from durable_dispatch.core import RetryPolicy
from durable_dispatch.testing import LocalWorkers

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts),
]
BLOCK = re.compile(r"(?:^(<!--[^\n]*-->)\n)?^```python\n(.*?)^```$", re.M | re.S)


def blocks() -> list[tuple[str, str | None, str]]:
    """``(where, marker, code)`` of every python block of the docs."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start(2))
            out.append((f"{doc.name}:{line}", m.group(1), m.group(2)))
    return out


def region(ref: str) -> str:
    path, _, name = ref.partition("#")
    text = (ROOT / path).read_text()
    if not name:
        return text.split('"""\n\n', 1)[1] if text.startswith('"""') else text
    start, end = f"# --8<-- [start:{name}]\n", f"# --8<-- [end:{name}]"
    assert start in text and end in text, f"{path} has no region {name}"
    body = text.split(start, 1)[1].split(end, 1)[0]
    return textwrap.dedent(body).rstrip(" ")


BLOCKS = blocks()


@pytest.mark.parametrize(("where", "marker", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_every_python_block_runs_or_is_an_example_file(
    where: str, marker: str | None, code: str, tmp_path: Path, monkeypatch: Any
) -> None:
    if marker and marker.startswith("<!-- example:"):
        ref = marker.removeprefix("<!-- example:").removesuffix("-->").strip()
        assert code.rstrip("\n") == region(ref).rstrip("\n"), f"{where} differs from {ref}"
        return
    if marker and marker.startswith("<!-- not run:"):
        assert len(marker) > len("<!-- not run:  -->") + 10, f"{where}: say why it cannot run"
        compile(code, where, "exec")  # it is Python all the same
        return
    monkeypatch.chdir(tmp_path)
    exec(compile(code, where, "exec"), {"__name__": "docs_block"})  # noqa: S102


def test_the_blocks_were_found() -> None:
    markers = [m for _, m, _ in BLOCKS if m]
    assert len(BLOCKS) >= 10 and any("examples/loop.py#loop" in m for m in markers)


# ------------------------------------------------------------------------ examples/loop.py
def _lying(payload: dict[str, Any], ctx: Any) -> Any:
    """Raises on the first attempt at x=3, returns what JSON cannot hold at x=5 (a refused
    value is not retried: x=5 is deferred after its first attempt)."""
    if payload["x"] == 3 and ctx.attempt == 0:
        raise ValueError("the user's function failed")
    if payload["x"] == 5:
        return {1, 2}  # a set: malformed-result
    return {"y": payload["x"] * 2}


def _record(state: Path) -> dict[str, Any]:
    p = view_state(state).projection
    return {
        "committed": sorted(p.committed),
        "deferred": sorted(p.deferred),
        "attempts": dict(p.attempts),
        "kinds": {k: list(v) for k, v in p.kinds.items()},
        "duplicates": p.duplicate_commits,
    }


def test_the_readme_loop_leaves_the_record_run_master_leaves(tmp_path: Path) -> None:
    """A user who copies the README loop gets what run_master gets: every item committed
    once, each failure charged under its kind, every commit delivered to the callback."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import loop  # examples/loop.py
    finally:
        sys.path.remove(str(ROOT / "examples"))
    from durable_dispatch.mpi import run_master

    items = [WorkItem(f"w{i:02d}", {"x": i}) for i in range(12)]
    by_loop: dict[str, Any] = {}
    by_master: dict[str, Any] = {}
    done = loop.master(
        LocalWorkers(_lying, 3, context=True), str(tmp_path / "a"), items, by_loop.__setitem__
    )
    report = run_master(
        items,
        tmp_path / "b",
        by_master.__setitem__,
        comm=LocalWorkers(_lying, 3, context=True),
        retry=RetryPolicy(3),
    )
    assert done and report.finished
    want = {w.work_id: {"y": 2 * w.payload["x"]} for w in items if w.work_id != "w05"}
    assert by_loop == by_master == want
    a, b = _record(tmp_path / "a"), _record(tmp_path / "b")
    assert a == b
    assert a["kinds"] == {"w03": ["error"], "w05": ["malformed-result"]}, a
    assert a["deferred"] == ["w05"] and a["attempts"]["w05"] == 1, a
    assert loop.main(["loop.py", str(tmp_path / "c")]) == 0  # its own entry point


def test_the_readme_test_module_passes(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import test_campaign  # examples/test_campaign.py
    finally:
        sys.path.remove(str(ROOT / "examples"))
    test_campaign.test_my_campaign(tmp_path)


def test_the_readme_campaign_runs_under_mpiexec(tmp_path: Path) -> None:
    """examples/campaign.py, the README's campaign, on 4 real ranks with isolated workers;
    run again on the same directory it resumes with nothing left to do."""
    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    cmd = mpiexec_command(4, [sys.executable, str(ROOT / "examples" / "campaign.py")])
    for run in range(2):
        res = run_mpiexec(cmd, timeout=120, cwd=tmp_path)
        assert not res.timed_out and res.returncode == 0, res.stderr[-3000:]
        lines = sorted(x for x in res.stdout.splitlines() if x.startswith("w"))
        if run == 0:
            assert len(lines) == 20 and "w7 {'answer': 14}" in lines, res.stdout[-2000:]
        else:
            assert lines == []  # every result was delivered the first time
    assert len(view_state(tmp_path / "state").projection.committed) == 20


def test_the_growing_campaign_example_explores_the_whole_site(tmp_path: Path, capsys: Any) -> None:
    import runpy

    argv = sys.argv
    sys.argv = ["grow.py", str(tmp_path / "state")]
    try:
        runpy.run_path(str(ROOT / "examples" / "grow.py"), run_name="__main__")
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    assert "finished: True pages: 4" in out and "page:/c -> []" in out


# ------------------------------------------------------------------ issue 47: the docs site
def _run_example(path: str, argv: list[str], capsys: Any) -> str:
    import runpy

    saved = sys.argv
    sys.argv = [path, *argv]
    try:
        runpy.run_path(str(ROOT / path), run_name="__main__")
    except SystemExit as e:
        assert e.code in (0, None), f"{path} exited with {e.code}"
    finally:
        sys.argv = saved
    return str(capsys.readouterr().out)


def test_the_priorities_example_serves_higher_first(tmp_path: Path, capsys: Any) -> None:
    out = _run_example("examples/priorities.py", [str(tmp_path / "s")], capsys)
    assert "['urgent', 'soon', 'routine-1', 'routine-2']" in out, out


def test_the_pipeline_example_waits_for_each_stage(tmp_path: Path, capsys: Any) -> None:
    out = _run_example("examples/pipeline.py", [str(tmp_path / "s")], capsys)
    assert "True {'total': 210, 'samples': 3}" in out, out


def test_the_watchdog_example_runs_both_rules(capsys: Any) -> None:
    out = _run_example("examples/watchdog.py", [], capsys)
    assert "fixed True 600" in out and "adaptive True" in out, out


def test_the_run_command_example_kills_at_the_deadline(capsys: Any) -> None:
    out = _run_example("examples/run_command.py", [], capsys)
    assert "timed_out=True" in out and "stdout=b'hello\\n'" in out, out


def test_the_quickstart_example_recovers_a_torn_journal(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    out = _run_example("examples/quickstart.py", [str(tmp_path)], capsys)
    assert "recovered 999 records" in out, out


def test_the_pandas_example_reads_every_result(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("pandas", reason="pandas is not installed (the docs extra has it)")
    from durable_dispatch.mpi import run_master

    items = [WorkItem(f"w{i}", {"x": i}) for i in range(12)]
    worker = LocalWorkers(lambda p: {"answer": p["x"] * 2}, 3)
    assert run_master(items, tmp_path / "state", comm=worker).finished
    out = _run_example("examples/results_pandas.py", [str(tmp_path / "state")], capsys)
    assert "result.answer" in out and "12 results" in out, out


#: every file under examples/ -> the test that runs it
RUN_BY = {
    "examples/campaign.py": "test_the_readme_campaign_runs_under_mpiexec",
    "examples/futures_map.py": "test_the_futures_tutorial_resolves_from_the_record",
    "examples/grow.py": "test_the_growing_campaign_example_explores_the_whole_site",
    "examples/loop.py": "test_the_readme_loop_leaves_the_record_run_master_leaves",
    "examples/quickstart.py": "test_the_quickstart_example_recovers_a_torn_journal",
    "examples/test_campaign.py": "test_the_readme_test_module_passes",
    "examples/test_pyfakefs_faults.py": "tests/test_pytest_plugin.py",
    "examples/priorities.py": "test_the_priorities_example_serves_higher_first",
    "examples/pipeline.py": "test_the_pipeline_example_waits_for_each_stage",
    "examples/futures_reduce.py": "test_the_futures_reduce_example_waits_and_fails_with_its_cause",
    "examples/watchdog.py": "test_the_watchdog_example_runs_both_rules",
    "examples/run_command.py": "test_the_run_command_example_kills_at_the_deadline",
    "examples/results_pandas.py": "test_the_pandas_example_reads_every_result",
    "examples/timeouts.py": "test_every_documented_launch_line_runs",
    "examples/tutorial/before.py": "test_the_first_tutorial_runs_as_written",
    "examples/tutorial/campaign.py": "test_the_first_tutorial_runs_as_written",
    "examples/tutorial/faulty.py": "test_the_first_tutorial_runs_as_written",
    "examples/tutorial/futures_before.py": "test_the_futures_tutorial_resolves_from_the_record",
}


def test_every_example_file_is_run_by_a_test() -> None:
    found = {str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("*.py")}
    assert found == set(RUN_BY), f"not run by a test: {found - set(RUN_BY)}"
    here = Path(__file__).read_text()
    for ref in set(RUN_BY.values()):
        if ref.startswith("tests/"):
            assert (ROOT / ref).exists()
        else:
            assert f"def {ref}(" in here, ref


def test_every_literalinclude_names_an_example_file() -> None:
    for page in DOCS:
        for m in re.finditer(r"^```\{literalinclude\} (\S+)", page.read_text(), re.M):
            target = (page.parent / m.group(1)).resolve()
            assert target.exists(), f"{page.name}: {m.group(1)} does not exist"
            assert str(target.relative_to(ROOT)) in RUN_BY, f"{m.group(1)} is run by no test"


# --------------------------------------------------------------- the command-line reference
def _subcommands() -> dict[str, Any]:
    import argparse

    from durable_dispatch.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    return {name: (p, helps.get(name)) for name, p in sub.choices.items()}


def test_every_subcommand_has_help_an_example_and_a_page() -> None:
    """sqlite-utils' rule: every command has help text, and the docs use it (the reference
    page is generated from the parser, so it cannot drift; the guides show each one)."""
    text = "".join(p.read_text() for p in DOCS)
    assert ":func: build_parser" in (ROOT / "docs/reference/cli.md").read_text()
    for name, (p, helptext) in _subcommands().items():
        assert helptext and p.description, f"{name}: no help"
        assert p.epilog and "Example: durable-dispatch " + name in p.epilog, f"{name}: no example"
        for action in p._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.dest}: no help"
        assert f"durable-dispatch {name}" in text, f"{name} appears in no page"


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    """The CI command (docs/conf.py): a missing docstring, a broken reference or link, a
    page in no toctree all fail it. Then the built reference holds every subcommand and every
    public name."""
    import subprocess

    for mod in ("sphinx", "myst_parser", "sphinxarg"):
        pytest.importorskip(mod, reason="the docs extra is not installed: pip install '.[docs]'")
    out = tmp_path / "html"
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going", "-E"]
    res = subprocess.run(
        [*cmd, "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-5000:]
    import html

    cli = html.unescape((out / "reference" / "cli.html").read_text()).replace("\u2019", "'")
    for name, (p, _help) in _subcommands().items():
        assert f'id="durable-dispatch-{name}"' in cli, name
        assert " ".join(str(p.description).split())[:60] in " ".join(cli.split()), name
        for action in p._actions:
            if action.dest != "help":
                assert all(opt in cli for opt in action.option_strings), (name, action.dest)
    import importlib

    for modname in (
        "durable_dispatch",
        "durable_dispatch.mpi",
        "durable_dispatch.futures",
        "durable_dispatch.testing",
        "durable_dispatch.errors",
    ):
        page = (out / "reference" / "api" / f"{modname}.html").read_text()
        for name in importlib.import_module(modname).__all__:
            entry = f'id="{modname}.{name}"' in page  # documented here, or named as
            named = f'<span class="pre">{name}</span>' in page  # another's or the stdlib's
            assert entry or named, f"{modname}.{name} has no reference entry"
    assert not _tracked("docs/reference/api"), "generated pages are not committed (Parsl's rule)"
    # what a user reads carries no internal label (a requirement code, an issue number): every
    # page of the built site, the API reference and the command reference included
    from .test_words import RULES_PAGE, labels

    # the rules page defines the labels (test_words.RULES_PAGE): the one page that carries them
    rules = out / RULES_PAGE.relative_to(ROOT / "docs").with_suffix(".html")
    found = {}
    for page in out.rglob("*.html"):
        if page == rules:
            continue
        text = html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))
        if labels(text):
            found[str(page.relative_to(out))] = labels(text)[:3]
    assert not found, found


def _tracked(under: str) -> list[Path]:
    import subprocess

    res = subprocess.run(
        ["git", "ls-files", under], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return [Path(x) for x in res.stdout.split()] if res.returncode == 0 else []


def test_a_name_without_a_docstring_fails_the_build() -> None:
    """docs/_ext/apipages.py warns (and -W fails) on a public name, or a public method of a
    public class, without a docstring of its own; a dataclass's generated one does not count."""
    pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install '.[docs]'")
    from dataclasses import dataclass

    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import apipages
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))

    def bare() -> None:
        pass

    @dataclass
    class Generated:
        x: int

    class Half:
        """Documented."""

        def method(self) -> None:
            pass

    assert apipages._undocumented(bare) == [""]
    assert apipages._undocumented(Generated) == [""]
    assert apipages._undocumented(Half) == [".method"]
    assert apipages._undocumented(WorkItem) == []


# ------------------------------------------- command lines that start ranks, run as written
LAUNCH = re.compile(r"^(?:\S+=\S+ )*(?:\S*durable-dispatch run |mpiexec )")
BLOCK_ANY = re.compile(r"(?:^(<!--[^\n]*-->)\n)?^```(bash|console)\n(.*?)^```$", re.M | re.S)
TUTORIALS = ("docs/tutorial/first-campaign.md", "docs/tutorial/futures.md")


def launch_lines(pages: list[str]) -> list[tuple[str, str, dict[str, str]]]:
    """``(where, command, tags)`` of every command line that starts ranks in ``pages``: a
    ``console`` block's ``$ `` lines or a ``bash`` block's lines. The comment before a block
    tags it: ``<!-- cwd: DIR; mpi: openmpi|mpich; root -->`` (the README's lines run where
    the repository's ``examples/`` is ``examples/``)."""
    out = []
    for rel in pages:
        text = (ROOT / rel).read_text()
        for m in BLOCK_ANY.finditer(text):
            tags: dict[str, str] = {"cwd": "." if rel == "README.md" else ""}
            for part in (m.group(1) or "").removeprefix("<!--").removesuffix("-->").split(";"):
                key, _, value = part.strip().partition(":")
                if key:
                    tags[key.strip()] = value.strip()
            for line in m.group(3).splitlines():
                if m.group(2) == "console" and not line.startswith("$ "):
                    continue  # a console block's output (a sample), not a command
                line = line.removeprefix("$ ") if m.group(2) == "console" else line
                if LAUNCH.match(line):
                    out.append((f"{rel}:{line}", line, tags))
    return out


@functools.cache
def _python_for_anyone() -> bool:
    """True when an unprivileged user (nobody) can start this Python under ``mpiexec``: not
    when it lives under a directory only root may enter (a pyenv under ``/root``)."""
    import subprocess
    import tempfile

    from durable_dispatch.mpi.launcher import mpiexec_command

    user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    with tempfile.TemporaryDirectory() as home:
        os.chmod(home, 0o777)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS")}
        env["HOME"] = env["TMPDIR"] = home
        try:
            cmd = user + mpiexec_command(1, [sys.executable, "-c", ""])
            res = subprocess.run(cmd, capture_output=True, timeout=120, env=env, cwd=home)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return res.returncode == 0


def run_line(
    line: str, cwd: Path, *, timeout: float = 300, as_user: bool = False
) -> tuple[int, str, str]:
    """Run one documented command line as a user would type it: in ``cwd``, with this
    environment's ``bin`` first on ``PATH`` (``python``, ``mpiexec``, ``durable-dispatch``)
    and without Open MPI's root variables unless the line sets them; in a session of its own,
    killed whole (``kill_session``) if it outlives ``timeout``."""
    import shlex
    import subprocess

    from durable_dispatch.mpi.launcher import kill_session

    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    argv = shlex.split(line.replace(".venv/bin/durable-dispatch", "durable-dispatch"))
    while "=" in argv[0]:
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    if argv[0] == "durable-dispatch":
        argv = [sys.executable, "-m", "durable_dispatch", *argv[1:]]
    if as_user:
        os.chmod(cwd, 0o777)
        env["HOME"] = env["TMPDIR"] = str(cwd)
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        out, err = proc.communicate()
        raise AssertionError(f"{line}: still running after {timeout}s\n{err[-3000:]}") from None
    finally:
        if proc.poll() is None:
            kill_session(proc)
    return proc.returncode, out, err


def _copy_examples(tmp_path: Path, cwd: str) -> Path:
    import shutil

    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    where = tmp_path / (cwd or "examples")
    return where


GUIDES = [
    "README.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs/how-to").glob("*.md")),
]
LINES = launch_lines(GUIDES)


@pytest.mark.mpi
@pytest.mark.parametrize(("where", "line", "tags"), LINES, ids=[w for w, _, _ in LINES])
def test_every_documented_launch_line_runs(
    where: str, line: str, tags: dict[str, str], tmp_path: Path
) -> None:
    """Each line of the README and the how-to guides that starts ranks works here as it is
    written: 2 cores, 4 ranks, this MPI, as root; the lines for a user also as an
    unprivileged user when this machine lets one run this Python."""
    from durable_dispatch.mpi.launcher import mpi_flavor

    flavor = {"intel": "mpich"}.get(mpi_flavor(), mpi_flavor())
    if tags.get("mpi") and tags["mpi"] != flavor:
        pytest.skip(f"a line for {tags['mpi']}; this MPI is {flavor}")
    root = os.geteuid() == 0
    if "root" in tags and not root:
        pytest.skip("a line for root; this test runs as a user")
    as_user = root and "root" not in tags and tags.get("mpi") == "openmpi"
    if as_user and not _python_for_anyone():
        pytest.skip("a line for a user, and this Python is not readable by an unprivileged user")
    cwd = _copy_examples(tmp_path, tags.get("cwd", ""))
    rc, out, err = run_line(line, cwd, as_user=as_user)
    assert rc == 0, f"{where}: exit {rc}\n{out[-2000:]}\n{err[-3000:]}"
    if "campaign.py" in line and "--print" not in line:
        assert "w19 {'answer': 38}" in out, out[-2000:]
    if "futures_map.py" in line:
        assert "best seed " in out, out[-2000:]
    if "durable-dispatch run" in line and root and _python_for_anyone():
        rc, out, err = run_line(
            line, _copy_examples(tmp_path / "user", tags.get("cwd", "")), as_user=True
        )
        assert rc == 0, f"{where}, as a user: exit {rc}\n{err[-3000:]}"


def test_the_run_command_adds_what_each_mpi_needs(capsys: Any, monkeypatch: Any) -> None:
    """``durable-dispatch run --print``: Open MPI gets --oversubscribe and binding off, and
    its root variables only for root; Hydra gets neither."""
    from durable_dispatch.cli import main
    from durable_dispatch.mpi import launcher

    if launcher.find_mpiexec() is None:
        pytest.skip("no mpiexec: install the mpi or the mpich extra")
    for euid in (0, 1000):
        monkeypatch.setattr(os, "geteuid", lambda euid=euid: euid)
        monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT", raising=False)
        monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", raising=False)
        assert main(["run", "--print", "-n", "4", "python", "campaign.py"]) == 0
        line = capsys.readouterr().out.strip()
        assert line.endswith(f"{sys.executable} campaign.py"), line
        openmpi = launcher.mpi_flavor() == "openmpi"
        assert ("--oversubscribe --bind-to none" in line) == openmpi, line
        assert ("OMPI_ALLOW_RUN_AS_ROOT=1" in line) == (openmpi and euid == 0), line
    assert main(["run", "-n", "4"]) == 2  # no program: a usage error


def test_the_tutorials_give_exactly_the_lines_their_tests_run() -> None:
    """The tutorials' launch lines are run, in order and with their outputs checked, by the two
    tutorial tests below; this keeps the pages and those tests the same list."""
    lines = [line for _, line, _ in launch_lines(list(TUTORIALS))]
    assert lines == [
        "durable-dispatch run -n 4 python before.py",
        "durable-dispatch run -n 4 python campaign.py",
        "durable-dispatch run -n 4 python campaign.py",
        "durable-dispatch run -n 4 python campaign.py",
        "durable-dispatch run -n 4 python campaign.py",
        "durable-dispatch run -n 4 python faulty.py",
        "durable-dispatch run -n 4 python -m mpi4py.futures futures_before.py",
        "durable-dispatch run -n 4 python -m durable_dispatch.futures --state-dir state "
        "futures_map.py",
        "durable-dispatch run -n 4 python -m durable_dispatch.futures --state-dir state "
        "futures_map.py",
    ], lines


def _not_under_intel_mpi() -> None:
    from durable_dispatch.mpi.launcher import mpi_flavor

    if mpi_flavor() == "intel":  # CI's third MPI: the MPICH pass has run these under Hydra
        pytest.skip("the tutorials run under Open MPI and MPICH; Intel MPI's pass skips them")


def _committed_lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if re.match(r"w\d+ \{", x)]


@pytest.mark.mpi
def test_the_first_tutorial_runs_as_written(tmp_path: Path) -> None:
    """docs/tutorial/first-campaign.md step by step, with the outputs it shows: the plain
    script, the durable one, a re-run that runs nothing, a Ctrl-C that drains (exit 3) and a
    resume that runs only the rest (each item once), the views, and the faulty campaign."""
    _not_under_intel_mpi()
    import signal
    import subprocess
    import time

    from durable_dispatch.mpi.launcher import kill_session

    from .test_doc_samples import assert_same, sample

    page = "docs/tutorial/first-campaign.md"
    cwd = _copy_examples(tmp_path, "examples/tutorial")
    dd = "durable-dispatch run -n 4 python"
    rc, out, err = run_line(f"{dd} before.py", cwd)
    assert rc == 0 and sorted(out.split("\n")[:-1]) == sorted(f"{x} {2 * x}" for x in range(20)), (
        out,
        err[-2000:],
    )
    assert_same(sample(page, "tutorial-before"), out, any_order=True)  # "an order that varies"
    rc, out, err = run_line(f"{dd} campaign.py", cwd)  # step 3
    assert rc == 0 and len(_committed_lines(out)) == 40, (out, err[-2000:])
    assert out.rstrip().endswith("finished") and "w39 {'answer': 78}" in out
    assert_same(sample(page, "tutorial-campaign"), out, any_order=True)
    rc, out, _ = run_line(f"{dd} campaign.py", cwd)  # step 4: nothing runs
    assert rc == 0 and out.strip() == "finished", out
    assert_same(sample(page, "tutorial-rerun"), out)
    # step 5: Ctrl-C once after a few lines: a drain, exit 3; then the rest, each item once
    import shutil

    shutil.rmtree(cwd / "state")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, "-m", "durable_dispatch", "run", "-n", "4", sys.executable]
    proc = subprocess.Popen(
        [*cmd, "campaign.py"],
        cwd=cwd,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # as a shell does for a foreground job: a suite started in the background ("cmd &")
        # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt (test_mpi_demo)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        while len(first) < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            first.append(line)
        assert len(first) == 3, first
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
        rest, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            kill_session(proc)
    out1 = "".join(first) + rest
    assert "interrupted: draining" in err, err[-3000:]
    assert proc.returncode == 3 and out1.rstrip().endswith("stopped: signal"), (out1, err[-3000:])
    err1 = err
    rc, out2, err = run_line(f"{dd} campaign.py", cwd)
    assert rc == 0 and out2.rstrip().endswith("finished"), (out2, err[-2000:])
    # the sample: its lines (the terminal's ^C aside) are what the two runs printed, its last
    # line the interrupted run's last; which items ran before the Ctrl-C varies from run to run
    shown = sample(page, "tutorial-ctrl-c")
    lines = [x for x in shown.splitlines() if x not in ("^C", "...")]
    printed = (out1 + err1 + out2).splitlines()
    assert all(x in printed for x in lines), (lines, printed)
    assert out1.splitlines()[-1] == lines[-1] and lines[-1] == "stopped: signal", out1
    both = _committed_lines(out1) + _committed_lines(out2)
    assert sorted(both) == sorted(f"w{i} {{'answer': {2 * i}}}" for i in range(40)), both
    assert 0 < len(_committed_lines(out1)) < 40
    # step 6: the views

    for name, line in (
        ("tutorial-watch", "durable-dispatch watch state --once"),
        ("tutorial-results", "durable-dispatch results state"),  # in commit order: it varies
    ):
        rc, out, err = run_line(line, cwd)
        assert rc == 0, (line, err)
        assert_same(sample(page, name), out, any_order=name == "tutorial-results")
    rc, out, err = run_line("durable-dispatch results state --csv results.csv --with-payload", cwd)
    assert rc == 0 and err.strip() == "wrote 40 row(s) to results.csv", err
    csv = (cwd / "results.csv").read_text()
    assert csv.startswith("work_id,payload.x,result.answer\n"), csv[:200]
    assert_same(sample(page, "tutorial-csv"), csv, any_order=True)
    # step 7: a hang and a segfault
    rc, out, err = run_line(f"{dd} faulty.py", cwd)
    assert rc == 0 and out.rstrip().endswith("finished"), (out, err[-3000:])
    assert "w13 {'answer': 26}" in out and "w7 {" not in out, out
    assert "kind=crash" in err and "defer work_id=w7" in err, err[-3000:]
    # the sample: what it prints (its order varies), then the warnings among its log's lines
    shown = sample(page, "tutorial-faulty").splitlines(keepends=True)
    warnings = "".join(x for x in shown if x.startswith("WARNING "))
    logged = "".join(x for x in err.splitlines(keepends=True) if x.startswith("WARNING "))
    assert_same("".join(x for x in shown if x not in warnings), out, any_order=True)
    assert_same(warnings, logged, "token", any_order=True)
    p = view_state(cwd / "state-faulty").projection
    assert sorted(p.deferred) == ["w7"] and len(p.committed) == 19
    rc, out, err = run_line("durable-dispatch deferred list state-faulty", cwd)
    assert rc == 0
    assert_same(sample(page, "tutorial-deferred"), out)


@pytest.mark.mpi
def test_the_futures_tutorial_resolves_from_the_record(tmp_path: Path) -> None:
    """docs/tutorial/futures.md: the mpi4py.futures script, then the durable one twice, with
    the same answer; the second run ran no call (the record has each once)."""
    _not_under_intel_mpi()
    from .test_doc_samples import assert_same, sample

    page = "docs/tutorial/futures.md"
    cwd = _copy_examples(tmp_path, "examples/tutorial")
    rc, out, err = run_line(
        "durable-dispatch run -n 4 python -m mpi4py.futures futures_before.py", cwd
    )
    assert rc == 0 and out.strip() == "best seed 173", (out, err[-3000:])
    assert_same(sample(page, "futures-before"), out)
    line = "durable-dispatch run -n 4 python -m durable_dispatch.futures --state-dir state"
    line += " futures_map.py"
    cwd = tmp_path / "examples"
    for name in ("futures-first-run", "futures-second-run"):
        rc, out, err = run_line(line, cwd)
        assert rc == 0 and out.strip() == "best seed 173", (out, err[-3000:])
        assert_same(sample(page, name), out)
    p = view_state(cwd / "state" / "executor-1").projection
    assert len(p.committed) == 200 and p.duplicate_commits == 0
    rc, out, err = run_line("durable-dispatch watch state/executor-1 --once", cwd)
    assert rc == 0, err
    assert_same(sample(page, "futures-watch"), out)  # the sample is what watch prints


def test_the_futures_reduce_example_waits_and_fails_with_its_cause(tmp_path: Path) -> None:
    """docs/how-to/dependencies.md: map then reduce with futures as arguments, twice (the
    second run from the record)."""
    _not_under_intel_mpi()
    from .test_doc_samples import assert_same, session

    [(line, shown)] = session("docs/how-to/dependencies.md", "futures-reduce")
    assert line.endswith(" futures_reduce.py"), line
    cwd = _copy_examples(tmp_path, "examples")
    for _ in range(2):
        rc, out, err = run_line(line, cwd)
        assert rc == 0, (out, err[-3000:])
        assert out.splitlines() == [
            "good 236",
            "everything failed: ValueError('seed 7 diverged')",
        ], (out, err[-3000:])
        assert_same(shown, out)


def test_the_tutorials_kill_step_points_to_stats_for_the_masters_host_and_pid(
    tmp_path: Path, capsys: Any
) -> None:
    """The kill step said "kill -9" without saying what to kill: it points to ``stats``, whose
    ``master`` line names the running master's host and PID."""
    import socket

    from durable_dispatch import CampaignState
    from durable_dispatch.cli import main

    page = (ROOT / "docs/tutorial/first-campaign.md").read_text()
    step = page.split("kill -9", 1)[1].split("\n\n", 1)[0]
    assert "durable-dispatch stats state" in step and "PID" in step, step
    with CampaignState.open(tmp_path / "state", ranks=(1,)) as s:
        assert s.publish_statistics(force=True)
        assert main(["stats", str(tmp_path / "state")]) == 0
    master = [x for x in capsys.readouterr().out.splitlines() if x.startswith("master")]
    assert master and f"pid {os.getpid()}" in master[0], master
    assert socket.gethostname() in master[0], master
