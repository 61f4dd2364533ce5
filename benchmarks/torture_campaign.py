"""One run of a torture scenario's campaign, under ``mpiexec`` (see ``torture.py``).

``python torture_campaign.py SCENARIO.json WORKDIR``: rank 0 runs ``run_master`` on
``WORKDIR/state`` with the scenario's items, watchdog, retry budgets and batch, appends every
commit its callback sees to ``WORKDIR/sink.jsonl`` (``{"id", "result"}``, flushed and fsynced
before the callback returns) and returns each item's children; the other ranks run
``run_worker``, isolated or not. Every rank writes its pid to ``WORKDIR/pids/<rank>`` so the
nemesis can find it; rank 0 writes its report to ``WORKDIR/report-<pid>.json`` (with the
run's number, ``TORTURE_RUN``, and when it ended).

``--plant NAME`` plants a known bug in this process before the campaign runs (the harness's own
tests check that the checker catches each): ``double-commit`` journals every commit twice,
``drop-child`` drops the last child a callback returns, ``deadline-after-restart`` ignores an
item's own timeout once the master has restarted. Production code has no such switch.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from durable_dispatch import WorkItem
from durable_dispatch.core import RetryPolicy, WatchdogConfig
from durable_dispatch.mpi import Feed, finish, run_master, run_worker


def expected(payload: dict[str, Any]) -> dict[str, Any]:
    """The result an item that succeeds must commit: a function of its payload only."""
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
    return {"id": payload["id"], "digest": digest}


def misbehave(kind: str, arg: float) -> None:
    """The kinds a campaign item and a futures call share: sleep, hang, segfault, abort."""
    if kind == "sleep":
        time.sleep(arg)
    elif kind == "hang":
        time.sleep(3600)
    elif kind == "segfault":
        ctypes.string_at(0)
    elif kind == "abort":
        os.abort()


def work(payload: dict[str, Any], ctx: Any) -> Any:
    """Behave as the item's ``kind`` says (see ``torture.KINDS``)."""
    kind, arg = payload["kind"], payload.get("arg", 0)
    if sorted(ctx.dependencies) != sorted(payload.get("after", ())):  # issue 51
        raise AssertionError(f"dependencies {sorted(ctx.dependencies)} != {payload.get('after')}")
    misbehave(kind, arg)
    if kind == "memory":
        _hog = bytearray(arg)  # over memory_limit: MemoryError (kind error) or a crash
        return {"bytes": len(_hog)}
    elif kind == "huge":
        return {"pad": "x" * arg}  # over max_result_bytes: result-too-large
    elif kind == "raise":
        raise RuntimeError("the item's own bug")
    elif kind == "flaky" and ctx.attempt == 0:
        raise RuntimeError("fails on its first attempt only")
    elif kind == "orphan":  # leaves a process behind; isolation's subreaper must reap it
        subprocess.Popen(["sleep", "600"], start_new_session=True)
    return expected(payload)


def plant(name: str) -> None:
    """Plant a known bug in this process (see the module docs)."""
    from durable_dispatch.campaign import recorder as recorder_mod
    from durable_dispatch.campaign import state as state_mod
    from durable_dispatch.core import dispatcher

    if name == "double-commit":
        original = recorder_mod.Recorder._journal_commits

        def twice(self: Any, commits: Any) -> Any:
            from durable_dispatch.core.events import Committed, encode

            # (a dispatch's commits come as columns, core.Commits)
            ev = Committed(
                commits.token, commits.rank, commits.work_ids, tuple(commits.results), time.time()
            )
            self._journal.append(encode(ev))
            return original(self, commits)

        recorder_mod.Recorder._journal_commits = twice  # type: ignore[method-assign]
    elif name == "drop-child":
        spawn = state_mod.CampaignState._spawn

        def drop(self: Any, parent: str, children: Any) -> None:
            items = list(children or [])
            return spawn(self, parent, items[:-1])

        state_mod.CampaignState._spawn = drop  # type: ignore[method-assign]
    elif name == "deadline-after-restart":
        allowed = dispatcher.Dispatcher.allowed_seconds

        def ignore(self: Any, items: Any) -> Any:
            if self.epoch > 1:
                return self.watchdog.seconds * len(items)
            return allowed(self, items)

        dispatcher.Dispatcher.allowed_seconds = ignore  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown planted bug {name!r}")


class _Trickle(Feed):
    """The items as a Feed submits them: three per turn (issue 58), all known again on a
    resumed run (skipped)."""

    def __init__(self, items: list[WorkItem]) -> None:
        self.items = items

    def refill(self) -> None:
        chunk, self.items = self.items[:3], self.items[3:]
        if chunk:
            self.state.submit(chunk)
        self.exhausted = not self.items


def main() -> int:
    from mpi4py import MPI

    scenario = json.loads(Path(sys.argv[1]).read_text())
    workdir = Path(sys.argv[2])
    if "--plant" in sys.argv:
        plant(sys.argv[sys.argv.index("--plant") + 1])
    rank = MPI.COMM_WORLD.Get_rank()
    (workdir / "pids").mkdir(exist_ok=True)
    (workdir / "pids" / str(rank)).write_text(str(os.getpid()))
    if rank != 0:
        run_worker(
            work,
            context=True,
            isolate=scenario["isolate"],
            memory_limit=scenario.get("memory_limit") if scenario["isolate"] else None,
            max_result_bytes=scenario["max_result"],
        )
        finish()
        return 0
    items = [
        WorkItem(
            i["id"],
            i,
            timeout=i.get("timeout"),
            priority=i.get("priority", 0),
            after=tuple(i.get("after", ())),
        )
        for i in scenario["items"]
    ]
    children = {c["parent"]: c["children"] for c in scenario.get("spawns", [])}
    sink = open(workdir / "sink.jsonl", "a")  # noqa: SIM115 - open for the whole run

    def on_commit(work_id: str, result: Any) -> list[WorkItem]:
        sink.write(json.dumps({"id": work_id, "result": result}) + "\n")
        sink.flush()
        os.fsync(sink.fileno())
        return [
            WorkItem(
                c["id"],
                c,
                timeout=c.get("timeout"),
                priority=c.get("priority", 0),
                after=tuple(c.get("after", ())),
            )
            for c in children.get(work_id, [])
        ]

    w = scenario["watchdog"]
    report = run_master(
        _Trickle(items) if scenario.get("feed") else items,
        workdir / "state",
        on_commit,
        watchdog=WatchdogConfig(w["seconds"], quantile=w.get("quantile")),
        retry=RetryPolicy(scenario["retries"], per_kind=scenario.get("per_kind", {})),
        batch=scenario["batch"],
        stuck_grace=scenario.get("stuck_grace", 10.0),
        drain_seconds=scenario.get("drain_seconds", 20.0),
    )
    run = int(os.environ.get("TORTURE_RUN", "0"))  # (which run wrote it, and when it ended)
    (workdir / f"report-{os.getpid()}.json").write_text(
        json.dumps(
            {"finished": report.finished, "reason": report.reason, "stats": report.stats}
            | {"run": run, "t": time.time()}
        )
    )
    sink.close()
    code = 0 if report.finished else 3
    finish(code=code)  # under ULFM it leaves here, with this status
    return code


if __name__ == "__main__":
    sys.exit(main())
