"""The pytest plugin: storage a test left open is closed before pyfakefs goes, and no real file
or descriptor is touched. Each case runs a user-style test module in its own pytest process and
checks its exit code and what it printed, not only its test count."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyfakefs.fake_filesystem_unittest import Patcher

from durable_dispatch import Journal
from durable_dispatch.storage import resources

ROOT = Path(__file__).resolve().parent.parent

# A conftest for the inner run. It opens real files before any test (so the fake descriptors of
# pyfakefs share their numbers), and at the very end (atexit, after pytest's own unconfigure)
# checks that each still holds exactly what it held, that the descriptors still work, and that
# no journal flusher thread is left; it writes its verdict to a file the outer test reads.
SENTINEL_CONFTEST = """
import atexit, os, threading

VERDICT = os.environ["DD_VERDICT"]
SENTINELS = []
for i in range(12):
    p = os.path.join(os.environ["DD_SENTINELS"], f"sentinel-{i}")
    with open(p, "wb") as f:
        f.write(b"sentinel %d\\n" % i)
    SENTINELS.append((p, os.open(p, os.O_RDWR)))


def check():
    bad = []
    for p, fd in SENTINELS:
        try:
            os.fstat(fd)
        except OSError as e:
            bad.append(f"descriptor of {p} was closed: {e}")
        with open(p, "rb") as f:
            data = f.read()
        if data != b"sentinel %d\\n" % SENTINELS.index((p, fd)):
            bad.append(f"{p} changed: {data[:80]!r}")
    flushers = [t.name for t in threading.enumerate() if t.name.startswith("journal-flusher")]
    if flushers:
        bad.append(f"flusher threads alive: {flushers}")
    with open(VERDICT, "w") as f:
        f.write("\\n".join(bad) or "ok")


atexit.register(check)
"""


def run_user_module(tmp_path: Path, body: str, *args: str) -> tuple[int, str, str]:
    """Run ``body`` as a test module in a fresh pytest process; return (rc, output, verdict)."""
    work = tmp_path / "user"
    sentinels = tmp_path / "sentinels"
    work.mkdir()
    sentinels.mkdir()
    (work / "conftest.py").write_text(SENTINEL_CONFTEST)
    (work / "test_user.py").write_text(textwrap.dedent(body))
    verdict = tmp_path / "verdict.txt"
    env = dict(os.environ, DD_VERDICT=str(verdict), DD_SENTINELS=str(sentinels))
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        # the module is a scripted sequence of tests (each relies on the one before): in order
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
        + ["-rw", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    return proc.returncode, out, verdict.read_text() if verdict.exists() else "no verdict"


LEFT_OPEN = """
    import errno
    import pytest
    from durable_dispatch import CampaignState, Journal, WorkItem
    from durable_dispatch.storage import DeferJournal

    SYNCS = ["always", "batch", "never"]

    @pytest.mark.parametrize("sync", SYNCS)
    def test_fake(sync, fs):
        fs.create_dir("/state")
        j = Journal.open("/state/j.jsonl", sync=sync)
        for i in range(50):
            j.append({"a": i})

    @pytest.mark.parametrize("sync", SYNCS)
    def test_fake_fixture_named_after(sync, inject_faults, fs):
        j = Journal.open("/state/j.jsonl", sync=sync)
        inject_faults.fail("fsync", errno.EIO, path="*.jsonl")
        j.append({"a": 1})

    @pytest.mark.parametrize("sync", SYNCS)
    def test_real(sync, tmp_path):
        j = Journal.open(tmp_path / "j.jsonl", sync=sync)
        j.append({"a": 1})

    def test_real_next_test_reopens(tmp_path_factory):
        # The same real path as a test before: the lock was released at that test's teardown.
        d = tmp_path_factory.getbasetemp() / "shared"
        d.mkdir(exist_ok=True)
        Journal.open(d / "j.jsonl", sync="batch").append({"a": 1})

    def test_real_next_test_reopens_again(tmp_path_factory):
        d = tmp_path_factory.getbasetemp() / "shared"
        with Journal.open(d / "j.jsonl", sync="batch") as j:
            assert [r.payload for r in j.records()] == [{"a": 1}]

    def test_state_and_defer(fs):
        s = CampaignState.open("/st", ranks=[1])
        s.submit([WorkItem("w1", {"x": 1})])
        DeferJournal.open("/st/other-defer.jsonl")

    def test_fails_before_close(fs, inject_faults):
        j = Journal.open("/j.jsonl", sync="batch")
        j.append({"a": 1})
        assert False, "this test fails on purpose"
