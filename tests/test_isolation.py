"""The isolated runner without MPI: a real child interpreter per runner, real signals, real
process trees (mpi/isolation.py). The same runner under mpiexec: test_mpi_isolation.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch.errors import IsolationError
from durable_dispatch.mpi.context import Batch, Outcomes, WorkContext
from durable_dispatch.mpi.isolation import IsolatedRunner, StopRequested

#: the variables Open MPI's and Hydra's (MPICH, Intel MPI) mpiexec give a rank (issue 33)
LAUNCHER_VARS = ("OMPI_", "PMIX_", "PRTE_", "PMI_", "HYDI_", "HYDRA_", "MPI_LOCAL")


def work(payload: dict[str, Any], ctx: WorkContext) -> Any:
    """Module level, so the child finds it by name."""
    what = payload.get("do", "ok")
    if what == "hang":
        if payload.get("child"):
            subprocess.Popen(["sleep", payload["child"]])  # stays in the item's group
        while True:
            time.sleep(3600)
    if what == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if what == "abort":
        os.abort()
    if what == "exit":
        os._exit(3)
    if what == "raise":
        raise ValueError("bad input")
    if what == "close-pipes":  # alive, but deaf and mute to its worker
        os.closerange(3, 1024)
        while True:
            time.sleep(3600)
    if what == "memory":
        return len(bytearray(1 << 30))
    if what == "beat":
        end = time.monotonic() + payload["seconds"]
        while time.monotonic() < end:
            ctx.beat()
            time.sleep(0.05)
    if what == "big":
        return "x" * 5000
    if what == "print":
        print("p" * 200_000, flush=True)
        return "printed"
    if what == "no-flush":  # a user's own write-only stream in place of stdout (no flush)

        class Logger:
            def write(self, text: str) -> int:
                return len(text)

        sys.stdout = Logger()  # type: ignore[assignment]
        print("to the logger")
        return "done"
    return {
        "pid": os.getpid(),
        "work_id": ctx.work_id,
        "attempt": ctx.attempt,
        "left": ctx.seconds_left(),
        "mpi": sorted(k for k in os.environ if k.startswith(LAUNCHER_VARS)),
    }


@pytest.fixture
def runner() -> Any:
    r = IsolatedRunner(work, "context", 4096, 1 << 30, subreaper=False)
    yield r
    r.close()


def _item(work_id: str, **payload: Any) -> dict[str, Any]:
    return {"work_id": work_id, "attempt": 1, "payload": payload}


def _one(r: IsolatedRunner, item: dict[str, Any], *args: Any) -> Any:
    """``r.run_item`` of ``item`` (``deadline, lease, tick, beat`` follow)."""
    return r.run_item(item["work_id"], item["payload"], *args, attempt=item["attempt"])


def _several(
    r: IsolatedRunner, items: list[dict[str, Any]], deadline: float | None
) -> tuple[list[Any], Any]:
    """``r.run`` of ``items``: the outcomes that came (in order), and the whole's failure."""
    batch = Batch(
        [w["work_id"] for w in items], [w["payload"] for w in items], [w["attempt"] for w in items]
    )
    out = Outcomes(len(items))
    whole = r.run(batch, out, deadline, 1.0, lambda: False, lambda: None)
    return [out.item(i) for i in range(len(items)) if out.by[i] is not None], whole


def _run(r: IsolatedRunner, item: dict[str, Any], seconds: float = 30.0) -> Any:
    beats: list[float] = []
    outcome = _one(
        r, item, time.monotonic() + seconds, seconds, lambda: False, lambda: beats.append(1.0)
    )
    return outcome, beats


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_item_runs_in_a_child_that_is_told_its_context_and_kept(runner: Any) -> None:
    import orjson

    # What Open MPI's and Hydra's (MPICH, Intel MPI) mpiexec set; the child must not see them.
    launcher = {"OMPI_COMM_WORLD_RANK": "3", "PMI_RANK": "3", "PMI_FD": "9", "HYDI_CONTROL_FD": "7"}
    launcher |= {"HYDRA_BSTRAP_PROXY_ID": "0", "MPI_LOCALRANKID": "3"}
    os.environ.update(launcher)
    try:
        first, _ = _run(runner, _item("w1"))
    finally:
        for k in launcher:
            del os.environ[k]
    second, _ = _run(runner, _item("w2"))
    a, b = orjson.loads(first.raw), orjson.loads(second.raw)
    assert a["pid"] != os.getpid() and a["pid"] == b["pid"]  # one child, kept across items
    assert (a["work_id"], a["attempt"]) == ("w1", 1) and 29 < a["left"] <= 30
    assert a["mpi"] == []


