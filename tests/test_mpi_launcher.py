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
    if launcher.mpi_flavor() != "openmpi":  # Hydra runs as root as it is: nothing to set
        assert "OMPI_ALLOW_RUN_AS_ROOT" not in env
        return
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    # ...and only in the child's environment, never in ours.
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in os.environ


def test_command_line() -> None:
    """Issue 33: each MPI's dialect (MPICH's Hydra rejected --oversubscribe)."""
    from durable_dispatch.errors import UsageError

    if launcher.mpi_flavor() == "openmpi":
        cmd = launcher.mpiexec_command(4, ["python", "x.py"], ulfm=True)
        over = ["--oversubscribe", "--bind-to", "none"]
        assert cmd[1:] == ["-n", "4", *over, "--with-ft", "ulfm", "python", "x.py"]
        assert launcher.ulfm_available()
    else:
        pin = ["-genv", "I_MPI_PIN", "0"] if launcher.mpi_flavor() == "intel" else []
        cmd = launcher.mpiexec_command(4, ["python", "x.py"])
        assert cmd[1:] == ["-n", "4", *pin, "python", "x.py"]
        with pytest.raises(UsageError, match="ULFM needs Open MPI"):
            launcher.mpiexec_command(4, ["python", "x.py"], ulfm=True)
        assert not launcher.ulfm_available()
    assert launcher.mpiexec_command(2, ["x"], mpiexec="/opt/mpiexec")[0] == "/opt/mpiexec"
    assert launcher.mpi_flavor("/opt/mpiexec") == "unknown"


def test_the_flavor_is_read_from_mpiexec_version(tmp_path: Path) -> None:
    for text, flavor in (
        ("prterun (Open MPI) 5.0.8", "openmpi"),
        ("HYDRA build details:\n    Version: 5.0.2", "mpich"),
        ("Intel(R) MPI Library for Linux* OS, Version 2021.19", "intel"),
        ("something else", "unknown"),
    ):
        fake = tmp_path / f"mpiexec-{flavor}"
        fake.write_text(f"#!/bin/sh\necho '{text}'\n")
        fake.chmod(0o755)
        assert launcher.mpi_flavor(str(fake)) == flavor


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


def test_ranks_are_not_bound_to_cores(tmp_path: Path) -> None:
    """Issue 33: Intel MPI's Hydra pinned rank i to core i, so with more ranks than cores the
    master shared its core with a worker and that worker's isolated child. Each rank may run on
    every core this process may run on, on each MPI."""
    # one write per line: three ranks' print() calls (a write per argument when the output
    # is a terminal) came out interleaved under MPICH ("CPUSCPUS [0, 1]")
    code = "import os; os.write(1, f'CPUS {sorted(os.sched_getaffinity(0))}\\n'.encode())"
    cmd = launcher.mpiexec_command(3, [sys.executable, "-c", code])
    res = launcher.run_mpiexec(cmd, timeout=60, quiet=True)
    assert res.returncode == 0, res.stderr[-2000:]
    seen = [line for line in res.stdout.splitlines() if line.startswith("CPUS")]
    assert seen == [f"CPUS {sorted(os.sched_getaffinity(0))}"] * 3, res.stdout


def test_stale_shm_files_of_dead_ranks_are_removed(tmp_path: Path) -> None:
    """Issue 33: killed MPICH and Intel MPI ranks left 16 MiB '<pid>:0:0' files in /dev/shm
    (404 of them after two test runs here), and a rank that later got such a pid failed
    MPI_Init with 'OFI EP enable failed ... Device or resource busy'."""
    import subprocess

    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in (f"{dead.pid}:0:0", f"{os.getpid()}:0:0", "7:x:0", "other"):
        (tmp_path / name).write_bytes(b"")
    assert launcher.remove_stale_shm(tmp_path) == [f"{dead.pid}:0:0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{os.getpid()}:0:0", "7:x:0", "other"]
    )


def test_a_stale_shm_file_whose_pid_was_given_again_is_removed(tmp_path: Path) -> None:
    """CI's Intel MPI pass: 5 of 16 ranks died of a segfault in MPI_Init. A killed rank's
    '<pid>:0:0' file outlived it, and was kept while another process had that pid; a rank that
    later got the pid found it (reproduced here with a small pid_max: segfaults in MPI_Init and
    'OFI EP enable failed'). A file last modified before the process now holding its pid
    started cannot be that process's."""
    import subprocess

    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        own = tmp_path / f"{later.pid}:0:0"
        own.write_bytes(b"")  # made while it runs: perhaps its own
        assert launcher.remove_stale_shm(tmp_path) == []
        os.utime(own, (1e9, 1e9))  # 2001: long before it started
        assert launcher.remove_stale_shm(tmp_path) == [own.name]
        assert not own.exists()
    finally:
        later.kill()
        later.wait()


def _stale_session_dir(base: Path, pid: int, host: str) -> Path:
    """What a SIGKILLed Open MPI 5 mpiexec of pid ``pid`` on ``host`` leaves (its PMIx
    rendezvous files)."""
    d = base / f"ompi.{pid}"
    (d / "0").mkdir(parents=True)
    for name in (f"pmix.{host}.tool", f"pmix.{host}.tool.{pid}", f"pmix.{host}.tool.x@0"):
        (d / name).write_text(f"4.2:tcp4://127.0.0.1:{40000 + pid % 1000};{pid}\n")
    return d


def test_a_killed_mpiexecs_session_directory_is_removed_before_the_next_starts(
    tmp_path: Path,
) -> None:
    """A SIGKILLed mpiexec (killed by anything but kill_session) left ``ompi.<pid>``; an
    mpiexec later given that pid died at once, "The PMIx server's listener thread failed to
    start" (2 of 10 runs of two test files side by side here, once the suite had left about 90
    such directories in /tmp). Only a dead pid's, this host's, this user's directory goes."""
    import subprocess

    host = os.uname().nodename
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = _stale_session_dir(tmp_path, dead.pid, host)
    alive = _stale_session_dir(tmp_path, os.getpid(), host)
    other_host = _stale_session_dir(tmp_path, dead.pid + 1, "some-other-node")
    (tmp_path / "ompi.notapid").mkdir()
    assert stale in launcher.remove_stale_session_dirs(str(tmp_path))
    assert not stale.exists()
    assert alive.exists() and other_host.exists() and (tmp_path / "ompi.notapid").exists()


@pytest.mark.skipif(
    launcher.find_mpiexec() is None or launcher.mpi_flavor() != "openmpi",
    reason="Open MPI's session directory (MPICH's Hydra and Intel MPI keep none)",
)
def test_an_mpiexec_starts_where_killed_ones_left_their_session_directories(
    tmp_path: Path,
) -> None:
    """The stale directories of the next 500 pids, as killed mpiexecs leave them: the next
    mpiexec starts (before: "The PMIx server's listener thread failed to start")."""
    host = os.uname().nodename
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    for k in range(1, 501):
        pid = (last + k) % top or 1
        if not (tmp_path / f"ompi.{pid}").exists() and not Path(f"/proc/{pid}").exists():
            _stale_session_dir(tmp_path, pid, host)
    cmd = launcher.mpiexec_command(2, [sys.executable, "-c", "print('ok')"])
    res = launcher.run_mpiexec(cmd, timeout=60, env={"TMPDIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("ok") == 2
