"""Process-tree hygiene for work that runs programs: no process outlives its item or job.

Linux only where it says so (``prctl``, ``/proc``); elsewhere these helpers do what they can and
say so in their return values.

- :func:`kill_group` kills a process group (a child started with its own group, and every
  descendant that stayed in it).
- :func:`become_subreaper` makes this process the "child subreaper" of its descendants
  (``PR_SET_CHILD_SUBREAPER``): a descendant whose parent exits is re-parented here instead of to
  init, so :func:`kill_descendants` still finds it, even after it left the group (``setsid``, a
  daemon's double fork).
- :func:`die_with_parent` asks the kernel to SIGKILL this process when its parent dies
  (``PR_SET_PDEATHSIG``), for a supervised child whose worker may be killed outright.
- :func:`start_reaper` starts a small process that outlives this one by an instant: when this
  process dies, however it dies (SIGKILL, the OOM killer, a normal exit), the kernel signals the
  reaper (``PR_SET_PDEATHSIG``), which then SIGKILLs what this process's work left: this
  process's own group (when it led it alone as the reaper started: Open MPI and MPICH start
  each rank in a group of its own; Slurm's tasks of a node share the group of the node's first
  task, which is then left alone), every group registered
  with :func:`reap_group` (the isolated children's), and every process whose environment
  carries this process's :data:`WORKER_MARK` (what its items started inherits it, even a
  program that left the group). The reaper sits in a group of its own, so a launcher that
  kills the rank's group does not take it before it has done its work, and it holds the rank's
  error output until it ends, so ``mpiexec`` ends only after it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

__all__ = [
    "kill_group",
    "become_subreaper",
    "die_with_parent",
    "kill_descendants",
    "children",
    "kill_trees",
    "start_reaper",
    "reap_group",
    "forget_group",
    "WORKER_MARK",
]

#: The longest :func:`kill_descendants` waits to reap what it killed.
REAP_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group ``pgid`` (nothing if the group is gone)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _prctl(option: int, arg: int) -> bool:
    name = ctypes.util.find_library("c")
    if name is None or not hasattr(os, "fork"):
        return False
    libc = ctypes.CDLL(name, use_errno=True)
    return bool(libc.prctl(option, arg, 0, 0, 0) == 0)


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants; False where the kernel cannot."""
    try:
        return _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int) -> bool:
    """SIGKILL this process when its parent dies; False where the kernel cannot, or when the
    parent (pid ``parent``) is already gone."""
    try:
        ok = _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):
        return False
    return ok and os.getppid() == parent


#: The environment variable that marks every process a worker's items start (its value is the
#: worker's own, set by :func:`start_reaper`): the reaper kills each process carrying it once
#: the worker is gone.
WORKER_MARK = "DURABLE_DISPATCH_WORKER"

# The reaper, run as ``python -I -S -c _REAPER WORKER_PID GROUP MARK``: no site, no import of
# this package (it starts in milliseconds, whatever the environment). It ignores the signals a
# launcher or a terminal sends to drain or end a job (its work comes after the worker's end),
# asks the kernel for SIGUSR2 when its parent dies, and reads ``+PGID`` / ``-PGID`` lines (the
# groups to kill, and those gone) on its standard input. Its parent's death shows as a new
# parent (a thread of the worker that ends hands its children to another thread of the same
# process: the same pid, not a death); it also looks every second, in case the signal was lost.
# The signal raises only while armed, once until the loop re-arms it: a second one that comes
# while the first is handled (the thread's end, then the process's) is not an error that would
# end the reaper before its kill pass.
_REAPER = r"""
import os, select, signal, sys, time
worker, group, mark = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].encode()
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT):
    signal.signal(s, signal.SIG_IGN)
class Gone(Exception):
    pass
state = {"reading": True, "rest": b"", "armed": False}
def gone(*_):
    if state["armed"]:  # once until re-armed: a second signal while one is handled is no error
        state["armed"] = False
        raise Gone
signal.signal(signal.SIGUSR2, gone)
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGUSR2), 0, 0, 0)
except Exception:
    pass
groups = {group} if group > 0 else set()
def serve():
    while os.getppid() == worker:
        if not state["reading"]:
            time.sleep(1.0)
        elif select.select([0], [], [], 1.0)[0]:
            data = os.read(0, 4096)
            if not data:
                state["reading"] = False
                continue
            *lines, state["rest"] = (state["rest"] + data).split(b"\n")
            for ln in lines:
                if ln[:1] == b"+":
                    groups.add(int(ln[1:]))
                elif ln[:1] == b"-":
                    groups.discard(int(ln[1:]))
while True:
    try:
        state["armed"] = True
        serve()
        break
    except Gone:
        if os.getppid() != worker:
            break
state["armed"] = False
signal.signal(signal.SIGUSR2, signal.SIG_IGN)
me = os.getpid()
for _ in range(2):
    for g in groups:
        try:
            os.killpg(g, signal.SIGKILL)
        except OSError:
            pass
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if mark in env:
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    time.sleep(0.05)
"""

_reaper: subprocess.Popen[bytes] | None = None
_reaper_lock = threading.Lock()