def test_a_hang_is_killed_at_its_deadline_with_its_process_group(runner: Any) -> None:
    """Issue 14: nothing ended a hung function; its rank was lost for good."""
    pid = _run(runner, _item("w0"))[0].raw
    start = time.monotonic()
    out, _ = _run(runner, _item("w1", do="hang", child="303.25"), seconds=1.0)
    took = time.monotonic() - start
    assert (out.kind, out.raw) == ("timeout", None) and "w1" in (out.reason or "")
    assert 0.9 <= took < 10
    assert not any("sleep 303.25" in _cmdline(p) for p in _pids())  # its group died with it
    after, beats = _run(runner, _item("w2"))
    assert after.kind is None and after.raw != pid  # a fresh child serves the next item
    assert len(beats) == 1  # the restart sent a heartbeat: its start costs no item's time
    assert runner.restarts == 1


@pytest.mark.parametrize(
    ("do", "why"),
    [("segfault", "SIGSEGV"), ("abort", "SIGABRT"), ("exit", "exited with code 3")],
)
def test_a_child_that_dies_is_a_crash_with_its_signal_and_is_restarted(
    runner: Any, do: str, why: str
) -> None:
    out, _ = _run(runner, _item("w1", do=do))
    assert out.kind == "crash" and why in (out.reason or ""), out
    assert _run(runner, _item("w2"))[0].kind is None


@pytest.mark.parametrize(
    ("do", "kind", "why"),
    [
        ("raise", "error", "ValueError: bad input"),
        ("memory", "error", "MemoryError"),
        ("big", "result-too-large", "over 4096"),
    ],
)
def test_a_function_that_fails_in_its_child_keeps_the_child(
    runner: Any, do: str, kind: str, why: str
) -> None:
    import orjson

    before = orjson.loads(_run(runner, _item("w0"))[0].raw)["pid"]
    out, _ = _run(runner, _item("w1", do=do))
    assert out.kind == kind and why in (out.reason or ""), out
    assert orjson.loads(_run(runner, _item("w2"))[0].raw)["pid"] == before


def test_heartbeats_push_the_deadline_as_the_master_does(runner: Any) -> None:
    out, beats = _run(runner, _item("w1", do="beat", seconds=1.5), seconds=0.6)
    assert out.kind is None and len(beats) >= 10


def test_stop_while_an_item_runs_kills_the_child(runner: Any) -> None:
    child = runner._child.proc
    calls = []

    def tick() -> bool:
        calls.append(1)
        return len(calls) > 20

    with pytest.raises(StopRequested):
        _one(runner, _item("w1", do="hang"), None, 1.0, tick, lambda: None)
    assert child.poll() is not None


def test_a_function_the_child_cannot_find_by_name_is_refused() -> None:
    with pytest.raises(IsolationError, match="lambda or a nested function"):
        IsolatedRunner(lambda p: p, "payload", 100, None, subreaper=False)


UNGUARDED = """
from mpi4py import MPI
RANK = MPI.COMM_WORLD.Get_rank()   # at import: the child would run it again

def fn(payload):
    return payload

from durable_dispatch.mpi.isolation import IsolatedRunner, IsolationError
try:
    IsolatedRunner(fn, "payload", 100, None)
except IsolationError as e:
    print("REFUSED", e)
"""


def test_a_script_that_runs_mpi_at_import_is_refused_with_the_fix(tmp_path: Path) -> None:
    """The child imports the campaign script again (as multiprocessing's spawn does); there MPI
    is never initialised, so a script that calls MPI at import fails fast with the reason."""
    script = tmp_path / "campaign.py"
    script.write_text(UNGUARDED)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert "REFUSED" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "if __name__" in out.stdout and "exited with code" in out.stdout


KILLED_AT_START = """
import os, signal, sys
from pathlib import Path

COUNT = Path({count!r})
if __name__ == "__mp_main__":  # the child, importing this script: SIGKILLed while it starts
    n = int(COUNT.read_text()) if COUNT.exists() else 0
    COUNT.write_text(str(n + 1))
    if n < {kills}:
        os.kill(os.getpid(), signal.SIGKILL)

def fn(payload):
    return payload

if __name__ == "__main__":
    from durable_dispatch.mpi.isolation import IsolatedRunner, IsolationError
    try:
        r = IsolatedRunner(fn, "payload", 100, None, subreaper=False)
    except IsolationError as e:
        print("REFUSED", e, flush=True)
        sys.exit(0)
    out = r.run_item("w", 7, None, 1.0,
                     lambda: False, lambda: None)
    r.close()
    print("RAN", out.raw, flush=True)
"""


