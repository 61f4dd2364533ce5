"""Fuzzing the readers: mutated journals, snapshots and wire messages (hypothesis).

Readers must return only typed errors or valid records, never another exception, and never a
record whose checksum fails. Each test counts the cases it tried and prints the total.
"""

from __future__ import annotations

import io
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from durable_dispatch import Journal
from durable_dispatch.errors import DurableDispatchError
from durable_dispatch.storage.format import (
    Header,
    bulk_check,
    frame_record,
    parse_record,
    verify_record,
)
from durable_dispatch.storage.journal import read_journal
from durable_dispatch.storage.scan import read_chunks, scan
from durable_dispatch.storage.snapshot import decode_snapshot, encode_snapshot

from .helpers import examples

COUNTS: dict[str, int] = {}
HDR = Header("00112233aabbccdd", 0)
PAYLOADS = [{"event": "committed", "work_id": f"w{i}", "n": i, "s": "é☃\n"} for i in range(8)]
LINES = [frame_record(HDR.seed, i, i - 1, orjson.dumps(p)) for i, p in enumerate(PAYLOADS)]
JOURNAL = HDR.frame() + b"".join(LINES)
SNAP = encode_snapshot(3, orjson.dumps({"frontier": ["a", "b"], "n": 1.5}))


def count(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def report() -> Any:
    yield
    print(f"\nfuzz cases tried: {sum(COUNTS.values())} {dict(sorted(COUNTS.items()))}")


def mutations() -> st.SearchStrategy[bytes]:
    lines = JOURNAL.splitlines(keepends=True)
    pos = st.integers(0, len(JOURNAL))
    return st.one_of(
        pos.map(lambda i: JOURNAL[:i]),  # truncation at any offset
        st.tuples(pos, st.integers(0, 7)).map(
            lambda t: (
                JOURNAL[: t[0]]
                + bytes([JOURNAL[t[0] % len(JOURNAL)] ^ (1 << t[1])])
                + JOURNAL[t[0] + 1 :]
            )
        ),  # a bit flip
        st.tuples(pos, st.binary(max_size=40)).map(
            lambda t: JOURNAL[: t[0]] + t[1] + JOURNAL[t[0] :]
        ),  # inserted garbage
        st.tuples(st.integers(1, len(lines)), st.sampled_from([b"\n", b"   \n", b"\x00" * 9])).map(
            lambda t: b"".join(lines[: t[0]] + [t[1]] + lines[t[0] :])
        ),  # blank lines
        st.tuples(st.integers(1, len(lines) - 1), st.integers(1, len(lines) - 1)).map(
            lambda t: b"".join(lines[: t[0]] + [lines[t[1]]] + lines[t[0] :])
        ),  # duplicated line
        st.permutations(lines[1:]).map(lambda p: lines[0] + b"".join(p)),  # reordered
        st.integers(1, len(lines)).map(
            lambda i: b"".join(lines[:i] + [b'{"v":1,"x":"' + b"y" * 5000 + b'"}\n'] + lines[i:])
        ),  # a huge line
        st.integers(1, len(lines)).map(
            lambda i: b"".join(lines[:i] + [b"\xff\xfe\xfa invalid utf-8\n"] + lines[i:])
        ),
        st.sampled_from(
            [
                b"[1,2]\n",
                b"42\n",
                b'"s"\n',
                b"null\n",
                b'{"v":1,"n":NaN}\n',
                b'{"v":1,"n":Infinity}\n',
            ]
        ).map(lambda x: LINES and HDR.frame() + x),
        st.just(JOURNAL.replace(b'{"v":1,', b'{"v":7,')),  # wrong version
        st.integers(1, len(lines) - 1).map(lambda i: b"".join(lines[:i] + lines[i + 1 :])),  # gap
    )


def check_records(recs: list[tuple[int, Any]]) -> None:
    for seq, p in recs:
        assert PAYLOADS[seq] == p, "a record was returned that was never written"


def test_journal_readers_never_crash_or_invent(tmp_path_factory: Any) -> None:
    """Every reader of a mutated journal either reads an honest prefix or raises a typed error;
    the fuzzer checks that it really tried (issue 21: a separate count test failed when run
    alone and could not tell which fuzzer had not run)."""
    before = COUNTS.get("journal", 0)
    _journal_readers_never_crash_or_invent(tmp_path_factory)
    assert COUNTS["journal"] - before >= examples(100)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=mutations())