def start_reaper() -> bool:
    """Start this process's reaper (see the module docs), once per process; True when one
    runs. It marks this process's environment with :data:`WORKER_MARK` first, so what this
    process starts from now on carries the mark. False where there is no ``/proc`` or no
    ``PR_SET_PDEATHSIG`` (not Linux), or the reaper could not start (it is then logged by the
    caller's choice: nothing else changes)."""
    global _reaper
    with _reaper_lock:
        if _reaper is not None:
            return _reaper.poll() is None
        if not sys.platform.startswith("linux"):
            return False
        mark = os.environ.get(WORKER_MARK)
        if not mark or not mark.startswith(f"{os.getpid()}-"):  # (inherited: another's)
            mark = os.environ[WORKER_MARK] = f"{os.getpid()}-{uuid.uuid4().hex[:16]}"
        group = os.getpid() if _leads_group_alone() else 0
        try:
            _reaper = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _REAPER, str(os.getpid()), str(group)]
                + [f"{WORKER_MARK}={mark}"],
                stdin=subprocess.PIPE,
                # It holds the rank's error output (and writes nothing to it): a launcher ends
                # the job once every rank's output is closed, so never before the reaper ended
                stdout=subprocess.DEVNULL,
                process_group=0,  # a launcher's kill of the rank's group leaves it its work
            )
        except OSError:
            return False
        _spared.add(_reaper.pid)
        return True


def _leads_group_alone() -> bool:
    """True when this process leads its process group and nothing else is in it yet (Open
    MPI's and MPICH's ranks); False when it shares a group (Slurm's tasks of a node share the
    group of the node's first task: killing it would kill the other ranks)."""
    me = os.getpid()
    if os.getpgrp() != me:
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 2 and int(fields[2]) == me:  # field 5 of /proc/PID/stat: the group
            return False
    return True


def _tell_reaper(line: str) -> None:
    with _reaper_lock:
        r = _reaper
        if r is None or r.stdin is None:
            return
        try:
            r.stdin.write(line.encode() + b"\n")
            r.stdin.flush()
        except (OSError, ValueError):
            pass  # it is gone (killed): the rest of the hygiene still runs


def reap_group(pgid: int) -> None:
    """Have the reaper kill group ``pgid`` too when this process dies (an isolated child's)."""
    _tell_reaper(f"+{pgid}")


def forget_group(pgid: int) -> None:
    """Group ``pgid`` was killed and reaped here: the reaper forgets it (its number may be
    reused)."""
    _tell_reaper(f"-{pgid}")


#: Processes this process's sweeps never kill (its reaper).
_spared: set[int] = set()


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process in ``/proc`` (empty where there is no ``/proc``)."""
    out: dict[int, int] = {}
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return out
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue  # it exited meanwhile
        fields = stat.rsplit(b")", 1)[-1].split()
        if len(fields) > 1:
            out[int(entry.name)] = int(fields[1])  # field 4 of /proc/PID/stat: the parent
    return out


def children(pid: int | None = None) -> list[int]:
    """The children of process ``pid`` (this one by default), read from
    ``/proc/PID/task/*/children`` (the children of each of its threads): a few small reads, no
    scan of ``/proc``; [] where there is no ``/proc``. This process's reaper is not among
    them."""
    pid = os.getpid() if pid is None else pid
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children", "rb") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return [p for p in out if p not in _spared]


def kill_descendants(root: int | None = None) -> list[int]:
    """SIGKILL every descendant of ``root`` (this process by default) and reap those that are
    this process's children; returns the pids killed. With :func:`become_subreaper` this reaches
    the descendants that started a session of their own once their parent exited."""
    root = os.getpid() if root is None else root
    return _kill_below([root], include_roots=False)


def kill_trees(roots: list[int], reaped: dict[int, tuple[int, Any]] | None = None) -> list[int]:
    """SIGKILL each of ``roots`` and every descendant of them, and reap those that are this
    process's children; returns the pids killed. ``reaped`` (optional) receives, by pid, the
    wait status and the ``resource`` usage (``os.wait4``'s) of each process reaped."""
    return _kill_below(roots, include_roots=True, reaped=reaped)


def _kill_below(
    roots: list[int], *, include_roots: bool, reaped: dict[int, tuple[int, Any]] | None = None
) -> list[int]:
    parents = _parents()
    below: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        below.setdefault(ppid, []).append(pid)
    found: list[int] = [r for r in roots if r not in _spared] if include_roots else []
    todo = [c for r in roots for c in below.get(r, ())]
    while todo:
        pid = todo.pop()
        if pid in _spared:
            continue  # this process's reaper: it must outlive this process
        found.append(pid)
        todo += below.get(pid, ())
    me = os.getpid()
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    # Reap this process's own children (re-parented orphans among them), but never wait long:
    # a process stuck in the kernel (an NFS wait) dies later and stays a zombie until then.
    mine = [pid for pid in found if parents.get(pid) == me]
    end = time.monotonic() + REAP_SECONDS
    while mine:
        left = []
        for pid in mine:
            try:
                done, status, usage = os.wait4(pid, os.WNOHANG)
            except (ChildProcessError, OSError):
                continue  # reaped elsewhere (a Popen object of its own)
            if done == 0:
                left.append(pid)
            elif reaped is not None:
                reaped[pid] = (status, usage)
        mine = left
        if not mine or time.monotonic() > end:
            break
        time.sleep(0.005)
    return found
