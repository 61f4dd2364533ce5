"""A campaign in a process of its own, for the owner-record tests (S13).

    python -m tests.children.owner_campaign STATE OUT N DELAY [--as-node NAME]

Runs N items (each sleeps DELAY seconds) with two in-process workers, appends each committed
work ID to OUT.commits, and writes OUT as JSON: {"finished": bool} or {"error": type,
"host": ..., "pid": ...}. ``--as-node`` makes this process look like one on another node (its
owner record names host NAME and a boot ID of its own), as a second job on another node does.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    state, out, n, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    if "--as-node" in sys.argv:
        from durable_dispatch.storage import owner

        name = sys.argv[sys.argv.index("--as-node") + 1]
        real = owner._identity

        def other_node() -> dict[str, object]:
            me = real()
            me.update(host=name, boot_id=f"boot-of-{name}", pidns=1)
            return me

        owner._identity = other_node  # type: ignore[assignment]
    from durable_dispatch import WorkItem
    from durable_dispatch.errors import LockHeldError
    from durable_dispatch.mpi import run_master
    from durable_dispatch.testing import LocalWorkers

    def fn(payload: object) -> object:
        time.sleep(delay)
        return payload

    commits = open(out + ".commits", "a")

    def on_commit(work_id: str, result: object) -> None:
        commits.write(work_id + "\n")
        commits.flush()

    items = [WorkItem(f"w{i:04d}", i) for i in range(n)]
    try:
        report = run_master(items, state, on_commit, comm=LocalWorkers(fn, 2), linger=0)
        result: dict[str, object] = {"finished": report.finished}
    except LockHeldError as e:
        result = {"error": "LockHeldError", "host": e.host, "pid": e.pid, "message": str(e)}
    except Exception as e:  # noqa: BLE001 - reported to the test
        result = {"error": type(e).__name__, "message": str(e)}
    with open(out + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main()
