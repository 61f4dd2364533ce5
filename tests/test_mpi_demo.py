"""The demo command end to end: `durable-dispatch demo` under a real mpiexec, then resume."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi


def demo(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "durable_dispatch",
            "demo",
            "--state-dir",
            str(state),
            "--items",
            "30",
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_runs_with_faults_and_resumes(tmp_path: Path) -> None:
    out = demo(tmp_path / "s")
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout)
    assert (s["work_items"], s["lost"], s["duplicate_commits"]) == (30, 0, 0)
    assert s["committed"] + s["deferred"] == 30
    # Isolated (the default): the hung and the segfaulting item cost a retry each, not a rank.
    assert s["failures_by_kind"]["timeout"] >= 1 and s["failures_by_kind"]["crash"] >= 1
    # A rank is parked at the end only where the master's watchdog fired (the "missing" answer,
    # or, on a loaded machine, a child's own timeout answered after the master's deadline),
    # never for an item's own failure.
    assert s["item_failures"] >= 1
    assert s["parked_ranks_now"] <= s["dispatch_watchdog_timeouts"], s
    from durable_dispatch.mpi.launcher import mpi_flavor

    if __import__("os").geteuid() == 0 and mpi_flavor() == "openmpi":  # Hydra needs none
        assert "OMPI_ALLOW_RUN_AS_ROOT=1" in out.stderr  # says so when it sets them
    again = demo(tmp_path / "s")
    assert again.returncode == 0
    s2 = json.loads(again.stdout)
    assert s2["epoch"] == 2 and s2["committed"] == s["committed"] and s2["lost"] == 0


def test_demo_without_faults_and_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "durable_dispatch", "demo", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "Example:" in out.stdout and "--no-faults" in out.stdout


def test_demo_with_multi_item_dispatches(tmp_path: Path) -> None:
    out = demo(tmp_path / "s", "--no-faults", "--batch", "8")
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads(out.stdout)
    assert (s["committed"], s["lost"], s["duplicate_commits"]) == (30, 0, 0)
    assert s["dispatched_items"] == 30 and s["dispatches"] == 4  # 8 + 8 + 8 + 6
    assert s["batch_splits"] == 0


@pytest.mark.parametrize(
    "bad", [["--batch", "0"], ["--ranks", "1"], ["--items", "0"], ["--watchdog", "nan"]]
)
def test_demo_refuses_bad_options_before_starting_mpiexec(tmp_path: Path, bad: list[str]) -> None:
    """Issue 15: 'demo --batch 0' raised inside mpiexec and the user waited the whole 600 s
    timeout for 'Error: demo did not finish'."""
    import time

    start = time.monotonic()
    out = demo(tmp_path / "s", *bad)  # with --json: the error is JSON on stdout (issue 18)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "must be" in json.loads(out.stdout)["error"]["message"], out.stdout
    assert time.monotonic() - start < 30 and not (tmp_path / "s").exists()


@contextlib.contextmanager
def _demo_in_a_terminal(
    state: Path, ms: float = 40.0, items: int = 600
) -> Iterator[tuple[int, int]]:
    """The demo on a pseudo-terminal, as a user at a shell starts it: yields ``(pid, pty fd)``
    and kills it (if still there) and closes the terminal after."""
    import os
    import pty
    import signal

    args = ["--state-dir", str(state), "--items", str(items), "--no-faults", "--json"]
    args += ["--ms", str(ms)]
    pid, fd = pty.fork()
    if pid == 0:  # the child: its own session, the pty its controlling terminal
        # As a shell does for a foreground job: a runner that started this suite in the
        # background ("cmd &" without job control) left SIGINT ignored, an ignored signal stays
        # ignored across exec, and Python then installs no KeyboardInterrupt: Ctrl-C would do
        # nothing (seen in a fresh-clone .ci/run started that way).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execv(sys.executable, [sys.executable, "-m", "durable_dispatch", "demo", *args])
    try:
        yield pid, fd
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(fd)


def _read_all(fd: int, pid: int, timeout: float) -> tuple[str, int]:
    """Everything the terminal shows until the program exits, and its exit code."""
    import os
    import select
    import time

    out, end = b"", time.monotonic() + timeout
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not data:
                break
            out += data
    _, status = os.waitpid(pid, 0)
    return out.decode(errors="replace").replace("\r\n", "\n"), os.waitstatus_to_exitcode(status)


def _wait_for_commits(state: Path, n: int) -> None:
    import time

    journal = state / "events.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if journal.exists() and journal.read_bytes().count(b'"committed"') >= n:
            return
        time.sleep(0.05)
    raise AssertionError("the demo made no progress")


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_in_a_terminal_drains_the_demo_and_a_second_one_stops_it(
    tmp_path: Path, presses: int
) -> None:
    """Issue 15: Ctrl-C printed a KeyboardInterrupt traceback and left the mpiexec job running in
    its own session. Ctrl-C (the byte ^C on a pseudo-terminal, so the terminal driver sends
    SIGINT) now drains: the summary says finished: false, nothing is in flight, exit 1; a second
    one kills the job's session (exit 130). Either way nothing is left running and the state
    directory resumes."""
    import os
    import time

    from durable_dispatch.campaign.admin import view_state

    state = tmp_path / "s"
    # With two presses 12 items take 1.5 s each, so that the drain the first one starts is still
    # on when the second arrives (with 40 ms items it could end first: exit 1, not 130).
    long = presses == 2
    ms = 1500.0 if long else 40.0
    with _demo_in_a_terminal(state, ms, 12 if long else 600) as (pid, fd):
        _wait_for_commits(state, 5 if presses == 1 else 2)
        for _ in range(presses):
            os.write(fd, b"\x03")
            time.sleep(0.3)
        out, code = _read_all(fd, pid, 120)
    assert "Traceback" not in out, out[-3000:]
    if presses == 1:
        assert code == 1, out[-3000:]
        summary = json.loads(out[out.index("{") :])
        assert summary["finished"] is False and summary["left"] > 0  # not done yet,
        assert summary["lost"] == 0 and summary["state"] == "stopped"  # not lost (issue 46)
        assert summary["duplicate_commits"] == 0
        assert not view_state(state).projection.in_flight  # drained
    else:
        assert code == 130 and "resumes" in out, out[-3000:]
    _assert_job_gone(state)
    # resumes where it stopped, with the same items (another --ms is another payload: U11)
    again = demo(state, "--no-faults", "--items", "12" if long else "600", "--ms", str(ms))
    assert again.returncode == 0, again.stderr[-3000:] + again.stdout[-3000:]
    s = json.loads(again.stdout)
    assert (s["lost"], s["duplicate_commits"], s["epoch"]) == (0, 0, 2)


def test_sigterm_stops_the_demo_and_its_job_with_exit_143(tmp_path: Path) -> None:
    """Issue 15: SIGTERM to the demo command kills its mpiexec session and exits 143, without a
    traceback."""
    import os
    import signal

    state = tmp_path / "s"
    with _demo_in_a_terminal(state) as (pid, fd):
        _wait_for_commits(state, 5)
        os.kill(pid, signal.SIGTERM)
        out, code = _read_all(fd, pid, 60)
    assert code == 143 and "Traceback" not in out, out[-3000:]
    _assert_job_gone(state)


def _assert_job_gone(state: Path) -> None:
    """No process of the demo's job (mpiexec and its ranks name the state directory) is left."""
    import os
    import time

    deadline = time.monotonic() + 10
    while True:
        job = [int(p) for p in os.listdir("/proc") if p.isdigit() and _in_demo_job(int(p), state)]
        if not job:
            return
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def _in_demo_job(pid: int, state: Path) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return str(state).encode() in cmd and stat[0] != "Z"


