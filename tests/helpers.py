"""Shared test helpers."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from durable_dispatch import Journal


def write_journal(path: Path | str, payloads: list[Any], sync: str = "always") -> list[int]:
    """Write ``payloads`` to a fresh journal; returns the sequence numbers."""
    with Journal.open(path, sync=sync) as j:
        seqs = [j.append(p).seq for p in payloads]
        j.sync_now()
    return seqs


def read_all(path: Path | str, **kw: Any) -> list[tuple[int, Any]]:
    """Open a journal (recovering it) and return ``[(seq, payload)]``."""
    with Journal.open(path, **kw) as j:
        return [(r.seq, r.payload) for r in j.records()]


def line_offsets(path: Path | str) -> list[int]:
    """Byte offsets at which each line of a file starts."""
    data = Path(path).read_bytes()
    offs, pos = [], 0
    for line in data.splitlines(keepends=True):
        offs.append(pos)
        pos += len(line)
    return offs


def sample_payloads(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Deterministic varied payloads (unicode, nesting, numbers)."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        out.append(
            {
                "event": rnd.choice(["committed", "dispatched", "deferred"]),
                "work_id": f"w-{i}",
                "n": rnd.randint(-(2**40), 2**40),
                "text": "".join(rnd.choice('aé☃ "\\\n{}:,') for _ in range(rnd.randint(0, 30))),
                "nested": {"list": [rnd.random(), None, True, {"k": i}]},
            }
        )
    return out


def file_mode(path: Path | str) -> int:
    """Permission bits of a file."""
    return os.stat(path).st_mode & 0o777


def fake_campaign(
    state: Any,
    *,
    now: float = 0.0,
    max_turns: int = 100_000,
    on_commit: Any = None,
    behave: Any = None,
    batch: int = 1,
) -> float:
    """Run a campaign to the end over a fake transport, through the facade only (the calls a
    hand-written master makes: next_send, sent, on_results, on_ready, tick, deliver): each WORK is
    answered in the same turn.

    ``behave(send) -> "ok" | "silent" | "malformed" | "partial"`` picks each worker's behaviour
    (default ok); a silent worker never answers (the watchdog recovers the task), a malformed one
    sends a broken RESULT and its READY (the invalid-result join recovers it), a partial one
    reports an error for the first item of its dispatch. Dispatches carry up to ``batch`` items.
    Returns the final virtual time.
    """
    from types import SimpleNamespace

    from durable_dispatch.core import Send

    core = state.core
    if on_commit is not None:  # the facade's callback (U6: what a crash kept from it first)
        state.redeliver(lambda wid, result: on_commit(SimpleNamespace(work_id=wid, result=result)))
    late: list[tuple[float, int, str]] = []  # (when, rank, token) of silent workers' late READY
    for _ in range(max_turns):
        if core.ledger.waiting:  # G4: what can never run ends deferred (run_master does this)
            state.settle_waiting()
        if state.done:
            return now
        results = []
        readies = [(rank, token) for when, rank, token in late if when <= now]
        late = [x for x in late if x[0] > now]
        while True:
            s = state.next_send(now, batch)
            if s is None:
                break
            assert isinstance(s, Send)
            state.sent(s.token, now)
            how = behave(s) if behave else "ok"
            if how in ("ok", "partial"):
                values = [{"done": w.work_id} for w in s.items]
                errors = {0: "the function raised"} if how == "partial" else None
                results.append((s.rank, str(s.token), values, errors))
                readies.append((s.rank, str(s.token)))
            elif how == "malformed":
                results.append((s.rank, str(s.token), None, None))
                readies.append((s.rank, str(s.token)))
            else:  # silent until after its deadline; then it sends its exact READY
                late.append((now + core.watchdog.seconds + 1, s.rank, str(s.token)))
        for rank, token, values, errors in results:
            state.on_results(rank, token, values, now, errors=errors)
        for rank, token in readies:
            state.on_ready(rank, token, now)
        now += 1.0
        state.tick(now)  # close what an fsync covers, join invalid results, sweep
        state.deliver()  # the delivery point: the callbacks
    raise AssertionError("campaign did not finish")


def run_demo(
    state_dir: Path, *args: str, n: int = 4, ulfm: bool = False, timeout: float = 180.0
) -> tuple[Any, dict[str, Any] | None]:
    """Run the bundled demo campaign under a real mpiexec; returns (MpiexecResult, summary).

    mpiexec runs in its own session with a timeout; on timeout the whole session is killed, so a
    hung rank can never hang the suite.
    """
    import sys

    import orjson

    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    summary = Path(state_dir) / "summary.json"
    if summary.exists():
        summary.unlink()
    cmd = mpiexec_command(
        n,
        [sys.executable, "-m", "durable_dispatch.cli.demo", str(state_dir), *args],
        ulfm=ulfm,
    )
    res = run_mpiexec(cmd, timeout=timeout)
    data = orjson.loads(summary.read_bytes()) if summary.exists() else None
    return res, data


# ------------------------------------------------------------------ real mounts (root only)
def _mount_refusal() -> str | None:
    """Why this machine cannot mount a tmpfs for a test, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a tmpfs needs root (CI runs as root and runs these tests)"
    return None


