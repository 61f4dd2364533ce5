"""A script with a bug on rank 0 after it submitted work, run under the runner: the job must end
non-zero within seconds with the error shown (U8), never hang."""

import time

from durable_dispatch.futures import MPIPoolExecutor


def slow(x):
    time.sleep(0.2)
    return x


if __name__ == "__main__":
    ex = MPIPoolExecutor()
    futures = [ex.submit(slow, i) for i in range(100)]
    print(futures[0].result(), flush=True)
    raise KeyError("a bug in the user's script")
