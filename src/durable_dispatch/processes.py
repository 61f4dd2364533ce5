"""Process-tree hygiene for work that runs programs (U3): no process outlives its item or job.

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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import time
from pathlib import Path

__all__ = [
    "kill_group",
    "become_subreaper",
    "die_with_parent",
    "kill_descendants",
    "children",
    "kill_trees",
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
    scan of ``/proc``; [] where there is no ``/proc``."""
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
    return out


def kill_descendants(root: int | None = None) -> list[int]:
    """SIGKILL every descendant of ``root`` (this process by default) and reap those that are
    this process's children; returns the pids killed. With :func:`become_subreaper` this reaches
    the descendants that started a session of their own once their parent exited."""
    root = os.getpid() if root is None else root
    return _kill_below([root], include_roots=False)


def kill_trees(roots: list[int]) -> list[int]:
    """SIGKILL each of ``roots`` and every descendant of them, and reap those that are this
    process's children; returns the pids killed."""
    return _kill_below(roots, include_roots=True)


def _kill_below(roots: list[int], *, include_roots: bool) -> list[int]:
    parents = _parents()
    below: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        below.setdefault(ppid, []).append(pid)
    found: list[int] = list(roots) if include_roots else []
    todo = [c for r in roots for c in below.get(r, ())]
    while todo:
        pid = todo.pop()
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
                done, _ = os.waitpid(pid, os.WNOHANG)
            except (ChildProcessError, OSError):
                continue  # reaped elsewhere (a Popen object of its own)
            if done == 0:
                left.append(pid)
        mine = left
        if not mine or time.monotonic() > end:
            break
        time.sleep(0.005)
    return found
