"""The futures executor under a real ``mpiexec`` (issue 32): its conformance suite run by pytest on
rank 0 under the runner, a job SIGKILLed mid-``map`` and re-run, the collective executor, and a
user's bug on rank 0. Each ``mpiexec`` runs in its own session with a timeout
(``run_mpiexec``)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from durable_dispatch import read_results
from durable_dispatch.campaign.statedir import is_state_dir
from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

ROOT = Path(__file__).resolve().parent.parent
CHILDREN = Path(__file__).parent / "children"


def _runner(n: int, *target: str, state: Path | None = None) -> list[str]:
    opts = ["--state-dir", str(state)] if state is not None else []
    return mpiexec_command(n, [sys.executable, "-m", "durable_dispatch.futures", *opts, *target])


@pytest.mark.timeout(900)
def test_the_conformance_suite_passes_under_the_runner() -> None:
    """Rank 0 runs pytest on ``tests/children/futures_suite.py`` (the stdlib's and mpi4py's
    cases, durability and S7; issue 48: a call that raises beside one that blocks, after
    batch="auto" ramped up, is seen by wait(FIRST_EXCEPTION), as_completed and
    map(unordered=True) before the blocker ends; lifecycle, argument and pickling semantics)
    while ranks 1-2 serve its executors, several at once when several are open."""
    cmd = _runner(
        3,
        "-m",
        "pytest",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        "-q",
        "--color=no",
        str(CHILDREN / "futures_suite.py"),
    )
    res = run_mpiexec(cmd, timeout=840, cwd=ROOT, env={"FUTURES_WORKERS": "2"})
    assert not res.timed_out and res.returncode == 0, res.stdout[-6000:] + res.stderr[-3000:]
    m = re.search(r"(\d+) passed", res.stdout)
    assert m and int(m.group(1)) >= 32 and "failed" not in res.stdout, res.stdout[-3000:]


def _runs(count: Path) -> list[int]:
    return [int(x) for x in count.read_text().split()] if count.exists() else []


@pytest.mark.parametrize("kill_at", [7, 31])
def test_a_job_killed_mid_map_reruns_only_what_was_not_committed(
    tmp_path: Path, kill_at: int
) -> None:
    """The done-when of issue 32: an mpi4py.futures script (one changed import) is SIGKILLed
    mid-``map`` and run again on its state directory: the re-run prints all 60 results once
    each, in order, and runs only the calls the first run did not commit (counted in a side
    file: each call ran at least once, and a committed call never ran again)."""
    state, count = tmp_path / "state", tmp_path / "count"
    script = str(CHILDREN / "futures_job.py")
    first = run_mpiexec(_runner(4, script, str(count), str(kill_at), state=state), timeout=120)
    assert not first.timed_out and first.returncode != 0
    printed = [line for line in first.stdout.splitlines() if line.startswith("result")]
    assert len(printed) == kill_at
    committed = {r.work_id for r in read_results(state / "executor-1")}
    assert len(committed) >= kill_at
    ran_first = _runs(count)
    second = run_mpiexec(_runner(4, script, str(count), "-1", state=state), timeout=120)
    assert not second.timed_out and second.returncode == 0, second.stderr[-3000:]
    lines = second.stdout.splitlines()
    assert lines == [f"result {x} {x * x}" for x in range(60)] + ["done"]
    ran_second = _runs(count)[len(ran_first) :]
    assert len(ran_second) == 60 - len(committed)  # only the missing calls ran
    assert set(ran_first) | set(ran_second) == set(range(60))
    assert len({r.work_id for r in read_results(state / "executor-1")}) == 60


@pytest.mark.parametrize("kill_at", [9, 41])
def test_two_executors_open_at_once_each_resume_after_a_sigkill(
    tmp_path: Path, kill_at: int
) -> None:
    """Issue 48: two executors open at once share the workers (calls submitted to each in
    turn); the job is SIGKILLed with both open and run again: each executor resumes from its
    own state directory, every result is printed once, in order, and only the calls neither
    record had committed run again (each call at least once, a committed one never again)."""
    state, count = tmp_path / "state", tmp_path / "count"
    script = str(CHILDREN / "futures_two.py")
    first = run_mpiexec(_runner(3, script, str(count), str(kill_at), state=state), timeout=120)
    assert not first.timed_out and first.returncode != 0
    assert len([x for x in first.stdout.splitlines() if x[:2] in ("a ", "b ")]) == kill_at
    committed = {
        name: {r.work_id for r in read_results(state / f"executor-{k}")}
        for k, name in ((1, "a"), (2, "b"))
    }
    assert len(committed["a"]) >= (kill_at + 1) // 2 and len(committed["b"]) >= kill_at // 2
    ran_first = _lines(count)
    second = run_mpiexec(_runner(3, script, str(count), "-1", state=state), timeout=120)
    assert not second.timed_out and second.returncode == 0, second.stderr[-3000:]
    expected = [f"{n} {x} {x * x if n == 'a' else -x}" for x in range(40) for n in "ab"]
    assert second.stdout.splitlines() == [*expected, "done"]
    ran_second = _lines(count)[len(ran_first) :]
    for name in "ab":
        again = [c for c in ran_second if c.startswith(name)]
        assert len(again) == 40 - len(committed[name])  # only the missing calls ran
        assert {c for c in ran_first + ran_second if c.startswith(name)} == {
            f"{name} {x}" for x in range(40)
        }
    for k in (1, 2):
        assert len({r.work_id for r in read_results(state / f"executor-{k}")}) == 40


def _lines(count: Path) -> list[str]:
    return count.read_text().splitlines() if count.exists() else []


def test_the_collective_executor_serves_from_every_rank(tmp_path: Path) -> None:
    cmd = mpiexec_command(3, [sys.executable, str(CHILDREN / "futures_comm.py"), str(tmp_path)])
    res = run_mpiexec(cmd, timeout=120)
    assert not res.timed_out and res.returncode == 0, res.stderr[-3000:]
    assert f"sum {sum(x**3 for x in range(30))} workers 2" in res.stdout
    assert "raised Odd 3" in res.stdout  # a class the script defines, from an isolated child
    left = sorted(p.name for p in tmp_path.glob("left-*"))  # (not stdout: see the script)
    assert left == ["left-0", "left-1", "left-2"], res.stdout


@pytest.mark.parametrize("how", ["runner", "collective"])
def test_a_bug_in_the_users_script_ends_the_job_nonzero_within_seconds(
    tmp_path: Path, how: str
) -> None:
    """U8 with the executor: rank 0 raises with calls in flight (runner) or inside the
    collective ``with`` block: the job ends non-zero with the error shown, never hangs."""
    if how == "runner":
        cmd = _runner(3, str(CHILDREN / "futures_bug.py"), state=tmp_path)
        error = "KeyError"
    else:
        script = str(CHILDREN / "futures_comm.py")
        cmd = mpiexec_command(3, [sys.executable, script, str(tmp_path), "bug"])
        error = "a bug in the user's code"
    start = time.monotonic()
    res = run_mpiexec(cmd, timeout=90)
    assert not res.timed_out and res.returncode != 0
    assert error in res.stderr, res.stderr[-3000:]
    assert time.monotonic() - start < 60


def test_the_runner_runs_a_module_and_a_command_and_passes_the_exit_status(
    tmp_path: Path,
) -> None:
    code = (
        "import sys\n"
        "from durable_dispatch.futures import MPIPoolExecutor\n"
        "with MPIPoolExecutor() as ex:\n"
        "    print('max', max(ex.map(abs, range(-9, 3))))\n"
        "sys.exit(3)\n"
    )
    res = run_mpiexec(_runner(2, "-c", code, state=tmp_path), timeout=90)
    assert not res.timed_out and res.returncode == 3 and "max 9" in res.stdout, res.stderr
    res = run_mpiexec(
        _runner(2, "-m", "tests.children.futures_job", str(tmp_path / "c"), "-1", state=tmp_path),
        timeout=90,
        cwd=ROOT,
    )
    assert not res.timed_out and res.returncode == 0 and res.stdout.endswith("done\n"), res.stderr
    res = run_mpiexec(_runner(2, "--bogus"), timeout=60)
    assert res.returncode != 0 and "usage" in res.stderr


def test_the_readme_futures_example_runs_and_a_rerun_answers_from_the_record(
    tmp_path: Path,
) -> None:
    """examples/futures_map.py, as the README runs it; the second run prints the same answer
    and commits nothing new (every call resolved from the record)."""
    example = str(ROOT / "examples" / "futures_map.py")
    outs, seqs = [], []
    for _ in range(2):
        res = run_mpiexec(_runner(4, example, state=tmp_path), timeout=180)
        assert not res.timed_out and res.returncode == 0, res.stderr[-3000:]
        outs.append(res.stdout)
        seqs.append([r.seq for r in read_results(tmp_path / "executor-1")])
    assert outs[0] == outs[1] and outs[0].startswith("best seed ")
    assert len(seqs[0]) == 200 and seqs[1] == seqs[0]


def test_a_map_reduce_of_futures_with_a_failing_map_and_a_kill(tmp_path: Path) -> None:
    """Issue 51: futures of the same executor passed as arguments (a list of them, several
    positional ones, a keyword one). The reduction over a failing map fails with
    DependencyFailed whose __cause__ is the map's exception; the other waits and sums. The job
    SIGKILLed after 10 maps and run again: the re-run prints the same outcomes, runs no
    committed call again, and resolves both the failed map and its dependents from the
    record."""
    state, count = tmp_path / "state", tmp_path / "count"
    script = str(CHILDREN / "futures_reduce.py")
    first = run_mpiexec(_runner(3, script, str(count), "yes", state=state), timeout=180)
    assert not first.timed_out and first.returncode != 0, first.stderr[-3000:]
    ran_first = count.read_text().splitlines()
    second = run_mpiexec(_runner(3, script, str(count), "no", state=state), timeout=180)
    assert not second.timed_out and second.returncode == 0, second.stderr[-3000:]
    lines = second.stdout.splitlines()
    want = [f"square{x} {x * x}" if x != 13 else "square13 ValueError thirteen" for x in range(40)]
    want.append(f"evens {sum(x * x for x in range(0, 40, 2))}")
    want.append("odds DependencyFailed True ValueError thirteen")
    want += [f"pair{i} ('pair', {i * i})" for i in range(4)]
    assert lines == want + ["done"], second.stdout[-3000:] + second.stderr[-3000:]
    ran = count.read_text().splitlines()
    squares = [r for r in ran if r.startswith("square")]
    assert sorted(set(squares)) == sorted({f"square {x}" for x in range(40)})
    assert len(squares) - len(set(squares)) <= len([r for r in ran_first if "square" in r])
    assert ran.count("total") == 1  # the odd reduction never ran; the even one once
    third = run_mpiexec(_runner(3, script, str(count), "no", state=state), timeout=180)
    assert third.stdout.splitlines() == want + ["done"]
    assert count.read_text().splitlines() == ran  # all from the record: nothing ran again


def test_an_operator_cancels_a_running_call_and_its_futures_fail_now_and_in_a_rerun(
    tmp_path: Path,
) -> None:
    """Issue 52 with the futures face: ``durable-dispatch cancel`` of a running call (isolated,
    300 s) fails its future at once with TaskFailed (kind "cancelled"), and the future that
    took it as an argument (issue 51) with DependencyFailed whose cause is that exception; the
    script ends long before the call would have; a re-run answers both from the record."""
    import json
    import subprocess

    from durable_dispatch.mpi.launcher import kill_session, launch_env

    state, mark = tmp_path / "state", tmp_path / "mark"
    script = str(CHILDREN / "futures_cancel.py")
    cmd = _runner(2, script, str(mark), state=state)
    expected = ["slow TaskFailed cancelled", "after DependencyFailed TaskFailed"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=launch_env(quiet=True), start_new_session=True,
    )  # fmt: skip
    try:
        end = time.monotonic() + 90
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()
            time.sleep(0.2)
        wid = mark.read_text()
        time.sleep(1.0)  # the call is in flight on the worker
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "durable_dispatch", "cancel", str(state / "executor-1"), wid,
             "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        body = json.loads(out.stdout)
        assert out.returncode == 0 and body["work_ids"][wid].startswith("cancelled"), out
        stdout, stderr = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        kill_session(proc)
    assert proc.returncode == 0, stderr[-3000:]
    assert stdout.splitlines() == expected, (stdout, stderr[-3000:])
    assert took < 240  # the 300 s call did not run to its end
    again = run_mpiexec(_runner(2, script, str(mark), state=state), timeout=180)
    assert not again.timed_out and again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.splitlines() == expected


def test_leaving_a_comm_executor_block_under_the_runner_keeps_the_workers(
    tmp_path: Path,
) -> None:
    """Under the runner the job's ranks serve rank 0's executors: an ``MPICommExecutor`` block
    there is one of those executors, and leaving it must not send the runner's workers away
    (it did: the next executor waited forever for workers that had exited)."""
    code = (
        "from mpi4py import MPI\n"
        "from durable_dispatch.futures import MPICommExecutor, MPIPoolExecutor\n"
        "for k in range(2):\n"
        "    with MPICommExecutor(MPI.COMM_WORLD, 0) as ex:\n"
        "        print('comm', k, sum(ex.map(abs, range(-4, 0))))\n"
        "with MPIPoolExecutor() as ex:\n"
        "    print('pool', ex.submit(abs, -7).result())\n"
    )
    res = run_mpiexec(_runner(2, "-c", code, state=tmp_path), timeout=120)
    assert not res.timed_out, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split("\n")[:3] == ["comm 0 10", "comm 1 10", "pool 7"], res.stdout


def test_mpi4pys_documented_api_beyond_the_executor(tmp_path: Path) -> None:
    """``get_comm_workers()`` inside a call in a worker rank (the two workers' communicator; a
    RuntimeError on rank 0 and in an isolated child, naming the fix); mpi4py's constructor
    keywords accepted, and ``path``, ``wdir``, ``env``, ``globals`` applied where the calls run,
    in the rank and in an isolated child; re-entering an ``MPICommExecutor`` raises RuntimeError
    and the instance can be entered again once left; ``MPI4PY_FUTURES_MAX_WORKERS``;
    ``bootup(wait=True)`` returns once every worker's isolated child has started (it returned
    before any had: mpi4py's own test of cancel_futures then found its first call cancelled)."""
    script = str(CHILDREN / "futures_mpi4py_api.py")
    res = run_mpiexec(_runner(3, script, str(tmp_path), state=tmp_path / "s"), timeout=180)
    assert not res.timed_out and res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.splitlines() == [
        "comm (2, True)",
        "rank 0 refused",
        "isolated True",
        "kw False True yes True 42",
        "kw True True yes True 42",
        "re-entry refused",
        "inside 3",
        "again 4",
        "max workers 1",
        "booted 2",
    ], res.stdout


