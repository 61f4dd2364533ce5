"""Code that claims to run, runs (issue 30, as sqlite-utils checks its docs by test).

Every ``python`` block of README.md and docs/*.md is one of:

- ``<!-- example: examples/FILE.py -->`` (or ``FILE.py#NAME``, the region between the file's
  ``# --8<-- [start:NAME]`` and ``# --8<-- [end:NAME]`` marks) on the line before it: the block
  is that file's text (region dedented) to the letter, and the file runs in a test here;
- ``<!-- not run: REASON -->``: a fragment, with the reason it cannot run alone;
- anything else: it runs as it is, in a fresh namespace and an empty working directory.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import WorkItem
from durable_dispatch.admin import view_state
from durable_dispatch.core import RetryPolicy
from durable_dispatch.testing import LocalWorkers

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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
    """Raises on the first attempt at x=3, returns what JSON cannot hold on the first at x=5."""
    if payload["x"] == 3 and ctx.attempt == 0:
        raise ValueError("the user's function failed")
    if payload["x"] == 5 and ctx.attempt == 0:
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
    assert by_loop == by_master == {w.work_id: {"y": 2 * w.payload["x"]} for w in items}
    a, b = _record(tmp_path / "a"), _record(tmp_path / "b")
    assert a == b
    assert a["kinds"] == {"w03": ["error"], "w05": ["malformed-result"]}, a
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
