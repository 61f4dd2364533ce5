"""A futures map-reduce whose map has a failing call, for ``tests/test_mpi_futures.py`` (issue
51): futures of the same executor passed as arguments.

``python -m durable_dispatch.futures --state-dir D futures_reduce.py COUNT KILL``: maps
``square`` over 0..39 (``square(13)`` raises), reduces the even ones with ``total(list of
futures)`` and the odd ones with ``total(*futures)``, and pairs every map with ``pair(x=f)``.
Every execution appends ``<fn> <x>`` to COUNT. With KILL ``yes`` rank 0 SIGKILLs itself once
the reductions are submitted and 10 maps are done. Prints one ``<name> <value or error>`` line
per outcome.
"""

import os
import signal
import sys
import time

from durable_dispatch.futures import DependencyFailed, MPIPoolExecutor, wait


def _count(what):
    with open(sys.argv[1], "a") as f:
        f.write(f"{what}\n")


def square(x):
    _count(f"square {x}")
    time.sleep(0.05)
    if x == 13:
        raise ValueError("thirteen")
    return x * x


def total(values, *more):
    _count("total")
    return sum(values) + sum(more) if isinstance(values, list) else values + sum(more)


def pair(*, x):
    _count("pair")
    return ("pair", x)


def show(name, fut):
    try:
        print(name, fut.result(), flush=True)
    except DependencyFailed as e:
        cause = e.__cause__
        print(
            name,
            "DependencyFailed",
            e.dependency == maps[13].work_id,
            type(cause).__name__,
            cause,
            flush=True,
        )
    except ValueError as e:
        print(name, "ValueError", e, flush=True)


if __name__ == "__main__":
    kill = sys.argv[2] == "yes"
    with MPIPoolExecutor() as ex:
        maps = [ex.submit(square, x) for x in range(40)]
        evens = ex.submit(total, [f for i, f in enumerate(maps) if i % 2 == 0])
        odds = ex.submit(total, *[f for i, f in enumerate(maps) if i % 2 == 1])
        pairs = [ex.submit(pair, x=f) for f in maps[:4]]
        if kill:
            wait(maps[:10])
            os.kill(os.getpid(), signal.SIGKILL)
        for i, f in enumerate(maps):
            show(f"square{i}", f)
        show("evens", evens)
        show("odds", odds)
        for i, f in enumerate(pairs):
            show(f"pair{i}", f)
    print("done", flush=True)
