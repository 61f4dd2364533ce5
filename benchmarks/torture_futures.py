"""One run of a torture scenario of the futures executor (``"mode": "futures"``, see
``torture.py``), under its runner::

    mpiexec -n N python -m durable_dispatch.futures --state-dir WORKDIR/fstate \\
        torture_futures.py SCENARIO.json WORKDIR

Rank 0 submits one call per item, in order; an item's ``after`` (indices of earlier items)
passes those calls' futures as an argument, so the call depends on them and receives their
values (it checks them). Once every call is submitted it writes ``WORKDIR/wids.json`` (the work
IDs by index: an operator's ``cancel`` names them), then waits for every future. Each execution
of a call appends ``<index> <run> <time>`` to ``WORKDIR/count`` (``TORTURE_RUN`` names the run),
so the checker can see which calls ran, when, and again after a restart or a retry. When every
future is settled it writes ``WORKDIR/outcomes.json``: per item its work ID and its outcome
(``ok``, ``raised``, or ``failed`` with the kind; for ``DependencyFailed`` the index of the
dependency it names and what that one's future failed with). If the executor's campaign ended
first (an operator's ``drain``: ``BrokenExecutor``) it writes ``WORKDIR/broken-<run>.json`` with
the reason and the outcomes of the futures settled by then (``null`` for the others) instead,
and exits 3; the next run resumes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import BrokenExecutor
from typing import Any

from torture_campaign import misbehave  # the same behaviours as a campaign's items

from durable_dispatch.core import RetryPolicy
from durable_dispatch.futures import DependencyFailed, MPIPoolExecutor, TaskFailed


class ItemError(Exception):
    """What a ``raise`` item raises (its index in ``args``)."""


def call(
    kind: str, arg: float, n: int, count: str, after: list[int], deps: list[Any]
) -> dict[str, int]:
    """Behave as the item's kind says; the value of a call that returns is a function of ``n``.
    ``deps`` are the values of the calls ``after`` names (their futures were the argument):
    each must be that call's value."""
    with open(count, "a") as f:
        f.write(f"{n} {os.environ.get('TORTURE_RUN', '?')} {time.time():.6f}\n")
    want = [{"n": j, "square": j * j} for j in after]
    if deps != want:
        raise AssertionError(f"call {n} received {deps!r} for its dependencies {after}")
    misbehave(kind, arg)
    if kind == "raise":
        raise ItemError(n)
    return {"n": n, "square": n * n}


def what(e: BaseException | None) -> str:
    """How a future failed, as the checker names a call's outcome."""
    if isinstance(e, ItemError):
        return "raised"
    if isinstance(e, TaskFailed):
        return f"failed:{e.kind}"
    return repr(e)


def outcome(f: Any, index: dict[str, int]) -> dict[str, Any]:
    """The outcome of future ``f`` (it waits for it); BrokenExecutor is raised."""
    try:
        return {"work_id": f.work_id, "ok": f.result()}
    except ItemError as e:
        return {"work_id": f.work_id, "raised": e.args[0]}
    except DependencyFailed as e:
        dep = index.get(e.dependency, e.dependency)  # type: ignore[arg-type]
        cause = what(e.__cause__)
        return {"work_id": f.work_id, "failed": e.kind, "dependency": dep, "cause": cause}
    except TaskFailed as e:
        return {"work_id": f.work_id, "failed": e.kind}


def main() -> int:
    scenario = json.loads(open(sys.argv[1]).read())
    workdir = sys.argv[2]
    run = os.environ.get("TORTURE_RUN", "?")
    # MPI is up on every rank (the runner ran MPI_Init before this): the nemesis may act now
    os.makedirs(os.path.join(workdir, "pids"), exist_ok=True)
    with open(os.path.join(workdir, "pids", "0"), "w") as f:
        f.write(str(os.getpid()))
    count = os.path.join(workdir, "count")
    with MPIPoolExecutor(
        task_timeout=scenario["task_timeout"],
        retry=RetryPolicy(scenario["retries"]),
        isolate=scenario["isolate"],
    ) as ex:
        fs: list[Any] = []
        for n, it in enumerate(scenario["items"]):
            after = list(it.get("after", ()))
            deps = [fs[j] for j in after]  # futures as an argument: dependencies
            fs.append(ex.submit(call, it["kind"], it.get("arg", 0), n, count, after, deps))
        index = {f.work_id: n for n, f in enumerate(fs)}
        _write(os.path.join(workdir, "wids.json"), [f.work_id for f in fs])
        try:
            out = [outcome(f, index) for f in fs]
        except BrokenExecutor as e:  # the campaign ended first (a drain): the next run resumes
            settled = [
                outcome(f, index) if f.done() and not isinstance(f.exception(), BrokenExecutor)
                else None
                for f in fs
            ]  # fmt: skip
            _write(os.path.join(workdir, f"broken-{run}.json"), {"why": str(e), "out": settled})
            return 3
    _write(os.path.join(workdir, "outcomes.json"), out)
    return 0


def _write(path: str, value: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
