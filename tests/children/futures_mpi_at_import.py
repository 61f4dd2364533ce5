"""An mpi4py script that calls MPI when it is imported (as most do), under the runner with the
default settings (isolated calls): the isolated child imports it too, and initializes MPI as a
world of its own. ``argv``: ``ok``, or ``broken`` to fail the import in the isolated child only
(the first call then fails with the child's reason and the fix)."""

import os
import sys

from mpi4py import MPI

from durable_dispatch.futures import BrokenExecutor, MPIPoolExecutor

SIZE = MPI.COMM_WORLD.Get_size()  # at import: in rank 0, the workers and the isolated child
if sys.argv[1:] == ["broken"] and os.environ.get("DURABLE_DISPATCH_ISOLATED_CHILD"):
    raise RuntimeError("this script cannot be imported here")


def world(x):
    return x, SIZE


if __name__ == "__main__":
    with MPIPoolExecutor() as ex:
        try:
            print("worlds", sorted({s for _, s in ex.map(world, range(8))}), flush=True)
        except BrokenExecutor as e:
            print("broken:", e, flush=True)
