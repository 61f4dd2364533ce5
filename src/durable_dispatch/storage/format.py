"""Journal line format: framing, checksums and a verifying scanner.

A journal file is JSON Lines. The first line is a header, every other line one record::

    {"v":1,"crc":"1a2b3c4d","h":{"journal":"<salt>","first_seq":0,"holes":[]}}
    {"v":1,"seq":0,"d":-1,"crc":"5e6f7a8b","p":{"event":"committed","work_id":"w-17"}}

* ``v`` is the format version; a reader refuses versions it does not know.
* ``seq`` is the record's sequence number; numbers are contiguous from ``first_seq`` (the
  header's ``holes`` lists spans a salvage removed on purpose).
* ``d`` is the highest sequence number known durable (covered by a successful fsync) when this
  line was written. A later line whose ``d`` covers a damaged record proves the damage is not a
  torn, never-synced tail but real corruption of durable data.
* ``crc`` is CRC-32 over ``"<seq>:<d>:"`` and then the payload's raw bytes, seeded with the CRC of
  the file's random salt. The payload is always the last member, so its bytes are the slice
  between ``,"p":`` and the closing brace: a reader checks them without re-encoding anything, and a
  line spliced in from another journal file (another salt) fails.

Scanning never trusts a line it has not verified, bounds the length of a line it will hold in
memory, and returns damage as values (offset, length, reason) so that each recovery mode can
decide what to do.
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

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
    return zlib.crc32(payload, zlib.crc32(b"%d:%d:" % (seq, durable), seed))


def frame_record(seed: int, seq: int, durable: int, payload: bytes) -> bytes:
    """One whole record line, newline included."""
    crc = record_crc(seed, seq, durable, payload)
    return b'{"v":1,"seq":%d,"d":%d,"crc":"%08x","p":%s}\n' % (seq, durable, crc, payload)


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
            {"journal": self.salt, "first_seq": self.first_seq, "holes": [list(h) for h in self.holes]}
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
    if not isinstance(obj["crc"], str) or obj["crc"] != "%08x" % zlib.crc32(body):
        return "header checksum mismatch"
    h = obj["h"]
    try:
        holes = tuple((int(a), int(b)) for a, b in h.get("holes", ()))
        hdr = Header(str(h["journal"]), int(h["first_seq"]), holes)
    except (KeyError, TypeError, ValueError, AttributeError):
        return "header fields invalid"
    return hdr


def parse_record(line: bytes, seed: int) -> tuple[int, int, Any] | str:
    """Parse and verify one record line.

    Returns:
        ``(seq, durable_mark, payload)`` when the line is intact, else the reason it is not.

    Raises:
        ValueError: with ``("version", v)`` args for an intact line of another format version.
    """
    if not line.endswith(b"\n"):
        return "torn record (no newline)"
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        if not line.strip(b"\x00\n"):
            return "zero-filled bytes"
        return "not JSON"
    if type(obj) is not dict or obj.keys() != _RECORD_KEYS:
        if type(obj) is dict and obj.get("v") not in (None, FORMAT_VERSION):
            raise ValueError("version", obj.get("v"))
        return "not a record object"
    seq = obj["seq"]
    durable = obj["d"]
    if obj["v"] != FORMAT_VERSION:
        raise ValueError("version", obj["v"])
    if type(seq) is not int or type(durable) is not int:
        return "sequence fields invalid"
    i = line.find(_P_MARK)
    payload = line[i + 5 : -2]
    if obj["crc"] != "%08x" % zlib.crc32(payload, zlib.crc32(b"%d:%d:" % (seq, durable), seed)):
        return "checksum mismatch"
    return seq, durable, obj["p"]


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


def scan(
    f: BinaryIO,
    size: int,
    max_line: int,
    *,
    count_kinds: bool = False,
) -> ScanResult:
    """Verify a whole journal file and classify its damage (never raises for damage).

    Raises:
        ValueError: ``("version", v)`` when a line is of another format version.
    """
    lines = iter_lines(f, max_line + 256)
    first = next(lines, None)
    if first is None:
        return ScanResult(header=None, size=size)
    parsed = parse_header(first[1])
    if isinstance(parsed, str):
        res = ScanResult(header=None, size=size)
        res.damage.append(Damage(0, first[2], parsed))
        # Any further line means this is more than a torn header.
        res.tail_only = next(lines, None) is None
        return res
    hdr = parsed
    seed = hdr.seed
    allowed_holes = {a: b for a, b in hdr.holes}
    res = ScanResult(
        header=hdr, size=size, end=first[2], next_seq=hdr.first_seq, prefix_next_seq=hdr.first_seq,
        header_len=first[2],
    )
    expected = hdr.first_seq
    damaged_from: int | None = None  # first seq that the first damage may have held
    for off, line, n in lines:
        r = parse_record(line, seed) if line else "record longer than the size bound"
        if isinstance(r, str):
            res.damage.append(Damage(off, n, r))
            if damaged_from is None:
                damaged_from = expected
            continue
        seq, durable, payload = r
        if seq != expected and allowed_holes.get(expected) != seq - 1:
            if damaged_from is None or seq <= (res.last_seq if res.last_seq is not None else -1):
                res.damage.append(Damage(off, n, f"sequence {seq}, expected {expected}", seq))
                if damaged_from is None:
                    damaged_from = expected
                continue
            res.holes.append((expected, seq - 1))
        if damaged_from is not None:
            res.after_damage += 1
            if durable >= damaged_from:
                res.tail_only = False
        else:
            res.end = off + n
            res.prefix_records += 1
            res.prefix_next_seq = seq + 1
        if res.first_seq is None:
            res.first_seq = seq
        res.last_seq = seq
        res.records += 1
        expected = seq + 1
        if count_kinds and type(payload) is dict:
            kind = payload.get("event", payload.get("kind"))
            if isinstance(kind, str):
                res.kinds[kind] = res.kinds.get(kind, 0) + 1
    res.next_seq = expected
    return res
