"""The worker's reaper (U3, issue 60): when a process that started it dies, however it dies,
what it started dies too. Real processes, real SIGKILL; Linux only (``/proc``, prctl)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the reaper needs Linux (/proc, prctl)"
)

# A stand-in for a worker rank: it starts its reaper, then programs as an item would, prints
# their pids, and waits. LEAD: it leads its own group (as Open MPI's and MPICH's ranks do);
# else it shares its parent's (as Slurm's tasks of a node do). SCRUB: the program is started
# with an environment of its own (no mark).
WORKER = """
import os, subprocess, sys, threading, time
from durable_dispatch import processes
lead, scrub = sys.argv[1] == "1", sys.argv[2] == "1"
if lead:
    os.setpgid(0, 0)
assert processes.start_reaper()
env = {"PATH": os.environ["PATH"]} if scrub else None
shell = subprocess.Popen(["sh", "-c", "sleep 300; true"], env=env)
alone = subprocess.Popen(["sleep", "301"], start_new_session=True)  # left its group
t = threading.Thread(target=lambda: None)  # a thread that ends: not the process's death
t.start(); t.join()
print(shell.pid, alone.pid, flush=True)
time.sleep(300)
"""


# A stand-in for the first task of a node under srun: it leads a group that another rank (a
# sibling it starts first, in its group, without the mark) shares.
SHARED = """
import os, subprocess, time
from durable_dispatch import processes
sibling = subprocess.Popen(["sleep", "303"])
assert processes.start_reaper()
shell = subprocess.Popen(["sh", "-c", "sleep 300; true"])
print(sibling.pid, shell.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _catches(pid: int, sig: int) -> bool:
    """``pid`` has a handler for ``sig`` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(ln.split()[1], 16) for ln in status.splitlines() if ln.startswith("SigCgt"))
    return bool(mask & (1 << (sig - 1)))


def _gone(pids: list[int], seconds: float = 20.0) -> list[int]:
    """The pids still alive after up to ``seconds`` (a generous bound, not a measurement)."""
    end = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _worker(lead: bool, scrub: bool) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, "1" if lead else "0", "1" if scrub else "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    pids = [int(x) for x in proc.stdout.readline().split()]
    assert len(pids) == 2, "the stand-in worker did not start"
    return proc, pids


def _kill_all(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize(
    "lead, scrub",
    [(True, False), (True, True), (False, False)],
    ids=["own-group", "own-group-clean-env", "shared-group"],
)
def test_a_sigkilled_worker_takes_what_it_started_with_it(lead: bool, scrub: bool) -> None:
    """The shell and its sleep (in the worker's group, or marked), and a program that left the
    group but kept the mark, die with a SIGKILLed worker; a thread of the worker that ended
    before was no death."""
    proc, (shell, alone) = _worker(lead, scrub)
    try:
        sleeps = [int(c) for c in Path(f"/proc/{shell}/task/{shell}/children").read_text().split()]
        assert _alive(shell) and _alive(alone), "a thread's end was taken for the worker's death"
        proc.kill()
        proc.wait()
        expected = [shell, *sleeps] + ([] if scrub else [alone])
        assert _gone(expected) == [], "a program outlived its SIGKILLed worker"
    finally:
        _kill_all([shell, alone, *([proc.pid] if proc.poll() is None else [])])


def test_the_reaper_leaves_a_group_it_shares_with_other_ranks_alone() -> None:
    """Slurm's tasks of a node share the group of the node's first task: when that task is a
    worker and dies (or ends first), its reaper must not kill the other ranks."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SHARED], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    sibling, shell = (int(x) for x in proc.stdout.readline().split())
    try:
        proc.kill()
        proc.wait()
        assert _gone([shell]) == [], "the marked program outlived its worker"
        assert _alive(sibling), "the reaper killed another rank of the group its worker led"
    finally:
        _kill_all([sibling, shell])


def test_the_reaper_leaves_a_group_it_does_not_lead_alone() -> None:
    """A worker that shares its group (Slurm's tasks of a node, the master among them): its
    reaper kills only what carries the worker's mark, never the group."""
    neighbour = subprocess.Popen(["sleep", "302"], env={"PATH": os.environ["PATH"]})
    proc, (shell, alone) = _worker(False, False)
    try:
        assert os.getpgid(neighbour.pid) == os.getpgid(proc.pid) == os.getpgrp()
        proc.kill()
        proc.wait()
        assert _gone([shell, alone]) == []
        assert neighbour.poll() is None, "the reaper killed a process of the group it shares"
    finally:
        neighbour.kill()
        neighbour.wait()
        _kill_all([shell, alone])


def test_the_reaper_survives_a_storm_of_its_death_signal_and_still_does_its_work() -> None:
    """The kernel signals the reaper when the thread that started it ends, and again when the
    worker dies: a signal that came while the reaper handled the one before ended it with a
    traceback and no kill pass (seen once in some 40 runs under mpiexec). Bursts of them while
    the worker lives leave it serving; then the worker's death still takes its programs."""
    script = WORKER.replace(
        "print(shell.pid, alone.pid, flush=True)",
        "print(shell.pid, alone.pid, processes._reaper.pid, flush=True)",
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "1", "0"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    shell, alone, reaper = (int(x) for x in proc.stdout.readline().split())
    try:
        end = time.monotonic() + 20  # until the reaper catches the signal (as it does before
        while not _catches(reaper, signal.SIGUSR2) and time.monotonic() < end:  # it asks for
            time.sleep(0.01)  # it: before, the signal's default would end it)
        for _ in range(10):  # bursts: signals of one kind do not queue up, a burst lands
            for _ in range(20000):  # some while the reaper handles the one before
                os.kill(reaper, signal.SIGUSR2)
            time.sleep(0.01)
        time.sleep(0.5)
        assert _alive(reaper), "a signal while the reaper handled the one before ended it"
        proc.kill()
        proc.wait()
        assert _gone([shell, alone]) == [], "a program outlived its SIGKILLed worker"
    finally:
        _kill_all([shell, alone, reaper, *([proc.pid] if proc.poll() is None else [])])
