"""A futures script whose worker rank dies while the executor's session starts, for
``tests/test_mpi_futures.py`` (a torture finding: under ULFM the other workers waited forever
for the dead one to make the workers' communicator, and the job never ended).

``python -m durable_dispatch.futures --state-dir D futures_worker_dies_at_session.py COUNT``
maps ``work`` over 12 inputs with ``isolate=False`` and prints each result; every execution of
``work`` appends its input to ``COUNT``. With ``DIE_RANK=k`` and ``DIE_AT=name`` in the
environment, worker rank ``k`` SIGKILLs itself when it enters the runner's function ``name``
(a profile function this script installs when the worker imports it, no hook of the library):
``serve`` (as it starts serving, before the session's communicator is made),
``_workers_comm`` (before the workers' communicator is made) or ``_session`` (after it, as the
session's thread starts). It writes ``DIE_MARK`` first, so the test knows the kill happened.
A ``BrokenExecutor`` (the session could not start) prints ``broken: why`` and exits 3.
"""

import os
import signal
import sys
import threading
import time
from concurrent.futures import BrokenExecutor

from durable_dispatch.futures import MPIPoolExecutor


def work(count, x):
    with open(count, "a") as f:
        f.write(f"{x}\n")
    time.sleep(0.01)
    return x * x


def _die_at(name: str, mark: str):
    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == name:
            with open(mark, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)

    return profile


if __name__ != "__main__" and os.environ.get("DIE_RANK"):
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == int(os.environ["DIE_RANK"]):
        hook = _die_at(os.environ["DIE_AT"], os.environ["DIE_MARK"])
        sys.setprofile(hook)  # the rank's main thread (serve)
        threading.setprofile(hook)  # a session's thread


if __name__ == "__main__":
    count = sys.argv[1]
    try:
        with MPIPoolExecutor(isolate=False) as ex:
            for x, y in zip(range(12), ex.map(work, [count] * 12, range(12)), strict=True):
                print(f"result {x} {y}", flush=True)
    except BrokenExecutor as e:
        print(f"broken: {e}", flush=True)
        sys.exit(3)
    print("done", flush=True)
