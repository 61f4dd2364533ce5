"""``DurableCommExecutor`` (mpi4py's ``MPICommExecutor``): every rank runs this script under a
plain ``mpiexec``; rank 0 submits, the others serve and get None. ``argv``: the state directory,
and ``bug`` to raise in the ``with`` block on rank 0 (the job must end non-zero, not hang)."""

import sys
from pathlib import Path

from mpi4py import MPI

from durable_dispatch.futures import MPICommExecutor


class Odd(Exception):
    """Defined by this script: it must come back from an isolated child as itself."""


def cube(x):
    return x**3


def even_only(x):
    if x % 2:
        raise Odd(x)
    return x


if __name__ == "__main__":
    with MPICommExecutor(MPI.COMM_WORLD, 0, state_dir=sys.argv[1]) as ex:
        if ex is not None:
            print("sum", sum(ex.map(cube, range(30))), "workers", ex.num_workers, flush=True)
            try:
                ex.submit(even_only, 3).result()
            except Odd as e:
                print("raised Odd", e.args[0], flush=True)
            if sys.argv[2:] == ["bug"]:
                raise RuntimeError("a bug in the user's code")
    rank = MPI.COMM_WORLD.Get_rank()
    # the witness that this rank got out of the block: a file, because Intel MPI's launcher
    # can lose a rank's last line of output when the ranks end together (seen once in CI)
    (Path(sys.argv[1]) / f"left-{rank}").write_text("")
    print("rank", rank, "left", flush=True)
