"""Tests of durable_dispatch.errors: hierarchy, attributes, messages, pickling."""

from __future__ import annotations

import errno
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
    E.ProtocolError("bad msg", rank=3, reason="not JSON"),
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
