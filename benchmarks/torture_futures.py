"""One run of a torture scenario of the futures executor (``"mode": "futures"``, see
``torture.py``), under its runner::

    mpiexec -n N python -m durable_dispatch.futures --state-dir WORKDIR/fstate \\
        torture_futures.py SCENARIO.json WORKDIR

Rank 0 submits one call per item and waits for every future; each execution of a call appends
``<index> <run>`` to ``WORKDIR/count`` (``TORTURE_RUN`` names the run), so the checker can see
which calls ran again after a restart. When every future is settled it writes
``WORKDIR/outcomes.json``: per item its work ID and its outcome (``ok``, ``raised`` or
``failed`` with the kind).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from torture_campaign import misbehave  # the same behaviours as a campaign's items

from durable_dispatch.core import RetryPolicy
from durable_dispatch.futures import MPIPoolExecutor, TaskFailed


class ItemError(Exception):
    """What a ``raise`` item raises (its index in ``args``)."""


def call(kind: str, arg: float, n: int, count: str) -> dict[str, int]:
    """Behave as the item's kind says; the value of a call that returns is a function of ``n``."""
    with open(count, "a") as f:
        f.write(f"{n} {os.environ.get('TORTURE_RUN', '?')}\n")
    misbehave(kind, arg)
    if kind == "raise":
        raise ItemError(n)
    return {"n": n, "square": n * n}


if __name__ == "__main__":
    scenario = json.loads(open(sys.argv[1]).read())
    workdir = sys.argv[2]
    # MPI is up on every rank (the runner ran MPI_Init before this): the nemesis may act now
    os.makedirs(os.path.join(workdir, "pids"), exist_ok=True)
    with open(os.path.join(workdir, "pids", "0"), "w") as f:
        f.write(str(os.getpid()))
    count = os.path.join(workdir, "count")
    out: list[dict[str, Any]] = []
    with MPIPoolExecutor(
        task_timeout=scenario["task_timeout"],
        retry=RetryPolicy(scenario["retries"]),
        isolate=scenario["isolate"],
    ) as ex:
        fs = [
            ex.submit(call, it["kind"], it.get("arg", 0), n, count)
            for n, it in enumerate(scenario["items"])
        ]
        for f in fs:
            try:
                out.append({"work_id": f.work_id, "ok": f.result()})
            except ItemError as e:
                out.append({"work_id": f.work_id, "raised": e.args[0]})
            except TaskFailed as e:
                out.append({"work_id": f.work_id, "failed": e.kind})
    tmp = os.path.join(workdir, "outcomes.json.tmp")
    with open(tmp, "w") as f:
        json.dump(out, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(workdir, "outcomes.json"))
