"""Storage under real kernel faults (S9): a read-only or full filesystem at open time.

Each test mounts its own small tmpfs (root only; CI runs as root, so these run there, and are
skipped elsewhere with the reason) and unmounts it in a ``finally``. No fault seam: the kernel
refuses for real.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from durable_dispatch import CampaignState, Journal, WorkItem
from durable_dispatch.campaign.admin import view_state
from durable_dispatch.errors import StorageError

from .helpers import Tmpfs, fake_campaign, read_all


def _journal_with(path: Path, n: int) -> bytes:
    with Journal.open(path, sync="always") as j:
        for i in range(n):
            j.append({"i": i})
    return path.read_bytes()


def test_an_open_on_a_read_only_filesystem_fails_closed(tmp_path: Path) -> None:
    """Issue 13, example 1: the open used to start degraded at seq 0 and close() wiped the file."""
    with Tmpfs(tmp_path / "m") as m:
        path = m.path / "j.jsonl"
        before = _journal_with(path, 10)
        m.remount("ro")
        try:
            with pytest.raises(StorageError) as ei:
                Journal.open(path, sync="always")
            assert ei.value.errno == errno.EROFS  # type: ignore[attr-defined]
        finally:
            m.remount("rw")
        assert path.read_bytes() == before  # untouched
        assert [p["i"] for _, p in read_all(path)] == list(range(10))


def test_an_open_without_inodes_for_its_lock_fails_closed(tmp_path: Path) -> None:
    with Tmpfs(tmp_path / "m", inodes=32) as m:
        path = m.path / "j.jsonl"
        before = _journal_with(path, 10)
        Path(str(path) + ".lock").unlink(missing_ok=True)  # the next open must create it
        m.fill(inodes=True)
        try:
            with pytest.raises(StorageError) as ei:
                Journal.open(path, sync="batch")
            assert ei.value.errno == errno.ENOSPC  # type: ignore[attr-defined]
        finally:
            m.free()
        assert path.read_bytes() == before
        assert len(read_all(path)) == 10


def test_a_new_journal_on_a_full_filesystem_still_starts_degraded(tmp_path: Path) -> None:
    """Nothing to lose: honest degradation to memory, as before."""
    with Tmpfs(tmp_path / "m", inodes=32) as m:
        m.fill(inodes=True)
        try:
            j = Journal.open(m.path / "new.jsonl", sync="always")
            assert not j.health.ok and j.health.errno == errno.ENOSPC
            assert not j.append({"a": 1}).durable
        finally:
            m.free()
        assert j.try_restore()
        j.close()
        assert read_all(m.path / "new.jsonl") == [(0, {"a": 1})]


def test_a_damaged_tail_is_not_cut_when_its_copy_does_not_fit(tmp_path: Path) -> None:
    """Issue 13, example 2: the side copy hit ENOSPC, and the damaged span was cut anyway."""
    with Tmpfs(tmp_path / "m", size=1 << 20) as m:
        path = m.path / "j.jsonl"
        _journal_with(path, 50)
        with open(path, "ab") as f:
            f.write(b'{"v":1,"garbage":"' + b"x" * (300 << 10))  # a torn 300 KB last line
        before = path.read_bytes()
        m.fill()
        try:
            for mode in ("tolerate-torn-tail", "point-in-time"):
                with pytest.raises(StorageError) as ei:
                    Journal.open(path, recovery=mode)
                assert ei.value.errno == errno.ENOSPC  # type: ignore[attr-defined]
                assert path.read_bytes() == before  # nothing cut
                assert not list(m.path.glob("j.jsonl.damaged-*"))  # no partial copy left
        finally:
            m.free()
        j = Journal.open(path)  # room again: the tail is saved, then cut
        try:
            assert j.recovery.cut_bytes == len(before) - j.recovery.cut_offset  # type: ignore[operator]
            side = Path(j.recovery.side_file or "")
            assert side.read_bytes() == before[j.recovery.cut_offset :]
            assert len(list(j.records())) == 50
        finally:
            j.close()


def test_a_campaign_restart_without_inodes_loses_nothing(tmp_path: Path) -> None:
    """Issue 13, example 1 at campaign level: 120 commits and 200 items were lost this way."""
    with Tmpfs(tmp_path / "m", inodes=64) as m:
        d = m.path / "state"
        with CampaignState.open(d, ranks=[1, 2]) as s:
            s.submit(WorkItem(f"w-{i}", {"i": i}) for i in range(120))
            fake_campaign(s)
            s.submit(WorkItem(f"w-{i}", {"i": i}) for i in range(120, 200))
        before = view_state(d).summary()
        assert (before["committed"], before["pending"]) == (120, 80)
        for lock in d.glob("*.lock"):
            lock.unlink()
        m.fill(inodes=True)
        try:
            with pytest.raises(StorageError):
                CampaignState.open(d, ranks=[1, 2])
        finally:
            m.free()
        after = view_state(d).summary()
        assert (after["committed"], after["pending"]) == (120, 80)
        with CampaignState.open(d, ranks=[1, 2]) as s:
            fake_campaign(s)
        assert view_state(d).summary()["committed"] == 200


def test_a_campaign_open_on_a_read_only_filesystem_is_a_typed_error(tmp_path: Path) -> None:
    with Tmpfs(tmp_path / "m") as m:
        d = m.path / "state"
        with CampaignState.open(d, ranks=[1]) as s:
            s.submit(WorkItem(f"w-{i}") for i in range(5))
        m.remount("ro")
        try:
            with pytest.raises(StorageError):
                CampaignState.open(d, ranks=[1])
            with pytest.raises(StorageError):
                CampaignState.open(m.path / "new-state", ranks=[1])
        finally:
            m.remount("rw")


# ------------------------------------------------- a dying disk: FS_IOC_SHUTDOWN on ext4
@pytest.mark.parametrize("sync", ["always", "batch"])
def test_a_disk_that_dies_mid_run_loses_no_acknowledged_record(tmp_path: Path, sync: str) -> None:
    """Real EIO with the page cache lost: every record acknowledged durable before the shutdown
    is on disk after a remount, and nothing after it was acknowledged durable."""
    from durable_dispatch.errors import NotDurableError

    from .helpers import Ext4Image

    with Ext4Image(tmp_path / "disk") as disk:
        path = disk.path / "j.jsonl"
        j = Journal.open(path, sync=sync)
        acked = []
        for i in range(200):
            r = j.append({"i": i})
            if sync == "batch" and i % 20 == 19:
                j.wait_durable(r.seq)
                acked = list(range(i + 1))
            elif sync == "always":
                assert r.durable
                acked.append(i)
        disk.shut_down()
        late = [j.append({"i": 200 + k}) for k in range(50)]
        j.sync_now()  # batch: the flusher may not have met the dead disk yet
        assert not j.health.ok and j.health.errno == errno.EIO
        assert not any(r.durable for r in late)
        with pytest.raises(NotDurableError):
            j.wait_durable(late[-1].seq)
        with pytest.raises(NotDurableError):
            j.close()  # the memory records cannot reach a dead disk: said, not hidden
        disk.remount()
        with Journal.open(path, sync="always") as again:
            kept = [r.payload["i"] for r in again.records()]
    assert kept[: len(acked)] == acked  # every acknowledged record, in order
    assert kept == list(range(len(kept)))  # and nothing invented


def test_an_open_on_a_dead_disk_fails_closed(tmp_path: Path) -> None:
    from .helpers import Ext4Image

    with Ext4Image(tmp_path / "disk") as disk:
        path = disk.path / "j.jsonl"
        before = _journal_with(path, 30)
        disk.shut_down()
        with pytest.raises(StorageError) as ei:
            Journal.open(path, sync="always")
        assert ei.value.errno == errno.EIO  # type: ignore[attr-defined]
        disk.remount()
        assert path.read_bytes() == before
        assert [p["i"] for _, p in read_all(path)] == list(range(30))
