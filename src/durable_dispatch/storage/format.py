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
from itertools import accumulate, repeat
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


def iter_lines(f: BinaryIO, max_line: int, start: int = 0) -> Iterator[tuple[int, bytes, int]]:
    """Yield ``(offset, line, length)`` for each line of ``f``.

    A line longer than ``max_line`` is not held in memory: it is yielded as ``b""`` with its true
    length, so callers see it as damage without reading it whole.
    """
    offset = start
    readline = f.readline
    limit = max_line + 1
    while True:
        line = readline(limit)
        if not line:
            return
        n = len(line)
        if n == limit and not line.endswith(b"\n"):
            # Oversized: skip to the end of this line without keeping it.
            while True:
                more = readline(1 << 16)
                n += len(more)
                if not more or more.endswith(b"\n"):
                    break
            yield offset, b"", n
        else:
            yield offset, line, n
        offset += n


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
    lines = iter_lines(f, max_line + 256)
    first = next(lines, None)
    if first is None:
        return ScanResult(header=None, size=size)
    parsed = parse_header(first[1])
    if isinstance(parsed, str):
        res = ScanResult(header=None, size=size)
        res.damage.append(Damage(0, first[2], parsed))
        # The header is fsynced before any record is appended (or together with them, before a
        # rewrite is renamed into place). So a damaged header is a torn, never-synced file unless
        # a later, well-framed line says some record had been made durable (its "d" mark).
        marks = (_durable_mark(line) for _off, line, _n in lines if line)
        res.tail_only = all(m is None or m < 0 for m in marks)
        return res
    hdr = parsed
    seed = hdr.seed
    allowed_holes = {a: b for a, b in hdr.holes}
    res = ScanResult(
        header=hdr,
        size=size,
        end=first[2],
        next_seq=hdr.first_seq,
        prefix_next_seq=hdr.first_seq,
        header_len=first[2],
    )
    expected = hdr.first_seq
    damaged_from: int | None = None  # first seq that the first damage may have held

    def one(off: int, line: bytes, n: int) -> None:
        nonlocal expected, damaged_from
        r = (
            (parse_record if count_kinds else verify_record)(line, seed)
            if line
            else "record longer than the size bound"
        )
        if isinstance(r, str):
            res.damage.append(Damage(off, n, r))
            if damaged_from is None:
                damaged_from = expected
            return
        seq, durable, payload = r
        if seq != expected and allowed_holes.get(expected) != seq - 1:
            if damaged_from is None or seq <= (res.last_seq if res.last_seq is not None else -1):
                res.damage.append(Damage(off, n, f"sequence {seq}, expected {expected}", seq))
                if damaged_from is None:
                    damaged_from = expected
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

    def accept(seqs: list[int], end: int) -> None:
        """A run of intact, contiguous records of the valid prefix, ending at offset ``end``."""
        nonlocal expected
        if res.first_seq is None:
            res.first_seq = seqs[0]
        res.last_seq = seqs[-1]
        res.records += len(seqs)
        res.prefix_records += len(seqs)
        res.prefix_next_seq = expected = seqs[-1] + 1
        res.end = end

    def many(batch: list[tuple[int, bytes, int]]) -> None:
        """A batch of lines: verified in bulk while no damage was seen, else line by line."""
        if damaged_from is None and not count_kinds and batch:
            lines = [line for _o, line, _n in batch]
            checked = _bulk_check(lines, seed, 2)
            if checked is not None and checked[0] == list(range(expected, expected + len(lines))):
                seqs, commas = checked
                if visit is not None:
                    offs = [o for o, _l, _n in batch]
                    visit(RawBatch(offs, seqs, list(_payload_slices(lines, commas, 2))))
                off, _line, n = batch[-1]
                accept(seqs, off + n)
                return
        for item in batch:
            one(*item)

    def blocks(pos: int) -> int:
        """Verify whole blocks of lines in bulk while all is well; return the offset from which
        the line-by-line path goes on: the end of the file, a torn or oversized line, or a block
        that fails a bulk check (that path names the damage and allows recorded holes)."""
        try:
            for start, lines in line_blocks(f, pos, size, 1 << 16, max_line + 256):
                checked = _bulk_check(lines, seed, 1)
                if checked is None or checked[0] != list(range(expected, expected + len(lines))):
                    return start
                seqs, commas = checked
                if visit is not None:
                    payloads = list(_payload_slices(lines, commas, 1))
                    visit(RawBatch(line_offsets(start, lines), seqs, payloads))
                pos = start + sum(map(len, lines)) + len(lines)
                accept(seqs, pos)
        except ReadDamage as d:
            return d.offset
        return pos

    pos = first[2]
    if not count_kinds:
        pos = blocks(pos)
    f.seek(pos)
    batch: list[tuple[int, bytes, int]] = []
    for item in iter_lines(f, max_line + 256, pos):
        batch.append(item)
        if len(batch) >= 256:
            many(batch)
            batch = []
    many(batch)
    res.next_seq = expected
    return res


