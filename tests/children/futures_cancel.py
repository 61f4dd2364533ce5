"""An operator cancels a running call of a futures script, for ``tests/test_mpi_futures.py``
(issues 51 and 52).

``python -m durable_dispatch.futures --state-dir D futures_cancel.py MARK``: one isolated call
blocks for 300 s (it writes its work ID to ``MARK`` once running), a second call takes the first
one's future as an argument. The test runs ``durable-dispatch cancel D/executor-1 ID``; the
script prints how each future ended: the first with TaskFailed (kind ``cancelled``), the second
with DependencyFailed caused by the first's exception. A re-run prints the same from the record.
"""

import sys
import time

from durable_dispatch.errors import DependencyFailed, TaskFailed
from durable_dispatch.futures import MPIPoolExecutor


def block(seconds):
    time.sleep(seconds)
    return seconds


def plus(x, y):
    return x + y


if __name__ == "__main__":
    mark = sys.argv[1]
    with MPIPoolExecutor(task_timeout=600) as ex:
        slow = ex.submit(block, 300)
        after = ex.submit(plus, slow, 1)
        with open(mark + ".tmp", "w") as f:
            f.write(slow.work_id)
        import os

        os.replace(mark + ".tmp", mark)
        try:
            print("slow returned", slow.result(), flush=True)
        except TaskFailed as e:
            print("slow", type(e).__name__, e.kind, flush=True)
        try:
            print("after returned", after.result(), flush=True)
        except DependencyFailed as e:
            print("after DependencyFailed", type(e.__cause__).__name__, flush=True)