def require_mounts() -> None:
    """Skip (outside CI only) when mounts are refused; in CI (``CI=true``) a refusal fails."""
    import pytest

    why = _mount_refusal()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the real-mount tests: {why}")
        pytest.skip(why)


class Tmpfs:
    """A small real tmpfs mounted at ``path`` (a context manager; always unmounted after).

    Args:
        path: an empty directory to mount on (created).
        size: bytes the filesystem holds.
        inodes: how many inodes it has (files, directories, the root included).
    """

    def __init__(self, path: Path, size: int = 512 << 10, inodes: int = 64) -> None:
        self.path, self.size, self.inodes = path, size, inodes

    def _run(self, *args: str) -> None:
        import subprocess

        subprocess.run(args, check=True, capture_output=True, timeout=30)

    def __enter__(self) -> Tmpfs:
        require_mounts()
        self.path.mkdir(parents=True, exist_ok=True)
        opts = f"size={self.size},nr_inodes={self.inodes},mode=0700"
        try:
            self._run("mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(self.path))
        except Exception as e:  # noqa: BLE001 - a refused mount is a skip outside CI
            import pytest

            if os.environ.get("CI") == "true":
                raise
            pytest.skip(f"this machine refused to mount a tmpfs: {e}")
        return self

    def remount(self, mode: str) -> None:
        """``"ro"`` or ``"rw"``: remount (``ro`` fails while a file is open for writing)."""
        self._run("mount", "-o", f"remount,{mode}", str(self.path))

    def fill(self, *, inodes: bool = False) -> None:
        """Use up every free byte (or, with ``inodes``, every free inode) with filler files."""
        import errno as _errno

        filler = self.path / ".filler"
        filler.mkdir(exist_ok=True)
        n = 0
        try:
            while True:
                with open(filler / f"f{n}", "wb", buffering=0) as f:
                    while not inodes:
                        f.write(b"\0" * 4096)
                n += 1
        except OSError as e:
            if e.errno != _errno.ENOSPC:
                raise

    def free(self) -> None:
        """Remove the filler files again."""
        import shutil

        shutil.rmtree(self.path / ".filler", ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        import subprocess

        r = subprocess.run(["umount", str(self.path)], capture_output=True, timeout=30, check=False)
        if r.returncode != 0:  # still busy: detach it now, the kernel frees it when unused
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)


class Ext4Image:
    """An ext4 filesystem in an image file on a loop device, mounted at ``path`` (a context
    manager; always unmounted and its loop device detached after).

    :meth:`shut_down` is the ``FS_IOC_SHUTDOWN`` ioctl with ``FS_GOING_DOWN_NOSYNC``: from then on
    every write and fsync fails with a real ``EIO``, and what was not fsynced is lost with the
    page cache, as on a dying disk. :meth:`remount` unmounts and mounts the image again (what a
    restart after the failure sees).
    """

    FS_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
    FS_GOING_DOWN_NOSYNC = 2

    def __init__(self, path: Path, size: int = 32 << 20) -> None:
        self.path, self.size = path, size
        self.image = path.with_name(path.name + ".img")
        self.device = ""

    def _run(self, *args: str) -> str:
        import subprocess

        return subprocess.run(
            args, check=True, capture_output=True, text=True, timeout=60
        ).stdout.strip()

    def _mount(self) -> None:
        self._run("mount", "-t", "ext4", self.device, str(self.path))

    def __enter__(self) -> Ext4Image:
        require_mounts()
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(self.size)
        try:
            self._run("mkfs.ext4", "-q", "-F", str(self.image))
            self.device = self._run("losetup", "-f", "--show", str(self.image))
            self._mount()
        except Exception as e:  # noqa: BLE001 - refused loop devices are a skip outside CI
            import pytest

            self.__exit__()
            if os.environ.get("CI") == "true":
                raise
            pytest.skip(f"this machine refused a loop device or an ext4 mount: {e}")
        return self

    def shut_down(self) -> None:
        """Shut the filesystem down now, dropping unsynced data (real EIO from here on)."""
        import fcntl

        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.ioctl(fd, self.FS_IOC_SHUTDOWN, self.FS_GOING_DOWN_NOSYNC.to_bytes(4, "little"))
        finally:
            os.close(fd)

    def remount(self) -> None:
        """Unmount (lazily if a descriptor still holds it) and mount the image again."""
        self._umount()
        self._mount()

    def _umount(self) -> None:
        import subprocess

        r = subprocess.run(["umount", str(self.path)], capture_output=True, timeout=60, check=False)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)

    def __exit__(self, *exc: object) -> None:
        import subprocess

        try:
            if self.device:
                self._umount()
        finally:
            if self.device:
                subprocess.run(["losetup", "-d", self.device], capture_output=True, check=False)
                self.device = ""
            self.image.unlink(missing_ok=True)