def _journal_readers_never_crash_or_invent(tmp_path_factory: Any, data: bytes) -> None:
    count("journal")
    # 1. the scanner (documented to raise ValueError("version", v) for another version)
    try:
        res = scan(io.BytesIO(data), len(data), 1 << 12)
        assert res.records <= len(PAYLOADS)
    except ValueError as e:
        assert e.args[0] == "version"
    # 2. per-line verification
    for line in data.splitlines(keepends=True):
        try:
            r = verify_record(line, HDR.seed)
            r2 = parse_record(line, HDR.seed)
        except ValueError as e:
            assert e.args[0] == "version"
            continue
        if not isinstance(r, str):
            assert line in LINES and not isinstance(r2, str)
            assert PAYLOADS[r[0]] == r2[2]
    # 3. the bulk reader
    try:
        chunks = read_chunks(
            io.BytesIO(data), HDR.seed, len(HDR.frame()), len(data), max_line=1 << 12
        )
        got = [row for rows in chunks for row in rows]
        check_records(got)
    except Exception as e:  # noqa: BLE001 - only the reader's own damage type is acceptable
        assert type(e).__name__ == "ReadDamage" or isinstance(e, ValueError), repr(e)
    # 4. the read-only reader and every recovery mode of Journal.open
    d = tmp_path_factory.mktemp("j")
    p = d / "j.jsonl"
    p.write_bytes(data)
    try:
        check_records([(r.seq, r.payload) for r in read_journal(p)])
    except DurableDispatchError:
        pass
    for mode in ("tolerate-torn-tail", "absolute", "point-in-time", "skip-corrupted"):
        p.write_bytes(data)
        try:
            with Journal.open(p, recovery=mode) as j:
                check_records([(r.seq, r.payload) for r in j.records()])
        except DurableDispatchError:
            pass


@settings(max_examples=examples(300), deadline=None)
@given(
    data=st.one_of(
        st.integers(0, len(SNAP)).map(lambda i: SNAP[:i]),
        st.tuples(st.integers(0, len(SNAP) - 1), st.integers(0, 7)).map(
            lambda t: SNAP[: t[0]] + bytes([SNAP[t[0]] ^ (1 << t[1])]) + SNAP[t[0] + 1 :]
        ),
        st.binary(max_size=300),
        st.just(SNAP.replace(b'"v":1', b'"v":2')),
    )
)
def _snapshot_decoder_never_crashes_or_mixes(data: bytes) -> None:
    count("snapshot")
    r = decode_snapshot(data)
    if not isinstance(r, str):
        assert data == SNAP and r == (3, {"frontier": ["a", "b"], "n": 1.5})


def test_snapshot_decoder_never_crashes_or_mixes() -> None:
    before = COUNTS.get("snapshot", 0)
    _snapshot_decoder_never_crashes_or_mixes()
    assert COUNTS["snapshot"] - before >= examples(100)


# ----------------------------------------------------------------- bounded readers (S10)
# Each reader runs in a fresh process that reports its peak RSS (getrusage) and what happened,
# so a reader that holds a 100 MB line, reads a sparse file whole, or blocks on a FIFO shows in
# the figures or in the process timeout (a hang fails the test; no timing threshold).
READER_CHILD = """
import json, os, resource, sys
from durable_dispatch import Journal, SnapshotStore
from durable_dispatch.cli import main
from durable_dispatch.campaign.state import CampaignState
from durable_dispatch.campaign.admin import view_state
from durable_dispatch.storage.journal import read_journal

reader, path = sys.argv[1], sys.argv[2]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
outcome = "ok"
try:
    if reader == "open":
        Journal.open(path, recovery="point-in-time").close()
    elif reader == "read_journal":
        sum(1 for _ in read_journal(path))
    elif reader == "snapshot":
        SnapshotStore(path, name="campaign").load()
    elif reader == "campaign":
        CampaignState.open(path, ranks=[1]).close()
    elif reader == "view_state":
        view_state(path)
    else:
        action = sys.argv[3:4] if reader == "deferred" else []
        rest = sys.argv[4:] if reader == "deferred" else sys.argv[3:]
        outcome = f"exit {main([reader, *action, path, *rest])}"
except Exception as e:
    outcome = type(e).__name__
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"outcome": outcome, "grew_kb": peak - base}))
"""

BIG = 100 << 20


def _run_reader(reader: str, path: Path, *extra: str) -> dict[str, Any]:
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", READER_CHILD, reader, str(path), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _journal_with_a_long_line(path: Path, newline: bool) -> None:
    from durable_dispatch import Journal

    with Journal.open(path, sync="always") as j:
        for i in range(3):
            j.append({"event": "epoch", "epoch": i + 1, "ts": 0.0})
    with open(path, "r+b") as f:
        f.seek(0, 2)
        f.write(b'{"v":1,"crc":"00000000","seq":3,"d":2,"p":"')
        f.truncate(f.tell() + BIG)  # a sparse 100 MB line: costs no disk
        if newline:
            f.seek(0, 2)
            f.write(b'"}\n')


@pytest.mark.parametrize("newline", [False, True], ids=["no-newline", "newline"])
@pytest.mark.parametrize(
    "reader",
    [
        "open",
        "read_journal",
        "verify",
        "inspect",
        "view_state",
        "stats",
        "campaign",
        "compact --dry-run",
        "deferred list",
        "deferred requeue w0",
    ],
)
def test_every_reader_is_bounded_by_the_record_bound(
    tmp_path: Path, reader: str, newline: bool
) -> None:
    """Issue 13, example 6: a 100 MB line made verify quadratic, inspect hold it twice, and
    stats hang. Every reader now holds at most the record bound (1 MiB) and one block."""
    d = tmp_path / "st"
    reader, *extra = reader.split()
    if reader in ("view_state", "stats", "campaign", "compact", "deferred"):
        from durable_dispatch import CampaignState

        CampaignState.open(d, ranks=[1]).close()
        target = d
        _journal_with_a_long_line(d / "events.jsonl", newline)
    else:
        d.mkdir()
        target = d / "j.jsonl"
        _journal_with_a_long_line(target, newline)
    got = _run_reader(reader, target, *extra)
    assert got["grew_kb"] < 40 << 10, got  # far below the 100 MB line
    assert got["outcome"] in ("ok", "exit 0", "exit 1", "JournalCorruptError"), got


