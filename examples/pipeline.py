"""A pipeline of stages, then a reduction: work that waits for work (docs/how-to/dependencies.md).

Each sample is fetched, then cleaned (after its fetch), then analysed (after its cleaning); one
report waits for every analysis. ``ctx.dependencies`` holds the results of an item's ``after``.
"""

import sys
import tempfile

from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers

SAMPLES = ["s1", "s2", "s3"]


def work(payload, ctx):
    stage, sample = payload["stage"], payload.get("sample")
    got = ctx.dependencies  # {work ID of each after: its committed result}
    if stage == "fetch":
        return [len(sample), 2, 3]
    if stage == "clean":
        return [x * 10 for x in got[f"fetch/{sample}"]]
    if stage == "analyse":
        return sum(got[f"clean/{sample}"])
    return {"total": sum(got.values()), "samples": len(got)}  # the report


def items():
    for s in SAMPLES:
        yield WorkItem(f"fetch/{s}", {"stage": "fetch", "sample": s})
        yield WorkItem(f"clean/{s}", {"stage": "clean", "sample": s}, after=[f"fetch/{s}"])
        yield WorkItem(f"analyse/{s}", {"stage": "analyse", "sample": s}, after=[f"clean/{s}"])
    yield WorkItem("report", {"stage": "report"}, after=[f"analyse/{s}" for s in SAMPLES])


if __name__ == "__main__":
    state = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dd-pipeline-")
    results = {}
    report = run_master(
        items(),
        state,
        lambda work_id, result: results.__setitem__(work_id, result),
        comm=LocalWorkers(work, 2, context=True),  # under mpiexec: run_worker(work, context=True)
    )
    print(report.finished, results["report"])
