"""Operator commands (issue 52): what the master's polling costs, and how long a command takes
from the command line to its effect.

Usage: ``python benchmarks/bench_control.py [--commands 10]``

Prints one JSON object:

* ``due_ns_idle``: one ``Inbox.due(now)`` between polls (the master's loop compares
  ``next_poll`` first, so a turn pays less than this);
* ``due_us_poll``: one poll with nothing new (a ``stat`` of ``control/``, every 0.5 s);
* ``latency_s``: median, max of ``--commands`` ``cancel`` commands sent with
  ``steer.send`` to a running in-process master (``LocalWorkers``, items of 20 ms), from
  the call to the acknowledgement read (the effect is journaled and fsynced before it).

Not a test: nothing here asserts a time (the per-task figures are ``compare.py``'s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from durable_dispatch import WorkItem  # noqa: E402
from durable_dispatch.campaign.control import Inbox  # noqa: E402
from durable_dispatch.cli.steering import send  # noqa: E402
from durable_dispatch.mpi import run_master  # noqa: E402
from durable_dispatch.testing import LocalWorkers  # noqa: E402


def _work(payload: object) -> object:
    time.sleep(0.02)
    return payload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commands", type=int, default=10)
    args = ap.parse_args()
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "state"
        d.mkdir()
        (d / "control").mkdir()
        inbox = Inbox(str(d))
        inbox.due(0.0)
        n = 1_000_000
        t = time.perf_counter_ns()
        for _ in range(n):
            inbox.due(0.1)
        out["due_ns_idle"] = round((time.perf_counter_ns() - t) / n, 1)
        k = 2000
        t = time.perf_counter_ns()
        for i in range(k):
            inbox.due(1.0 + i)
        out["due_us_poll"] = round((time.perf_counter_ns() - t) / k / 1000, 2)

        state = Path(tmp) / "campaign"
        items = [WorkItem(f"w{i}") for i in range(2000)]
        took: list[float] = []
        done = threading.Event()

        def operator() -> None:
            time.sleep(1.0)  # the master is running
            for i in range(args.commands):
                t0 = time.monotonic()
                sent = send(str(state), "cancel", {"work_ids": [f"w{1999 - i}"]}, poll=0.01)
                assert sent.how == "master", sent
                took.append(time.monotonic() - t0)
            done.set()

        th = threading.Thread(target=operator)
        th.start()
        run_master(items, state, comm=LocalWorkers(_work, workers=1), max_seconds=5 + args.commands)
        th.join()
        out["latency_s"] = {
            "median": round(statistics.median(took), 3),
            "max": round(max(took), 3),
            "n": len(took),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