"""


def test_left_open_storage_never_crashes_pytest_nor_touches_real_files(tmp_path: Path) -> None:
    rc, out, verdict = run_user_module(tmp_path, LEFT_OPEN)
    assert rc == 1, out  # the one failing test, and nothing else
    assert "1 failed, 12 passed" in out, out
    assert "this test fails on purpose" in out
    assert "INTERNALERROR" not in out and "Bad file descriptor" not in out, out
    assert out.count("StorageLeftOpenWarning") >= 12, out
    assert verdict == "ok"


def test_a_clean_run_exits_zero(tmp_path: Path) -> None:
    body = LEFT_OPEN.split("    def test_fails_before_close")[0]
    rc, out, verdict = run_user_module(tmp_path, body)
    assert rc == 0, out
    assert "12 passed" in out and "Bad file descriptor" not in out, out
    assert verdict == "ok"


def test_the_warning_can_fail_the_test(tmp_path: Path) -> None:
    body = """
        from durable_dispatch import Journal

        def test_slip(fs):
            Journal.open("/j.jsonl", sync="batch").append({"a": 1})
    """
    rc, out, verdict = run_user_module(
        tmp_path, body, "-W", "error::durable_dispatch.testing.StorageLeftOpenWarning"
    )
    assert rc == 1 and "1 passed, 1 error" in out, out
    assert verdict == "ok"


def test_a_degraded_journal_left_open_is_a_warning_naming_its_memory_records(
    tmp_path: Path,
) -> None:
    """Issue 29.5: a journal a test left open while degraded (disk_full under pyfakefs) made
    its close() raise NotDurableError at teardown: an ERROR, and the user's suite exited 1. It
    is what the plugin reports: a warning that names the records only in memory; exit 0."""
    body = """
        from durable_dispatch import Journal
        from durable_dispatch.testing import disk_full

        def test_left_open_while_the_disk_is_full(fs):
            fs.create_dir("/state")
            j = Journal.open("/state/j.jsonl", sync="always")
            j.append({"a": 0})
            disk_full(fs)
            for i in range(1, 4):
                assert not j.append({"a": i}).durable
            assert not j.health.ok
    """
    rc, out, verdict = run_user_module(tmp_path, body)
    assert rc == 0 and "1 passed, 1 warning" in out and "ERROR" not in out, out
    assert "StorageLeftOpenWarning" in out and "NotDurableError" in out, out
    assert "3 record(s) held only in memory (seq 1..3)" in out, out
    assert verdict == "ok"


def test_a_patcher_without_the_plugin_abandons_what_it_left_open(tmp_path: Path) -> None:
    """Without the plugin, a journal outliving its fake filesystem touches no descriptor."""
    body = """
        import time
        import pytest
        from pyfakefs.fake_filesystem_unittest import Patcher
        from durable_dispatch import Journal
        from durable_dispatch.errors import UsageError

        def test_patcher():
            with Patcher():
                j = Journal.open("/j.jsonl", sync="batch", batch_max_delay=0.05)
                for i in range(100):
                    j.append({"a": i})
            j.append({"a": "queued after the fake filesystem went away"})
            time.sleep(0.3)  # the flusher wakes up on the real filesystem
            assert j.closed
            with pytest.raises(UsageError):
                j.append({"a": 1})
    """
    rc, out, verdict = run_user_module(tmp_path, body, "-p", "no:durable_dispatch")
    assert rc == 0 and "1 passed" in out, out
    assert verdict == "ok"


def test_the_example_module_runs_in_its_own_session() -> None:
    """``examples/test_pyfakefs_faults.py`` is what the README shows users: it must pass as is."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"]
        + ["examples/test_pyfakefs_faults.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed" in proc.stdout and "failed" not in proc.stdout


def test_the_registry_closes_newest_first_and_forgets_closed_objects() -> None:
    closed: list[str] = []

    class Thing:
        def __init__(self, name: str) -> None:
            self.name, self.closed = name, False

        def close(self) -> None:
            self.closed = True
            closed.append(self.name)

    stamp = resources.mark()
    resources.track(True)
    try:
        a, b, c = Thing("a"), Thing("b"), Thing("c")
        for t in (a, b, c):
            resources.register(t)
        b.close()
        assert resources.open_since(stamp) == [c, a]
        assert not resources.is_open(b)
        resources.unregister(c)
        assert resources.open_since(stamp) == [a]
        del a
        assert len(resources.open_since(stamp)) == 1  # kept alive while tracking
        resources.open_since(stamp)[0].close()
    finally:
        resources.track(False)
    assert resources.open_since(stamp) == []


@pytest.mark.parametrize("sync", ["always", "never"])
def test_a_journal_collected_unclosed_closes_its_descriptor(tmp_path: Path, sync: str) -> None:
    j = Journal.open(tmp_path / "j.jsonl", sync=sync)
    fd = j._fd
    assert fd is not None
    resources.unregister(j)  # as if the plugin were not there
    del j
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_the_finalizer_never_closes_a_real_descriptor_of_a_fake_number(tmp_path: Path) -> None:
    with Patcher():
        j = Journal.open("/j.jsonl", sync="always")
        fake = j._fd
        assert fake is not None
    resources.unregister(j)  # as if the plugin were not there
    mine = os.open(tmp_path, os.O_RDONLY)
    try:
        try:
            os.fstat(fake)
        except OSError:  # the number is free for real: make it name a real descriptor
            os.dup2(mine, fake)
        before = os.fstat(fake)
        del j
        gc.collect()
        assert os.fstat(fake) == before  # still open, still the same file
    finally:
        os.close(mine)
