"""An mpi4py.futures script, changed in its import line only, for ``tests/test_mpi_futures.py``.

``python -m durable_dispatch.futures --state-dir D futures_job.py COUNT KILL_AT``: maps ``work``
over 60 inputs and prints each result as it comes (one line each); every execution of ``work``
appends its input to the file ``COUNT``. With ``KILL_AT`` >= 0, rank 0 SIGKILLs itself after
printing that many results (the job dies mid-``map``, as on a node failure or ``scancel``).
"""

import os
import signal
import sys
import time

from durable_dispatch.futures import MPIPoolExecutor  # was: from mpi4py.futures import ...


def work(count, x):
    with open(count, "a") as f:
        f.write(f"{x}\n")
    time.sleep(0.02)
    return (x, x * x)  # a tuple comes back a tuple


if __name__ == "__main__":
    count, kill_at = sys.argv[1], int(sys.argv[2])
    with MPIPoolExecutor() as ex:
        for i, r in enumerate(ex.map(work, [count] * 60, range(60))):
            assert isinstance(r, tuple)
            print(f"result {r[0]} {r[1]}", flush=True)
            if i + 1 == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    print("done", flush=True)
