"""A failed call retried by an operator, for ``tests/test_meeting.py`` (issue 58).

``python -m durable_dispatch.futures --state-dir D futures_retry.py FLAG MARK``: ``dep`` crashes
while the file FLAG does not exist (it writes its work ID to MARK), ``after`` takes its future
as an argument. The script prints how each future ended.
"""

import os
import sys

from durable_dispatch import RetryPolicy
from durable_dispatch.errors import DependencyFailed
from durable_dispatch.futures import MPIPoolExecutor


def flaky(flag):
    if not os.path.exists(flag):
        os._exit(3)  # a crash (isolated: only this call's future fails, TaskCrashed)
    return 5


def plus(x, y):
    return x + y


if __name__ == "__main__":
    flag, mark = sys.argv[1], sys.argv[2]
    with MPIPoolExecutor(retry=RetryPolicy(retries=0)) as ex:
        dep = ex.submit(flaky, flag)
        after = ex.submit(plus, dep, 1)
        with open(mark, "w") as f:
            f.write(dep.work_id)
        try:
            print("dep returned", dep.result(), flush=True)
        except Exception as e:
            print("dep", type(e).__name__, flush=True)
        try:
            print("after returned", after.result(), flush=True)
        except DependencyFailed:
            print("after DependencyFailed", flush=True)
