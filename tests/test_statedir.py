"""A state directory's open and close: the locks its master holds, what they cost on a slow
mount, and the directories earlier versions left (issue 49).

The FUSE tests need root and /dev/fuse (CI has them) and are skipped elsewhere with the reason.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from durable_dispatch import CampaignState, WorkItem
from durable_dispatch.campaign.statedir import LOCK_NAME, _master_running
from durable_dispatch.errors import LockHeldError
from durable_dispatch.mpi import run_master
from durable_dispatch.storage import Journal, owner
from durable_dispatch.testing import LocalWorkers
from durable_dispatch.testing.sharedfs import SlowMount, SlowStorage, slow_mount, unavailable

ROOT = Path(__file__).resolve().parent.parent
HOST = socket.gethostname()
#: the journals of a state directory (each had a ``<name>.lock`` beside it before issue 49)
JOURNALS = ("events.jsonl", "submissions.jsonl", ".dispatch_protocol_deferred.jsonl")

_why = unavailable()
fuse = pytest.mark.skipif(_why is not None, reason=_why or "")


def test_a_master_takes_no_lock_file_per_journal_and_a_lone_journal_is_still_refused(
    tmp_path: Path,
) -> None:
    """The directory's lock and owner claim keep every other writer out (S5, S13): no
    ``<journal>.lock`` is made, and a journal opened alone on a master's file is refused by the
    lock on the file itself (S12). Fails on 587a243 (each journal made its lock file)."""
    d = tmp_path / "s"
    s = CampaignState.open(d)
    try:
        assert sorted(p.name for p in d.glob("*.lock")) == [LOCK_NAME]
        for name in JOURNALS:
            with pytest.raises(LockHeldError):
                Journal.open(d / name)
        with pytest.raises(LockHeldError):
            CampaignState.open(d)
        assert _master_running(str(d))
    finally:
        s.close()
    assert not _master_running(str(d))
    o = owner.read_owner(d)  # the release was prepared beside the last snapshot: in place now
    assert o is not None and o.released and not list(d.glob(".owner-*"))
    Journal.open(d / "events.jsonl").close()  # the master is gone: a lone writer may open it


# --------------------------------------------------------------- a directory of 587a243
def _items(n: int) -> list[WorkItem]:
    return [WorkItem(f"w{i:03d}", {"i": i}) for i in range(n)]


def _campaign(d: Path, n: int) -> list[str]:
    done: list[str] = []
    rep = run_master(
        _items(n),
        d,
        lambda wid, result: done.append(wid),
        comm=LocalWorkers(lambda p: p["i"], 2),
        linger=0,
    )
    assert rep.finished
    return done


def _as_587a243_left_it(d: Path) -> None:
    """Give ``d`` the lock files a master of 587a243 left beside each journal: the public
    ``Journal.open`` takes one the way that master did for each of its journals."""
    for name in JOURNALS:
        Journal.open(d / name).close()
    assert all((d / f"{name}.lock").is_file() for name in JOURNALS)


#: what a master of 587a243 held while it ran: filelock's flock on master.lock, the owner
#: claim, and for each journal its ``<name>.lock`` and a flock on the file itself
_OLD_MASTER = """
import sys, time
import filelock
from durable_dispatch.storage import Journal, owner
d = sys.argv[1]
lock = filelock.FileLock(d + "/master.lock", timeout=0, mode=0o600, thread_local=False)
lock.acquire()
claim = owner.claim(d)
held = [Journal.open(d + "/" + name) for name in sys.argv[2:]]
print("open", flush=True)
time.sleep(120)
"""


@contextmanager
def _old_master(d: Path) -> Iterator[subprocess.Popen[str]]:
    p = subprocess.Popen(
        [sys.executable, "-c", _OLD_MASTER, str(d), *JOURNALS],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
        start_new_session=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "open"
        yield p
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _previous_layout_opens_resumes_and_refuses(d: Path, *, flock_works: bool) -> None:
    assert sorted(_campaign(d, 20)) == [f"w{i:03d}" for i in range(20)]
    _as_587a243_left_it(d)
    # it opens and resumes: the 20 committed items are known, the 10 new ones run
    assert sorted(_campaign(d, 30)) == [f"w{i:03d}" for i in range(20, 30)]
    # a second writer is refused while a master of this version holds it ...
    s = CampaignState.open(d)
    try:
        with pytest.raises(LockHeldError) as ei:
            CampaignState.open(d)
        assert ei.value.pid == os.getpid()
        if flock_works:  # (where it does not, the owner record refuses masters, S13)
            with pytest.raises(LockHeldError):
                Journal.open(d / "events.jsonl")  # (as a master of 587a243 would open it)
    finally:
        s.close()
    # ... and this version is refused while a master of 587a243 holds it
    with _old_master(d) as old:
        assert _master_running(str(d))
        with pytest.raises(LockHeldError) as ei:
            CampaignState.open(d)
        assert (ei.value.host, ei.value.pid) == (HOST, old.pid)
    s = CampaignState.open(d)  # the old master is gone (SIGKILLed): taken over at once
    try:
        assert len(s.core.ledger.committed) == 30
    finally:
        s.close()


def test_a_directory_as_587a243_left_it_opens_resumes_and_refuses_a_second_writer(
    tmp_path: Path,
) -> None:
    """Compatibility: the lock files each journal of 587a243 had stay, unused; the directory
    opens and resumes, and a second writer is refused either way round (flock excludes)."""
    _previous_layout_opens_resumes_and_refuses(tmp_path / "s", flock_works=True)


@fuse
def test_a_directory_as_587a243_left_it_on_a_mount_whose_locks_do_not_lock(
    tmp_path: Path,
) -> None:
    """The same where flock excludes no one: the owner record refuses the second writer (S13)."""
    with slow_mount(tmp_path, locks="none") as m:
        _previous_layout_opens_resumes_and_refuses(Path(m.path) / "s", flock_works=False)


# ------------------------------------------------------- what an open and a close cost
def _open_close(m: SlowMount, d: Path) -> tuple[dict[str, int], list[str]]:
    """The mount's counts of one open and close of the state directory ``d``, and its trace."""
    m.configure(trace=True)
    m.trace(clear=True)
    before = m.counters()
    CampaignState.open(d).close()
    after = m.counters()
    m.configure(trace=False)
    ops = m.trace(clear=True)
    counts = {k: after[k] - before.get(k, 0) for k in ("fsyncs", "metadata_ops")}
    print(f"open and close of {d.name}: {counts}")
    shown = [f"{o.op} {o.path} {o.other} {o.outcome}" for o in ops if o.metadata]
    shown += [f"{o.op} {o.path}" for o in ops if o.op.startswith("fsync")]
    return counts, shown


