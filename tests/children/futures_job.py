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
from dataclasses import dataclass

from durable_dispatch.futures import MPIPoolExecutor  # was: from mpi4py.futures import ...


@dataclass
class Square:
    """A class this script defines: the isolated children pickle it as __mp_main__.Square."""

    x: int
    y: int


def work(count, x):
    with open(count, "a") as f:
        f.write(f"{x}\n")
    time.sleep(0.02)
    return (x, Square(x, x * x))  # a tuple comes back a tuple, a Square a Square


if __name__ == "__main__":
    count, kill_at = sys.argv[1], int(sys.argv[2])
    with MPIPoolExecutor() as ex:
        for i, r in enumerate(ex.map(work, [count] * 60, range(60))):
            assert isinstance(r, tuple) and isinstance(r[1], Square)
            print(f"result {r[0]} {r[1].y}", flush=True)
            if i + 1 == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    print("done", flush=True)
