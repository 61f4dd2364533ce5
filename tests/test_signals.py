"""Signals as Slurm sends them (issue 45, U10): one event that arrives as several signals is one
request; a drained stop ends every rank with the resumable outcome, never 128 + the signal.

The unit tests send real signals to this process (the handlers run in the main thread) with a
clock the test moves; the MPI tests send real signals to real ranks under mpiexec, as Slurm does
at a time limit under srun (every task, then srun's copy) or on ``scancel --signal=USR1 --full``
with a forwarding batch script."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durable_dispatch.cli.launch import RESUMABLE, launch, requeue_command
from durable_dispatch.mpi.launchcheck import check_world, launched_tasks
from durable_dispatch.mpi.signals import SAME_REQUEST_SECONDS, CaughtSignals


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.01)  # the handler runs at the next bytecode of the main thread


def test_signals_within_the_window_are_one_request() -> None:
    clock, repeats = Clock(), []
    with CaughtSignals(on_repeat=repeats.append, clock=clock) as c:
        _deliver(signal.SIGTERM)  # the time limit's SIGTERM to the task
        clock.t += 0.2
        _deliver(signal.SIGTERM)  # srun's copy
        _deliver(signal.SIGUSR1)  # the batch script's trap forwarding it once more
        assert c.received == [signal.SIGTERM, signal.SIGTERM, signal.SIGUSR1]
        assert c.requests == [signal.SIGTERM] and repeats == []
        clock.t += SAME_REQUEST_SECONDS + 0.1  # a later signal is a second request
        _deliver(signal.SIGINT)
        assert c.requests == [signal.SIGTERM, signal.SIGINT] and repeats == [signal.SIGINT]


def test_a_late_copy_after_the_campaign_returned_is_absorbed_then_defaults_come_back() -> None:
    """A rank that drained and left ``run_master``/``run_worker`` within the window must not
    die of a copy of the request (it would end 128 + SIGTERM instead of its resumable code)."""
    clock = Clock()
    previous = signal.getsignal(signal.SIGUSR1)
    got: list[int] = []
    signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
    try:
        with CaughtSignals(clock=clock) as c:
            _deliver(signal.SIGUSR1)
        clock.t += 1.0
        _deliver(signal.SIGUSR1)  # a copy: absorbed, the previous handler not called
        assert got == [] and c.requests == [signal.SIGUSR1]
        clock.t += SAME_REQUEST_SECONDS
        _deliver(signal.SIGUSR1)  # after the window: the previous handler again
        assert got == [signal.SIGUSR1]
        _deliver(signal.SIGUSR1)
        assert got == [signal.SIGUSR1, signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_without_a_signal_the_previous_handlers_come_back_at_once() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    with CaughtSignals():
        assert signal.getsignal(signal.SIGTERM) != previous
    assert signal.getsignal(signal.SIGTERM) == previous


# ---------------------------------------------------------------- the launch check (U10)


def test_several_worlds_of_one_name_the_fix() -> None:
    env = {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4"}
    why = check_world(1, env, "Open MPI v5.0.8, package: Open MPI")
    assert why is not None and "SLURM_STEP_NUM_TASKS=4" in why and "srun --mpi=pmix" in why
    why = check_world(1, {"PMI_SIZE": "3"}, "MPICH Version: 4.3.0")
    assert why is not None and "PMI_SIZE=3" in why and "srun --mpi=pmi2" in why
    assert check_world(4, env, "Open MPI") is None  # a right launch
    why = check_world(1, {}, "Open MPI")  # python campaign.py alone: no workers
    assert why is not None and "no workers" in why and "mpiexec -n" in why


def test_the_batch_scripts_own_task_count_is_not_a_launch() -> None:
    """In the batch script, SLURM_NTASKS is the allocation's size: a process started there by
    mpiexec -n 2 in a 4-task allocation is fine, and says nothing about what started it."""
    assert launched_tasks({"SLURM_NTASKS": "4", "SLURM_STEP_ID": "batch"}) is None
    assert launched_tasks({"SLURM_NTASKS": "4"}) is None
    assert launched_tasks({"SLURM_NTASKS": "4", "SLURM_STEP_ID": "3"}) == ("SLURM_NTASKS", 4)
    assert launched_tasks({"OMPI_COMM_WORLD_SIZE": "1"}) is None


FAKE_SIZE_ONE = """
import sys
from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master
report = run_master([WorkItem("a", {})], sys.argv[1])
sys.exit(0 if report.finished else 3)
"""


@pytest.mark.mpi
def test_a_world_of_one_that_was_launched_as_four_ends_at_once_not_resumable(
    tmp_path: Path,
) -> None:
    """What ``srun --mpi=none -n 4`` does with the Open MPI wheel, without Slurm: four
    processes, each a world of size 1, with the launcher's variables saying 4. Before, one took
    the lock and returned reason="no workers left" (exit 3: requeued forever), the others raised
    LockHeldError. Now each ends within seconds, exit 1, naming the fix, before any lock."""
    pytest.importorskip("mpi4py")
    script = tmp_path / "c.py"
    script.write_text(FAKE_SIZE_ONE)
    env = dict(os.environ, SLURM_STEP_ID="0", SLURM_NTASKS="4", SLURM_STEP_NUM_TASKS="4")
    for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        env.pop(k, None)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "state")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for _ in range(4)
    ]
    try:
        for p in procs:
            _out, err = p.communicate(timeout=60)
            assert p.returncode not in (0, RESUMABLE), err[-2000:]
            assert "srun --mpi=pmix" in err and "SLURM_STEP_NUM_TASKS=4" in err, err[-2000:]
            assert "LockHeldError" not in err
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    assert not (tmp_path / "state").exists()  # nothing opened: it failed before the lock


# ---------------------------------------------------------------- durable-dispatch launch


def test_launch_passes_the_exit_status_on_and_requeues_only_on_the_resumable_code(
    tmp_path: Path,
) -> None:
    """The README's old recipe ended COMPLETED 0:0 after a drain (``wait`` returns 0) and after
    a failed mpiexec. ``launch`` ends with the command's status and requeues on 3 only."""
    log = tmp_path / "scontrol.log"
    fake = tmp_path / "scontrol"
    state = tmp_path / "state"
    state.write_text("JobState=RUNNING RunTime=00:00:20 TimeLimit=00:01:00")
    fake.write_text(
        f'#!/bin/sh\nif [ "$1" = requeue ]; then echo "$@" >> {log}; '
        f'else echo "JobId=77 $(cat {state}) Restarts=0"; fi\n'
    )
    fake.chmod(0o755)
    env = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0"}
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}:{old}"
    try:
        assert requeue_command(env) == [str(fake), "requeue", "77"]
        assert launch(["sh", "-c", "exit 3"], env=env) == 3
        assert log.read_text() == "requeue 77\n"
        assert launch(["sh", "-c", "exit 1"], env=env) == 1  # a failed launch: no requeue
        assert launch(["sh", "-c", "exit 0"], env=env) == 0
        assert (
            launch(["sh", "-c", "exit 3"], env=dict(env, SLURM_RESTART_COUNT="5"), max_requeues=5)
            == 3
        )  # ran 6 times already: not again
        assert launch(["sh", "-c", "exit 3"], env={}) == 3  # not in a Slurm job
        # scancel (what a job sees of itself while it ends): the ranks drained, but a cancel
        # stays a cancel
        state.write_text("JobState=COMPLETING RunTime=00:00:05 TimeLimit=00:05:00")
        assert launch(["sh", "-c", "exit 3"], env=env) == 3
        assert log.read_text() == "requeue 77\n"
        state.write_text("JobState=COMPLETING RunTime=1-00:00:20 TimeLimit=1-00:00:00")
        assert launch(["sh", "-c", "exit 3"], env=env) == 3  # the time limit: requeued
        assert log.read_text() == "requeue 77\nrequeue 77\n"
    finally:
        os.environ["PATH"] = old


