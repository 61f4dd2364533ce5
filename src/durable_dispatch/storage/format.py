"""Journal line format: the framing of a header and a record, and their checksums.

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

Reading the lines back and scanning a file for damage is :mod:`.scan`'s job.
"""

from __future__ import annotations

import re
import secrets
import zlib
from binascii import hexlify
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add
from struct import pack as _pack
from typing import Any

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


#: A record line (without its newline) in the canonical framing :func:`frame_record` writes,
#: as one pattern for a whole block of lines (``re.M``): the checksum's hex digits, the region it
#: covers, the sequence number and the payload. The same lines :func:`verify_record` accepts.
_RECORD_LINE = re.compile(
    rb'^\{"v":1,"crc":"([0-9a-f]{8})",("seq":([0-9]+),"d":-?[0-9]+,"p":(.*))\}$', re.M
)


def bulk_check(lines: list[bytes], seed: int) -> tuple[list[int], list[bytes]] | None:
    """``(seqs, payload bytes)`` of ``lines`` (split without their newlines) if every one is an
    intact record in the canonical framing; None if any line is not, so that the caller checks
    line by line and names the damage.

    A few C-level passes over the block: one regular expression finds every line's framing and
    parts (a line it does not match leaves fewer matches than lines), ``zlib.crc32`` checks each
    covered region, and all the stored checksums are compared at once as hex digits.
    """
    n = len(lines)
    found = _RECORD_LINE.findall(b"\n".join(lines))
    if not n or len(found) != n:
        return None
    hexes, regions, seqs, payloads = zip(*found, strict=True)
    crcs = _pack(f">{n}I", *map(zlib.crc32, regions, repeat(seed, n)))
    if hexlify(crcs) != b"".join(hexes):
        return None
    return list(map(int, seqs)), list(payloads)


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
