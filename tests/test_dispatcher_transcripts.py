"""Data-driven protocol scenarios for the dispatch core (tests/testdata/dispatcher/*.txt).

Each file is a sequence of blocks separated by blank lines. A block is one or more commands, a line
``----``, and the expected output (one line per decision, ``ok`` when there is none). Lines starting
with ``#`` are comments. Commands (times are virtual seconds):

    init epoch=1 watchdog=10 lease=30 retries=1 ranks=1,2   submit w0 w1      reserve NOW [MAX]
    dispatched TOKEN NOW     send-failed TOKEN NOW          commit-done TOKEN
    result RANK TOKEN NOW [malformed]     ready RANK TOKEN NOW     heartbeat RANK TOKEN NOW
    results RANK TOKEN NOW COUNT [errors=I,J]   (a RESULT with COUNT entries; items I, J failed)
    join NOW     sweep NOW     snapshot-persisted     defer-recorded WORK persisted|memory
    host RANK HOST (its failure domain)   lost NOW RANK... (the runtime reported them together)
    status W...  parked  idle  pending  stats FIELD...

A TOKEN of ``-`` sends no token at all. Set ``DD_REWRITE_TRANSCRIPTS=1`` to rewrite expectations.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch.core import (
    Commit,
    Commits,
    Decision,
    Defer,
    Dispatcher,
    Park,
    PersistSnapshot,
    Quarantine,
    Release,
    Requeue,
    RetryPolicy,
    Send,
    Token,
    WatchdogConfig,
    WorkItem,
)

from .helpers import each_commit

DATA = Path(__file__).parent / "testdata" / "dispatcher"


def render(d: Decision) -> str:
    if isinstance(d, Send):
        return f"send rank={d.rank} token={d.token} work={','.join(w.work_id for w in d.items)}"
    if isinstance(d, Commit):
        return f"commit rank={d.rank} token={d.token} work={d.work_id} result={d.result}"
    if isinstance(d, Commits):  # a dispatch's commits as columns: one line per item, as above
        return "\n".join(map(render, each_commit([d])))
    if isinstance(d, Requeue):
        return (
            f"requeue work={d.work_id} token={d.token} source={d.source} kind={d.kind} "
            f"attempts={d.attempts}" + (" split" if d.split else "")
        )
    if isinstance(d, Defer):
        return (
            f"defer work={d.work.work_id} token={d.token} source={d.source} attempts={d.attempts} "
            f"kinds={','.join(d.kinds)}"
        )
    if isinstance(d, Park):
        return f"park rank={d.rank} token={d.token} source={d.source}"
    if isinstance(d, Release):
        return f"release rank={d.rank} token={d.token}"
    if isinstance(d, PersistSnapshot):
        return "persist-snapshot"
    if isinstance(d, Quarantine):
        return f"quarantine rank={d.rank} {d.message} {d.classification.value} ({d.reason})"
    raise AssertionError(f"unknown decision {d!r}")


def _tok(s: str) -> Any:
    return None if s == "-" else s


class Runner:
    def __init__(self) -> None:
        self.d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10), ranks=(1, 2))

    def run(self, line: str) -> list[str]:
        cmd, *a = line.split()
        d = self.d
        out: list[Decision] = []
        if cmd == "init":
            kw = dict(x.split("=", 1) for x in a)
            lease = float(kw["lease"]) if "lease" in kw else None
            self.d = Dispatcher(
                epoch=int(kw.get("epoch", 1)),
                watchdog=WatchdogConfig(float(kw.get("watchdog", 10)), heartbeat_lease=lease),
                retry=RetryPolicy(int(kw.get("retries", 1))),
                ranks=[int(r) for r in kw.get("ranks", "1,2").split(",")],
            )
            return []
        if cmd == "submit":
            d.submit(WorkItem(w) for w in a)
            return []
        if cmd == "reserve":
            r = d.reserve(float(a[0]), int(a[1]) if len(a) > 1 else 1)
            return [render(r)] if r is not None else ["none"]
        if cmd == "dispatched":
            out = d.mark_dispatched(Token.parse(a[0]), float(a[1]))  # type: ignore[arg-type]
        elif cmd == "send-failed":
            out = d.send_failed(Token.parse(a[0]), float(a[1]))  # type: ignore[arg-type]
        elif cmd == "commit-done":
            out = d.commit_done(Token.parse(a[0]))  # type: ignore[arg-type]
        elif cmd == "result":
            valid = not (len(a) > 3 and a[3] == "malformed")
            out = d.on_result(int(a[0]), _tok(a[1]), "r", float(a[2]), valid=valid, error="bad")
        elif cmd == "results":
            n = int(a[3])
            bad = a[4].removeprefix("errors=").split(",") if len(a) > 4 else []
            errors = {int(i): f"item {i} failed" for i in bad}
            out = d.on_results(
                int(a[0]), _tok(a[1]), [f"r{i}" for i in range(n)], float(a[2]), errors=errors
            )
        elif cmd == "ready":
            out = d.on_ready(int(a[0]), _tok(a[1]), float(a[2]))
        elif cmd == "heartbeat":
            out = d.on_heartbeat(int(a[0]), _tok(a[1]), float(a[2]))
        elif cmd == "host":
            d.note_host(int(a[0]), a[1])
        elif cmd == "lost":
            out = d.ranks_lost([int(r) for r in a[1:]], float(a[0]), "process failed")
        elif cmd == "join":
            out = d.join_invalid(float(a[0]))
        elif cmd == "sweep":
            out = d.sweep(float(a[0]))
        elif cmd == "snapshot-persisted":
            d.snapshot_persisted()
        elif cmd == "defer-recorded":
            d.defer_recorded(a[0], a[1] == "persisted")
        elif cmd == "status":
            return [f"{w}: {d.status(w).value if d.status(w) else None}" for w in a]
        elif cmd == "parked":
            return [f"parked {r}={t}" for r, t in sorted(d.parked_ranks().items())] or [
                "parked none"
            ]
        elif cmd == "idle":
            return ["idle " + (" ".join(map(str, d.idle_ranks())) or "none")]
        elif cmd == "pending":
            return ["pending " + (" ".join(d.pending()) or "none")]
        elif cmd == "stats":
            st = d.statistics().as_dict()
            return [f"{k}={st[k]}" for k in a]
        else:
            raise AssertionError(f"unknown command {cmd!r}")
        return [render(x) for x in out]


def parse(text: str) -> list[tuple[list[str], list[str], list[str]]]:
    """Blocks of (comments, commands, expected)."""
    blocks = []
    for raw in text.strip().split("\n\n"):
        lines = raw.splitlines()
        comments = [x for x in lines if x.startswith("#")]
        body = [x for x in lines if not x.startswith("#")]
        if not body:
            blocks.append((comments, [], []))
            continue
        i = body.index("----")
        blocks.append((comments, body[:i], body[i + 1 :]))
    return blocks


@pytest.mark.parametrize("path", sorted(DATA.glob("*.txt")), ids=lambda p: p.stem)
def test_transcript(path: Path) -> None:
    runner = Runner()
    rewritten = []
    failures = []
    for comments, cmds, expected in parse(path.read_text()):
        got: list[str] = []
        for c in cmds:
            got += runner.run(c)
        got = got or ["ok"]
        if cmds and got != expected:
            failures.append(f"{cmds}\n  expected {expected}\n  got      {got}")
        rewritten.append("\n".join(comments + (cmds + ["----"] + got if cmds else [])))
    if os.environ.get("DD_REWRITE_TRANSCRIPTS"):
        path.write_text("\n\n".join(rewritten) + "\n")
        return
    assert not failures, "\n".join(failures)


def test_there_are_transcripts() -> None:
    assert len(list(DATA.glob("*.txt"))) >= 4