# A campaign's state directory as a master leaves it: ``finished`` (every item committed, the
# directory closed), ``stopped`` (closed with work left), ``died`` (SIGKILLed with work left,
# never closed).
_STATE = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from durable_dispatch import CampaignState, WorkItem
from helpers import fake_campaign
how, d = sys.argv[1], sys.argv[2]
state = CampaignState.open(d, ranks=(1,))
state.submit([WorkItem(f"w{{i}}", i) for i in range(3)])
if how == "finished":
    fake_campaign(state)
if how == "died":
    os.kill(os.getpid(), signal.SIGKILL)
state.close()
"""


def _campaign_state(tmp_path: Path, how: str) -> Path:
    d = tmp_path / how
    script = _STATE.format(tests=str(Path(__file__).parent))
    r = subprocess.run([sys.executable, "-c", script, how, str(d)], check=False)
    assert r.returncode == (-signal.SIGKILL if how == "died" else 0)
    return d


def test_launch_exits_0_only_when_the_state_directory_says_the_campaign_finished(
    tmp_path: Path,
) -> None:
    """Issue 60: mpiexec exits 0 once Open MPI's runtime ended a job that lost a node's daemon
    (the job ended COMPLETED with 146 items left), and srun exits 14 once Slurm cancelled the
    step (launch said "not resumable, not requeued" with 135 left). With --state-dir the record
    decides: work left is a resumable stop, exit 3 and requeue."""
    from durable_dispatch.cli.launch import campaign_outcome

    finished, stopped, died = (
        _campaign_state(tmp_path, h) for h in ("finished", "stopped", "died")
    )
    assert [campaign_outcome(d) for d in (finished, stopped, died, tmp_path / "none")] == [
        "finished",
        "stopped",
        "died",
        "none",
    ]
    log = tmp_path / "scontrol.log"
    fake = tmp_path / "scontrol"
    fake.write_text(
        f'#!/bin/sh\nif [ "$1" = requeue ]; then echo "$@" >> {log}; '
        'else echo "JobId=77 JobState=RUNNING RunTime=00:00:20 TimeLimit=00:01:00"; fi\n'
    )
    fake.chmod(0o755)
    env = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0"}
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}:{old}"

    def requeues() -> int:
        return log.read_text().count("requeue 77") if log.exists() else 0

    try:
        assert launch(["sh", "-c", "exit 0"], env=env, state_dir=finished) == 0
        assert requeues() == 0
        # mpiexec's 0 after its runtime ended the job: work left
        assert launch(["sh", "-c", "exit 0"], env=env, state_dir=stopped) == 3
        assert requeues() == 1
        # srun's 14 after Slurm cancelled the step: the master never closed the directory
        assert launch(["sh", "-c", "exit 14"], env=env, state_dir=died) == 3
        assert requeues() == 2
        assert launch(["sh", "-c", "exit 0"], env=env, state_dir=died) == 3
        assert requeues() == 3
        # the master closed it with work left and the script failed (a bug): not requeued
        assert launch(["sh", "-c", "exit 1"], env=env, state_dir=stopped) == 1
        # nothing there: a wrong --state-dir is not a success
        assert launch(["sh", "-c", "exit 0"], env=env, state_dir=tmp_path / "none") == 2
        assert requeues() == 3
        # the command line
        from durable_dispatch.cli import main

        code = main(["launch", "--state-dir", str(stopped), "--", "sh", "-c", "exit 0"])
        assert code == 3 and requeues() == 3  # (no SLURM_JOB_ID in this process's environment)
    finally:
        os.environ["PATH"] = old


def test_launch_waits_for_a_master_that_opens_the_state_directory_as_the_job_ends(
    tmp_path: Path,
) -> None:
    """Seen on the cluster in a box: PRRTE lost a node as the job started and mpiexec exited 0
    while the master (on another rank's node) was still starting; it opened the state
    directory 0.1 s later and was killed. ``launch`` read "no campaign" at once, exited 2 and
    did not requeue: the job ended with every item left. A master that opens the directory
    as the job ends is a master that died: exit 3."""
    from durable_dispatch.cli.launch import campaign_outcome

    state = tmp_path / "state"
    script = _STATE.format(tests=str(Path(__file__).parent))
    straggler = subprocess.list2cmdline([sys.executable, "-c", script, "died", str(state)])
    cmd = ["sh", "-c", f"(sleep 1; {straggler}) >/dev/null 2>&1 & exit 0"]
    assert launch(cmd, env={}, state_dir=state) == 3
    assert campaign_outcome(state) == "died"


def test_launch_passes_one_sigusr1_per_request_on(tmp_path: Path) -> None:
    """SIGTERM, SIGUSR1 and SIGINT within the window (a time limit, srun's copy, a trap) reach
    the command as one SIGUSR1; the command's resumable exit is the launcher's."""
    got = tmp_path / "got"
    child = (
        f"import signal,sys,time\n"
        f"n=[]\n"
        f"signal.signal(signal.SIGUSR1, lambda s,f: n.append(s))\n"
        f"open({str(got)!r}.replace('got','ready'),'w').close()\n"
        f"t=time.time()+3\n"
        f"while time.time()<t: time.sleep(0.05)\n"
        f"open({str(got)!r},'w').write(str(len(n)))\n"
        f"sys.exit(3)\n"
    )
    ready = tmp_path / "ready"
    runner = (
        "import sys\nfrom durable_dispatch.cli.launch import launch\n"
        f"sys.exit(launch([sys.executable, '-c', {child!r}], env={{}}, hold=0))\n"
    )
    p = subprocess.Popen([sys.executable, "-c", runner], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            p.send_signal(s)
        assert p.wait(timeout=60) == 3
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert got.read_text() == "1"


# ---------------------------------------------------------------- real ranks under mpiexec

DOUBLE = """
import sys, time
from mpi4py import MPI
from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master, run_worker

def work(payload):
    time.sleep(0.3)
    return payload

if __name__ == "__main__":
    if MPI.COMM_WORLD.Get_rank() == 0:
        report = run_master([WorkItem(f"w{i}", i) for i in range(400)], sys.argv[1])
        print("REPORT", report.finished, report.reason, flush=True)
        sys.exit(0 if report.finished else 3)
    run_worker(work)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("signals", [("SIGTERM", "SIGTERM"), ("SIGUSR1", "SIGUSR1", "SIGUSR1")])
def test_one_event_as_several_signals_to_every_rank_drains_with_the_resumable_code(
    tmp_path: Path, signals: tuple[str, ...]
) -> None:
    """What Slurm does: the time limit's SIGTERM to every task and srun's copy of it; or
    ``scancel --signal=USR1 --full`` with a forwarding script. Before, the copy was a second
    signal: the master stopped at once and each worker ``os._exit(128 + signal)`` (the job
    ended 143 or 138). Now it is one request: the job drains, the master's code 3 is the job's,
    every worker ends 0, nothing is left in flight."""
    from durable_dispatch.campaign.admin import view_state
    from durable_dispatch.mpi.launcher import kill_session, launch_env, mpiexec_command

    script = tmp_path / "c.py"
    script.write_text(DOUBLE)
    state = tmp_path / "state"
    cmd = mpiexec_command(4, [sys.executable, str(script), str(state)])
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=launch_env(None, quiet=True),
        start_new_session=True,
    )
    try:
        journal, deadline = state / "events.jsonl", time.monotonic() + 120
        while time.monotonic() < deadline and (
            not journal.exists() or journal.read_bytes().count(b'"committed"') < 6
        ):
            time.sleep(0.05)
        ranks = [p for p in _session_pids(proc.pid) if _cmdline(p).endswith(f"{script} {state}")]
        assert len(ranks) == 4, ranks
        for name in signals:  # each copy to every rank, a few ms apart
            for pid in ranks:
                os.kill(pid, getattr(signal, name))
            time.sleep(0.05)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill_session(proc)
            proc.communicate()
    assert proc.returncode == 3, f"rc={proc.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    assert "REPORT False signal" in out
    assert not view_state(state).projection.in_flight


def _session_pids(sid: int) -> list[int]:
    from durable_dispatch.mpi.launcher import pids_in_session

    return [p for p in pids_in_session(sid) if p != sid]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_launch_reads_a_command_killed_by_its_forwarded_sigusr1_as_resumable(
    tmp_path: Path,
) -> None:
    """Found under Slurm: the signal came as the campaign finished, prterun had put its handler
    away and died of the SIGUSR1 passed on to it: FAILED 138:0 with every item done. The
    outcome is unknown, so resumable: the requeued job ends at once if all is done."""
    runner = (
        "import sys\nfrom durable_dispatch.cli.launch import launch\n"
        "sys.exit(launch(['sleep', '30'], env={}, hold=0))\n"
    )
    p = subprocess.Popen([sys.executable, "-c", runner], start_new_session=True)
    try:
        time.sleep(2)  # launch is up and sleep started
        p.send_signal(signal.SIGUSR1)
        assert p.wait(timeout=60) == RESUMABLE
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_the_launch_check_message_holds_no_control_character() -> None:
    """The message embedded the MPI library's version string with its trailing NUL byte, so
    ``grep PMI job.err`` answered "binary file matches": a message holds printable text only."""
    pytest.importorskip("mpi4py")
    from durable_dispatch.mpi.launchcheck import check_world
    from durable_dispatch.mpi.launcher import launch_env

    # in a process of its own: importing mpi4py.MPI here would start MPI in the test process
    ask = "import sys; from mpi4py import MPI; sys.stdout.write(MPI.Get_library_version())"
    library = subprocess.run(
        [sys.executable, "-c", ask], env=launch_env(quiet=True), capture_output=True,
        text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    for lib in (library, library.rstrip("\x00") + "\x00", "Open MPI v5\x1b[31m\x00\n2nd line"):
        why = check_world(1, {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "4"}, lib)
        assert why is not None and why.isprintable(), repr(why)
        assert lib.split("\x00")[0].split("\x1b")[0].strip()[:8] in why, why


@pytest.mark.skipif(os.geteuid() != 0, reason="the root variables are set only as root (CI)")
def test_launch_as_root_sets_open_mpis_root_variables_as_run_does(tmp_path: Path) -> None:
    """The documented sbatch example failed as root ("mpiexec exited 1: not resumable"):
    ``launch`` now gives its command Open MPI's two root variables, as ``run`` does, and says
    so on stderr."""
    from durable_dispatch.mpi.launcher import mpi_flavor

    if mpi_flavor() not in ("openmpi", "unknown"):
        pytest.skip("Hydra (MPICH, Intel MPI) runs as root without them")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    show = "import os; print(os.environ.get('OMPI_ALLOW_RUN_AS_ROOT'), "
    show += "os.environ.get('OMPI_ALLOW_RUN_AS_ROOT_CONFIRM'))"
    res = subprocess.run(
        [sys.executable, "-m", "durable_dispatch", "launch", "--", sys.executable, "-c", show],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1", "1"], res.stdout
    assert "OMPI_ALLOW_RUN_AS_ROOT=1" in res.stderr, res.stderr
