"""Journal line format: framing, checksums and a verifying scanner.

A journal file is JSON Lines. The first line is a header, every other line one record::

    {"v":1,"crc":"1a2b3c4d","h":{"journal":"<salt>","first_seq":0,"holes":[]}}
    {"v":1,"crc":"5e6f7a8b","seq":0,"d":-1,"p":{"event":"committed","work_id":"w-17"}}

* ``v`` is the format version; a reader refuses versions it does not know.
* ``seq`` is the record's sequence number; numbers are contiguous from ``first_seq`` (the
  header's ``holes`` lists spans a salvage removed on purpose).
* ``d`` is the highest sequence number known durable (covered by a successful fsync) when this
  line was written. A later line whose ``d`` covers a damaged record proves the damage is not a
  torn, never-synced tail but real corruption of durable data.
* ``crc`` is CRC-32, seeded with the CRC of the file's random salt, over the bytes that follow it
  up to the closing brace (``"seq":0,"d":-1,"p":{...}``), exactly as they stand in the line: a
  reader checks them without re-encoding anything, and a line spliced in from another journal file
  (another salt) fails. The payload is always the last member, so its raw bytes are the slice
  between ``,"p":`` and the closing brace.

Scanning never trusts a line it has not verified, bounds the length of a line it will hold in
memory, and returns damage as values (offset, length, reason) so that each recovery mode can
decide what to do.
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate, chain, repeat
from operator import add, getitem, itemgetter
from typing import Any, BinaryIO, NamedTuple

import orjson

FORMAT_VERSION = 1
_P_MARK = b',"p":'
_H_MARK = b',"h":'
_RECORD_KEYS = frozenset(("v", "seq", "d", "crc", "p"))
_HEADER_KEYS = frozenset(("v", "crc", "h"))


def new_salt() -> str:
    """A fresh random salt for a new journal file."""
    return secrets.token_hex(8)


def salt_crc(salt: str) -> int:
    """The CRC seed derived from a file's salt."""
    return zlib.crc32(salt.encode("ascii"))


def record_crc(seed: int, seq: int, durable: int, payload: bytes) -> int:
    """CRC of one record as stored in its ``crc`` member."""
    return zlib.crc32(b'"seq":%d,"d":%d,"p":%s' % (seq, durable, payload), seed)


def frame_record(seed: int, seq: int, durable: int, payload: bytes) -> bytes:
    """One whole record line, newline included."""
    region = b'"seq":%d,"d":%d,"p":%s' % (seq, durable, payload)
    return b'{"v":1,"crc":"%08x",%s}\n' % (zlib.crc32(region, seed), region)


@dataclass(frozen=True)
class Header:
    """A journal file's header line."""

    salt: str
    first_seq: int
    holes: tuple[tuple[int, int], ...] = ()

    @property
    def seed(self) -> int:
        """CRC seed for this file's records."""
        return salt_crc(self.salt)

    def frame(self) -> bytes:
        """The header line, newline included."""
        body = orjson.dumps(
            {
                "journal": self.salt,
                "first_seq": self.first_seq,
                "holes": [list(h) for h in self.holes],
            }
        )
        return b'{"v":1,"crc":"%08x","h":%s}\n' % (zlib.crc32(body), body)


def parse_header(line: bytes) -> Header | str:
    """Parse and verify a header line; returns the reason string when it is damaged.

    Raises:
        ValueError: with ``("version", v)`` args when the line is intact but of another version.
    """
    if not line.endswith(b"\n"):
        return "torn header (no newline)"
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return "header is not JSON"
    if not isinstance(obj, dict) or set(obj) != _HEADER_KEYS:
        if isinstance(obj, dict) and obj.get("v") not in (None, FORMAT_VERSION):
            raise ValueError("version", obj.get("v"))
        return "header has wrong members"
    if obj["v"] != FORMAT_VERSION:
        raise ValueError("version", obj["v"])
    i = line.find(_H_MARK)
    body = line[i + len(_H_MARK) : -2]
    if not isinstance(obj["crc"], str) or obj["crc"] != f"{zlib.crc32(body):08x}":
        return "header checksum mismatch"
    h = obj["h"]
    try:
        holes = tuple((int(a), int(b)) for a, b in h.get("holes", ()))
        hdr = Header(str(h["journal"]), int(h["first_seq"]), holes)
    except (KeyError, TypeError, ValueError, AttributeError):
        return "header fields invalid"
    return hdr


