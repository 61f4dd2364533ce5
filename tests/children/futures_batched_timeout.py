"""A call that hangs, sent in one dispatch with fast calls, each with ``task_timeout``: it fails
at its own timeout, not at the dispatch's (the sum of its calls'), and its batch-mates resolve.
Run under the runner; ``argv``: the task timeout. Prints how the hang failed, then ``done``."""

import sys
import time

from durable_dispatch.core import RetryPolicy
from durable_dispatch.futures import MPIPoolExecutor, TaskTimedOut


def fast(x):
    return x


def hang(x):
    time.sleep(3600)


if __name__ == "__main__":
    timeout = float(sys.argv[1])
    with MPIPoolExecutor(task_timeout=timeout, retry=RetryPolicy(0)) as ex:
        assert sum(ex.map(fast, range(4000))) == sum(range(4000))  # batch="auto" ramps up
        fs = [ex.submit(fast, -x) for x in range(1, 40)]
        stuck = ex.submit(hang, 0)
        fs += [ex.submit(fast, -x) for x in range(40, 80)]
        start = time.monotonic()
        try:
            stuck.result()
        except TaskTimedOut as e:
            print("timed out:", e, flush=True)
            print(f"after {time.monotonic() - start:.1f} s", flush=True)
        assert [f.result() for f in fs] == [-x for x in range(1, 80)]
    print("done", flush=True)