def on_a_terminal(
    argv: list[str], *, stdout_too: bool = False, timeout: float = 120.0
) -> tuple[int, str, bytes]:
    """Run ``argv`` with its stderr (and, with ``stdout_too``, its stdout) on a fresh
    pseudo-terminal; returns ``(exit code, what the terminal showed, the piped stdout)``."""
    import pty
    import subprocess

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            argv,
            stdout=follower if stdout_too else subprocess.PIPE,
            stderr=follower,
            stdin=subprocess.DEVNULL,
        )
        os.close(follower)
        follower = -1
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        out, _ = proc.communicate(timeout=timeout)
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    return proc.returncode, seen.decode(errors="replace"), out or b""


def examples(full: int) -> int:
    """A property test's example count: ``full`` under the ``ci`` profile (200 examples by
    default), scaled by the profile in force (``dev`` runs an eighth of it, at least 5; ``long``
    25 times it): counts come from the profile, never from the test alone (tests/conftest.py)."""
    from hypothesis import settings

    return max(5, round(full * settings.default.max_examples / 200))


def each_commit(decisions: Any) -> list[Any]:
    """The core's decisions with each ``Commits`` (a dispatch's commits as columns) written as
    one ``Commit`` per item, in its place: what a test of commits per item reads."""
    from durable_dispatch.core import Commit, Commits

    out: list[Any] = []
    for d in decisions:
        if isinstance(d, Commits):
            out += [
                Commit(d.rank, d.token, w, r, d.part)
                for w, r in zip(d.work_ids, d.results, strict=True)
            ]
        else:
            out.append(d)
    return out