@pytest.mark.parametrize(("kills", "expect"), [(2, "RAN b'7'"), (3, "REFUSED")])
def test_a_child_killed_by_a_signal_while_it_starts_is_started_again(
    tmp_path: Path, kills: int, expect: str
) -> None:
    """A child SIGKILLed before it said it was up (the OOM killer, an operator) says nothing
    about the work function: the start is tried again, and only three in a row end the rank
    (torture seed 917007198 once ended the rank at the first)."""
    script = tmp_path / "campaign.py"
    count = tmp_path / "starts"
    script.write_text(KILLED_AT_START.format(count=str(count), kills=kills))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert expect in out.stdout, out.stdout + out.stderr[-2000:]
    assert count.read_text() == str(min(kills + 1, 3))
    if expect == "REFUSED":
        assert "killed by SIGKILL while it started, 3 times in a row" in out.stdout


#: The sleeps the tests below leave behind carry this process's pid (``sleep 304.75<pid>``,
#: matched as a whole argument), so that each cleanup kills its own and none of another test
#: process's (pytest-xdist, or a second suite on the machine).
_TAG = str(os.getpid())


SUBREAPER = """
import sys, time
sys.path.insert(0, {tests!r})
from test_isolation import work
from durable_dispatch.mpi.isolation import IsolatedRunner

def leave_daemon(payload, ctx):
    import subprocess
    subprocess.Popen(["setsid", "-f", "sleep", "304.75{tag}"])   # leaves the group and the session
    return "ok"

if __name__ == "__main__":
    r = IsolatedRunner(leave_daemon, "context", 100, None)
    print(r.run_item("w", None, None, 1.0,
                     lambda: False, lambda: None).kind, flush=True)
    time.sleep(0.5)
    r.close()
    print("closed", flush=True)
"""


def test_a_daemon_the_function_left_dies_when_the_worker_closes(tmp_path: Path) -> None:
    """U3: the worker is the subreaper of its descendants, so a daemon that left the item's
    group and session is still found and killed when the worker stops."""
    script = tmp_path / "worker.py"
    script.write_text(SUBREAPER.format(tests=str(Path(__file__).parent), tag=_TAG))
    try:
        out = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120
        )
        assert out.stdout.split() == ["None", "closed"], out.stderr[-2000:]
        left = [p for p in _pids() if f"sleep 304.75{_TAG} " in _cmdline(p)]
        assert left == []
    finally:
        for p in _pids():
            if f"sleep 304.75{_TAG} " in _cmdline(p):
                os.kill(p, signal.SIGKILL)


LEFTOVERS = """
import subprocess, sys, time
sys.path.insert(0, {tests!r})
from durable_dispatch.mpi.isolation import IsolatedRunner

def leave_two(payload, ctx):
    subprocess.Popen(["sleep", "304.76{tag}"], start_new_session=True)   # the child's own child
    subprocess.Popen(["setsid", "-f", "sleep", "304.77{tag}"])          # an orphan, re-parented
    time.sleep(0.3)
    return "ok"

def alive():
    out = subprocess.run(["pgrep", "-f", "sleep 304.7[67]{tag}$"], capture_output=True, text=True)
    return len(out.stdout.split())

if __name__ == "__main__":
    r = IsolatedRunner(leave_two, "context", 100, None)
    o = r.run_item("w", None, None, 1.0,
                   lambda: False, lambda: None)
    print(o.kind, alive(), flush=True)
    r.close()
"""


def test_what_an_item_leaves_running_is_killed_when_its_dispatch_ends(tmp_path: Path) -> None:
    """U3 (issue 35's harness found it): a process an item left running, the child's own or an
    orphan re-parented to the worker, is killed when the dispatch ends, not when the worker
    stops: a worker SIGKILLed later (the OOM killer) cannot kill it, and it kept the job's
    output pipes open, so mpiexec never ended."""
    script = tmp_path / "worker.py"
    script.write_text(LEFTOVERS.format(tests=str(Path(__file__).parent), tag=_TAG))
    try:
        out = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120
        )
        assert out.stdout.split() == ["None", "0"], out.stdout + out.stderr[-2000:]
    finally:
        for p in _pids():
            if any(f"sleep 304.7{k}{_TAG} " in _cmdline(p) for k in "67"):
                os.kill(p, signal.SIGKILL)