_PREFIX = b'{"v":1,"crc":"'  # 14 bytes, then 8 hex digits
_SEQ_MARK = b'","seq":'  # at [22:30]
_HEX = b"0123456789abcdef"
_cut_at: Any = getitem  # bytes[slice] -> bytes; typeshed's map() cannot say so


def verify_record(line: bytes, seed: int) -> tuple[int, int, bytes] | str:
    """Verify one record line without decoding its payload.

    The fast path reads the fixed-format framing written by :func:`frame_record`; anything else
    takes a slow path that decodes the line as JSON to name the damage precisely.

    Returns:
        ``(seq, durable_mark, payload_bytes)`` when the line is intact, else the reason it is not.

    Raises:
        ValueError: with ``("version", v)`` args for an intact line of another format version.
    """
    if line[:14] == _PREFIX and line[22:30] == _SEQ_MARK and line[-2:] == b"}\n":
        region = line[24:-2]
        # Compare the canonical lowercase hex bytes: "ED5E0331" or " d5e0331" are not ours.
        if line[14:22] == b"%08x" % zlib.crc32(region, seed):
            c1 = region.find(b",", 6)
            c2 = region.find(b",", c1 + 5)
            seq_b, d_b = region[6:c1], region[c1 + 5 : c2]
            if (
                region[c1 : c1 + 5] == b',"d":'
                and region[c2 : c2 + 5] == b',"p":'
                and seq_b.isdigit()
                and (d_b.isdigit() or (d_b[:1] == b"-" and d_b[1:].isdigit()))
            ):
                return int(seq_b), int(d_b), region[c2 + 5 :]
    return _verify_slow(line, seed)


def _bulk_check(lines: list[bytes], seed: int, tail: int) -> tuple[list[int], list[int]] | None:
    """``(seqs, comma positions)`` of ``lines`` if every one is an intact record in canonical
    framing, checked with C-level bulk operations (``map`` over slices, ``zlib.crc32``, ``int``);
    None if any line is not, so the caller can check line by line and name the damage.

    ``tail`` is 2 for lines that keep their newline, 1 for lines split without it.
    """
    n = len(lines)
    end = b"}\n" if tail == 2 else b"}"
    if not (
        all(map(bytes.startswith, lines, repeat(_PREFIX, n)))
        and all(map(bytes.endswith, lines, repeat(end, n)))
        and list(map(itemgetter(slice(22, 30)), lines)) == [_SEQ_MARK] * n
    ):
        return None
    try:
        hexes = list(map(itemgetter(slice(14, 22)), lines))
        if b"".join(hexes).translate(None, _HEX):  # only canonical lowercase hex digits
            return None
        stored = list(map(int, hexes, repeat(16, n)))
        regions = map(itemgetter(slice(24, -tail)), lines)
        if stored != list(map(zlib.crc32, regions, repeat(seed, n))):
            return None
        commas = list(map(bytes.find, lines, repeat(b",", n), repeat(30, n)))
        return list(map(int, map(_cut_at, lines, map(slice, repeat(30, n), commas)))), commas
    except ValueError:
        return None


def _payload_slices(lines: list[bytes], commas: list[int], tail: int) -> Iterator[bytes]:
    """The raw payload bytes of checked lines (see :func:`_bulk_check`), sliced in C."""
    n = len(lines)
    starts = map(bytes.find, lines, repeat(b',"p":', n), commas)
    return map(_cut_at, lines, map(slice, map(add, starts, repeat(5, n)), repeat(-tail, n)))