@pytest.mark.mpi
def test_a_resume_with_other_options_names_the_changed_payload(tmp_path: Path) -> None:
    """Another ``--ms`` changes every item's payload under its known work ID (U11): the resume
    is refused, and the demo's error names the cause, not only Open MPI's abort notice."""
    state = tmp_path / "s"
    first = demo(state, "--no-faults", "--ms", "5")
    assert first.returncode == 0, first.stderr[-3000:]
    again = demo(state, "--no-faults", "--ms", "6")
    assert again.returncode == 2, again.stdout[-3000:]
    message = json.loads(again.stdout)["error"]["message"]
    assert "ChangedPayloadError" in message and "demo-0000" in message, message


def test_the_demo_summary_is_in_words_a_user_knows(tmp_path: Path) -> None:
    """The summary a person reads names what happened: no JSON key (``invalid_result_rollbacks``),
    no ``stale RESULT=1`` or ``mode no-ulfm``: a late answer ignored, a malformed result refused,
    ULFM on or off. ``--json`` keeps the keys for machines."""
    out = subprocess.run(
        [sys.executable, "-m", "durable_dispatch", "demo", "--state-dir", str(tmp_path / "s")]
        + ["--items", "30"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "MPI fault tolerance (ULFM)" in text and "lost (must be 0)" in text, text
    assert "failed attempts by kind" in text and "timeout" in text, text
    for raw in ("RESULT=", "no-ulfm", "invalid_result_rollbacks", "stale ", "mode "):
        assert raw not in text, (raw, text)