ORPHAN_HOLDS_OUTPUT = """
import os, signal, subprocess, sys, threading, time
sys.path.insert(0, {tests!r})
from durable_dispatch.mpi.isolation import IsolatedRunner

def start_and_wait(payload, ctx):
    print("hello from the child", flush=True)
    subprocess.Popen(["sleep", "304.78{tag}"], start_new_session=True)  # inherits its output
    time.sleep(60)

if __name__ == "__main__":
    r = IsolatedRunner(start_and_wait, "context", 100, None)
    threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()  # the OOM killer
    r.run_item("w", None, None, 1.0,
               lambda: False, lambda: None)
"""


def test_a_process_left_running_does_not_hold_the_workers_output(tmp_path: Path) -> None:
    """The torture harness's second finding: an item starts a process (in a session of its
    own) and its worker is SIGKILLed mid-dispatch: the process, re-parented to init, held the
    rank's output, so mpiexec waited for it forever. The child's output now goes through the
    worker (a relay), and the worker's own output closes when the worker dies."""
    script = tmp_path / "worker.py"
    script.write_text(ORPHAN_HOLDS_OUTPUT.format(tests=str(Path(__file__).parent), tag=_TAG))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, _err = proc.communicate(timeout=30)  # EOF once the worker is dead
        assert "hello from the child" in out  # the relay copied the child's output
        assert proc.returncode == -signal.SIGKILL
    finally:
        proc.kill()
        for p in _pids():
            if f"sleep 304.78{_TAG} " in _cmdline(p):
                os.kill(p, signal.SIGKILL)