def test_a_hang_batched_with_other_calls_fails_at_its_own_task_timeout(tmp_path: Path) -> None:
    """U9 in a dispatch of several calls: a hang sent with fast calls (after batch="auto" ramped
    up), each with task_timeout=3, fails with TaskTimedOut at its own timeout (the isolating
    worker kills it alone, and says so), not at the dispatch's, the sum of its calls' (here
    minutes: it was killed after about 21 s with six batch-mates); its batch-mates resolve."""
    script = str(CHILDREN / "futures_batched_timeout.py")
    res = run_mpiexec(_runner(2, script, "3", state=tmp_path), timeout=150)
    assert not res.timed_out, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.returncode == 0 and res.stdout.endswith("done\n"), res.stderr[-3000:]
    assert "its own timeout (3 s) passed" in res.stdout, res.stdout


@pytest.mark.parametrize("how", ["ok", "broken"])
def test_a_script_that_calls_mpi_when_imported_runs_isolated(tmp_path: Path, how: str) -> None:
    """Most mpi4py scripts call MPI at module level: with the default settings (isolated calls)
    the isolated child imports the script and initializes MPI as a world of its own (size 1),
    where it aborted and every call failed with "no workers left". A child that cannot import
    the script fails the first call with BrokenExecutor naming the child's reason and the fix
    (the IsolationError's text), not only "no workers left"."""
    script = str(CHILDREN / "futures_mpi_at_import.py")
    res = run_mpiexec(_runner(2, script, how, state=tmp_path), timeout=120)
    assert not res.timed_out and res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    if how == "ok":
        assert res.stdout == "worlds [1]\n", res.stdout + res.stderr[-3000:]
    else:
        assert res.stdout.startswith("broken:"), res.stdout + res.stderr[-3000:]
        for part in ("IsolationError", "this script cannot be imported here", "isolate=False"):
            assert part in res.stdout, res.stdout