def line_offsets(start: int, lines: list[bytes]) -> list[int]:
    """The offset of each of ``lines`` (split without their newlines) when the first is at
    ``start``: C-level running sums."""
    return list(accumulate(map(add, map(len, lines[:-1]), repeat(1)), initial=start))


def _durable_mark(line: bytes) -> int | None:
    """The ``d`` mark of a well-framed record line, without verifying it (None if not framed)."""
    if line[:14] != _PREFIX or line[22:30] != _SEQ_MARK:
        return None
    region = line[24:]
    c1 = region.find(b',"d":')
    c2 = region.find(b",", c1 + 5)
    try:
        return int(region[c1 + 5 : c2]) if c1 > 0 and c2 > 0 else None
    except ValueError:
        return None


def checked_record(line: bytes, seed: int) -> tuple[int, int, bytes] | str:
    """Like :func:`verify_record`, for readers of a file whose header already fixed the version:
    a record line of another version is damage (a reason string), not an exception."""
    try:
        return verify_record(line, seed)
    except ValueError as e:
        return f"record of unsupported format version {e.args[1]!r}"


def parse_record(line: bytes, seed: int) -> tuple[int, int, Any] | str:
    """Like :func:`verify_record` but returns the decoded payload."""
    r = verify_record(line, seed)
    if isinstance(r, str):
        return r
    try:
        return r[0], r[1], orjson.loads(r[2])
    except orjson.JSONDecodeError:
        return "payload is not JSON"


def _verify_slow(line: bytes, seed: int) -> tuple[int, int, bytes] | str:
    if not line.endswith(b"\n"):
        return "torn record (no newline)"
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        if not line.strip():
            return "blank line"
        if not line.strip(b"\x00\n"):
            return "zero-filled bytes"
        return "not JSON"
    if type(obj) is not dict:
        return "not a record object"
    if obj.get("v") not in (None, FORMAT_VERSION):
        raise ValueError("version", obj.get("v"))
    if obj.keys() != _RECORD_KEYS:
        return "not a record object"
    if type(obj["seq"]) is not int or type(obj["d"]) is not int:
        return "sequence fields invalid"
    # Intact JSON with the right members but not in the canonical framing: the checksum was
    # computed over canonical bytes, so verify against those.
    payload = payload_of(line)
    crc = obj["crc"]
    if not isinstance(crc, str) or crc != f"{record_crc(seed, obj['seq'], obj['d'], payload):08x}":
        return "checksum mismatch"
    # The checksum covers the canonical bytes; a line that is not byte-canonical is not ours.
    if frame_record(seed, obj["seq"], obj["d"], payload) != line:
        return "record is not in canonical form"
    return obj["seq"], obj["d"], payload


def payload_of(line: bytes) -> bytes:
    """The raw payload bytes of a framed record line."""
    return line[line.find(_P_MARK, 30) + 5 : -2]


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
    """The one line reader (S10): bytes ``[start, end)`` of ``f`` as :class:`Lines` blocks and
    :class:`Gap` spans, in file order.

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
        checked = _bulk_check(lines, seed, 1)
        if checked is None or checked[0] != list(range(expected, expected + len(lines))):
            return False
        seqs, commas = checked
        if visit is not None:
            payloads = list(_payload_slices(lines, commas, 1))
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
    bounds a line). It checks each block with C-level bulk operations (``map`` over slices,
    ``zlib.crc32`` and ``int``): every line's framing, every line's checksum, contiguous sequence
    numbers; then it decodes the block's lines with one orjson call. A block that fails any bulk
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
        checked = _bulk_check(lines, seed, 1)
        if checked is not None:
            seqs, commas = checked
            first = seqs[0] if expected is None else expected
            if seqs == list(range(first, first + n)):
                try:
                    values = loads(b"[" + b",".join(_payload_slices(lines, commas, 1)) + b"]")
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
