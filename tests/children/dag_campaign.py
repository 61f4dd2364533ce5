"""A campaign of work that waits for work (issue 51, G4): a random DAG of NODES items with
fan-in and fan-out, items that always fail, one ``after`` ID never submitted and a cycle.
Run by tests/test_dependencies.py in process (over ``testing.LocalWorkers``) and under
``mpiexec``, SIGKILLed at random moments, and checked against :func:`expected`.

Usage: python dag_campaign.py STATE_DIR KILL local        (in process, 3 local workers)
       mpiexec -n 4 python dag_campaign.py STATE_DIR KILL mpi
KILL is ``none`` or ``after:<seconds>`` (a timer SIGKILLs the master). The master prints
``REPORT <finished>``.

Each node's result is ``payload + sum of its dependencies' results`` (mod 2**31), read from
``ctx.dependencies``, so a wrong or missing dependency result shows in every value after it.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sys
import threading
import time
from typing import Any

NODES = 2000
MOD = 2**31
#: nodes whose work always raises
FAILING = {n for n in range(NODES) if n % 97 == 13}
#: a node that names an ID never submitted
MISSING_AT = 1500
#: three nodes in a cycle (each names the next), and the nodes that name them
CYCLE = (1700, 1701, 1702)


def deps(n: int) -> list[str]:
    """The ``after`` IDs of node ``n``: 0 to 3 earlier nodes (deterministic)."""
    if n in CYCLE:
        return [f"n{CYCLE[(CYCLE.index(n) + 1) % 3]}"]
    d = hashlib.sha256(str(n).encode()).digest()
    picks = {int.from_bytes(d[2 * k : 2 * k + 2], "big") % n for k in range(d[9] % 4)} if n else ()
    out = [f"n{m}" for m in sorted(picks)]
    if n == MISSING_AT:
        out.append("missing-id")
    if n == 1703:
        out.append(f"n{CYCLE[0]}")
    return out


def payload(n: int) -> int:
    return n * 7 + 1


def items() -> list[Any]:
    """Every node as a work item, in a shuffled order (a dependent often comes first)."""
    from durable_dispatch import WorkItem

    order = list(range(NODES))
    random.Random(51).shuffle(order)
    return [WorkItem(f"n{n}", payload(n), after=tuple(deps(n)), priority=n % 3) for n in order]


def expected() -> tuple[dict[str, int], dict[str, str]]:
    """The committed values, and the deferred IDs with the kind of their last failure."""
    values: dict[str, int] = {}
    deferred: dict[str, str] = {}
    state: dict[int, str] = {}

    def visit(n: int, stack: set[int]) -> str:
        if n in state:
            return state[n]
        if n in stack:
            return "dependency"
        stack.add(n)
        verdict = "ok"
        for dep in deps(n):
            if not dep.startswith("n"):
                verdict = "dependency"
                continue
            if visit(int(dep[1:]), stack) != "ok":
                verdict = "dependency"
        stack.discard(n)
        if verdict == "ok" and n in FAILING:
            verdict = "error"
        state[n] = verdict
        return verdict

    for n in range(NODES):
        visit(n, set())
    for n in range(NODES):
        if state[n] == "ok":
            continue
        deferred[f"n{n}"] = state[n]
    for n in range(NODES):  # in index order: every dependency is earlier (but the cycle's)
        if state[n] == "ok":
            values[f"n{n}"] = (payload(n) + sum(values[d] for d in deps(n))) % MOD
    return values, deferred


def work(p: int, ctx: Any) -> int:
    n = (p - 1) // 7
    if n in FAILING:
        raise RuntimeError(f"node {n} fails")
    got = dict(ctx.dependencies)
    if sorted(got) != sorted(deps(n)):
        raise AssertionError(f"node {n}: dependencies {sorted(got)} != {deps(n)}")
    time.sleep(0.0005)
    return (p + sum(got.values())) % MOD


def main() -> None:
    from durable_dispatch import RetryPolicy, WatchdogConfig
    from durable_dispatch.mpi import run_master

    state, kill, how = sys.argv[1], sys.argv[2], sys.argv[3]
    what, _, arg = kill.partition(":")
    if what == "after":
        threading.Timer(float(arg), lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    comm = None
    if how == "local":
        from durable_dispatch.testing import LocalWorkers

        comm = LocalWorkers(work, 3, context=True)
    report = run_master(
        items(),
        state,
        comm=comm,
        watchdog=WatchdogConfig.build(60),
        retry=RetryPolicy(retries=1),
        batch=4,
    )
    print("REPORT", report.finished, flush=True)


if __name__ == "__main__":
    if sys.argv[3] == "mpi":
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() != 0:
            from durable_dispatch.mpi import run_worker

            run_worker(work, context=True)
            sys.exit(0)
    main()