@pytest.mark.parametrize(
    "reader", ["open", "read_journal", "verify", "inspect", "snapshot", "campaign", "view_state"]
)
def test_no_reader_blocks_on_a_fifo(tmp_path: Path, reader: str) -> None:
    """Issue 13, example 6: a FIFO at a journal or snapshot path blocked every reader."""
    import os

    d = tmp_path / "st"
    d.mkdir()
    if reader in ("snapshot", "campaign", "view_state"):
        os.mkfifo(d / "campaign.000000000001.snap")
        target = d
    else:
        target = d / "j.jsonl"
        os.mkfifo(target)
    got = _run_reader(reader, target)
    assert got["outcome"] in ("StorageError", "SnapshotCorruptError", "exit 1", "exit 2"), got


@pytest.mark.parametrize("how", ["sparse", "dev-zero"])
def test_a_snapshot_is_read_within_bounds(tmp_path: Path, how: str) -> None:
    """Issue 13, example 6: a sparse 500 MB .snap cost 1 GB of memory in every command, and a
    .snap symlinked to /dev/zero read until MemoryError."""
    import os

    snap = tmp_path / "campaign.000000000001.snap"
    if how == "sparse":
        with open(snap, "wb") as f:
            f.truncate(500 << 20)
    else:
        os.symlink("/dev/zero", snap)
    got = _run_reader("snapshot", tmp_path)
    assert got["grew_kb"] < 40 << 10, got
    assert got["outcome"] in ("SnapshotCorruptError", "StorageError"), got
    inspected = _run_reader("verify", snap)
    assert inspected["grew_kb"] < 40 << 10 and inspected["outcome"] in ("exit 1", "exit 2")


def _framed(region: bytes) -> bytes:
    """A record line (without its newline) whose checksum holds over ``region`` as it is."""
    return b'{"v":1,"crc":"%08x",%s}' % (zlib.crc32(region, HDR.seed), region)


def _damaged(line: bytes, how: int, at: int, b: int) -> bytes:
    """``line`` with one kind of damage at ``at`` (a bit flip, a byte set, a cut, an insertion)."""
    at %= len(line)
    if how == 0:
        return line[:at] + bytes([line[at] ^ (1 << (b % 8))]) + line[at + 1 :]
    if how == 1:
        return line[:at] + bytes([b]) + line[at + 1 :]
    if how == 2:
        return line[:at]
    return line[:at] + bytes([b]) + line[at:]


@settings(max_examples=examples(400), deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 10**12),
            st.integers(-1, 10**12),
            st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")),
            st.one_of(  # (intact more often than not, so whole blocks pass too)
                st.none(),
                st.none(),
                st.none(),
                st.tuples(st.integers(0, 3), st.integers(0, 200), st.integers(0, 255)),
            ),
            st.sampled_from(["", "", "", "upper", "d", "seq0", "v"]),
        ),
        max_size=6,
    )
)
def test_the_bulk_check_accepts_exactly_the_lines_verify_record_accepts(rows: list[Any]) -> None:
    """The replay's fast path (one pattern over a block of lines) accepts a block only when every
    line is one :func:`verify_record` accepts, and reads the same sequence numbers and payloads:
    the fast path is never the more lenient one (a ``d`` that is not a number, say)."""
    lines = []
    for seq, d, payload, damage, form in rows:
        line = frame_record(HDR.seed, seq, d, payload)[:-1]
        if form == "upper":  # the stored checksum in capitals: not the canonical digits
            line = line[:14] + line[14:22].upper() + line[22:]
        elif form == "d":  # a checksum that holds over a durable mark that is not a number
            line = _framed(b'"seq":%d,"d":x%d,"p":%s' % (seq, d, payload))
        elif form == "seq0":  # a leading zero: still digits, accepted by both
            line = _framed(b'"seq":0%d,"d":%d,"p":%s' % (seq, d, payload))
        elif form == "v":
            line = line.replace(b'{"v":1,', b'{"v":2,', 1)
        if damage is not None:
            line = _damaged(line, *damage).replace(b"\n", b"")
        lines.append(line)
    expected: list[tuple[int, bytes]] | None = []
    for line in lines:
        try:
            r = verify_record(line + b"\n", HDR.seed)
        except ValueError:
            r = "another version"
        if isinstance(r, str):
            expected = None
            break
        assert expected is not None
        expected.append((r[0], r[2]))
    got = bulk_check(lines, HDR.seed)
    event("accepted" if got is not None else "refused")
    if expected is None or not lines:
        assert got is None
    else:
        assert got is not None and list(zip(*got, strict=True)) == expected
