"""The sample files in fixtures/ are what their names say (and match make_fixtures.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from durable_dispatch import Journal, SnapshotStore
from durable_dispatch.errors import JournalCorruptError, JournalVersionError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copy(FIXTURES / name, dst)
    return dst


def test_fixtures_are_reproducible() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("mk", FIXTURES / "make_fixtures.py")
    assert spec and spec.loader
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    assert (FIXTURES / "valid.jsonl").read_bytes() == mk.journal_bytes()


def test_valid(tmp_path: Path) -> None:
    with Journal.open(_copy(tmp_path, "valid.jsonl"), recovery="absolute") as j:
        assert [r.payload["work_id"] for r in j.records()] == ["w-1", "w-2", "w-1", "w-2", "w-2"]


def test_torn_tail(tmp_path: Path) -> None:
    with Journal.open(_copy(tmp_path, "torn_tail.jsonl")) as j:
        assert j.recovery.records == 4 and j.recovery.cut_bytes > 0


def test_corrupt_middle(tmp_path: Path) -> None:
    with pytest.raises(JournalCorruptError) as ei:
        Journal.open(_copy(tmp_path, "corrupt_middle.jsonl"))
    assert ei.value.reason == "checksum mismatch"


def test_wrong_version(tmp_path: Path) -> None:
    with pytest.raises(JournalVersionError):
        Journal.open(_copy(tmp_path, "wrong_version.jsonl"))


def test_snapshot(tmp_path: Path) -> None:
    _copy(tmp_path, "campaign.000000000001.snap")
    snap = SnapshotStore(tmp_path, name="campaign").load()
    assert snap is not None and snap.value["frontier"] == ["w-3", "w-4"]
