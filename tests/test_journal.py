"""Tests of durable_dispatch.storage.journal on real files (faults: see test_faults.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from durable_dispatch import Journal
from durable_dispatch.errors import (
    JournalCorruptError,
    JournalVersionError,
    LockHeldError,
    RecordEncodeError,
    RecordTooLargeError,
    StorageError,
    UsageError,
)
from durable_dispatch.storage.format import Header, frame_record
from durable_dispatch.storage.journal import read_journal
from durable_dispatch.storage.scan import RawBatch
from durable_dispatch.testing import inject_faults

from .helpers import file_mode, line_offsets, read_all, sample_payloads, write_journal

POLICIES = ["always", "batch", "never"]


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("sync", POLICIES)
def test_round_trip_every_policy(tmp_path: Path, sync: str) -> None:
    path = tmp_path / "j.jsonl"
    payloads = sample_payloads(300)
    seqs = write_journal(path, payloads, sync=sync)
    assert seqs == list(range(300))
    assert read_all(path) == list(zip(seqs, payloads, strict=True))


@pytest.mark.parametrize("sync", POLICIES)
def test_reopen_continues_sequence(tmp_path: Path, sync: str) -> None:
    path = tmp_path / "j.jsonl"
    write_journal(path, [{"a": 1}, {"a": 2}], sync=sync)
    with Journal.open(path, sync=sync) as j:
        assert j.next_seq == 2
        assert j.append({"a": 3}).seq == 2
    assert [s for s, _ in read_all(path)] == [0, 1, 2]


def test_every_line_is_a_json_object_with_version_seq_and_checksum(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    write_journal(path, [{"event": "committed", "work_id": "w-17"}])
    lines = path.read_bytes().splitlines()
    objs = [orjson.loads(line) for line in lines]
    assert all(isinstance(o, dict) and o["v"] == 1 and "crc" in o for o in objs)
    assert objs[1]["seq"] == 0 and objs[1]["p"] == {"event": "committed", "work_id": "w-17"}


def test_always_receipts_are_durable_and_one_write_per_record(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j.jsonl", sync="always") as j, inject_faults() as probe:
        receipts = [j.append({"i": i}) for i in range(20)]
        assert all(r.durable for r in receipts)
        assert j.durable_seq == 19
        assert probe.seen["write"] == 20
        assert probe.seen["fsync"] == 20


def test_never_writes_but_never_fsyncs(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path, sync="never") as j, inject_faults() as probe:
        receipts = [j.append({"i": i}) for i in range(10)]
        assert not any(r.durable for r in receipts)
        assert probe.seen["write"] == 10 and probe.seen["fsync"] == 0
        # Flushed to the kernel: a reader sees the bytes before any fsync.
        assert path.read_bytes().count(b"\n") == 11
        j.wait_durable(9)  # an explicit request does fsync
        assert probe.seen["fsync"] == 1
        assert j.durable_seq == 9


def test_batch_group_commit_shares_fsyncs(tmp_path: Path) -> None:
    with (
        Journal.open(
            tmp_path / "j.jsonl", sync="batch", batch_max_records=10_000, batch_max_delay=60
        ) as j,
        inject_faults() as probe,
    ):
        receipts = [j.append({"i": i}) for i in range(500)]
        assert not any(r.durable for r in receipts)
        j.wait_durable(receipts[-1].seq)
        assert j.durable_seq == 499
        assert probe.seen["fsync"] == 1 and probe.seen["write"] == 1


def _eventually(cond: object, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.005)
    return False


def test_batch_is_bounded_by_count(tmp_path: Path) -> None:
    with Journal.open(
        tmp_path / "j.jsonl", sync="batch", batch_max_records=5, batch_max_delay=3600
    ) as j:
        for i in range(5):
            j.append({"i": i})
        # No wait_durable: the count bound alone must trigger the fsync.
        assert _eventually(lambda: j.durable_seq == 4)


def test_batch_is_bounded_by_delay(tmp_path: Path) -> None:
    with Journal.open(
        tmp_path / "j.jsonl", sync="batch", batch_max_records=10**6, batch_max_delay=0.01
    ) as j:
        j.append({"i": 0})
        assert _eventually(lambda: j.durable_seq == 0)


@pytest.mark.parametrize("sync", POLICIES)
def test_concurrent_threads(tmp_path: Path, sync: str) -> None:
    path = tmp_path / "j.jsonl"
    got: list[list[int]] = [[] for _ in range(8)]
    with Journal.open(path, sync=sync, batch_max_records=64) as j:

        def worker(k: int) -> None:
            for i in range(250):
                r = j.append({"t": k, "i": i})
                got[k].append(r.seq)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        j.wait_durable(j.next_seq - 1)
    all_seqs = sorted(s for g in got for s in g)
    assert all_seqs == list(range(2000))
    recs = read_all(path)
    assert [s for s, _ in recs] == all_seqs
    by_thread: dict[int, list[int]] = {}
    for _s, p in recs:
        by_thread.setdefault(p["t"], []).append(p["i"])
    assert all(v == list(range(250)) for v in by_thread.values())


def test_records_from_seq_includes_queued(tmp_path: Path) -> None:
    with Journal.open(
        tmp_path / "j.jsonl", sync="batch", batch_max_records=10**6, batch_max_delay=3600
    ) as j:
        for i in range(10):
            j.append({"i": i})
        assert [r.seq for r in j.records(from_seq=7)] == [7, 8, 9]
        assert [r.payload["i"] for r in j.records()] == list(range(10))


# ---------------------------------------------------------------------------- refusals
def test_second_writer_in_process_gets_lock_error(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path):
        with pytest.raises(LockHeldError) as ei:
            Journal.open(path)
        assert ei.value.path == str(path) + ".lock"
    with Journal.open(path):  # released on close
        pass


def test_second_writer_process_gets_lock_error(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    code = (
        "import sys\nfrom durable_dispatch import Journal\n"
        "from durable_dispatch.errors import LockHeldError\n"
        "try:\n    Journal.open(sys.argv[1])\nexcept LockHeldError as e:\n"
        "    print('held', e.path); sys.exit(3)\n"
    )
    with Journal.open(path):
        out = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True
        )
    assert out.returncode == 3, out.stderr
    assert "held" in out.stdout


def test_oversized_and_unencodable_records_are_refused_before_writing(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path, sync="always", max_record_bytes=100) as j:
        j.append({"ok": 1})
        size = path.stat().st_size
        with pytest.raises(RecordTooLargeError) as ei:
            j.append({"big": "x" * 200})
        assert ei.value.limit == 100 and ei.value.size > 100
        with pytest.raises(RecordEncodeError):
            j.append({"bad": object()})
        with pytest.raises(RecordEncodeError):
            j.append({1: "non-str key"})
        assert path.stat().st_size == size
        assert j.append({"ok": 2}).seq == 1


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        Journal.open(tmp_path / "j", sync="sometimes")
    with pytest.raises(UsageError):
        Journal.open(tmp_path / "j", recovery="hope")
    with pytest.raises(UsageError):
        Journal.open(tmp_path / "j", max_record_bytes=0)
    with pytest.raises(UsageError):
        Journal(str(tmp_path / "j"))
    j = Journal.open(tmp_path / "j")
    j.close()
    with pytest.raises(UsageError):
        j.append({})
    with Journal.open(tmp_path / "k") as k, pytest.raises(UsageError):
        k.wait_durable(5)


def test_files_are_owner_only_and_parents_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "j.jsonl"
    write_journal(path, [{"x": 1}])
    assert file_mode(path) == 0o600
    assert file_mode(str(path) + ".lock") == 0o600
    assert file_mode(tmp_path / "a") == 0o700


def test_refuses_to_follow_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    link = tmp_path / "j.jsonl"
    link.symlink_to(target)
    from durable_dispatch.errors import StorageError

    with pytest.raises(StorageError):
        Journal.open(link)


# --------------------------------------------------------------------------- recovery
def _journal_with(tmp_path: Path, n: int = 5, name: str = "j.jsonl") -> Path:
    path = tmp_path / name
    write_journal(path, [{"event": "e", "i": i, "pad": "p" * i} for i in range(n)])
    return path


def test_torn_tail_at_every_offset_of_last_record(tmp_path: Path) -> None:
    src = _journal_with(tmp_path, 4, "src.jsonl")
    data = src.read_bytes()
    last = line_offsets(src)[-1]
    for cut in range(last + 1, len(data)):  # every proper prefix of the last line
        d = tmp_path / f"c{cut}"
        d.mkdir()
        path = d / "j.jsonl"
        path.write_bytes(data[:cut])
        with Journal.open(path) as j:
            rep = j.recovery
            assert rep.cut_offset == last and rep.cut_bytes == cut - last
            assert rep.side_file and Path(rep.side_file).read_bytes() == data[last:cut]
            assert [r.seq for r in j.records()] == [0, 1, 2]
            assert j.append({"after": True}).seq == 3
        assert [s for s, _ in read_all(path)] == [0, 1, 2, 3]


def test_zero_filled_tail_is_cut(tmp_path: Path) -> None:
    path = _journal_with(tmp_path)
    with open(path, "ab") as f:
        f.write(b"\x00" * 4096)
    with Journal.open(path) as j:
        assert j.recovery.cut_bytes == 4096
        assert j.recovery.damage[0].reason.startswith("torn")
        assert j.next_seq == 5


def test_checksum_failing_last_record_is_cut(tmp_path: Path) -> None:
    path = _journal_with(tmp_path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # inside the last payload
    path.write_bytes(bytes(data))
    with Journal.open(path) as j:
        assert j.recovery.damage[0].reason == "checksum mismatch"
        assert j.next_seq == 4


def test_absolute_mode_refuses_even_a_torn_tail(tmp_path: Path) -> None:
    path = _journal_with(tmp_path)
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(JournalCorruptError) as ei:
        Journal.open(path, recovery="absolute")
    assert ei.value.offset == line_offsets(path)[-1]
    assert not list(tmp_path.glob("*.damaged-*"))


@pytest.mark.parametrize("damage", ["bitflip", "garbage", "blank", "duplicate", "spliced"])
def test_mid_file_damage_is_an_error_by_default(tmp_path: Path, damage: str) -> None:
    path = _journal_with(tmp_path, 6)
    other = _journal_with(tmp_path, 6, "other.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    if damage == "bitflip":
        lines[3] = lines[3].replace(b'"i":2', b'"i":3')
    elif damage == "garbage":
        lines.insert(3, b"this is not json\n")
    elif damage == "blank":
        lines.insert(3, b"\n")
    elif damage == "duplicate":
        lines.insert(3, lines[2])
    else:  # a line of another journal (other salt) at the right position
        lines[3] = other.read_bytes().splitlines(keepends=True)[3]
    path.write_bytes(b"".join(lines))
    offset = sum(len(x) for x in lines[:3])
    with pytest.raises(JournalCorruptError) as ei:
        Journal.open(path)
    assert ei.value.offset == offset
    assert str(offset) in str(ei.value)


def test_sequence_gap_is_damage(tmp_path: Path) -> None:
    path = _journal_with(tmp_path, 6)
    lines = path.read_bytes().splitlines(keepends=True)
    del lines[3]
    path.write_bytes(b"".join(lines))
    with pytest.raises(JournalCorruptError) as ei:
        Journal.open(path)
    assert "sequence" in (ei.value.reason or "")


def test_point_in_time_keeps_prefix_and_side_file_holds_the_rest(tmp_path: Path) -> None:
    path = _journal_with(tmp_path, 6)
    data = path.read_bytes()
    offs = line_offsets(path)
    path.write_bytes(data[: offs[3] + 10] + b"X" + data[offs[3] + 11 :])
    with Journal.open(path, recovery="point-in-time") as j:
        assert [r.seq for r in j.records()] == [0, 1]
        assert j.recovery.cut_offset == offs[3]
        side = Path(j.recovery.side_file or "")
        assert side.read_bytes() == (data[: offs[3] + 10] + b"X" + data[offs[3] + 11 :])[offs[3] :]
        assert j.append({}).seq == 2
    assert [s for s, _ in read_all(path)] == [0, 1, 2]


def test_skip_corrupted_salvages_every_intact_record(tmp_path: Path) -> None:
    path = _journal_with(tmp_path, 8)
    original = path.read_bytes()
    lines = original.splitlines(keepends=True)
    lines[3] = b"garbage\n"  # seq 2
    lines[6] = lines[6][:10] + b"\n"  # seq 5
    damaged = b"".join(lines)
    path.write_bytes(damaged)
    with Journal.open(path, recovery="skip-corrupted") as j:
        assert [r.seq for r in j.records()] == [0, 1, 3, 4, 6, 7]
        assert len(j.recovery.damage) == 2
        assert Path(j.recovery.side_file or "").read_bytes() == damaged
        assert j.append({"new": 1}).seq == 8
    # The salvaged file is valid under the default mode: the gaps are recorded holes.
    assert [s for s, _ in read_all(path)] == [0, 1, 3, 4, 6, 7, 8]


def test_unsynced_region_with_a_hole_is_a_torn_tail(tmp_path: Path) -> None:
    """A lost page inside a never-synced batch, with later lines of the same batch intact."""
    path = tmp_path / "j.jsonl"
    hdr = Header("feedfacecafebeef", 0)
    seed = hdr.seed
    lines = [hdr.frame()] + [frame_record(seed, 0, -1, b'{"a":0}')]
    lines += [frame_record(seed, s, 0, b'{"a":%d}' % s) for s in (1, 2, 3)]  # one batch, d=0
    lines[2] = b"\x00" * len(lines[2])  # seq 1 lost
    path.write_bytes(b"".join(lines))
    with Journal.open(path) as j:
        assert [r.seq for r in j.records()] == [0]
        assert j.recovery.cut_offset == len(lines[0]) + len(lines[1])
    # ...but once a later line proves seq 1 was durable, the same hole is corruption.
    lines = [hdr.frame(), frame_record(seed, 0, -1, b"{}"), b"\x00" * 20 + b"\n"]
    lines += [frame_record(seed, 2, 1, b"{}")]
    path.write_bytes(b"".join(lines))
    with pytest.raises(JournalCorruptError):
        Journal.open(path)


@pytest.mark.parametrize(
    "mode", ["tolerate-torn-tail", "absolute", "point-in-time", "skip-corrupted"]
)
def test_wrong_version_is_refused_in_every_mode(tmp_path: Path, mode: str) -> None:
    path = _journal_with(tmp_path)
    path.write_bytes(path.read_bytes().replace(b'{"v":1,', b'{"v":2,'))
    with pytest.raises(JournalVersionError):
        Journal.open(path, recovery=mode)


def test_damaged_header_alone_restarts_damaged_header_with_records_is_an_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"v":1,"crc":"00')
    with Journal.open(path) as j:
        assert j.recovery.created and j.recovery.cut_bytes == 16
        j.append({"x": 1})
    path2 = _journal_with(tmp_path, 3, "k.jsonl")
    data = bytearray(path2.read_bytes())
    data[5] ^= 0xFF
    path2.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError) as ei:
        Journal.open(path2)
    assert ei.value.offset == 0


def test_empty_file_is_a_new_journal(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"")
    with Journal.open(path) as j:
        assert j.recovery.created
        assert j.append({}).seq == 0


def test_oversized_line_on_disk_is_damage_not_memory_blowup(tmp_path: Path) -> None:
    path = _journal_with(tmp_path, 3)
    with open(path, "ab") as f:
        f.write(b"x" * (3 << 20) + b"\n")
    with Journal.open(path, max_record_bytes=1024) as j:
        assert j.recovery.damage[0].reason.startswith("record longer")
        assert j.recovery.cut_bytes == (3 << 20) + 1


# ------------------------------------------------------------------------------ crash
_CHILD = r"""
import sys
from durable_dispatch import Journal
j = Journal.open(sys.argv[1], sync="always")
i = j.next_seq
out = sys.stdout
while True:
    r = j.append({"event": "x", "seq_hint": i, "pad": "z" * (i % 97)})
    if r.durable:
        out.write("%d\n" % r.seq)
        out.flush()
    i += 1
