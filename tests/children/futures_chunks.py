"""A chunked ``map`` under the runner, for ``tests/test_futures_chunks.py``.

``python -m durable_dispatch.futures --state-dir D futures_chunks.py COUNT MODE``: every
execution of ``work`` appends its input to the file ``COUNT``. ``MODE`` ``checks``: maps with
``chunksize > 1`` (values in order for ``map``, ``starmap`` and ``unordered``; a call that raises;
a call whose isolated child is SIGKILLed; a future of the executor as an argument; an argument
that cannot be pickled), one line printed per check. ``MODE`` an integer ``K``: a map of 200
calls in chunks of 8, each result printed as it comes; with ``K >= 0`` rank 0 SIGKILLs itself
after printing ``K`` results (the job dies mid-``map``).
"""

import os
import signal
import sys
import threading
import time

from durable_dispatch import RetryPolicy
from durable_dispatch.futures import MPIPoolExecutor, TaskCrashed, TaskTimedOut
from durable_dispatch.futures._calls import call_digest


def work(count, x):
    with open(count, "a") as f:
        f.write(f"{x}\n")
    if x == 37:
        raise ValueError(f"bad {x}")
    if x == 151:
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def add(count, a, b):
    return work(count, a) + b


def slow(count, x):
    with open(count, "a") as f:
        f.write(f"{x}\n")
    time.sleep(0.01)
    return x * x


def nap(count, x, seconds):
    with open(count, "a") as f:
        f.write(f"{x}\n")
    time.sleep(seconds)
    return x


def deadlines(count):
    """A chunk's deadline is task_timeout per call: four calls of 0.6 s each fit in the chunk's
    4 s (one call's 1 s would not); a call that hangs fails alone with TaskTimedOut."""
    with MPIPoolExecutor(task_timeout=1, retry=RetryPolicy(0)) as ex:
        got = list(ex.map(nap, [count] * 4, range(300, 304), [0.6] * 4, chunksize=4))
        print("deadline", got == list(range(300, 304)))
        seen = []
        try:
            for v in ex.map(nap, [count] * 4, range(310, 314), [0.1, 0.1, 60, 0.1], chunksize=4):
                seen.append(v)
        except TaskTimedOut as e:
            print("hung", e.kind, seen == [310, 311])


def checks(count):
    with MPIPoolExecutor(task_timeout=30) as ex:
        print(
            "map",
            list(ex.map(work, [count] * 30, range(30), chunksize=8)) == [x * x for x in range(30)],
        )
        pairs = [(count, x, 1) for x in range(40, 60)] + [[count, 60, 1]]  # a list too
        print(
            "starmap",
            list(ex.starmap(add, pairs, chunksize=6)) == [x * x + 1 for x in range(40, 61)],
        )
        got = sorted(ex.map(work, [count] * 20, range(60, 80), chunksize=7, unordered=True))
        print("unordered", got == [x * x for x in range(60, 80)])
        seen = []
        try:
            for v in ex.map(work, [count] * 8, range(32, 40), chunksize=8):
                seen.append(v)
        except ValueError as e:
            print("raised", e, seen == [x * x for x in range(32, 37)], e.__cause__ is not None)
        seen = []
        try:
            for v in ex.map(work, [count] * 8, range(144, 152), chunksize=8):
                seen.append(v)
        except TaskCrashed as e:
            single = e.work_id.split("/")[1] == call_digest(work, (count, 151), {})
            print("crashed", e.kind, single, seen == [x * x for x in range(144, 151)])
        first = ex.submit(work, count, 200)
        print(
            "dependency",
            list(ex.map(add, [count] * 3, [201, 202, 203], [first] * 3, chunksize=3))
            == [201**2 + 40000, 202**2 + 40000, 203**2 + 40000],
        )
        try:
            list(ex.map(work, [count] * 3, [204, 205, threading.Lock()], chunksize=4))
        except TypeError as e:
            print("unpicklable", "pickle" in str(e))


def job(count, kill_at):
    with MPIPoolExecutor() as ex:
        for i, r in enumerate(ex.map(slow, [count] * 200, range(200), chunksize=8)):
            print(f"result {r}", flush=True)
            if i + 1 == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    print("done", flush=True)


def on_self(count, directory):
    from mpi4py import MPI

    from durable_dispatch import read_results
    from durable_dispatch.futures import MPICommExecutor

    state = os.path.join(directory, "self")
    with MPICommExecutor(MPI.COMM_SELF, state_dir=state) as ex:
        squares = list(ex.map(slow, [count] * 37, range(37), chunksize=8))
        sums = list(ex.starmap(add, [(count, x, 1) for x in range(40, 50)], chunksize=4))
    rows = list(read_results(state))
    print(
        "self",
        squares == [x * x for x in range(37)],
        sums == [x * x + 1 for x in range(40, 50)],
        len(rows),
    )
    before = len(open(count).read().split())
    with MPICommExecutor(MPI.COMM_SELF, state_dir=state) as ex:
        again = list(ex.map(slow, [count] * 37, range(37), chunksize=8))
    print("again", again == squares, len(open(count).read().split()) - before)


if __name__ == "__main__":
    if sys.argv[2] == "self":
        on_self(sys.argv[1], sys.argv[3])
    elif sys.argv[2] == "checks":
        checks(sys.argv[1])
        deadlines(sys.argv[1])
    else:
        job(sys.argv[1], int(sys.argv[2]))
