"""One short campaign run from open to close, its fsyncs and metadata operations counted
through the fs seam.

    python -m tests.children.fixedcost_run STATE OUT N [KILL_AT]

Runs N trivial items at batch 64 with three in-process workers (campaign ``fixedcost``) on
state directory STATE, recording every fsync and directory fsync the run makes, and every
create, rename, link, unlink and mkdir, in order, as ``[op, kind]`` (:func:`kind_of` names the
file). With KILL_AT the process SIGKILLs itself right after its KILL_AT-th fsync returned
(counted from 1, whichever thread made it); otherwise it writes OUT as JSON:
``{"operations": [[op, kind], ...], "finished": bool, "seconds": the run's}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time


def kind_of(op: str, path: str, state: str) -> str:
    """What a synced ``path`` is, in a few words that do not depend on the run's random names."""
    if op in ("dir-fsync", "mkdir"):
        return "state directory" if os.path.abspath(path) == state else "parent directory"
    name = os.path.basename(path)
    for prefix, kind in (
        ("campaign-name.json", "campaign name"),
        (".owner-", "owner record"),
        ("master.owner.", "owner record"),
        (".campaign.", "snapshot"),
        (".master-stats.", "statistics"),
    ):
        if name.startswith(prefix):
            return kind
    return name


def main() -> None:
    state, out, n = os.path.abspath(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    from durable_dispatch import WorkItem
    from durable_dispatch.mpi import run_master
    from durable_dispatch.storage import fs
    from durable_dispatch.testing import LocalWorkers

    seen: list[list[str]] = []
    lock = threading.Lock()

    def record(op: str, path: str, detail: object) -> None:
        if op == "open" and detail:
            op = "create"
        elif op not in ("fsync", "dir-fsync", "replace", "link", "unlink", "mkdir"):
            return
        with lock:
            seen.append([op, kind_of(op, path, state)])
            if op.endswith("fsync") and sum(o.endswith("fsync") for o, _ in seen) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    fs.set_recorder(record)
    began = time.monotonic()
    report = run_master(
        [WorkItem(f"t{i}", {"i": i}) for i in range(n)],
        state,
        comm=LocalWorkers(lambda p: p, 3),
        batch=64,
        linger=0,
        campaign="fixedcost",
    )
    fs.set_recorder(None)
    took = time.monotonic() - began
    with open(out, "w") as f:
        json.dump({"operations": seen, "finished": report.finished, "seconds": took}, f)


if __name__ == "__main__":
    main()
