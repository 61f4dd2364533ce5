"""The README's master loop, runnable: the facade a hand-written master calls, one call per
thing that happened. ``run_master`` runs this loop, plus signals, progress, ULFM and linger.

Run it in-process with ``python examples/loop.py [STATE_DIR]`` (workers: ``LocalWorkers``), or
under MPI as ``mpiexec -n 4 python examples/loop.py STATE_DIR --mpi``. ``tests/test_docs.py``
runs it and checks that the README shows the region between the ``--8<--`` marks as it is here.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterable
from typing import Any

from durable_dispatch import CampaignState, WorkItem
from durable_dispatch.mpi import protocol as P
from durable_dispatch.mpi.transport import Transport

LIMIT = 4096  # messages read per turn


def work(payload: dict[str, int]) -> dict[str, int]:
    """The work function (module level: an isolated child finds it by name)."""
    return {"y": payload["x"] * 2}


def master(link: Transport, state_dir: str, items: Iterable[WorkItem], on_commit: Any) -> bool:
    """Run a campaign over ``link`` until every item is committed or deferred; True if so."""
    batch = 1
    # --8<-- [start:loop]
    ranks = range(1, link.size)  # rank 0 is this master; workers start, then say READY
    with CampaignState.open(state_dir, ranks=ranks, starting=True, on_commit=on_commit) as state:
        state.submit(items)  # known work IDs are skipped on resume
        state.deliver()  # what the last run did not deliver, first (your on_commit)
        while not state.done:
            now, msgs = state.now(), link.receive(LIMIT)  # observed clock; never blocks
            inbox = P.sort(msgs)  # decoded by kind, each in arrival order
            for rank, token in inbox.readies:  # 1. READY (releases parked ranks too)
                state.on_ready(rank, token, now)
            for rank, token in inbox.beats:
                state.on_heartbeat(rank, token, now)
            for rank, why in inbox.gone:  # a worker that failed and ends
                state.on_gone(rank, why, now)
            while (s := state.next_send(now, batch)) is not None:  # 2. dispatch, journaled
                error = link.send(s.rank, P.WORK, P.work_message(s))  # before it is sent
                state.sent(s.token, state.now(), error)  # the deadline starts now
            for rank, token, values, errors, failure in inbox.results:  # 3. RESULT: a
                state.on_results(rank, token, values, now, errors=errors, failure=failure)
            state.tick(state.now(), drained=len(msgs) < LIMIT)  # 4. close, join; 5. sweep
            state.deliver()  # 6. the delivery point: your callbacks run here, and only here
        done = state.done
    link.stop(ranks, P.encode({}), P.STOP, timeout=10.0)  # close() delivered every commit
    # --8<-- [end:loop]
    return done


def main(argv: list[str]) -> int:
    state_dir = argv[1] if len(argv) > 1 else tempfile.mkdtemp(prefix="dd-loop-")
    items = [WorkItem(f"w{i:02d}", {"x": i}) for i in range(20)]
    seen: dict[str, Any] = {}
    if "--mpi" in argv:
        from mpi4py import MPI

        from durable_dispatch.mpi import run_worker
        from durable_dispatch.mpi.transport import MpiTransport

        if MPI.COMM_WORLD.Get_rank() != 0:
            run_worker(work)
            return 0
        link: Transport = MpiTransport()
    else:
        from durable_dispatch.testing import LocalWorkers

        link = LocalWorkers(work, 3)
    done = master(link, state_dir, items, seen.__setitem__)
    print(f"finished={done} committed={len(seen)} state={state_dir}")
    # --8<-- [start:results]
    from durable_dispatch import read_results

    for r in read_results(state_dir):  # commit order, one per work ID
        print(r.work_id, r.result, r.epoch, r.rank, r.ts)
    # --8<-- [end:results]
    right = all(seen[w.work_id] == {"y": 2 * w.payload["x"]} for w in items if w.work_id in seen)
    return 0 if done and right else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