@fuse
def test_an_open_and_a_close_cost_at_most_these_operations_on_a_slow_mount(
    tmp_path: Path,
) -> None:
    """Pins what one open and close of a state directory asks of a shared filesystem (counts,
    not times: on a cluster's mount each metadata operation costs about 1 ms and each fsync
    several). The kernel caches no lookup here (``cache_seconds=0``), so every lookup the
    library makes reaches the mount and the counts do not depend on timing: 587a243 made 246
    metadata operations and 7 fsyncs for a fresh directory and 264 and 8 for the resume
    (among them each journal's lock file: a lookup, a create and a chmod each, four listings
    of the directory); this version 104 and 7, 130 and 8, and 106 and 132 since the closing
    snapshot checks the owner record again after its wait for the journal's fsync, right before
    its rename (S13; a lookup of the directory and of the next record's name here); 106 and 141
    since the resume fsyncs its three journals side by side, each through a descriptor of its
    own (a lookup of the directory and of the file each, uncached here; with the kernel's
    cache they cost none, and the three fsyncs' waits overlap). (With the kernel's default 1 s
    cache, as ``bench_sharedfs.py`` mounts it: 87 and 45 before, 44 and 33 now.)"""
    with slow_mount(tmp_path, SlowStorage(), cache_seconds=0) as m:
        d = Path(m.path) / "s"
        fresh, trace = _open_close(m, d)
        kinds = Counter(line.split()[0] for line in trace)
        assert fresh["fsyncs"] <= 7 and fresh["metadata_ops"] <= 106, (fresh, trace)
        assert kinds["chmod"] == 0 and kinds["readdir"] <= 1, (kinds, trace)
        again, trace = _open_close(m, d)
        assert again["fsyncs"] <= 8 and again["metadata_ops"] <= 141, (again, trace)


