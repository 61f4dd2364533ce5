"""Run an external program for one work item, the way a campaign needs it (no process outlives
its item).

``run_command(argv, timeout=...)`` starts the program in a session (and so a process group) of
its own, reads its stdout and stderr as they come, keeps at most ``max_output`` bytes of each
(plus a SHA-256 digest and the byte count of all of it), and at the deadline kills the whole
group: the program and every descendant that stayed in its group. When the program exits on its
own, what it left running in its group is killed too, so no process outlives its item. The
outcome is a :class:`CommandOutcome`, never an exception for what the program did.

What escapes: a descendant that starts a session of its own (``setsid``, a daemon) leaves the
group and is not killed; run such programs under a container or a cgroup.
"""

from __future__ import annotations

import hashlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from .errors import UsageError

__all__ = ["CommandOutcome", "run_command"]


@dataclass(frozen=True)
class CommandOutcome:
    """What one run of a program did.

    Attributes:
        argv: the command that ran.
        returncode: its exit code; None when a signal ended it.
        signal: the name of the signal that ended it (``"SIGSEGV"``, ``"SIGKILL"`` ...), or None.
        timed_out: True when the deadline came first (the group was then killed with SIGKILL).
        seconds: wall time from start to the end of its output.
        stdout, stderr: at most ``max_output`` bytes of each, the first ones.
        stdout_bytes, stderr_bytes: how many bytes the program wrote to each.
        stdout_sha256, stderr_sha256: hex digests of everything written to each.
    """

    argv: tuple[str, ...]
    returncode: int | None
    signal: str | None
    timed_out: bool
    seconds: float
    stdout: bytes
    stderr: bytes
    stdout_bytes: int
    stderr_bytes: int
    stdout_sha256: str
    stderr_sha256: str

    @property
    def ok(self) -> bool:
        """True when the program exited with code 0 before its deadline."""
        return self.returncode == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        """True when some output was not kept (see ``stdout_bytes`` / ``stderr_bytes``)."""
        return self.stdout_bytes > len(self.stdout) or self.stderr_bytes > len(self.stderr)


class _Capture:
    """One output stream: the first ``limit`` bytes, the count and the digest of all."""

    def __init__(self, limit: int) -> None:
        self.kept = bytearray()
        self.count = 0
        self.digest = hashlib.sha256()
        self.limit = limit

    def add(self, data: bytes) -> None:
        self.count += len(data)
        self.digest.update(data)
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    assert pipe is not None
    try:
        pipe.write(data)
    except (BrokenPipeError, ValueError, OSError):
        pass  # the program exited or closed its input
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_command(
    argv: Sequence[str],
    *,
    timeout: float,
    max_output: int = 1 << 20,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: bytes | None = None,
) -> CommandOutcome:
    """Run ``argv`` with a deadline and bounded capture; see the module docs.

    Args:
        argv: the program and its arguments (no shell).
        timeout: seconds until the whole process group is killed.
        max_output: bytes of stdout and of stderr kept (each); the rest is counted and digested.
        env: the environment (default: this process's).
        cwd: the working directory.
        stdin: bytes fed to the program's standard input (default: none, it reads EOF).

    Raises:
        UsageError: an empty ``argv``, a non-positive ``timeout`` or a negative ``max_output``.
        OSError: the program could not be started (not found, not executable).
    """
    if not argv or not all(isinstance(a, str) for a in argv):
        raise UsageError(f"argv must be a non-empty sequence of strings, got {argv!r}")
    if not timeout > 0:
        raise UsageError(f"timeout must be > 0 seconds, got {timeout!r}")
    if not isinstance(max_output, int) or max_output < 0:
        raise UsageError(f"max_output must be an integer >= 0, got {max_output!r}")
    start = time.monotonic()
    deadline = start + timeout
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,  # its own session and process group: killed as one
    )
    pgid = proc.pid
    out, err = _Capture(max_output), _Capture(max_output)
    timed_out = False
    try:
        if stdin is not None:
            # Fed from a thread, so that a program that writes before it reads cannot block us.
            threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
        assert proc.stdout is not None and proc.stderr is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    _kill_group(pgid)
                    break
                if proc.poll() is not None:
                    # The program is done: what it left in its group goes too, so that a
                    # background child holding the pipes cannot keep this item alive.
                    _kill_group(pgid)
                for key, _ in sel.select(min(left, 0.5)):
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        key.data.add(data)
                    else:
                        sel.unregister(key.fileobj)
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            _kill_group(pgid)
            proc.wait()
        _kill_group(pgid)  # descendants still in the group, whatever happened above
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
    sig = signal.Signals(-rc).name if rc < 0 else None
    return CommandOutcome(
        argv=tuple(argv),
        returncode=rc if rc >= 0 else None,
        signal=sig,
        timed_out=timed_out,
        seconds=time.monotonic() - start,
        stdout=bytes(out.kept),
        stderr=bytes(err.kept),
        stdout_bytes=out.count,
        stderr_bytes=err.count,
        stdout_sha256=out.digest.hexdigest(),
        stderr_sha256=err.digest.hexdigest(),
    )
