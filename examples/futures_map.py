"""An mpi4py.futures script made durable by one changed import (docs/futures.md).

mpiexec -n 4 python -m durable_dispatch.futures --state-dir state examples/futures_map.py
"""

from durable_dispatch.futures import MPIPoolExecutor  # was: from mpi4py.futures import ...


def simulate(seed, steps=20_000):  # at module level: the workers find it by name
    x = seed
    for _ in range(steps):
        x = (x * 1103515245 + 12345) % 2**31
    return seed, x


if __name__ == "__main__":
    with MPIPoolExecutor(task_timeout=60) as ex:  # a call past 60 s fails alone
        best = max(ex.map(simulate, range(200)), key=lambda r: r[1])
    print("best seed", best[0])  # a re-run prints it at once, from the record
