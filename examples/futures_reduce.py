"""Map then reduce with futures as arguments (docs/how-to/dependencies.md).

mpiexec -n 4 python -m durable_dispatch.futures --state-dir state examples/futures_reduce.py
"""

from durable_dispatch.futures import DependencyFailed, MPIPoolExecutor


def simulate(seed):  # at module level: the workers find it by name
    if seed == 7:
        raise ValueError("seed 7 diverged")
    return seed * seed


def total(values):
    return sum(values)


if __name__ == "__main__":
    with MPIPoolExecutor() as ex:
        maps = [ex.submit(simulate, s) for s in range(10)]
        good = ex.submit(total, [m for s, m in enumerate(maps) if s != 7])  # waits for them
        everything = ex.submit(total, maps)  # waits too, but one of its inputs fails
        print("good", good.result())
        try:
            everything.result()
        except DependencyFailed as e:
            print("everything failed:", repr(e.__cause__))  # the map's own exception
