"""Tests of durable_dispatch.errors: hierarchy, attributes, messages, pickling."""

from __future__ import annotations

import errno
import os
import pickle

import pytest

from durable_dispatch import errors as E

SAMPLES = [
    E.UsageError("bad call"),
    E.ConfigurationError("bad value", name="DD_WATCHDOG"),
    E.JournalCorruptError("damaged", path="/s/j.jsonl", offset=42, reason="checksum mismatch"),
    E.JournalVersionError("v2", path="/s/j.jsonl", reason="unsupported version"),
    E.SnapshotCorruptError("bad", path="/s/x.snap", reason="checksum mismatch"),
    E.RecordTooLargeError("big", size=10, limit=5),
    E.RecordEncodeError("enc"),
    E.StorageError("no", path="/s", op="open", errno=errno.EACCES),
    E.StorageDegradedError("deg", path="/s", op="fsync", errno=errno.EIO),
    E.MemoryBoundError("full", path="/s", op="append", errno=errno.ENOSPC, pending=3),
    E.NotDurableError("nd", path="/s", op="write", errno=errno.EIO, pending=7),
    E.LockHeldError("held", path="/s/j.jsonl.lock"),
    E.NoMasterError("none", path="/s"),
    E.NoOutputError("no output kept", work_id="w-1", path="/s"),
    E.ProtocolError("bad msg", rank=3, reason="not JSON"),
    E.CampaignMismatchError("other campaign", path="/s", recorded="a.py", given="b.py"),
]


@pytest.mark.parametrize("err", SAMPLES, ids=lambda e: type(e).__name__)
def test_every_error_pickles_with_its_facts(err: E.DurableDispatchError) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert back.message == err.message
    assert isinstance(back, E.DurableDispatchError)


def test_attributes_and_messages() -> None:
    e = E.JournalCorruptError("damaged", path="/s/j.jsonl", offset=42, reason="checksum mismatch")
    assert (e.path, e.offset, e.reason) == ("/s/j.jsonl", 42, "checksum mismatch")
    assert "offset=42" in str(e) and "/s/j.jsonl" in str(e)
    s = E.StorageError("no", path="/s", op="open", errno=errno.EACCES)
    assert isinstance(s, OSError)
    assert (s.path, s.op, s.errno, s.filename) == ("/s", "open", errno.EACCES, "/s")
    assert s.strerror == "Permission denied"
    assert E.NotDurableError("nd", pending=7).pending == 7
    assert E.ProtocolError("x", rank=3, reason="r").rank == 3
    assert E.LockHeldError("h", path="/l").path == "/l"
    assert E.RecordTooLargeError("b", size=10, limit=5).limit == 5
    assert E.ConfigurationError("c", name="N").name == "N"


def test_hierarchy() -> None:
    assert issubclass(E.JournalVersionError, E.JournalCorruptError)
    assert issubclass(E.JournalCorruptError, E.CorruptionError)
    assert issubclass(E.MemoryBoundError, E.StorageDegradedError)
    assert issubclass(E.StorageDegradedError, E.StorageError)
    assert issubclass(E.UsageError, ValueError)
    for name in E.__all__:
        assert issubclass(getattr(E, name), E.DurableDispatchError)
        assert getattr(E, name).__doc__


def test_every_error_has_a_row_in_docs_errors_md_and_each_named_test_exists() -> None:
    """Issue 21: the hierarchy says what is raised when, and each documented raise has a test
    (a row naming a test that no longer exists, or a class without a row, fails here)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "errors.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)`.*$", text, re.M)}
    missing = [n for n in E.__all__ if n != "DurableDispatchError" and n != "CorruptionError"]
    assert [n for n in missing if n not in rows] == []
    for name, row in rows.items():
        refs = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row)
        assert refs, f"the row of {name} names no test"
        for path, test in refs:
            source = (root / path).read_text()
            assert f"def {test}(" in source, f"{name}: {path}::{test} does not exist"


def test_protocol_violations_are_counted_not_raised() -> None:
    """ProtocolError is documented as never raised: the core classifies and counts every
    message that breaks the protocol, whatever its shape."""
    from durable_dispatch.core import Dispatcher, WatchdogConfig, WorkItem

    d = Dispatcher(1, WatchdogConfig(10), ranks=(1,))
    d.submit([WorkItem("a")])
    s = d.reserve(0.0)
    d.mark_dispatched(s.token, 0.0)  # type: ignore[union-attr]
    for junk in (None, 7, "e1", "e1-99", "e0-1", ["e1-1"], {"t": 1}, "x" * 100):
        for rank in (1, 99, -1):
            d.on_ready(rank, junk, 1.0)
            d.on_results(rank, junk, [1], 1.0)
            d.on_heartbeat(rank, junk, 1.0)
    st = d.statistics()
    assert sum(st.malformed.values()) and sum(st.unowned.values()) and sum(st.stale.values())
    assert d.status("a") is not None


def test_os_error_attributes_assigned_later_are_kept() -> None:
    """Issue 21: the errno, strerror and filename setters of StorageError silently dropped what
    was assigned (code that fills in an OSError's fields after building it lost them)."""
    e = E.StorageError("no", path="/s", op="open", errno=errno.EACCES)
    e.errno = errno.ENOSPC
    e.filename = "/other"
    assert (e.errno, e.filename, e.path) == (errno.ENOSPC, "/other", "/other")
    assert e.strerror == os.strerror(errno.ENOSPC)
    e.strerror = "told otherwise"
    assert e.strerror == "told otherwise"
    back = pickle.loads(pickle.dumps(e))
    assert (back.errno, back.filename, back.strerror) == (errno.ENOSPC, "/other", "told otherwise")


def test_a_record_too_large_is_about_the_data_not_a_usage_error() -> None:
    """A worker's oversized result raises it: it is not a misuse of the API (still a
    ValueError, as before)."""
    err = E.RecordTooLargeError("big", size=10, limit=5)
    assert not isinstance(err, E.UsageError)
    assert isinstance(err, ValueError) and isinstance(err, E.DurableDispatchError)
