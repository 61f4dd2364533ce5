from mpi4py.futures import MPIPoolExecutor


def simulate(seed, steps=20_000):
    x = seed
    for _ in range(steps):
        x = (x * 1103515245 + 12345) % 2**31
    return seed, x


if __name__ == "__main__":
    with MPIPoolExecutor() as ex:
        best = max(ex.map(simulate, range(200)), key=lambda r: r[1])
    print("best seed", best[0])