def test_a_child_whose_worker_is_gone_before_it_runs_leaves_at_once() -> None:
    """The torture harness's third finding: workers SIGKILLed while their children were still
    importing (7 ranks on 2 cores) left the children running, since they asked to die with
    their worker only after their imports. The bootstrap asks first, then leaves at once if its
    worker is already gone: here a parent pid that is not its parent, and it exits 1 before
    importing anything of the package."""
    from durable_dispatch.mpi import isolation

    code = isolation._BOOTSTRAP + "\nprint('imported')"
    out = subprocess.run(
        [sys.executable, "-c", code, "0", "0", "0", "0", "1"],  # pid 1 is not its parent
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and out.stdout == "", out.stdout + out.stderr


def _pids() -> list[int]:
    return [
        int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and _alive(int(e.name))
    ]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_dispatch_of_several_items_goes_on_in_a_fresh_child_after_a_crash(runner: Any) -> None:
    items = [_item("a"), _item("b", do="segfault"), _item("c"), _item("d", do="raise")]
    out, whole = _several(runner, items, None)
    assert whole is None and [o.kind for o in out] == [None, "crash", None, "error"]
    assert runner.restarts == 1


def test_a_dispatch_of_several_items_fails_as_a_whole_at_its_shared_deadline(runner: Any) -> None:
    items = [_item("a"), _item("b", do="hang"), _item("c")]
    out, whole = _several(runner, items, time.monotonic() + 1.0)
    assert whole is not None and whole.kind == "timeout" and "b:" in (whole.reason or "")
    assert [o.kind for o in out] in ([], [None])  # a's result may not have been sent yet


def test_a_child_that_closes_its_pipes_is_killed_and_replaced_not_waited_for(
    runner: Any,
) -> None:
    out, _ = _run(runner, _item("w1", do="close-pipes"))
    assert out.kind == "crash" and "closed its pipe" in (out.reason or ""), out
    assert _run(runner, _item("w2"))[0].kind is None


def test_u9_a_restarted_child_keeps_each_items_own_timeout(runner: Any) -> None:
    """Issue 29.3: after a restart the next item's deadline became now + the watchdog's lease
    (120 s). The worker now restarts the child before its READY (prepare), and an item with its
    own timeout (lease 0 from the master) is never extended, by a restart or by a heartbeat."""
    beats: list[int] = []

    def hang(work_id: str) -> tuple[Any, float]:
        start = time.monotonic()
        out = _one(
            runner,
            _item(work_id, do="hang"),
            start + 1.0,
            0.0,
            lambda: False,
            lambda: beats.append(1),
        )
        return out, time.monotonic() - start

    out, _ = _run(runner, _item("w1", do="segfault"))
    assert out.kind == "crash" and runner._child is None
    runner.prepare()  # what run_worker does between the RESULT and the READY
    assert runner.restarts == 1 and runner._child is not None
    out, took = hang("w2")
    assert out.kind == "timeout" and took < 30 and beats == []
    # killed: without prepare() the item in hand pays for the start, and is not extended
    out, took = hang("w3")
    assert out.kind == "timeout" and took < 30 and beats == [] and runner.restarts == 2
    runner.prepare()
    runner.prepare()  # a child that runs is kept
    assert runner.restarts == 3


def test_two_sessions_starting_and_killing_children_side_by_side_never_kill_each_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two executors open at once (issue 48): a worker serves each in a thread with a runner of
    its own. One session's child was taken for a leftover by the other's sweep when it was
    started between the sweep's look at the live children and its kill: the starting runner
    got BrokenPipeError writing the child's setup, and the futures worker rank ended the job
    (MPI_Abort; seen once in two runs of the conformance suite). Here one thread starts a
    fresh child for each item (its runner closed after each) while the other's items hang to a
    0.1 s deadline (a kill and a sweep each): every item of the first still runs. A start is
    made slow after the fork (as on a loaded machine, where the thread loses the core there),
    so that the other thread's sweeps meet children being started."""
    import threading
    import types

    from durable_dispatch.mpi import isolation

    def slow_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(*args, **kwargs)
        time.sleep(0.05)
        return proc

    monkeypatch.setattr(
        isolation, "subprocess", types.SimpleNamespace(**{**vars(subprocess), "Popen": slow_popen})
    )

    errors: list[BaseException] = []
    outcomes: list[Any] = []
    end = time.monotonic() + 6.0

    def start_many() -> None:
        try:
            while time.monotonic() < end:
                r = IsolatedRunner(work, "context", 4096, 1 << 30, subreaper=True)
                try:
                    outcomes.append(_run(r, _item("a"))[0])
                finally:
                    r.close()
        except BaseException as e:  # noqa: BLE001 - the finding
            errors.append(e)

    def kill_many() -> None:
        r = IsolatedRunner(work, "context", 4096, 1 << 30, subreaper=True)
        try:
            while time.monotonic() < end:
                _run(r, _item("b", do="hang"), seconds=0.1)
        except BaseException as e:  # noqa: BLE001 - the finding
            errors.append(e)
        finally:
            r.close()

    threads = [threading.Thread(target=start_many), threading.Thread(target=kill_many)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert outcomes and all(o.kind is None for o in outcomes), [
        (o.kind, o.reason) for o in outcomes if o.kind is not None
    ]


def test_a_users_stdout_without_flush_does_not_turn_a_finished_item_into_a_crash(
    runner: Any,
) -> None:
    """The child flushes the item's streams when it ends (so that its kept output is whole): a
    ``sys.stdout`` the user replaced with a write-only object (no ``flush``) is not an error
    of the item, which finished: its result comes back, and the next item runs in that child."""
    import orjson

    outcome, _ = _run(runner, _item("w1", do="no-flush"))
    assert outcome.kind is None and orjson.loads(outcome.raw) == "done", outcome
    after, _ = _run(runner, _item("w2"))
    assert after.kind is None, after


def test_a_worker_output_that_refuses_writes_does_not_break_its_children(tmp_path: Path) -> None:
    """The worker copies its children's output to its own (the job's log); when that refuses
    a write (a full disk: ``/dev/full`` here), the chunk is dropped and the copying goes on:
    the next items' prints still work (the relay had ended on the first error, and every
    later print of the child failed on a closed pipe) and their output is still kept."""
    script = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_isolation import work\n"
        "from durable_dispatch.mpi.isolation import IsolatedRunner\n"
        "r = IsolatedRunner(work, 'context', 4096, None, subreaper=False)\n"
        "for w in ('w1', 'w2', 'w3'):\n"
        "    o = r.run_item(w, {'do': 'print'},\n"
        "                   time.monotonic() + 60, 60.0, lambda: False, lambda: None)\n"
        "    kept = len((o.output or {}).get('stdout', b''))\n"
        "    print(w, o.kind, o.raw, kept, file=sys.stderr, flush=True)\n"
        "r.close()\n"
    )
    with open("/dev/full", "w") as full:
        res = subprocess.run(
            [sys.executable, "-c", script], stdout=full, stderr=subprocess.PIPE, text=True,
            timeout=120,
        )  # fmt: skip
    lines = [ln.split() for ln in res.stderr.splitlines() if ln.startswith("w")]
    assert [ln[:3] for ln in lines] == [
        [w, "None", "b'\"printed\"'"] for w in ("w1", "w2", "w3")
    ], res.stderr[-3000:]
    assert all(int(ln[3]) == 64 << 10 for ln in lines), lines  # each item's last 64 KiB kept
