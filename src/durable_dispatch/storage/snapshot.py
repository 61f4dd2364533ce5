"""Atomic, checksummed, generational snapshots, owner-only.

Theory of operation. ``save(obj)`` encodes ``obj`` with orjson and writes one file per generation,
``<name>.<generation>.snap``, through a temp file: exclusive create (never following a symlink,
owner-only permissions) -> one write -> fsync -> rename over the target -> fsync of the directory.
A reader therefore sees either the old complete generation or the new complete one. Each file is a
header line ``{"v":1,"gen":N,"len":L,"crc":"xxxxxxxx"}`` followed by ``L`` bytes of JSON
body; ``crc`` is CRC-32 over ``"<N>:<L>:"`` and the body. ``load()`` returns the newest
generation that verifies and says when it had to fall back past a damaged newer one. The
newest ``keep`` generations are kept; older ones are removed after a successful save.

Durability contract: a generation returned by ``save`` has had its file and its directory entry
fsynced (unless the store was made with ``durable=False``: then it is atomic, not durable). A
failed save (the disk said EIO, ENOSPC, EDQUOT or EROFS) leaves every earlier generation
untouched, keeps the value in memory (``unsaved``), turns ``health`` to ``DEGRADED`` and raises
:class:`~durable_dispatch.errors.StorageDegradedError`; the next ``save`` tries again.
"""

from __future__ import annotations

import logging
import os
import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from ..errors import (
    RecordEncodeError,
    SnapshotCorruptError,
    StorageDegradedError,
    StorageError,
    UsageError,
)
from . import fs, owner
from .format import new_salt
from .health import Health, HealthState
from .rewrite import replace_file

__all__ = ["SnapshotStore", "Snapshot"]

log = logging.getLogger("durable_dispatch.snapshot")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_MAX_HEADER = 256
#: The largest generation number: file names carry exactly 12 digits, and a name with any other
#: number of digits (a planted ``snapshot.18446744073709551615.snap``) is not a generation.
MAX_GENERATION = 10**12 - 1


@dataclass(frozen=True)
class Snapshot:
    """A loaded snapshot.

    Attributes:
        generation: the generation number that was loaded.
        value: the decoded JSON value.
        fell_back: True when a newer generation exists but failed its checks.
        skipped: ``(path, reason)`` of every newer generation that was passed over.
    """

    generation: int
    value: Any
    fell_back: bool = False
    skipped: tuple[tuple[str, str], ...] = ()


def _crc(gen: int, body: bytes) -> int:
    """CRC-32 over the generation, the length and the body: no header field is unprotected."""
    return zlib.crc32(body, zlib.crc32(b"%d:%d:" % (gen, len(body))))


def encode_snapshot(gen: int, body: bytes) -> bytes:
    """The bytes of one snapshot file."""
    head = b'{"v":1,"gen":%d,"len":%d,"crc":"%08x"}\n' % (gen, len(body), _crc(gen, body))
    return head + body


def decode_snapshot(data: bytes, expect_gen: int | None = None) -> tuple[int, Any] | str:
    """Verify and decode one snapshot file's bytes; returns ``(gen, value)`` or the reason."""
    nl = data.find(b"\n", 0, _MAX_HEADER)
    if nl < 0:
        return "no header line"
    try:
        head = orjson.loads(data[:nl])
    except orjson.JSONDecodeError:
        return "header is not JSON"
    if not isinstance(head, dict) or set(head) != {"v", "gen", "len", "crc"}:
        return "header has wrong members"
    if head["v"] != 1:
        return f"unsupported format version {head['v']!r}"
    body = data[nl + 1 :]
    if type(head["len"]) is not int or len(body) != head["len"]:
        return f"body is {len(body)} bytes, header says {head['len']!r}"
    if type(head["gen"]) is not int or head["crc"] != f"{_crc(head['gen'], body):08x}":
        return "checksum mismatch"
    if expect_gen is not None and head["gen"] != expect_gen:
        return f"generation {head['gen']!r} in a file named for {expect_gen}"
    try:
        return int(head["gen"]), orjson.loads(body)
    except orjson.JSONDecodeError:
        return "body is not JSON"


def read_snapshot_file(f: BinaryIO) -> bytes | str:
    """The bytes of an open snapshot file, read within bounds; the reason when they cannot
    be a snapshot.

    Reads the header line (at most 256 bytes) first, and the body only when the header's
    length matches the file's size measured now: a planted sparse file or a header that lies
    costs one small read, never the whole file.
    """
    size = os.fstat(f.fileno()).st_size
    head = f.read(_MAX_HEADER)
    nl = head.find(b"\n")
    if nl < 0:
        return "no header line"
    try:
        length = orjson.loads(head[:nl]).get("len")
    except (orjson.JSONDecodeError, AttributeError):
        return "header is not JSON"
    if type(length) is not int or length != size - nl - 1:
        return f"file is {size} bytes, its header says a body of {length!r} after {nl + 1}"
    return head + f.read(size - len(head))


