"""run_command with real programs: deadlines kill the whole process group, output is bounded,
and nothing the program started outlives its item."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durable_dispatch import run_command
from durable_dispatch.errors import UsageError

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_exit_code_and_output() -> None:
    out = run_command(
        [PY, "-c", "import sys; print('hi'); sys.stderr.write('e'); sys.exit(3)"], timeout=60
    )
    assert out.returncode == 3 and out.signal is None and not out.timed_out and not out.ok
    assert out.stdout == b"hi\n" and out.stderr == b"e"
    assert out.stdout_sha256 == hashlib.sha256(b"hi\n").hexdigest()


def test_stdin_is_fed_and_a_success_is_ok() -> None:
    out = run_command(
        [PY, "-c", "import sys; sys.stdout.write(sys.stdin.read().upper())"],
        timeout=60,
        stdin=b"abc" * 100_000,
    )
    assert out.ok and out.stdout == b"ABC" * 100_000


def test_a_crash_is_named_by_its_signal() -> None:
    out = run_command(
        [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], timeout=60
    )
    assert out.returncode is None and out.signal == "SIGSEGV" and not out.timed_out


def test_a_hang_is_killed_with_its_descendants_at_the_deadline(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen(['sleep', '300'])\nopen({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)\n"
    )
    start = time.monotonic()
    out = run_command([PY, "-c", code], timeout=2)
    assert out.timed_out and out.signal == "SIGKILL"
    assert time.monotonic() - start < 60  # the deadline ended it, not the 300 s sleep
    grandchild = int(pidfile.read_text())
    for _ in range(100):
        if not _alive(grandchild):
            break
        time.sleep(0.05)
    assert not _alive(grandchild), "a descendant outlived its item"


def test_a_background_child_left_behind_is_killed_when_the_program_exits(tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    code = (
        "import subprocess\n"
        f"p = subprocess.Popen(['sleep', '300'])\nopen({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "print('done')\n"
    )
    out = run_command([PY, "-c", code], timeout=120)
    assert out.returncode == 0 and out.stdout == b"done\n" and not out.timed_out
    assert out.seconds < 100  # it did not wait for the sleep holding the pipes
    bg = int(pidfile.read_text())
    for _ in range(100):
        if not _alive(bg):
            break
        time.sleep(0.05)
    assert not _alive(bg)


def test_64_mb_of_output_is_counted_and_digested_but_not_held() -> None:
    """Issue 14: a 64 MB output must not blow the worker's memory. Measured in a child."""
    child = (
        "import resource, sys\n"
        "from durable_dispatch import run_command\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "out = run_command([sys.executable, '-c', "
        "'import sys\\nfor _ in range(1024): sys.stdout.buffer.write(b\"x\" * 65536)'], "
        "timeout=120, max_output=4096)\n"
        "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base\n"
        "print(out.stdout_bytes, len(out.stdout), out.truncated, grew)\n"
    )
    res = subprocess.run([PY, "-c", child], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    count, kept, truncated, grew_kb = res.stdout.split()
    assert int(count) == 64 << 20 and int(kept) == 4096 and truncated == "True"
    assert int(grew_kb) < 16 << 10  # far below 64 MB


def test_bad_calls_are_usage_errors() -> None:
    with pytest.raises(UsageError):
        run_command([], timeout=1)
    with pytest.raises(UsageError):
        run_command(["true"], timeout=0)
    with pytest.raises(UsageError):
        run_command(["true"], timeout=1, max_output=-1)
    with pytest.raises(FileNotFoundError):
        run_command(["/nonexistent/program"], timeout=1)
    assert os.environ  # the environment is passed through by default
