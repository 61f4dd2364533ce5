"""``MPICommExecutor(MPI.COMM_SELF)`` in a plain script (not under the runner): as in mpi4py, a
communicator of one rank runs the calls in a thread of it; here each call is durable all the
same (a second executor on the same state directory resolves them from the record, at submit).
``argv``: a directory for the state directories."""

import os
import sys

from mpi4py import MPI

from durable_dispatch.futures import BrokenExecutor, MPICommExecutor, get_comm_workers


def square(x):
    return x * x


def workers():
    return get_comm_workers().Get_size()


def fail(x):
    raise KeyError(x)


if __name__ == "__main__":
    state = os.path.join(sys.argv[1], "self")
    with MPICommExecutor(MPI.COMM_SELF, 0, state_dir=state) as ex:
        print("squares", sum(ex.map(square, range(20))), flush=True)
        print("workers", ex.num_workers, ex.submit(workers).result(), flush=True)
        try:
            ex.submit(fail, 3).result()
        except KeyError as e:
            print("raised", e, flush=True)
    with MPICommExecutor(MPI.COMM_SELF, state_dir=state) as ex:
        fs = [ex.submit(square, x) for x in range(20)]
        print("from the record", all(f.done() for f in fs), flush=True)
    broken = os.path.join(sys.argv[1], "broken")
    with MPICommExecutor(MPI.COMM_SELF, initializer=fail, initargs=(0,), state_dir=broken) as ex:
        try:
            ex.submit(square, 2).result()
        except BrokenExecutor as e:
            print("broken", "the initializer failed: KeyError" in str(e), flush=True)