class SnapshotStore:
    """Generational atomic snapshots of one JSON value in a directory.

    Args:
        directory: where the files live (created owner-only if missing).
        name: the file name stem (letters, digits, ``_ . -``).
        keep: how many newest generations to keep (at least 1; keep 2+ to allow fallback).
        mode: permission bits of created files.
        durable: False: a save is not fsynced (neither the file nor the directory); it is still
            atomic for readers and survives a crash of the process, but a power loss may lose
            it or leave it damaged (the reader then falls back to an older generation). For
            values that are only a display, such as the master's statistics.
        directory_claim: the owner claim of the state directory the store is in, held by
            this process with that directory's master lock, as a state directory's master
            passes it: the store checks it before each save, and, being the only writer of its
            files while the claim is held, reads the directory's names from the claim's
            listing once and keeps track of its own generations from then on (no listing per
            load or save). Without it every save lists the directory.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        name: str = "snapshot",
        keep: int = 3,
        mode: int = 0o600,
        *,
        durable: bool = True,
        directory_claim: owner.OwnerClaim | None = None,
    ) -> None:
        if not _NAME_RE.match(name):
            raise UsageError(f"snapshot name {name!r} must match {_NAME_RE.pattern}")
        if not isinstance(keep, int) or keep < 1:
            raise UsageError(f"keep must be a positive integer, got {keep!r}")
        self.directory = os.fspath(directory)
        self.name = name
        self.keep = keep
        self._mode = mode
        self._durable = durable
        self._health = Health()
        self._unsaved: Any = None
        self._has_unsaved = False
        self._last_gen = 0
        self._file_re = re.compile(r"^" + re.escape(name) + r"\.(\d{12})\.snap$")
        self._claim = directory_claim
        #: with a claim: the directory's names as this store knows them (its own files kept up
        #: to date by its saves and prunes), None until first needed
        self._names: list[str] | None = None

    # ------------------------------------------------------------------ listing
    def generations(self, names: list[str] | None = None) -> list[int]:
        """Generation numbers present on disk (or among ``names``), oldest first."""
        if names is None:
            try:
                names = os.listdir(self.directory)
            except FileNotFoundError:
                return []
        gens = []
        for n in names:
            m = self._file_re.match(n)
            if m:
                gens.append(int(m.group(1)))
        return sorted(gens)

    def _listing(self) -> list[str]:
        """The directory's names: listed now, or, for a store that holds the directory's claim,
        as it knows them (the claim's listing, kept up to date by its own saves and prunes)."""
        if self._names is not None:
            return list(self._names)
        claim = self._claim
        if claim is not None and claim.listing is not None:
            names = list(claim.listing)
        else:
            try:
                names = os.listdir(self.directory)
            except FileNotFoundError:
                return []
        if claim is not None:
            self._names = list(names)
        return names

    def path_of(self, generation: int) -> str:
        """The file path of ``generation``."""
        return os.path.join(self.directory, f"{self.name}.{generation:012d}.snap")

    # ------------------------------------------------------------------- saving
    def save(self, obj: Any, *, before_publish: Callable[[], object] | None = None) -> int:
        """Atomically write ``obj`` as a new generation; returns its number.

        ``before_publish`` is called once the new generation is written and fsynced, before it
        is renamed into place (:func:`~durable_dispatch.storage.rewrite.replace_file`): a
        snapshot that folds a journal up to a record waits there for that record's fsync, which
        runs meanwhile.

        Raises:
            RecordEncodeError: orjson cannot encode ``obj`` (nothing written).
            StorageDegradedError: the disk refused (EIO, ENOSPC, EDQUOT, EROFS); earlier
                generations are intact, ``obj`` is kept in ``unsaved``, ``health`` is DEGRADED.
                Call ``save`` again later.
            StorageError: another OS error (permission denied, not a directory ...).
            LockHeldError: another master claimed the state directory this store is in.
        """
        try:
            body = orjson.dumps(obj)
        except (orjson.JSONEncodeError, TypeError) as e:
            raise RecordEncodeError(f"snapshot value cannot be encoded as JSON: {e}") from None
        claim = self._claim
        guard = claim.check if claim is not None else owner.guard_for(self.path_of(0))
        if guard is not None:
            guard()  # S13: another master claimed the directory: write nothing (LockHeldError)
        try:
            if claim is None and not os.path.isdir(self.directory):
                fs.makedirs(self.directory)
            names = self._listing()  # once: for the number and the pruning
            gens = self.generations(names)
            gen = max([self._last_gen, *gens]) + 1
            if gen > MAX_GENERATION:
                raise StorageError(
                    f"snapshot generations are exhausted (the newest is {gen - 1}); a file with "
                    f"that number was planted, or this store saved {MAX_GENERATION} times",
                    path=self.path_of(gen - 1),
                    op="save",
                )
            publish = before_publish
            if before_publish is not None and guard is not None:
                # the wait may be long (a stalled mount): the claim is checked again after it,
                # right before the rename, as it was before the write when nothing was waited
                # for in between (S13)
                def publish() -> None:
                    before_publish()
                    guard()

            self._write(gen, body, publish)
            if self._names is not None:
                self._names.append(os.path.basename(self.path_of(gen)))
        except OSError as e:
            if not fs.is_degradable(e):
                raise StorageError(
                    f"cannot save snapshot: {e.strerror or e}",
                    path=getattr(e, "filename", None) or self.directory,
                    op="save",
                    errno=e.errno,
                ) from e
            since = self._health.since if not self._health.ok else time.time()
            self._health = Health(HealthState.DEGRADED, "save", e.errno, self.directory, since, 1)
            self._unsaved, self._has_unsaved = obj, True
            log.error(
                "snapshot %s/%s not saved (%s); value kept in memory", self.directory, self.name, e
            )
            raise StorageDegradedError(
                f"snapshot not saved: {e.strerror or e}",
                path=self.directory,
                op="save",
                errno=e.errno,
            ) from e
        self._last_gen = gen
        self._health = Health()
        self._unsaved, self._has_unsaved = None, False
        self._prune(gen, names)
        return gen

    def _write(self, gen: int, body: bytes, before: Callable[[], object] | None = None) -> None:
        tmp = os.path.join(self.directory, f".{self.name}.{gen}.{new_salt()}.tmp")
        data = [encode_snapshot(gen, body)]
        replace_file(
            self.path_of(gen), tmp, data, self._mode, sync=self._durable, before_rename=before
        )

    def _prune(self, newest: int, names: list[str]) -> None:
        """Remove generations older than the newest ``keep`` and stale temp files (best effort),
        from ``names``, the listing taken before ``newest`` was written.

        The removals are not fsynced: a crash may bring back an old generation or a temp file,
        which the next save prunes again (loading takes the newest valid generation). Saving an
        fsync here keeps a rollback's snapshot (S8) at two fsyncs, on the master's thread.
        """
        try:
            old = [g for g in [*self.generations(names), newest] if g <= newest][: -self.keep]
            stale = [n for n in names if n.startswith(f".{self.name}.") and n.endswith(".tmp")]
            gone = {os.path.basename(self.path_of(g)) for g in old} | set(stale)
            if self._names is not None:
                self._names = [n for n in self._names if n not in gone]
            for g in old:
                fs.unlink(self.path_of(g))
            for n in stale:
                fs.unlink(os.path.join(self.directory, n))
        except OSError as e:
            log.warning(
                "snapshot %s/%s: pruning old generations failed: %s", self.directory, self.name, e
            )

    # ------------------------------------------------------------------ loading
    def load(self, validate: Callable[[Any], None] | None = None) -> Snapshot | None:
        """The newest generation that passes its checks, or None when there is none at all.

        ``validate``, if given, checks a decoded body and raises ``ValueError`` naming
        what is wrong; a generation it refuses is passed over like a damaged one.

        Raises:
            SnapshotCorruptError: generations exist but none passes its checks.
            StorageError: a generation file cannot be read for a reason other than damage.
        """
        skipped: list[tuple[str, str]] = []
        for gen in reversed(self.generations(self._listing())):
            path = self.path_of(gen)
            try:
                with fs.open_read(path) as f:
                    data = read_snapshot_file(f)
            except FileNotFoundError:
                continue
            except OSError as e:
                if not fs.is_degradable(e):
                    raise StorageError(
                        f"cannot read snapshot: {e.strerror or e}",
                        path=path,
                        op="read",
                        errno=e.errno,
                    ) from e
                skipped.append((path, f"read failed: {e.strerror}"))
                continue
            r = data if isinstance(data, str) else decode_snapshot(data, gen)
            if validate is not None and not isinstance(r, str):
                try:
                    validate(r[1])
                except ValueError as e:
                    r = f"invalid body: {e}"
            if isinstance(r, str):
                skipped.append((path, r))
                log.warning("snapshot %s is damaged (%s); falling back", path, r)
                continue
            self._last_gen = max(self._last_gen, gen)
            return Snapshot(gen, r[1], bool(skipped), tuple(skipped))
        if skipped:
            path, reason = skipped[0]
            raise SnapshotCorruptError(
                f"no valid snapshot generation in {self.directory} ({len(skipped)} damaged)",
                path=path,
                reason=reason,
            )
        return None

    # --------------------------------------------------------------- properties
    @property
    def health(self) -> Health:
        """``OK`` after a successful save; ``DEGRADED`` while the newest value is memory-only."""
        return self._health

    @property
    def unsaved(self) -> Any:
        """The value whose save failed and has not been saved since (None otherwise)."""
        return self._unsaved

    @property
    def has_unsaved(self) -> bool:
        """True while a failed save's value is held in memory only."""
        return self._has_unsaved

    def __repr__(self) -> str:
        return f"<SnapshotStore {self.directory!r} name={self.name!r} health={self._health!r}>"
