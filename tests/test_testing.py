"""Tests of the public fault-injection helpers (durable_dispatch.testing)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from durable_dispatch.storage import Journal, fs
from durable_dispatch.storage.journal import read_journal
from durable_dispatch.testing import FaultInjector, inject_faults


def _write(path: Path) -> None:
    fd = fs.open_append(str(path))
    try:
        fs.write_all(fd, b"x")
        fs.fsync(fd)
    finally:
        fs.close(fd)


def test_every_call_until_healed(tmp_path: Path) -> None:
    with inject_faults() as f:
        rule = f.fail("fsync", errno.EIO)
        for _ in range(3):
            with pytest.raises(OSError) as ei:
                _write(tmp_path / "a")
            assert ei.value.errno == errno.EIO
        assert rule.fired == 3
        f.heal()
        _write(tmp_path / "a")
    assert fs.get_fault_hook() is None


def test_nth_and_from_nth(tmp_path: Path) -> None:
    with inject_faults() as f:
        f.fail("write", errno.ENOSPC, nth=2)
        _write(tmp_path / "a")
        with pytest.raises(OSError):
            _write(tmp_path / "a")
        _write(tmp_path / "a")
        f.heal()
        f.fail("write", errno.EROFS, nth=2, from_nth=True)
        _write(tmp_path / "b")
        for _ in range(3):
            with pytest.raises(OSError):
                _write(tmp_path / "b")


def test_path_patterns_match_full_path_or_basename(tmp_path: Path) -> None:
    with inject_faults() as f:
        f.fail("open", errno.EIO, path="*.jsonl")
        _write(tmp_path / "ok.snap")
        with pytest.raises(OSError):
            _write(tmp_path / "bad.jsonl")
        f.heal()
        f.fail("open", errno.EIO, path=str(tmp_path / "sub") + "/*")
        _write(tmp_path / "top")
        os.mkdir(tmp_path / "sub")
        with pytest.raises(OSError):
            _write(tmp_path / "sub" / "x")
        assert f.log[-1] == ("open", str(tmp_path / "sub" / "x"), errno.EIO)
        assert f.seen["open"] >= 4


def test_every_operation_can_fail(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"abc")
    calls = {
        "open": lambda: fs.open_append(str(tmp_path / "n")),
        "write": lambda: fs.write_all(fs.open_append(str(tmp_path / "w")), b"x"),
        "fsync": lambda: fs.fsync(fs.open_append(str(tmp_path / "s"))),
        "dir-fsync": lambda: fs.fsync_dir(str(tmp_path)),
        "replace": lambda: fs.replace(str(tmp_path / "f"), str(tmp_path / "g")),
        "close": lambda: fs.close(fs.open_append(str(tmp_path / "c"))),
        "truncate": lambda: fs.truncate(str(tmp_path / "f"), 1),
        "unlink": lambda: fs.unlink(str(tmp_path / "f")),
        "read": lambda: fs.open_read(str(tmp_path / "f")),
    }
    assert set(calls) == set(fs.OPERATIONS)
    for op, call in calls.items():
        with inject_faults() as f:
            f.fail(op, errno.EIO)
            with pytest.raises(OSError) as ei:
                call()
            assert ei.value.errno == errno.EIO, op
            assert f.log and f.log[0][0] == op


def test_bad_rules_are_refused() -> None:
    f = FaultInjector()
    with pytest.raises(ValueError):
        f.fail("fsink")
    with pytest.raises(ValueError):
        f.fail("write", nth=0)


def test_nested_injectors_restore_the_previous_hook() -> None:
    with inject_faults() as outer:
        with inject_faults() as inner:
            assert fs.get_fault_hook() is inner
        assert fs.get_fault_hook() is outer
    assert fs.get_fault_hook() is None


def test_a_rule_from_the_nth_on_keeps_matching_a_file_its_restore_rewrote(tmp_path: Path) -> None:
    """Issue 46: "every fsync of the journal fails from the 3rd on" named the journal's path;
    its restore writes a fresh copy (another name) and renames it over the journal, and the
    rule stopped matching both the copy and the renamed file: the disk gone for good healed.
    The copy matches as the file it will become, and the renamed descriptor as its new name."""
    path = str(tmp_path / "events.jsonl")
    with inject_faults() as f:
        j = Journal.open(path, sync="always")
        rule = f.fail("fsync", errno.EIO, path=path, nth=3, from_nth=True)
        for i in range(6):
            j.append({"i": i})
        assert not j.health.ok
        assert not j.try_restore()  # the copy's fsync fails too: the disk is gone
        assert not j.health.ok and rule.fired >= 2
        f.heal(rule)
        assert j.try_restore() and j.health.ok  # until the test heals it
        rule = f.fail("fsync", errno.EIO, path=path)
        j.append({"after": 1})  # the renamed file's descriptor is still that journal
        assert not j.health.ok and rule.fired == 1
        f.heal()
        j.close()
    assert [r.payload for r in read_journal(path)][-1] == {"after": 1}
