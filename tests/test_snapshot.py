"""Tests of durable_dispatch.storage.snapshot on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_dispatch import SnapshotStore
from durable_dispatch.errors import RecordEncodeError, SnapshotCorruptError, UsageError
from durable_dispatch.storage.snapshot import decode_snapshot, encode_snapshot
from durable_dispatch.testing import inject_faults

from .helpers import file_mode


def test_save_load_round_trip_and_generations(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "state", name="campaign", keep=3)
    assert store.load() is None
    gens = [store.save({"frontier": list(range(i)), "n": i}) for i in range(5)]
    assert gens == [1, 2, 3, 4, 5]
    assert store.generations() == [3, 4, 5]
    snap = store.load()
    assert snap is not None
    assert (snap.generation, snap.value, snap.fell_back) == (
        5,
        {"frontier": [0, 1, 2, 3], "n": 4},
        False,
    )
    assert file_mode(store.path_of(5)) == 0o600


def test_save_writes_temp_fsyncs_renames_and_fsyncs_directory(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, name="s")
    store.save({"a": 1})
    with inject_faults() as probe:
        store.save({"a": 2})
    assert probe.seen["open"] == 1  # exclusive create of the temp file
    assert probe.seen["fsync"] == 1 and probe.seen["replace"] == 1
    assert probe.seen["dir-fsync"] >= 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_corrupt_newest_generation_falls_back(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, name="s", keep=3)
    store.save({"v": "old"})
    g2 = store.save({"v": "new"})
    p = Path(store.path_of(g2))
    data = bytearray(p.read_bytes())
    data[-3] ^= 0x20
    p.write_bytes(bytes(data))
    snap = store.load()
    assert snap is not None and snap.value == {"v": "old"} and snap.generation == 1
    assert snap.fell_back and snap.skipped[0] == (str(p), "checksum mismatch")
    # The next save does not reuse the damaged generation's number.
    assert store.save({"v": "newer"}) == 3


@pytest.mark.parametrize("cut", [0, 5, 30, -1])
def test_truncated_newest_generation_falls_back(tmp_path: Path, cut: int) -> None:
    store = SnapshotStore(tmp_path, name="s")
    store.save([1])
    g = store.save([2])
    p = Path(store.path_of(g))
    p.write_bytes(p.read_bytes()[:cut])
    snap = store.load()
    assert snap is not None and snap.value == [1] and snap.fell_back


def test_torn_temp_files_are_ignored_and_cleaned(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, name="s")
    store.save({"ok": 1})
    (tmp_path / ".s.2.abc.tmp").write_bytes(b'{"v":1,"gen":2,"len":99')
    snap = store.load()
    assert snap is not None and snap.value == {"ok": 1} and not snap.fell_back
    store.save({"ok": 2})
    assert not (tmp_path / ".s.2.abc.tmp").exists()


def test_all_generations_corrupt_is_an_error(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, name="s")
    g = store.save({"a": 1})
    Path(store.path_of(g)).write_bytes(b"junk")
    with pytest.raises(SnapshotCorruptError) as ei:
        store.load()
    assert ei.value.path == store.path_of(g)


def test_generation_mismatch_and_wrong_version_are_damage() -> None:
    data = encode_snapshot(7, b'{"a":1}')
    assert decode_snapshot(data, 7) == (7, {"a": 1})
    assert "generation" in str(decode_snapshot(data, 8))
    assert "version" in str(decode_snapshot(data.replace(b'"v":1', b'"v":2'), 7))
    assert decode_snapshot(b"", None) == "no header line"


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        SnapshotStore(tmp_path, name="../evil")
    with pytest.raises(UsageError):
        SnapshotStore(tmp_path, keep=0)
    with pytest.raises(RecordEncodeError):
        SnapshotStore(tmp_path).save({"x": {1, 2}})


def test_a_planted_huge_generation_is_not_a_generation(tmp_path: Path) -> None:
    """Issue 13, example 9: a planted generation 2**64-1 made every later save unreadable (its
    successor does not fit a JSON integer) and load() fell back to the planted file forever."""
    store = SnapshotStore(tmp_path, name="s")
    store.save({"n": 1})
    huge = 2**64 - 1
    (tmp_path / f"s.{huge}.snap").write_bytes(encode_snapshot(huge, b'{"planted":true}'))
    gen = store.save({"n": 2})
    assert gen == 2
    again = SnapshotStore(tmp_path, name="s").load()
    assert again is not None and again.value == {"n": 2} and again.generation == 2


def test_saves_past_the_last_generation_are_refused(tmp_path: Path) -> None:
    from durable_dispatch.errors import StorageError
    from durable_dispatch.storage.snapshot import MAX_GENERATION

    store = SnapshotStore(tmp_path, name="s")
    Path(store.path_of(MAX_GENERATION)).write_bytes(encode_snapshot(MAX_GENERATION, b"{}"))
    with pytest.raises(StorageError, match="exhausted"):
        store.save({"n": 1})
    loaded = store.load()
    assert loaded is not None and loaded.generation == MAX_GENERATION