def test_a_comm_executor_on_comm_self_runs_the_calls_in_a_thread(tmp_path: Path) -> None:
    """``MPICommExecutor(MPI.COMM_SELF)`` in a plain script (a communicator of one rank): as in
    mpi4py the calls run in a thread of that rank (it was a UsageError, "no worker ranks"), and
    each is durable all the same: values, a raised exception re-raised, ``get_comm_workers()``
    of size 1, a second executor on the same directory resolving them from the record at
    submit, an initializer that raises making the executor broken with its reason."""
    cmd = mpiexec_command(1, [sys.executable, str(CHILDREN / "futures_self.py"), str(tmp_path)])
    res = run_mpiexec(cmd, timeout=120)
    assert not res.timed_out and res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.splitlines() == [
        "squares 2470",
        "workers 1 1",
        "raised 3",
        "from the record True",
        "broken True",
    ], res.stdout + res.stderr[-3000:]


@pytest.mark.ulfm
@pytest.mark.parametrize("die_at", ["serve", "_workers_comm", "_session"])
def test_a_worker_killed_while_the_session_starts_never_hangs_the_job(
    tmp_path: Path, die_at: str
) -> None:
    """A torture finding (seed 1087): under ULFM, with ``isolate=False``, a worker rank
    SIGKILLed while the executor's session started left the other workers waiting forever in
    ``Create_group`` (a collective over the workers only, which Open MPI's ULFM does not end
    when one of them is dead): no call ran and the job never ended. Worker rank 2 (of 3) now
    kills itself as it starts serving, before the session's communicator is made (``serve``:
    every rank's ``Dup`` fails, the executor raises ``BrokenExecutor``; the old code ended
    with tracebacks and status 0), before the workers' communicator is made (``_workers_comm``:
    every rank's ``Split`` fails, no worker can serve, ``BrokenExecutor``; the old code never
    killed there) or just after (``_session``: the session goes on with the two ranks left;
    the old code timed out). The script exits 3 on ``BrokenExecutor``. Either way the job
    ends, and a re-run on the same state directory prints every result once, running only the
    calls the first run did not commit."""
    state, count, mark = tmp_path / "state", tmp_path / "count", tmp_path / "died"
    script = str(CHILDREN / "futures_worker_dies_at_session.py")
    argv = [sys.executable, "-m", "durable_dispatch.futures", "--state-dir", str(state)]
    cmd = mpiexec_command(4, [*argv, script, str(count)], ulfm=True)
    env = {"DIE_RANK": "2", "DIE_AT": die_at, "DIE_MARK": str(mark)}
    first = run_mpiexec(cmd, timeout=120, env=env)
    out = first.stdout + first.stderr
    assert not first.timed_out, out[-3000:]
    assert mark.exists()  # the worker did die where it was told
    broken = {
        "serve": "the executor's session could not be opened",
        "_workers_comm": "the workers' communicator could not be made",
    }
    if die_at in broken:
        assert first.returncode == 3 and "broken:" in first.stdout, out[-3000:]
        assert broken[die_at] in first.stdout, out[-3000:]
    else:
        assert "done" in first.stdout.splitlines(), out[-3000:]
        assert [line for line in first.stdout.splitlines() if line.startswith("result")] == [
            f"result {x} {x * x}" for x in range(12)
        ]
    executor = state / "executor-1"
    if die_at == "serve":  # the executor never opened its state directory: nothing ran
        assert not is_state_dir(executor) and not count.exists()
    committed = {r.work_id for r in read_results(executor)} if is_state_dir(executor) else set()
    ran_first = _runs(count)
    second = run_mpiexec(cmd, timeout=120)
    assert not second.timed_out and second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.splitlines() == [f"result {x} {x * x}" for x in range(12)] + ["done"]
    ran_second = _runs(count)[len(ran_first) :]
    assert len(ran_second) == 12 - len(committed)  # nothing committed ran again, nothing lost
    assert set(ran_first) | set(ran_second) == set(range(12))
    assert len({r.work_id for r in read_results(state / "executor-1")}) == 12