class ReadDamage(Exception):
    """Internal: a record read back by :func:`read_chunks` failed its checks."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(offset, reason)
        self.offset = offset
        self.reason = reason


def line_blocks(
    f: BinaryIO, start: int, end: int, chunk_size: int = 1 << 16, max_line: int | None = None
) -> Iterator[tuple[int, list[bytes]]]:
    """Yield ``(offset, lines)`` for bytes ``[start, end)`` of ``f``: blocks of consecutive whole
    lines, without their newlines, the first starting at ``offset``.

    Read in large chunks and split in C, with no per-line Python work: for a region that should
    hold whole records. Every whole line is yielded before a problem after it is raised, so
    ``ReadDamage.offset`` is where the lines stopped being whole.

    Raises:
        ReadDamage: the region does not end on a line boundary, the file is shorter, or a line
            (newline included) is ``max_line`` bytes or longer.
    """
    f.seek(start)
    pos = start
    left = end - start
    carry = b""
    while left > 0 or carry:
        block = f.read(min(chunk_size, left)) if left > 0 else b""
        left -= len(block)
        if not block and left > 0:
            raise ReadDamage(pos, "file shorter than expected")
        data = carry + block
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if left <= 0:
                raise ReadDamage(pos, "torn record (no newline)")
            if max_line is not None and len(data) >= max_line:
                raise ReadDamage(pos, "line longer than the size bound")
            carry = data
            continue
        lines = data[: cut - 1].split(b"\n")
        if max_line is not None and max(map(len, lines)) >= max_line:
            raise ReadDamage(pos, "line longer than the size bound")
        yield pos, lines
        pos += cut
        carry = data[cut:]
        if left <= 0 and carry:
            raise ReadDamage(pos, "torn record (no newline)")


def read_chunks(
    f: BinaryIO,
    seed: int,
    start: int,
    end: int,
    from_seq: int = 0,
    holes: tuple[tuple[int, int], ...] = (),
    chunk_size: int = 1 << 16,
) -> Iterator[Iterable[tuple[int, Any]]]:
    """Yield, chunk by chunk, iterables of ``(seq, payload)`` for bytes ``[start, end)`` of ``f``.

    The fast path for replaying millions of records. It reads large chunks and checks each chunk
    with C-level bulk operations (``map`` over slices, ``zlib.crc32`` and ``int``): every line's
    framing, every line's checksum, contiguous sequence numbers; then it decodes the chunk's lines
    with one orjson call. A chunk that fails any bulk check is re-checked line by line, which
    names the first damaged offset (and allows the header's recorded holes).

    Raises:
        ReadDamage: a line fails its checks, or the region does not end on a line boundary.
    """
    expected: int | None = None
    hole_after = {a - 1: b + 1 for a, b in holes}
    loads = orjson.loads
    for pos, lines in line_blocks(f, start, end, chunk_size):
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
