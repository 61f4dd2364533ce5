"""Honest degradation: every fs operation x EIO/ENOSPC/EROFS x every sync policy (docs/faults.md).

Each case asserts: no receipt is durable that was not fsynced, nothing accepted is lost (memory,
then disk after healing), the health transitions are right, and sequence numbers stay unique.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_dispatch import Journal, SnapshotStore
from durable_dispatch.errors import (
    DurableDispatchError,
    MemoryBoundError,
    NotDurableError,
    StorageDegradedError,
    StorageError,
)
from durable_dispatch.storage.fs import OPERATIONS
from durable_dispatch.storage.journal import HealthState
from durable_dispatch.storage.snapshot import decode_snapshot
from durable_dispatch.testing import FaultInjector, disk_full, inject_faults, read_only_filesystem

from .helpers import examples, read_all

ERRNOS = [errno.EIO, errno.ENOSPC, errno.EROFS]
POLICIES = ["always", "batch", "never"]
STEADY_OPS = ["write", "fsync"]  # what an append does
RESTORE_OPS = ["open", "write", "fsync", "replace", "dir-fsync"]  # what try_restore does


def _open(path: Path, sync: str, **kw: Any) -> Journal:
    return Journal.open(path, sync=sync, batch_max_records=10**6, batch_max_delay=3600, **kw)


def _push(j: Journal, payloads: list[Any]) -> list[Any]:
    receipts = [j.append(p) for p in payloads]
    try:
        j.wait_durable(receipts[-1].seq)
    except NotDurableError:
        pass
    return receipts


def _reopened(path: Path) -> list[tuple[int, Any]]:
    with Journal.open(path) as j:
        return [(r.seq, r.payload) for r in j.records()]


@pytest.mark.parametrize("sync", POLICIES)
@pytest.mark.parametrize("err", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("op", STEADY_OPS)
def test_journal_steady_state_fault(tmp_path: Path, op: str, err: int, sync: str) -> None:
    path = tmp_path / "j.jsonl"
    with inject_faults() as faults:
        j = _open(path, sync)
        good = _push(j, [{"i": i} for i in range(5)])
        assert j.durable_seq == 4 and j.health.ok
        rule = faults.fail(op, err)  # the whole disk fails this operation
        bad = _push(j, [{"i": i} for i in range(5, 15)])
        assert rule.fired >= 1
        h = j.health
        assert h.state is HealthState.DEGRADED and h.errno == err and h.path == str(path)
        assert h.op == op and h.pending == 10 and h.since is not None
        assert not any(r.durable for r in bad), "a receipt claimed durability without an fsync"
        assert j.durable_seq == 4
        with pytest.raises(NotDurableError) as ei:
            j.wait_durable(14)
        assert ei.value.pending == 10
        # Accepted records stay readable, in order, with unique sequence numbers.
        assert [r.seq for r in j.records()] == list(range(15))
        # While the fault lasts, restore fails and says so; nothing is lost.
        assert j.try_restore() is False
        assert not j.health.ok and j.health.pending == 10
        more = j.append({"i": 15})
        assert more.seq == 15 and not more.durable
        faults.heal()
        assert j.try_restore() is True
        assert j.health.ok and j.health.pending == 0
        assert j.durable_seq == 15
        after = j.append({"i": 16})
        j.wait_durable(after.seq)
        j.close()
    assert [r.seq for r in good] == list(range(5))
    assert _reopened(path) == [(i, {"i": i}) for i in range(17)]


@pytest.mark.parametrize("err", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("op", RESTORE_OPS)
def test_journal_restore_fault_keeps_degraded_until_healed(
    tmp_path: Path, op: str, err: int
) -> None:
    path = tmp_path / "j.jsonl"
    with inject_faults() as faults:
        j = _open(path, "always")
        _push(j, [{"i": i} for i in range(3)])
        faults.fail("fsync", errno.EIO, nth=1)  # one failed fsync degrades the journal
        assert not j.append({"i": 3}).durable
        faults.heal()
        faults.fail(op, err)
        assert j.try_restore() is False
        h = j.health
        assert h.state is HealthState.DEGRADED and h.op == "restore" and h.errno == err
        # The journal file is untouched by the failed restore: the durable prefix is intact and
        # no temp file is left behind.
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
        faults.heal()
        assert j.try_restore()
        j.close()
    assert _reopened(path) == [(i, {"i": i}) for i in range(4)]


@pytest.mark.parametrize("err", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("op", ["open", "write", "fsync", "dir-fsync"])
def test_journal_that_cannot_start_on_disk_starts_degraded(
    tmp_path: Path, op: str, err: int
) -> None:
    path = tmp_path / "new" / "j.jsonl"
    with inject_faults() as faults:
        faults.fail(op, err)
        j = _open(path, "always")
        assert not j.health.ok and j.health.errno == err
        receipts = [j.append({"i": i}) for i in range(3)]
        assert [r.seq for r in receipts] == [0, 1, 2] and not any(r.durable for r in receipts)
        faults.heal()
        assert j.try_restore()
        j.close()
    assert _reopened(path) == [(i, {"i": i}) for i in range(3)]


def test_read_only_filesystem_helper(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path, sync="always") as j:
        j.append({"a": 1})
    before = path.read_bytes()
    with inject_faults() as faults:
        read_only_filesystem(faults, str(tmp_path / "*"))
        # As on a real read-only mount: the lock file cannot be opened for writing, so the open
        # fails closed (S9) and changes nothing (it used to start degraded, because filelock's
        # open of the lock file was outside the seam).
        with pytest.raises(StorageError) as ei:
            Journal.open(path, sync="always")
        assert ei.value.errno == errno.EROFS  # type: ignore[attr-defined]
        assert path.read_bytes() == before
        faults.heal()
        with Journal.open(path, sync="always") as j:
            assert j.next_seq == 1
            j.append({"a": 2})
    assert _reopened(path) == [(0, {"a": 1}), (1, {"a": 2})]


def test_close_fault_after_fsync_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with inject_faults() as faults:
        j = Journal.open(path, sync="batch")
        j.append({"a": 1})
        faults.fail("close", errno.EIO)
        j.close()  # fsynced before the close failed: durable
    assert _reopened(path) == [(0, {"a": 1})]


def test_close_while_degraded_raises_not_durable(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with inject_faults() as faults:
        j = Journal.open(path, sync="always")
        faults.fail("fsync", errno.EIO)
        j.append({"a": 1})
        with pytest.raises(NotDurableError) as ei:
            j.close()
        assert ei.value.pending == 1
    assert j.closed
    # The lock was released even so.
    Journal.open(path).close()


def test_failed_fsync_is_never_retried_on_the_same_descriptor(tmp_path: Path) -> None:
    """fsyncgate: a second fsync returning 0 proves nothing, so none is attempted."""
    path = tmp_path / "j.jsonl"
    with inject_faults() as faults:
        j = Journal.open(path, sync="always")
        faults.fail("fsync", errno.EIO, nth=1)
        assert not j.append({"a": 1}).durable
        fsyncs = faults.seen["fsync"]
        assert not j.append({"a": 2}).durable  # degraded: no write, no fsync
        with pytest.raises(NotDurableError):
            j.wait_durable(1)
        assert faults.seen["fsync"] == fsyncs
        assert j.try_restore()
        # The restore wrote a fresh file (temp + rename), fsynced it and its directory.
        assert faults.seen["replace"] == 1 and faults.seen["dir-fsync"] >= 1
        j.close()
    assert _reopened(path) == [(0, {"a": 1}), (1, {"a": 2})]


def test_memory_bound_refuses_with_typed_error(tmp_path: Path) -> None:
    with inject_faults() as faults:
        j = Journal.open(tmp_path / "j.jsonl", sync="always", max_memory_bytes=1000)
        faults.fail("write", errno.ENOSPC)
        n = 0
        with pytest.raises(MemoryBoundError) as ei:
            while True:
                j.append({"pad": "x" * 50})
                n += 1
        assert ei.value.errno == errno.ENOSPC and ei.value.pending == n
        assert j.next_seq == n  # the refused record took no sequence number
        faults.heal()
        assert j.try_restore()
        assert j.append({"ok": True}).seq == n
        j.close()


def test_non_disk_errors_at_start_raise_typed_errors(tmp_path: Path) -> None:
    with inject_faults() as faults:
        faults.fail("open", errno.EACCES)
        with pytest.raises(StorageError) as ei:
            Journal.open(tmp_path / "j.jsonl")
        assert ei.value.errno == errno.EACCES and ei.value.op == "open"
    # the failed open released its lock
    Journal.open(tmp_path / "j.jsonl").close()


def test_unreadable_journal_refuses_to_start(tmp_path: Path) -> None:
    """Without reading the file the next sequence number is unknown: no guessing."""
    path = tmp_path / "j.jsonl"
    Journal.open(path).close()
    Journal.open(path).close()
    with inject_faults() as faults:
        faults.fail("read", errno.EIO)
        with pytest.raises(StorageError) as ei:
            Journal.open(path)
        assert ei.value.op == "read"


def test_batch_fault_mid_batch_from_threads_keeps_everything(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "j.jsonl"
    with inject_faults() as faults:
        j = Journal.open(path, sync="batch", batch_max_records=16, batch_max_delay=0.001)
        seqs: list[int] = []
        lock = threading.Lock()

        def worker(k: int) -> None:
            for i in range(200):
                r = j.append({"k": k, "i": i})
                with lock:
                    seqs.append(r.seq)
                if k == 0 and i == 50:
                    faults.fail("fsync", errno.EIO)

        ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sorted(seqs) == list(range(800))
        durable_before = j.durable_seq
        faults.heal()
        assert j.try_restore() or j.health.ok
        j.sync_now()
        assert j.durable_seq == 799 >= durable_before
        j.close()
    got = _reopened(path)
    assert [s for s, _ in got] == list(range(800))
    assert sorted((p["k"], p["i"]) for _, p in got) == [
        (k, i) for k in range(4) for i in range(200)
    ]


# ------------------------------------------------------------------------------ snapshots
@pytest.mark.parametrize("err", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("op", ["open", "write", "fsync", "close", "replace", "dir-fsync"])
def test_snapshot_save_fault(tmp_path: Path, op: str, err: int) -> None:
    store = SnapshotStore(tmp_path, name="s", keep=2)
    g1 = store.save({"v": 1})
    with inject_faults() as faults:
        faults.fail(op, err)
        with pytest.raises(StorageDegradedError) as ei:
            store.save({"v": 2})
        assert ei.value.errno == err
        h = store.health
        assert h.state is HealthState.DEGRADED and h.errno == err and h.pending == 1
        assert store.has_unsaved and store.unsaved == {"v": 2}
        # The previous generation is untouched and loadable.
        assert decode_snapshot(Path(store.path_of(g1)).read_bytes(), g1) == (g1, {"v": 1})
        snap = store.load()
        assert snap is not None
        if op == "dir-fsync":
            # The rename happened but was not made durable: either complete file may load.
            assert snap.value in ({"v": 1}, {"v": 2})
        else:
            assert snap.value == {"v": 1} and snap.generation == g1
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        faults.heal()
    g = store.save({"v": 3})  # the next save tries again
    assert store.health.ok and not store.has_unsaved
    snap = store.load()
    assert snap is not None and snap.value == {"v": 3} and snap.generation == g


# -------------------------------------------------------------------------------- pyfakefs
def test_full_disk_in_the_middle_of_a_batch(fs: Any) -> None:
    fs.create_dir("/state")
    j = Journal.open("/state/e.jsonl", sync="batch", batch_max_records=10**6, batch_max_delay=3600)
    first = [j.append({"i": i}) for i in range(5)]
    j.wait_durable(first[-1].seq)
    disk_full(fs, free_bytes=300, path="/state")
    batch = [j.append({"i": i, "pad": "x" * 50}) for i in range(5, 55)]
    with pytest.raises(NotDurableError):
        j.wait_durable(batch[-1].seq)
    assert j.health.errno == errno.ENOSPC and j.health.pending == 50
    assert j.durable_seq == 4
    fs.set_disk_usage(10**9, "/state")
    assert j.try_restore() and j.durable_seq == 54
    j.close()
    with Journal.open("/state/e.jsonl") as j2:
        assert [r.seq for r in j2.records()] == list(range(55))


def test_plugin_fixture_under_pyfakefs(fs: Any, inject_faults: FaultInjector) -> None:
    """The fixture from the pytest plugin, used exactly as a user would (no import)."""
    fs.create_dir("/s")
    inject_faults.fail("fsync", errno.EIO, path="/s/*.jsonl", nth=2)
    with Journal.open("/s/e.jsonl", sync="always") as j:
        assert not j.append({"a": 1}).durable  # fsync 1 was the header's; 2 fails
        assert inject_faults.log == [("fsync", "/s/e.jsonl", errno.EIO)]
        assert j.try_restore()
    store = SnapshotStore("/s", name="c")
    inject_faults.fail("replace", errno.EROFS)
    with pytest.raises(StorageDegradedError):
        store.save({"x": 1})


def test_truncate_fault_while_cutting_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path, sync="always") as j:
        for i in range(3):
            j.append({"i": i})
    path.write_bytes(path.read_bytes()[:-4])  # torn last record
    with inject_faults() as faults:
        faults.fail("truncate", errno.EIO)
        j = Journal.open(path, sync="always")
        assert not j.health.ok and j.health.errno == errno.EIO
        assert j.next_seq == 2  # numbering continues after the valid prefix
        assert [r.seq for r in j.records()] == [0, 1]
        assert not j.append({"i": 2}).durable
        faults.heal()
        assert j.try_restore()
        j.close()
    assert _reopened(path) == [(0, {"i": 0}), (1, {"i": 1}), (2, {"i": 2})]
    assert list(tmp_path.glob("j.jsonl.damaged-*"))  # the torn bytes were saved first


# ------------------------------------------------------------ the fault seam on the open path
@settings(
    max_examples=examples(120),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    op=st.sampled_from(OPERATIONS),
    err=st.sampled_from([errno.EIO, errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES]),
    nth=st.integers(1, 4),
    recovery=st.sampled_from(["tolerate-torn-tail", "point-in-time", "skip-corrupted"]),
    torn=st.booleans(),
)
def test_a_fault_anywhere_in_an_open_never_loses_a_durable_record(
    tmp_path_factory: Any, op: str, err: int, nth: int, recovery: str, torn: bool
) -> None:
    """S9 through the seam: whichever step of an open fails (its nth call of that operation),
    with whichever errno, the open raises a typed error or starts (maybe degraded) knowing every
    record; a close, a restore and the next open keep all 10 durable records."""
    d = tmp_path_factory.mktemp("open-fault")
    path = d / "j.jsonl"
    with Journal.open(path, sync="always") as j:
        for i in range(10):
            j.append({"i": i})
    if torn:
        with open(path, "ab") as f:
            f.write(b'{"v":1,"crc":"0')  # a torn tail the open cuts (after saving it)
    with inject_faults() as faults:
        faults.fail(op, err, nth=nth, from_nth=True)
        try:
            j = Journal.open(path, sync="always", recovery=recovery)
        except DurableDispatchError:
            j = None
        if j is not None:
            assert j.next_seq == 10  # numbering continues: the file was read
        faults.heal()
        if j is not None:
            j.close()
    kept = [p["i"] for _, p in read_all(path, recovery="point-in-time")]
    assert kept == list(range(10))