@fuse
def test_a_new_directory_s_parent_fsync_runs_beside_the_claim_and_ends_before_the_open(
    tmp_path: Path,
) -> None:
    """Issue 49: the fsync of a new state directory's parent (what makes the directory itself
    durable) ran before anything else of the open, one fsync's wait in series. With every
    fsync stalled, it now waits at the same time as the owner record's own fsync (two fsyncs
    waiting at once; one before), and the open still returns only after it (S1's order: the
    directory is durable before anything in it is reported durable)."""
    import threading
    import time

    with slow_mount(tmp_path, SlowStorage()) as m:
        d = Path(m.path) / "s"
        m.configure(trace=True)
        opened: list[CampaignState] = []
        failed: list[BaseException] = []
        returned: list[float] = []

        def open_it() -> None:
            try:
                opened.append(CampaignState.open(d))
                returned.append(time.time())
            except BaseException as e:  # noqa: BLE001 - shown below
                failed.append(e)

        t = threading.Thread(target=open_it)
        try:
            with m.stalled():
                t.start()
                end = time.monotonic() + 30
                waiting = 0
                while time.monotonic() < end and waiting < 2 and t.is_alive():
                    waiting = m.counters().get("waiting_fsyncs", 0)
                assert waiting == 2, (waiting, m.trace())
                assert not opened and not failed
        finally:
            t.join(60)  # (the stall ended with the block: the open goes on to its end)
            for s in opened:
                s.close()
        assert not t.is_alive() and not failed and opened, failed
        parent = [o for o in m.trace() if o.op == "fsyncdir" and o.path == "/"]
        assert len(parent) == 1 and parent[0].outcome == "ok", parent
        assert parent[0].at <= returned[0]


def test_a_new_directory_whose_parent_fsync_fails_is_refused_and_left_unlocked(
    tmp_path: Path,
) -> None:
    """The parent's fsync runs beside the lock and the claim now: when it fails (EIO) the open
    still fails with a typed error, before any journal is made, lets go of the lock and the
    claim, and leaves no thread; the next open (the directory is there now, but nothing says
    its entry is durable) fsyncs the parent again."""
    import errno
    import threading
    import time

    from durable_dispatch.errors import StorageError
    from durable_dispatch.storage import fs
    from durable_dispatch.testing import inject_faults

    d = tmp_path / "s"
    with inject_faults() as f:
        rule = f.fail("dir-fsync", errno.EIO, path=str(tmp_path))
        with pytest.raises(StorageError) as e:
            CampaignState.open(d)
    assert rule.fired >= 1 and e.value.errno == errno.EIO, e.value
    assert "durable" in str(e.value)
    assert not _master_running(str(d))
    assert not [p for p in os.listdir(d) if p.endswith(".jsonl")], os.listdir(d)
    end = time.monotonic() + 30  # (a thread may still be leaving once its work ended)
    while any(t.name == "fsync-new-dir" for t in threading.enumerate()):
        assert time.monotonic() < end
        time.sleep(0.01)
    synced: list[str] = []
    prev = fs.set_recorder(lambda op, path, _d: synced.append(path) if op == "dir-fsync" else None)
    try:
        with CampaignState.open(d) as s:
            s.submit([WorkItem("a")])
        assert str(tmp_path) in synced, synced  # the retry made the directory durable
        synced.clear()
        CampaignState.open(d).close()
        assert str(tmp_path) not in synced, synced  # (a resume of a real state does not)
    finally:
        fs.set_recorder(prev)


def test_the_open_waits_for_the_new_directory_s_parent_fsync_before_it_makes_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's fsync is held here: the open takes the lock and claims the directory
    meanwhile, but makes no journal and does not return until it ends."""
    import threading
    import time

    from durable_dispatch.storage import fs

    d = tmp_path / "s"
    real = fs.fsync_dir
    held, started = threading.Event(), threading.Event()

    def fsync_dir(directory: str) -> None:
        if os.path.abspath(directory) == str(tmp_path):
            started.set()
            assert held.wait(30)
        real(directory)

    monkeypatch.setattr(fs, "fsync_dir", fsync_dir)
    opened: list[CampaignState] = []
    t = threading.Thread(target=lambda: opened.append(CampaignState.open(d)))
    t.start()
    try:
        assert started.wait(15)
        end = time.monotonic() + 15
        while not owner.read_owner(d) and time.monotonic() < end:
            time.sleep(0.01)
        assert owner.read_owner(d) is not None  # claimed while the fsync waits
        t.join(0.3)
        assert not opened and not [p for p in os.listdir(d) if p.endswith(".jsonl")]
    finally:
        held.set()
        t.join(30)
        for s in opened:
            s.close()
    assert opened
