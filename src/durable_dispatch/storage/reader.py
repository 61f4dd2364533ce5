"""Reading a journal file back, verified: the one reader of its records.

Every read of a journal's records goes through :class:`FileView`, a consistent view of the file
taken under the journal's locks (where the records start and end, the salt's seed, the holes its
header records, a line's bound), or through :func:`read_journal` for a reader beside a running
writer. All of them stand on :func:`~.format.read_lines` (the one line reader, bounded) and check
the same **sequence rule** (:func:`follows`): a record's number is the one after the record
before it, or the first number after a hole its header records; the first record read may have
any number. A salvage (``skip-corrupted``) alone skips damaged records, and the holes it leaves
are written into the new file's header, so the rewritten file follows the rule again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, BinaryIO

import orjson

from ..errors import JournalCorruptError, JournalVersionError, StorageError, UsageError
from . import fs
from .format import bulk_check, checked_record, line_offsets, payload_of
from .health import Record
from .scan import Gap, RawBatch, ReadDamage, read_chunks, read_header, read_lines

__all__ = ["FileView", "follows", "read_journal"]

_record = tuple.__new__


def follows(seq: int, last: int | None, holes: dict[int, int]) -> bool:
    """The sequence rule: ``seq`` may come after the record numbered ``last`` (None: the first
    record read) when it is the next number, or the first after a recorded hole (``holes`` maps
    a hole's first number to its last)."""
    if last is None:
        return True
    return seq == last + 1 or holes.get(last + 1) == seq - 1


def damage(path: str, offset: int, reason: str) -> JournalCorruptError:
    """The typed error for a record that fails its checks at ``offset``."""
    return JournalCorruptError(
        f"journal damaged at offset {offset}: {reason}", path=path, offset=offset, reason=reason
    )


@dataclass(frozen=True, slots=True)
class FileView:
    """The records of a journal file in bytes ``[start, end)`` (see the module docs)."""

    path: str
    start: int  # just after the header
    end: int
    seed: int
    max_line: int  # a line's bound, framing included
    holes: tuple[tuple[int, int], ...] = ()

    def raw_batches(self, f: BinaryIO | None) -> Iterator[RawBatch]:
        """Every record, verified but not decoded, in batches of consecutive lines (``f`` is
        closed at the end)."""
        if f is None:
            return
        last: int | None = None
        with f:
            for block in read_lines(f, self.start, self.end, self.max_line):
                if isinstance(block, Gap):
                    raise damage(self.path, block.offset, block.reason)
                batch = self._verified(line_offsets(block.offset, block.lines), block.lines)
                last = self._in_order(batch, last)
                yield batch

    def raw_at(self, f: BinaryIO | None, offsets: Iterable[int]) -> Iterator[RawBatch]:
        """Re-read and verify, in batches, the records that start at ``offsets`` (ascending):
        one sequential pass of :func:`read_lines` from the first offset."""
        wanted = iter(offsets)
        last = -1

        def next_offset() -> int | None:
            nonlocal last
            off = next(wanted, None)
            if off is None:
                return None
            if f is None or off <= last or off < self.start or off >= self.end:
                raise UsageError(f"{off} is not a record offset in ascending order")
            last = off
            return off

        try:
            nxt = next_offset()
            if nxt is None or f is None:
                return
            offs: list[int] = []
            lines: list[bytes] = []
            for block in read_lines(f, nxt, self.end, self.max_line):
                if isinstance(block, Gap):
                    if block.offset <= nxt < block.offset + max(block.length, 1):
                        raise damage(self.path, nxt, block.reason)
                    continue
                pos = block.offset
                for line in block.lines:
                    if nxt is not None and nxt < pos:
                        raise damage(self.path, nxt, "no record starts at this offset")
                    if pos == nxt:
                        offs.append(pos)
                        lines.append(line)
                        nxt = next_offset()
                    pos += len(line) + 1
                if len(offs) >= 1024 or (nxt is None and offs):
                    yield self._verified(offs, lines)
                    offs, lines = [], []
                if nxt is None:
                    return
            if offs:
                yield self._verified(offs, lines)
            if nxt is not None:
                raise damage(self.path, nxt, "no record starts at this offset")
        finally:
            if f is not None:
                f.close()

    def records(
        self, f: BinaryIO | None, tail: list[tuple[int, bytes]], from_seq: int
    ) -> Iterator[Record]:
        """The decoded records with ``seq >= from_seq``: the file's, then ``tail`` (records not
        in the file yet, as ``(seq, line)``)."""
        parts: list[Iterable[Record]] = []
        if f is not None:
            parts.append(chain.from_iterable(map(_as_records, self._chunks(f, from_seq))))
        parts.append(
            Record(seq, orjson.loads(payload_of(line))) for seq, line in tail if seq >= from_seq
        )
        return chain.from_iterable(parts)

    def intact_lines(self, *, strict: bool) -> Iterator[tuple[int, int, bytes]]:
        """``(seq, durable_mark, payload_bytes)`` of the records, read from the path.

        With ``strict`` a damaged record, or one out of order, raises
        :class:`JournalCorruptError` (it was durable and must not be dropped silently); without
        it they are skipped (a salvage, which records the holes it leaves)."""
        holes = dict(self.holes)
        with fs.open_read(self.path) as f:
            last: int | None = None
            for item in read_lines(f, self.start, self.end, self.max_line):
                found: Iterable[tuple[int, bytes | str]] = (
                    [(item.offset, item.reason)]
                    if isinstance(item, Gap)
                    else zip(
                        line_offsets(item.offset, item.lines),
                        [x + b"\n" for x in item.lines],
                        strict=True,
                    )
                )
                for off, got in found:
                    r = got if isinstance(got, str) else checked_record(got, self.seed)
                    if not isinstance(r, str) and not follows(r[0], last, holes):
                        if strict or r[0] <= (last if last is not None else -1):
                            r = f"sequence {r[0]} after {last}"  # a spliced or replayed span
                    if isinstance(r, str):
                        if strict:
                            raise JournalCorruptError(
                                f"durable record damaged at offset {off}: {r}",
                                path=self.path,
                                offset=off,
                                reason=r,
                            )
                        continue
                    last = r[0]
                    yield r

    def _chunks(self, f: BinaryIO, from_seq: int) -> Iterator[Iterable[tuple[int, Any]]]:
        with f:
            try:
                yield from read_chunks(
                    f,
                    self.seed,
                    self.start,
                    self.end,
                    from_seq,
                    self.holes,
                    max_line=self.max_line,
                )
            except ReadDamage as d:
                raise damage(self.path, d.offset, d.reason) from None

    def _verified(self, offsets: list[int], lines: list[bytes]) -> RawBatch:
        """Verify lines (split without their newline) in bulk; line by line, naming the
        damage, only if that fails."""
        checked = bulk_check(lines, self.seed)
        if checked is not None:
            return RawBatch(offsets, *checked)
        rows = [self._checked(o, line + b"\n") for o, line in zip(offsets, lines, strict=True)]
        return RawBatch(offsets, [r[0] for r in rows], [r[1] for r in rows])

    def _checked(self, off: int, line: bytes) -> tuple[int, bytes]:
        r = checked_record(line, self.seed) if line else "oversized record"
        if isinstance(r, str):
            raise damage(self.path, off, r)
        return r[0], r[2]

    def _in_order(self, batch: RawBatch, last: int | None) -> int | None:
        """The sequence rule over a batch of consecutive records; the batch's last number."""
        holes = dict(self.holes)
        for off, seq in zip(batch.offsets, batch.seqs, strict=True):
            if not follows(seq, last, holes):
                raise damage(self.path, off, f"sequence {seq} after {last}")
            last = seq
        return last


def read_journal(
    path: str | os.PathLike[str], from_seq: int = 0, *, max_record_bytes: int = 1 << 20
) -> Iterator[Record]:
    """Stream the intact records of a journal file without locking or changing it.

    For readers beside a running writer (``stats``, ``deferred list``) or of files one must not
    repair: a torn last line (a write in progress, or a crash) is not returned; damage before it
    raises.

    Raises:
        JournalCorruptError: the header or a record before the tail is damaged.
        JournalVersionError: another format version.
        OSError: the file cannot be read.
    """
    p = os.fspath(path)
    try:
        f = fs.open_read(p)
    except StorageError:
        raise
    except OSError as e:
        raise StorageError(
            f"cannot read journal: {e.strerror or e}", path=p, op="read", errno=e.errno
        ) from e
    return _read_journal(f, p, from_seq, max_record_bytes + 256)


def _read_journal(f: Any, p: str, from_seq: int, bound: int) -> Iterator[Record]:
    with f:
        size = os.fstat(f.fileno()).st_size  # what is appended from now on is not read
        first = next(read_lines(f, 0, size, bound, 4096), None)
        if first is None:
            return
        try:
            hdr, header_len, _rest = read_header(first)
        except ValueError as e:
            raise JournalVersionError(
                f"journal format version {e.args[1]!r} is not supported",
                path=p,
                reason="unsupported version",
            ) from None
        if isinstance(hdr, str):
            raise JournalCorruptError(
                f"journal header is damaged: {hdr}", path=p, offset=0, reason=hdr
            )
        try:
            chunks = read_chunks(
                f,
                hdr.seed,
                header_len,
                size,
                from_seq,
                hdr.holes,
                max_line=bound,
                torn_tail_ok=True,
            )
            for rows in chunks:
                for seq, payload in rows:
                    yield Record(seq, payload)
        except ReadDamage as d:
            raise damage(p, d.offset, d.reason) from None


def _as_records(rows: Iterable[tuple[int, Any]]) -> Iterator[Record]:
    return map(_record, repeat(Record), rows)