"""


def test_sigkill_crash_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    path = tmp_path / "crash.jsonl"
    rnd = random.Random(1234)
    acked: dict[int, bytes] = {}
    for _ in range(50):
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True
        )
        time.sleep(rnd.uniform(0.15, 0.4))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        for line in out.split():
            acked[int(line)] = b""
        with Journal.open(path, recovery="tolerate-torn-tail") as j:
            got = {r.seq: r.payload for r in j.records()}
        missing = [s for s in acked if s not in got]
        assert not missing, f"acknowledged records lost: {missing[:5]}"
        assert sorted(got) == list(range(len(got)))
        for s, p in got.items():
            assert p["seq_hint"] == s and p["pad"] == "z" * (s % 97)
    assert len(acked) > 50


def test_a_record_of_another_version_mid_file_is_damage_for_readers(tmp_path: Path) -> None:
    """Found by fuzzing: the read-only reader raised a bare ValueError for such a line."""
    from durable_dispatch.storage.journal import read_journal

    path = _journal_with(tmp_path, 5)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b'{"v":1,', b'{"v":0,')
    path.write_bytes(b"".join(lines))
    with pytest.raises(JournalCorruptError) as ei:
        list(read_journal(path))
    assert "version" in (ei.value.reason or "")


def test_raw_batches_give_offsets_seqs_and_payload_bytes_as_stored(tmp_path: Path) -> None:
    # Enough records for several blocks, with payloads of varied length.
    payloads = [{"i": i, "pad": "x" * (i % 97)} for i in range(3000)]
    path = tmp_path / "j.jsonl"
    with Journal.open(path, sync="never") as j:
        for p in payloads:
            j.append(p)
        j.sync_now()
        batches = list(j.raw_batches())
        assert len(batches) > 1
        offsets = [o for b in batches for o in b.offsets]
        assert offsets == line_offsets(path)[1:]  # the header's line is not a record
        assert [s for b in batches for s in b.seqs] == list(range(3000))
        assert [orjson.loads(p) for b in batches for p in b.payloads] == payloads
        # raw_at re-reads any ascending subset of those offsets.
        picked = offsets[::7] + [offsets[-1]]
        again = list(j.raw_at(picked))
        assert [o for b in again for o in b.offsets] == picked
        assert [s for b in again for s in b.seqs] == list(range(0, 3000, 7)) + [2999]
        assert [orjson.loads(p) for b in again for p in b.payloads] == [
            payloads[s] for b in again for s in b.seqs
        ]


def test_raw_at_refuses_offsets_that_are_not_records(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path, sync="always") as j:
        for i in range(5):
            j.append({"i": i})
        offs = line_offsets(path)
        with pytest.raises(UsageError):
            list(j.raw_at([offs[2], offs[1]]))  # not ascending
        with pytest.raises(UsageError):
            list(j.raw_at([0]))  # the header
        with pytest.raises(UsageError):
            list(j.raw_at([path.stat().st_size]))  # past the end
        with pytest.raises(JournalCorruptError) as ei:
            list(j.raw_at([offs[2] + 3]))  # inside a record
        assert ei.value.offset == offs[2] + 3


def test_raw_reads_name_damage_that_appeared_after_open(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    write_journal(path, [{"i": i} for i in range(2000)], sync="never")
    with Journal.open(path) as j:
        offs = line_offsets(path)
        data = bytearray(path.read_bytes())
        data[offs[1500] + 40] ^= 0x01  # bit rot in a durable record
        path.write_bytes(bytes(data))
        with pytest.raises(JournalCorruptError) as ei:
            list(j.raw_batches())
        assert ei.value.offset == offs[1500]
        with pytest.raises(JournalCorruptError) as ei:
            list(j.raw_at([offs[10], offs[1500]]))
        assert ei.value.offset == offs[1500]


def test_open_visits_every_record_of_the_valid_prefix_once(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    write_journal(path, [{"i": i} for i in range(2500)], sync="never")
    with Journal.open(path) as j:
        expect = [
            (o, p) for b in j.raw_batches() for o, p in zip(b.offsets, b.payloads, strict=True)
        ]
    seen: list[tuple[int, bytes]] = []

    def visit(b: RawBatch) -> None:
        seen.extend(zip(b.offsets, b.payloads, strict=True))

    with Journal.open(path, visit=visit) as j:
        assert not j.recovery.damage
    assert seen == expect
    # A torn tail: the visit stops before it, and the repair keeps exactly what was visited.
    with path.open("ab") as f:
        f.write(b'{"v":1,"crc":"0000')
    seen.clear()
    with Journal.open(path, visit=visit) as j:
        assert j.recovery.damage
        assert [p for b in j.raw_batches() for p in b.payloads] == [p for _o, p in seen]
    # Damage in the middle: records after it are not visited (salvage keeps them, so the caller
    # must look at recovery.damage before trusting the visit to be complete).
    offs = line_offsets(path)
    data = bytearray(path.read_bytes())
    data[offs[1000] + 40] ^= 0x01
    path.write_bytes(bytes(data))
    seen.clear()
    with Journal.open(path, recovery="skip-corrupted", visit=visit) as j:
        assert j.recovery.damage
        assert [o for o, _p in seen] == offs[1:1000]


@pytest.mark.parametrize("where", [1, 1499, 2998])
def test_damage_deep_in_a_large_file_is_found_at_its_exact_offset(
    tmp_path: Path, where: int
) -> None:
    """The scan reads large files in blocks; damage in any block, and a torn tail after many
    blocks, are still named at the exact line."""
    path = tmp_path / "j.jsonl"
    write_journal(path, [{"i": i, "pad": "x" * (i % 50)} for i in range(3000)], sync="never")
    offs = line_offsets(path)
    data = bytearray(path.read_bytes())
    data[offs[1 + where] + 35] ^= 0x01
    path.write_bytes(bytes(data) + b'{"v":1,"crc":"ab')
    with Journal.open(path, recovery="point-in-time") as j:
        assert j.recovery.cut_offset == offs[1 + where]
        assert j.recovery.damage[0].offset == offs[1 + where]
        assert j.recovery.damage[-1].offset == len(data)  # the torn tail
        assert [r.seq for r in j.records()] == list(range(where))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_a_path_that_is_not_a_plain_file_is_refused_before_anything_is_touched(
    tmp_path: Path, kind: str
) -> None:
    """Issue 13, example 7: a hard link's target was overwritten, a symlink's copied aside, and a
    FIFO blocked every reader forever."""
    from durable_dispatch.errors import StorageError

    target = tmp_path / "elsewhere.jsonl"
    write_journal(target, [{"i": i} for i in range(5)])
    before = target.read_bytes()
    target.write_bytes(before + b"torn tail")  # what an open would cut and copy aside
    before = target.read_bytes()
    path = tmp_path / "j.jsonl"
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "hardlink":
        os.link(target, path)
    else:
        os.mkfifo(path)
    with pytest.raises(StorageError, match="refusing to open the journal"):
        Journal.open(path, sync="always")
    assert target.read_bytes() == before
    assert not list(tmp_path.glob("*.damaged-*")) and not list(tmp_path.glob("j.jsonl.lock"))


# A writer in another process: opens the journal (or a state directory), appends, compacts once
# (a rewrite renames a new file into place), says "ready", and holds it until stdin closes.
HOLDER = """
import sys
from durable_dispatch import CampaignState, Journal, WorkItem
if sys.argv[1] == "journal":
    j = Journal.open(sys.argv[2], sync="always")
    for i in range(5):
        j.append({"i": i})
    j.replace_contents([{"i": i} for i in range(5)])
    j.append({"i": 5})
