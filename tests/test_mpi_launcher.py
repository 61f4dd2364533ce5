"""Tests of durable_dispatch.mpi.launcher: root variables, timeouts that kill the whole session."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from durable_dispatch.mpi import launcher

pytestmark = pytest.mark.mpi


def test_root_variables_only_for_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMPI_ALLOW_RUN_AS_ROOT", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    env = launcher.launch_env(quiet=True)
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in env
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    env = launcher.launch_env(quiet=True)
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    # ...and only in the child's environment, never in ours.
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in os.environ


def test_command_line() -> None:
    cmd = launcher.mpiexec_command(4, ["python", "x.py"], ulfm=True)
    assert cmd[1:] == ["-n", "4", "--oversubscribe", "--with-ft", "ulfm", "python", "x.py"]
    assert launcher.mpiexec_command(2, ["x"], mpiexec="/opt/mpiexec")[0] == "/opt/mpiexec"


def test_a_hung_job_is_killed_whole_at_the_timeout(tmp_path: Path) -> None:
    marker = tmp_path / "pids"
    script = tmp_path / "hang.py"
    script.write_text(
        "import os, time\n"
        f"open({str(marker)!r} + '.' + str(os.getpid()), 'w').close()\n"
        "time.sleep(3600)\n"
    )
    cmd = launcher.mpiexec_command(3, [sys.executable, str(script)])
    t = time.monotonic()
    res = launcher.run_mpiexec(cmd, timeout=8)
    assert res.timed_out and time.monotonic() - t < 120
    # Its session directory went with it: a later mpiexec given the same pid would otherwise
    # find the stale PMIx rendezvous files and die ("listener thread failed to start", 213).
    assert not any(d.exists() for d in launcher.session_dirs(res.session))
    pids = [int(p.name.rsplit(".", 1)[1]) for p in tmp_path.glob("pids.*")]
    assert len(pids) == 3
    time.sleep(0.5)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_a_missing_mpiexec_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """FileNotFoundError, the builtin for it (docs/errors.md), naming the extra to install.
    The Open MPI wheel cannot be uninstalled here, so its finder is replaced."""
    from durable_dispatch.mpi import launcher

    monkeypatch.setattr(launcher, "find_mpiexec", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"durable-dispatch\[mpi\]"):
        launcher.mpiexec_command(2, ["true"])
