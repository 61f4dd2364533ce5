"""The slow shared-filesystem mount (durable_dispatch.testing.sharedfs) behaves like one.

Needs root, /dev/fuse, fuse3 and mfusepy (CI has them: .ci/install-fuse); skipped elsewhere with
the reason.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading

import pytest

from durable_dispatch.testing.sharedfs import SlowMount, SlowStorage, slow_mount, unavailable

_why = unavailable()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


def _other_process_locks(path: str, kind: str) -> str:
    take = (
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)"
        if kind == "flock"
        else "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)"
    )
    code = (
        "import fcntl, os, sys\n"
        f"fd = os.open({path!r}, os.O_RDWR)\n"
        "try:\n"
        f"    {take}\n"
        "    print('got')\n"
        "except BlockingIOError:\n"
        "    print('excluded')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return r.stdout.strip()


@pytest.mark.parametrize("locks", ["local", "none"])
def test_locks_exclude_only_when_local(tmp_path, locks):
    with slow_mount(tmp_path, locks=locks) as m:
        p = os.path.join(m.path, "f")
        fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            want = "excluded" if locks == "local" else "got"
            assert _other_process_locks(p, "flock") == want
            assert _other_process_locks(p, "fcntl") == want
        finally:
            os.close(fd)
        if locks == "none":
            assert m.counters()["locks_granted"] >= 2


def test_passthrough_keeps_bytes_and_inodes(tmp_path):
    with slow_mount(tmp_path, SlowStorage(fsync_ms=1, metadata_ms=0.5)) as m:
        p = os.path.join(m.path, "d", "f")
        os.mkdir(os.path.dirname(p))
        with open(p, "wb") as f:
            f.write(b"x" * 100_000)
            f.flush()
            os.fsync(f.fileno())
        os.replace(p, p + "2")
        os.link(p + "2", p + "3")
        assert os.stat(p + "3").st_ino == os.stat(os.path.join(m.backing, "d", "f2")).st_ino
        with open(p + "3", "rb") as f:
            assert f.read() == b"x" * 100_000
        assert sorted(os.listdir(os.path.dirname(p))) == ["f2", "f3"]
        c = m.counters()
        assert c["fsyncs"] >= 1 and c["metadata_ops"] >= 3
    assert not os.path.ismount(m.path)


def test_a_stall_blocks_fsync_until_resumed(tmp_path):
    with slow_mount(tmp_path) as m:
        fd = os.open(os.path.join(m.path, "f"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.write(fd, b"a")
            done = threading.Event()

            def sync() -> None:
                os.fsync(fd)
                done.set()

            with m.stalled():
                t = threading.Thread(target=sync, daemon=True)
                t.start()
                assert not done.wait(1.0)  # blocked for as long as the stall lasts
                assert m.counters()["stalled_fsyncs"] == 1
                os.stat(os.path.join(m.path, "f"))  # metadata still answers
            assert done.wait(60)
        finally:
            os.close(fd)


def test_close_unmounts_even_when_busy_and_stalled(tmp_path):
    m = SlowMount(tmp_path / "b", tmp_path / "m").start()
    fd = os.open(os.path.join(m.path, "f"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        m.stall()
    finally:
        m.close()  # a descriptor is still open on it: the unmount must still happen
    assert not os.path.ismount(m.path)
    assert m.path not in open("/proc/mounts").read()
    try:
        os.close(fd)
    except OSError:
        pass  # its server is gone (ENOTCONN): the descriptor is closed all the same