else:
    j = CampaignState.open(sys.argv[2], ranks=[1], sync="always")
    j.submit([WorkItem("w1", {"x": 1})])
print("ready", flush=True)
sys.stdin.read()
j.close()
print("closed", flush=True)
"""


@contextlib.contextmanager
def _held_elsewhere(kind: str, path: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, kind, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        try:
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0 and "closed" in out


@pytest.mark.parametrize("replace", [False, True], ids=["deleted", "replaced"])
def test_a_deleted_or_replaced_lock_file_lets_no_second_writer_in(
    tmp_path: Path, replace: bool
) -> None:
    """Issue 13, example 4 (S12): the lock is on the journal file itself, and moved to the new
    file before a rewrite renames it into place."""
    path = tmp_path / "j.jsonl"
    with _held_elsewhere("journal", path):
        lock = Path(str(path) + ".lock")
        lock.unlink()
        if replace:
            lock.write_text("")
        before = path.read_bytes()
        with pytest.raises(LockHeldError) as ei:
            Journal.open(path)
        assert "deleted or replaced" in str(ei.value)
        assert path.read_bytes() == before  # the second writer changed nothing
    assert [r.payload["i"] for r in read_journal(path)] == list(range(6))


def test_skip_corrupted_salvage_drops_repeated_sequence_numbers(tmp_path: Path) -> None:
    """Issue 13, example 3: intact records whose sequence number repeats an earlier one (a
    spliced or replayed span with valid checksums) were copied back, and the salvaged journal
    no longer read. The scan calls them damage; the salvage now agrees with it."""
    path = tmp_path / "j.jsonl"
    hdr = Header("feedfacecafebeef", 0)
    seed = hdr.seed
    lines = [hdr.frame()] + [frame_record(seed, s, s, b'{"a":%d}' % s) for s in range(4)]
    lines += [b"garbage\n"]  # seq 4 damaged
    lines += [frame_record(seed, s, s, b'{"again":%d}' % s) for s in (1, 2)]  # repeats
    lines += [frame_record(seed, s, s, b'{"a":%d}' % s) for s in (5, 6)]
    path.write_bytes(b"".join(lines))
    with Journal.open(path, recovery="skip-corrupted") as j:
        assert [r.seq for r in j.records()] == [0, 1, 2, 3, 5, 6]
        assert [r.payload for r in j.records()][1] == {"a": 1}  # the first one is kept
        assert j.append({"new": 1}).seq == 7
    assert [s for s, _ in read_all(path)] == [0, 1, 2, 3, 5, 6, 7]  # a valid journal


def test_a_symlink_at_the_lock_path_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    """Issue 13, example 7: with filelock 3.12.0 (the old floor) a symlink at the lock path had
    its target truncated and chmodded; the floor is now a filelock that opens it O_NOFOLLOW."""
    target = tmp_path / "precious.txt"
    target.write_bytes(b"keep me\n")
    target.chmod(0o644)
    path = tmp_path / "j.jsonl"
    Path(str(path) + ".lock").symlink_to(target)
    with pytest.raises(StorageError) as ei:
        Journal.open(path)
    assert ei.value.errno == errno.ELOOP  # type: ignore[attr-defined]
    assert target.read_bytes() == b"keep me\n" and file_mode(target) == 0o644


def test_wait_durable_with_a_timeout_flushes_once_then_gives_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``timeout=0`` used to raise TimeoutError before trying a single flush, so 'do not wait'
    meant 'fail' even on a healthy disk. Now it flushes once; TimeoutError comes only when a
    flush returned and the record is still not durable (another thread's group commit holds it,
    simulated here by a flush that does nothing)."""
    with Journal.open(tmp_path / "j.jsonl", sync="never") as j:
        seq = j.append({"a": 1}).seq
        j.wait_durable(seq, timeout=0)
        assert j.durable_seq >= seq
        seq = j.append({"a": 2}).seq
        monkeypatch.setattr(j, "_flush", lambda sync: True)
        with pytest.raises(TimeoutError):
            j.wait_durable(seq, timeout=0.05)
        monkeypatch.undo()
        j.wait_durable(seq)


@pytest.mark.parametrize("beside_did", [True, False])
def test_a_directory_fsync_beside_is_waited_for_by_the_first_fsync_or_done_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beside_did: bool
) -> None:
    """``Journal.directory_sync_beside`` (issue 49): a new journal opened with
    ``dir_sync=False`` waits at its first fsync for the caller's directory fsync running
    beside, and fsyncs the directory itself only when that one failed (S1); later fsyncs ask
    neither."""
    from durable_dispatch.storage import fs

    real, dirs, asked = fs.fsync_dir, [], []
    monkeypatch.setattr(fs, "fsync_dir", lambda d: (dirs.append(d), real(d))[1])
    j = Journal.open(str(tmp_path / "j.jsonl"), sync="always", dir_sync=False)
    try:
        j.directory_sync_beside(lambda: (asked.append(1), beside_did)[1])
        assert dirs == [] and asked == []  # nothing until the first fsync
        j.append({"a": 1})
        j.append({"a": 2})
        assert j.durable_seq == 1 and asked == [1]
        assert dirs == ([] if beside_did else [str(tmp_path)])
    finally:
        j.close()
