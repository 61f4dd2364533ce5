"""Reading a journal file's lines and scanning it: the one line reader (bounded), the verifying
scan that classifies damage for recovery, and the fast chunked reader for replay.

:func:`read_lines` yields whole lines and the spans it could not (torn, oversized, short) as
values; :func:`scan` verifies a whole file with the framing of :mod:`.format` and returns what
it found (:class:`ScanResult`: damage as offsets and reasons, never an exception), so that each
recovery mode decides what to do (:mod:`.recovery`); :func:`read_chunks` checks and decodes
blocks of records with C-level bulk operations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, BinaryIO, NamedTuple

import orjson

from .format import (
    Header,
    _durable_mark,
    bulk_check,
    checked_record,
    line_offsets,
    parse_header,
    parse_record,
    verify_record,
)

#: Why a line was not held in memory.
OVERSIZED = "record longer than the size bound"
TORN = "torn record (no newline)"
SHORTER = "file shorter than when reading started"


class Gap(NamedTuple):
    """A span :func:`read_lines` could not yield as whole lines."""

    offset: int
    length: int
    #: :data:`OVERSIZED`, :data:`TORN` or :data:`SHORTER`.
    reason: str
    #: The bytes of a torn last line (always shorter than the bound); empty otherwise.
    data: bytes = b""


class Lines(NamedTuple):
    """Whole consecutive lines, without their newlines, the first at ``offset``."""

    offset: int
    lines: list[bytes]


def read_lines(
    f: BinaryIO, start: int, end: int, max_line: int, chunk_size: int = 1 << 16
) -> Iterator[Lines | Gap]:
    """The one line reader (bounded in memory): bytes ``[start, end)`` of ``f`` as
    :class:`Lines` blocks and :class:`Gap` spans, in file order.

    ``end`` is the size the caller measured when it started: nothing after it is read, however
    the file grows. Linear in ``end - start``: large chunks, split in C, each byte copied a
    bounded number of times. Memory is bounded by ``chunk_size + max_line``: a line whose length
    (without its newline) reaches ``max_line`` is never held, only skipped to its newline and
    yielded as an :data:`OVERSIZED` gap. Bytes after the last newline are a :data:`TORN` gap, and
    a file that ends before ``end`` a :data:`SHORTER` one.
    """
    f.seek(start)
    pos = start  # offset of the first byte not yet yielded
    base = start  # offset of the next block
    parts: list[bytes] = []  # a partial line from pos on, shorter than max_line
    held = 0
    skipping: int | None = None  # an oversized line began here
    left = end - start
    while left > 0:
        block = f.read(min(chunk_size, left))
        if not block:
            break
        left -= len(block)
        bstart, base = base, base + len(block)
        i = 0
        if skipping is not None:
            nl = block.find(b"\n")
            if nl < 0:
                continue
            yield Gap(skipping, bstart + nl + 1 - skipping, OVERSIZED)
            skipping, i = None, nl + 1
            pos = bstart + i
        cut = block.rfind(b"\n", i) + 1
        if cut == 0:
            held += len(block) - i
            if held >= max_line:
                skipping, parts, held = pos, [], 0
            else:
                parts.append(block[i:] if i else block)
            continue
        head = block[i : cut - 1]
        data = b"".join([*parts, head]) if parts else head
        lines = data.split(b"\n")
        if max(map(len, lines)) >= max_line:
            yield from _runs(pos, lines, max_line)
        else:
            yield Lines(pos, lines)
        pos = bstart + cut
        held = len(block) - cut
        parts = [block[cut:]] if held else []
        if held >= max_line:
            skipping, parts, held = pos, [], 0
    if skipping is not None:
        yield Gap(skipping, base - skipping, OVERSIZED if left <= 0 else SHORTER)
    elif parts:
        yield Gap(pos, held, TORN if left <= 0 else SHORTER, b"".join(parts))
    elif left > 0:
        yield Gap(base, 0, SHORTER)


def _runs(pos: int, lines: list[bytes], max_line: int) -> Iterator[Lines | Gap]:
    """Split a block of lines around the ones that reach ``max_line``."""
    run: list[bytes] = []
    run_at = off = pos
    for line in lines:
        n = len(line) + 1
        if len(line) >= max_line:
            if run:
                yield Lines(run_at, run)
                run = []
            yield Gap(off, n, OVERSIZED)
        else:
            if not run:
                run_at = off
            run.append(line)
        off += n
    if run:
        yield Lines(run_at, run)


class RawBatch(NamedTuple):
    """Verified records of consecutive journal lines (see :meth:`Journal.raw_batches`)."""

    #: File offset of each record's line.
    offsets: list[int]
    #: Sequence number of each record.
    seqs: list[int]
    #: Payload JSON bytes of each record, exactly as stored.
    payloads: list[bytes]


@dataclass(frozen=True)
class Damage:
    """One damaged span of a journal file."""

    offset: int
    length: int
    reason: str
    seq: int | None = None


@dataclass
class ScanResult:
    """Everything one verifying pass over a journal file learned.

    ``end`` is the offset just after the last good record of the valid prefix (where appending
    may resume after a torn tail is cut). ``records`` counts intact records, ``next_seq`` is the
    sequence number the next append takes, and ``damage`` lists every damaged span in order.
    """

    header: Header | None
    size: int
    end: int = 0
    records: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    next_seq: int = 0
    damage: list[Damage] = field(default_factory=list)
    #: True when the first damage is a torn tail: no later record attests it was ever durable.
    tail_only: bool = True
    #: Number of intact records after the first damage (kept by skip-corrupted salvage).
    after_damage: int = 0
    holes: list[tuple[int, int]] = field(default_factory=list)
    header_len: int = 0
    #: Records and next sequence number of the valid prefix (before the first damage).
    prefix_records: int = 0
    prefix_next_seq: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    #: The ``ts`` member (seconds since the epoch) of the first and last record that has one.
    first_ts: float | None = None
    last_ts: float | None = None


def read_header(first: Lines | Gap) -> tuple[Header | str, int, Lines | None]:
    """The header from the first item :func:`read_lines` yielded for a file: ``(header or the
    reason it is damaged, its length, the rest of the first block's lines or None)``.

    Raises:
        ValueError: ``("version", v)`` for an intact header of another format version.
    """
    if isinstance(first, Gap):
        reason = first.reason if first.reason == OVERSIZED else parse_header(first.data)
        return reason, first.length, None
    line = first.lines[0] + b"\n"
    after = Lines(first.offset + len(line), first.lines[1:])
    return parse_header(line), len(line), after if after.lines else None


def scan(
    f: BinaryIO,
    size: int,
    max_line: int,
    *,
    count_kinds: bool = False,
    visit: Callable[[RawBatch], None] | None = None,
) -> ScanResult:
    """Verify a whole journal file and classify its damage (never raises for damage).

    ``visit``, if given, is called with each run of intact records of the valid prefix (before the
    first damage), in order, as a :class:`RawBatch`.

    Raises:
        ValueError: ``("version", v)`` when a line is of another format version.
    """
    if visit is not None and count_kinds:
        raise ValueError("visit and count_kinds do not go together")
    bound = max_line + 256
    items = read_lines(f, 0, size, bound)
    first = next(items, None)
    if first is None:
        return ScanResult(header=None, size=size)
    parsed, header_len, after = read_header(first)
    rest = chain([after] if after is not None else [], items)
    if isinstance(parsed, str):
        res = ScanResult(header=None, size=size)
        res.damage.append(Damage(0, header_len, parsed))
        # The header is fsynced before any record is appended (or together with them, before a
        # rewrite is renamed into place). So a damaged header is a torn, never-synced file unless
        # a later, well-framed line says some record had been made durable (its "d" mark).
        marks = (
            _durable_mark(line)
            for item in rest
            for line in (item.lines if isinstance(item, Lines) else [item.data])
            if line
        )
        res.tail_only = all(m is None or m < 0 for m in marks)
        return res
    hdr = parsed
    seed = hdr.seed
    allowed_holes = {a: b for a, b in hdr.holes}
    res = ScanResult(
        header=hdr,
        size=size,
        end=header_len,
        next_seq=hdr.first_seq,
        prefix_next_seq=hdr.first_seq,
        header_len=header_len,
    )
    expected = hdr.first_seq
    damaged_from: int | None = None  # first seq that the first damage may have held

    def damaged(off: int, n: int, reason: str, seq: int | None = None) -> None:
        nonlocal damaged_from
        res.damage.append(Damage(off, n, reason, seq))
        if damaged_from is None:
            damaged_from = expected

    def one(off: int, line: bytes, n: int) -> None:
        nonlocal expected
        r = (parse_record if count_kinds else verify_record)(line, seed)
        if isinstance(r, str):
            damaged(off, n, r)
            return
        seq, durable, payload = r
        if seq != expected and allowed_holes.get(expected) != seq - 1:
            if damaged_from is None or seq <= (res.last_seq if res.last_seq is not None else -1):
                damaged(off, n, f"sequence {seq}, expected {expected}", seq)
                return
            res.holes.append((expected, seq - 1))
        if damaged_from is not None:
            res.after_damage += 1
            if durable >= damaged_from:
                res.tail_only = False
        else:
            res.end = off + n
            res.prefix_records += 1
            res.prefix_next_seq = seq + 1
            if visit is not None:
                visit(RawBatch([off], [seq], [payload]))
        if res.first_seq is None:
            res.first_seq = seq
        res.last_seq = seq
        res.records += 1
        expected = seq + 1
        if count_kinds and type(payload) is dict:
            kind = payload.get("event", payload.get("kind"))
            if isinstance(kind, str):
                res.kinds[kind] = res.kinds.get(kind, 0) + 1
            ts = payload.get("ts")
            if isinstance(ts, (int, float)) and not isinstance(ts, bool):
                if res.first_ts is None:
                    res.first_ts = ts
                res.last_ts = ts

    def in_bulk(block: Lines) -> bool:
        """A block of intact, contiguous records of the valid prefix, checked with C-level bulk
        operations; False (nothing accepted) when any line needs the line-by-line path, which
        names the damage and allows recorded holes."""
        nonlocal expected
        lines = block.lines
        checked = bulk_check(lines, seed)
        if checked is None or checked[0] != list(range(expected, expected + len(lines))):
            return False
        seqs, payloads = checked
        if visit is not None:
            visit(RawBatch(line_offsets(block.offset, lines), seqs, payloads))
        if res.first_seq is None:
            res.first_seq = seqs[0]
        res.last_seq = seqs[-1]
        res.records += len(seqs)
        res.prefix_records += len(seqs)
        res.prefix_next_seq = expected = seqs[-1] + 1
        res.end = block.offset + sum(map(len, lines)) + len(lines)
        return True

    for item in rest:
        if isinstance(item, Gap):
            damaged(item.offset, item.length, item.reason)
        elif not (damaged_from is None and not count_kinds and in_bulk(item)):
            for off, line in zip(line_offsets(item.offset, item.lines), item.lines, strict=True):
                one(off, line + b"\n", len(line) + 1)
    res.next_seq = expected
    return res


class ReadDamage(Exception):
    """Internal: a record read back by :func:`read_chunks` failed its checks."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(offset, reason)
        self.offset = offset
        self.reason = reason


def read_chunks(
    f: BinaryIO,
    seed: int,
    start: int,
    end: int,
    from_seq: int = 0,
    holes: tuple[tuple[int, int], ...] = (),
    *,
    max_line: int,
    torn_tail_ok: bool = False,
    chunk_size: int = 1 << 16,
) -> Iterator[Iterable[tuple[int, Any]]]:
    """Yield, chunk by chunk, iterables of ``(seq, payload)`` for bytes ``[start, end)`` of ``f``.

    The fast path for replaying millions of records, over :func:`read_lines` (``max_line``
    bounds a line). It checks each block in a few C-level passes (:func:`.format.bulk_check`:
    one pattern over the block, ``zlib.crc32`` per line): every line's framing, every line's
    checksum, contiguous sequence numbers; then it decodes the block's payloads with one orjson
    call. A block that fails any bulk
    check is re-checked line by line, which names the first damaged offset (and allows the
    header's recorded holes). With ``torn_tail_ok`` a torn last line (a write in progress) ends
    the records quietly.

    Raises:
        ReadDamage: a line fails its checks, is longer than the bound, or the region does not
            end on a line boundary (unless ``torn_tail_ok``).
    """
    expected: int | None = None
    hole_after = {a - 1: b + 1 for a, b in holes}
    loads = orjson.loads
    for block in read_lines(f, start, end, max_line, chunk_size):
        if isinstance(block, Gap):
            if torn_tail_ok and block.reason == TORN:
                return
            raise ReadDamage(block.offset, block.reason)
        pos, lines = block
        n = len(lines)
        rows: Any = None
        checked = bulk_check(lines, seed)
        if checked is not None:
            seqs, payloads = checked
            first = seqs[0] if expected is None else expected
            if seqs == list(range(first, first + n)):
                try:
                    values = loads(b"[" + b",".join(payloads) + b"]")
                except orjson.JSONDecodeError:
                    values = None
                if values is not None and len(values) == n:
                    rows = zip(range(first, first + n), values, strict=True)
                    expected = first + n
                    if first < from_seq:
                        rows = (r for r in rows if r[0] >= from_seq)
        if rows is None:
            rows = []
            off = pos
            for line in lines:
                r = checked_record(line + b"\n", seed)
                if isinstance(r, str):
                    raise ReadDamage(off, r)
                seq = r[0]
                if expected is not None and seq != expected and hole_after.get(expected - 1) != seq:
                    raise ReadDamage(off, f"sequence {seq}, expected {expected}")
                expected = seq + 1
                try:
                    rows.append((seq, loads(r[2])))
                except orjson.JSONDecodeError:
                    raise ReadDamage(off, "payload is not JSON") from None
                off += len(line) + 1
            rows = [r for r in rows if r[0] >= from_seq]
        yield rows
