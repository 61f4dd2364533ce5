"""Two pools open at once (one per stage), for ``tests/test_mpi_futures.py`` (issue 48).

``python -m durable_dispatch.futures --state-dir D futures_two.py COUNT KILL_AT``: executor-1
squares and executor-2 negates 40 inputs each, the calls submitted in turn to one and the other,
and prints each result as it comes, in turn (``a X Y`` and ``b X Y``, one line each); every
execution appends ``a X`` or ``b X`` to the file ``COUNT``. With ``KILL_AT`` >= 0, rank 0
SIGKILLs itself after printing that many lines (both executors die mid-call).
"""

import os
import signal
import sys
import time

from durable_dispatch.futures import MPIPoolExecutor  # was: from mpi4py.futures import ...


def square(count, x):
    with open(count, "a") as f:
        f.write(f"a {x}\n")
    time.sleep(0.02)
    return x * x


def negate(count, x):
    with open(count, "a") as f:
        f.write(f"b {x}\n")
    time.sleep(0.02)
    return -x


if __name__ == "__main__":
    count, kill_at = sys.argv[1], int(sys.argv[2])
    first, second = MPIPoolExecutor(), MPIPoolExecutor()
    fa, fb = [], []
    for x in range(40):
        fa.append(first.submit(square, count, x))
        fb.append(second.submit(negate, count, x))
    printed = 0
    for x in range(40):
        for name, f in (("a", fa[x]), ("b", fb[x])):
            print(f"{name} {x} {f.result()}", flush=True)
            printed += 1
            if printed == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    first.shutdown()
    second.shutdown()
    print("done", flush=True)
