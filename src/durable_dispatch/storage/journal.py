"""Append-only JSON Lines journal: checksums, sync policies, group commit, honest degradation.

Theory of operation. ``append`` encodes the payload with orjson (refusing oversized or unencodable
records before anything is written), takes the next sequence number and queues the bytes. A
*flush* moves queued records to the kernel with one ``write()`` of whole lines (survives a process
crash); a *sync* then ``fsync``s the file (survives power loss). Only after ``fsync`` returns is a
sequence number reported durable. The sync policy decides who flushes and when:

* ``always``: ``append`` flushes and fsyncs before it returns; concurrent appenders share fsyncs.
* ``batch``: group commit. A background flusher writes and fsyncs the queue when it holds
  ``batch_max_records`` records or its oldest record is ``batch_max_delay`` seconds old;
  ``wait_durable(seq)`` flushes at once and returns when ``seq`` is durable.
* ``never``: each append is written to the kernel, never fsynced; receipts say ``durable=False``.

Honest degradation (S4). When a write or fsync fails the journal never trusts that descriptor
again: every record since the last good fsync (written or not) moves to a bounded in-memory list,
the file descriptor is closed, ``health`` turns ``DEGRADED`` and new appends go to memory with
``durable=False`` receipts. ``try_restore()`` writes the durable prefix plus the memory records to a
*fresh* temporary file, fsyncs it, renames it over the journal and fsyncs the directory; only then
are those records durable and the health ``OK`` again. Sequence numbers never repeat.

Opening recovers according to a named mode (``RECOVERY_MODES``); bytes a mode drops are first
copied to a side file next to the journal, and the :class:`RecoveryReport` says what happened.

A journal remembers the filesystem it was opened on (:func:`fs.filesystem`: the real one, or
pyfakefs's fake one). If that filesystem goes away while the journal is open (a test left it open
and pyfakefs tore down), the journal is *abandoned*: its descriptors are forgotten, never written,
synced or closed (their numbers now name unrelated real descriptors), its flusher stops, and what it
still held in memory is dropped with a warning in the log.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, repeat
from types import TracebackType
from typing import Any, BinaryIO

import filelock
import orjson

from ..errors import (
    JournalCorruptError,
    JournalVersionError,
    LockHeldError,
    MemoryBoundError,
    NotDurableError,
    RecordEncodeError,
    RecordTooLargeError,
    StorageDegradedError,
    StorageError,
    UsageError,
)
from . import fs, resources
from .format import (
    Damage,
    Gap,
    Header,
    RawBatch,
    ReadDamage,
    _bulk_check,
    _payload_slices,
    checked_record,
    frame_record,
    line_offsets,
    new_salt,
    payload_of,
    read_chunks,
    read_header,
    read_lines,
    scan,
)
from .health import Health, HealthState, Receipt, Record, RecoveryReport

__all__ = [
    "Journal",
    "Receipt",
    "Record",
    "RawBatch",
    "Health",
    "HealthState",
    "RecoveryReport",
    "SYNC_POLICIES",
    "RECOVERY_MODES",
    "read_journal",
]

log = logging.getLogger("durable_dispatch.journal")

SYNC_POLICIES = ("always", "batch", "never")
RECOVERY_MODES = ("tolerate-torn-tail", "absolute", "point-in-time", "skip-corrupted")


class _Degraded(Exception):
    """Internal: an open-time step failed with a degradable errno."""

    def __init__(self, op: str, err: OSError) -> None:
        super().__init__(op)
        self.op = op
        self.err = err


class _Owned:
    """What a journal holds (descriptor, writer lock) and the filesystem it was opened on.

    Kept apart from the journal for its finalizer, which must not refer to the journal.
    """

    __slots__ = ("fd", "flock", "inode_lock", "filesystem")

    def __init__(self, filesystem: object) -> None:
        self.fd: int | None = None
        self.flock: filelock.BaseFileLock | None = None
        #: A descriptor holding a ``flock`` on the journal file itself (S12).
        self.inode_lock: int | None = None
        self.filesystem = filesystem

    def shadowed(self) -> bool:
        """True when calls may reach this filesystem again later (see :func:`fs.comes_back`)."""
        return fs.comes_back(self.filesystem)

    def release(self) -> None:
        """Let go of the descriptor and the lock (at close, at an abandon, in the finalizer).

        On their own filesystem they are closed and released; on any other they are only
        forgotten, never closed: their numbers name other (real) descriptors there.
        """
        fds = [fd for fd in (self.fd, self.inode_lock) if fd is not None]
        flock, self.flock = self.flock, None
        self.fd = self.inode_lock = None
        if not fs.reaches(self.filesystem):
            # Their numbers name other (real) descriptors now: never close them.
            for fd in fds:
                fs.forget(fd)
            if flock is not None:
                resources.disown_lock(flock)
            return
        for fd in fds:
            try:
                fs.close(fd)
            except OSError:
                pass
        if flock is not None:
            try:
                flock.release()
            except OSError:
                pass


class Journal:
    """An append-only, checksummed JSON Lines journal with one writer process (S1, S2, S4, S5).

    Open with :meth:`Journal.open`; use as a context manager or call :meth:`close`.
    """

    def __init__(self, path: str, *, _token: object = None, **kw: Any) -> None:
        if _token is not _OPEN_TOKEN:
            raise UsageError("use Journal.open(path, ...) to open a journal")
        self.path = path
        self._dir = os.path.dirname(os.path.abspath(path))
        self.sync: str = kw["sync"]
        self.max_record_bytes: int = kw["max_record_bytes"]
        self._batch_max = kw["batch_max_records"]
        self._batch_delay = kw["batch_max_delay"]
        self._max_mem = kw["max_memory_bytes"]
        self._file_mode = kw["mode"]
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._io_lock = threading.Lock()
        # Guarded by _lock:
        # Records are framed (checksummed line bytes) when appended: (seq, line).
        self._queue: list[tuple[int, bytes]] = []  # appended, not yet written
        self._queue_since = 0.0
        self._memory: list[tuple[int, bytes]] = []  # memory-only while degraded
        self._mem_bytes = 0
        self._health = Health()
        self._degraded = False  # mirrors "not self._health.ok" for the hot path
        self._batch = kw["sync"] == "batch"
        self._closed = False
        self._next_seq = 0
        self._durable_seq = -1
        # Guarded by _io_lock:
        self._owned = _Owned(fs.filesystem())  # self._fd lives here, for the finalizer
        self._unsynced: list[tuple[int, bytes]] = []  # written, not fsynced
        self._written = 0  # file size after our writes
        self._synced = 0  # file size covered by the last good fsync
        self._header = Header(new_salt(), 0)
        self._seed = self._header.seed
        self._header_len = 0
        self._file_exists = False
        self._flusher: threading.Thread | None = None
        self._file_read = False  # the file on disk was read, verified and repaired by this open
        self.recovery = RecoveryReport(mode=kw["recovery"])
        weakref.finalize(self, self._owned.release)

    @property
    def _fd(self) -> int | None:
        return self._owned.fd

    @_fd.setter
    def _fd(self, fd: int | None) -> None:
        self._owned.fd = fd

    @property
    def _flock(self) -> filelock.BaseFileLock | None:
        return self._owned.flock

    @_flock.setter
    def _flock(self, lock: filelock.BaseFileLock | None) -> None:
        self._owned.flock = lock

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        sync: str = "batch",
        *,
        recovery: str = "tolerate-torn-tail",
        max_record_bytes: int = 1 << 20,
        batch_max_records: int = 1024,
        batch_max_delay: float = 0.002,
        max_memory_bytes: int = 64 << 20,
        mode: int = 0o600,
        lock_timeout: float = 0.0,
        visit: Callable[[RawBatch], None] | None = None,
    ) -> Journal:
        """Open (creating if needed) and recover a journal, taking its writer lock.

        Args:
            path: the journal file; missing parent directories are created owner-only.
            sync: ``"always"``, ``"batch"`` or ``"never"`` (see the module docs).
            recovery: one of :data:`RECOVERY_MODES`. ``tolerate-torn-tail`` (default) cuts a torn,
                zero-filled or checksum-failing tail that no later record proves durable;
                ``absolute`` refuses any damage; ``point-in-time`` keeps the valid prefix before
                the first damage; ``skip-corrupted`` keeps every intact record and records the gaps.
                Dropped bytes always go to a side file ``<path>.damaged-<offset>``.
            max_record_bytes: bound on one encoded payload; larger appends are refused.
            batch_max_records: ``batch`` mode writes and fsyncs at least this often (in records).
            batch_max_delay: ``batch`` mode's longest wait (seconds) before it writes and fsyncs.
            max_memory_bytes: bound on record bytes held in memory while degraded.
            mode: permission bits of files the journal creates.
            lock_timeout: seconds to wait for another writer's lock (0: fail at once).
            visit: called during the recovery scan, which verifies every record anyway, with
                each run of intact records of the valid prefix as a :class:`RawBatch` (line
                offsets, sequence numbers and payload JSON bytes, in order), so a caller that
                needs every record reads the file once. Records after the first damage are not
                visited: they are all seen only when ``journal.recovery.damage`` is empty.

        Returns:
            The open journal; ``journal.recovery`` reports what opening found and did, and
            ``journal.health`` is ``DEGRADED`` if the disk refused to let it start on disk.

        Raises:
            UsageError: an unknown sync policy or recovery mode, or a non-positive bound.
            LockHeldError: another writer holds ``<path>.lock`` (S5).
            JournalCorruptError: damage the recovery mode does not repair (offset included).
            JournalVersionError: the file is of a format version this library does not read.
            StorageError: the OS refused with a non-disk error (permission denied, not a file ...),
                or the disk refused (EROFS, ENOSPC, EDQUOT, EIO) before the existing file was read,
                verified and repaired, for example its lock file could not be created, or the
                copy of damaged bytes to their side file failed: the journal is left as it was
                (S9). A disk that refuses only after that, or when no file exists yet, starts
                the journal ``DEGRADED`` instead.
        """
        if sync not in SYNC_POLICIES:
            raise UsageError(f"unknown sync policy {sync!r}; use one of {SYNC_POLICIES}")
        if recovery not in RECOVERY_MODES:
            raise UsageError(f"unknown recovery mode {recovery!r}; use one of {RECOVERY_MODES}")
        for name, val in (
            ("max_record_bytes", max_record_bytes),
            ("batch_max_records", batch_max_records),
            ("max_memory_bytes", max_memory_bytes),
        ):
            if not isinstance(val, int) or val <= 0:
                raise UsageError(f"{name} must be a positive integer, got {val!r}")
        if not batch_max_delay >= 0:
            raise UsageError(f"batch_max_delay must be >= 0, got {batch_max_delay!r}")
        j = cls(
            os.fspath(path),
            _token=_OPEN_TOKEN,
            sync=sync,
            recovery=recovery,
            max_record_bytes=max_record_bytes,
            batch_max_records=batch_max_records,
            batch_max_delay=float(batch_max_delay),
            max_memory_bytes=max_memory_bytes,
            mode=mode,
        )
        j._start(recovery, lock_timeout, visit)
        resources.register(j)
        return j

    def _start(
        self,
        recovery: str,
        lock_timeout: float,
        visit: Callable[[RawBatch], None] | None = None,
    ) -> None:
        try:
            try:
                self._refuse_unsafe_path()
                if not os.path.isdir(self._dir):
                    fs.makedirs(self._dir)
                self._take_lock(lock_timeout)
                self._lock_inode()
                self._recover_and_open(recovery, visit)
            except StorageError:
                raise
            except OSError as e:
                # S9: the disk may refuse and the journal start degraded only once the existing
                # file was read, verified and repaired (its records are then known and kept), or
                # when there is no file to lose. Before that, fail closed: a typed error, and
                # nothing was changed.
                if not fs.is_degradable(e) or not (self._file_read or self._nothing_to_lose()):
                    raise StorageError(
                        f"cannot open journal: {e.strerror or e}"
                        + ("" if self._file_read else "; the journal was left as it was"),
                        path=getattr(e, "filename", None) or self.path,
                        op="open",
                        errno=e.errno,
                    ) from e
                raise _Degraded("open", e) from e
        except _Degraded as d:
            self._durable_seq = self._next_seq - 1
            self._enter_degraded(d.op, d.err)
        except BaseException:
            self._owned.release()
            raise
        if self.sync == "batch":
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"journal-flusher:{self.path}", daemon=True
            )
            self._flusher.start()

    def _take_lock(self, timeout: float) -> None:
        lock = filelock.FileLock(
            self.path + ".lock", timeout=timeout, mode=0o600, thread_local=False
        )
        try:
            fs.check_fault("open", lock.lock_file)  # filelock creates it, outside the seam
            lock.acquire()
        except filelock.Timeout:
            raise LockHeldError(
                "another writer holds this journal's lock", path=self.path + ".lock"
            ) from None
        self._flock = lock

    def _lock_inode(self) -> None:
        """Lock the journal file itself (S12), after its lock file: an operator who deletes or
        replaces ``<path>.lock`` under a running writer lets a second one take the lock file, but
        never this lock. A rewrite moves it to the new file before renaming it into place."""
        try:
            self._owned.inode_lock = fs.lock_file(self.path, self._file_mode)
        except BlockingIOError:
            raise LockHeldError(
                "another writer holds this journal (its lock file was deleted or replaced under "
                "it)",
                path=self.path,
            ) from None

    def _recover_and_open(self, mode: str, visit: Callable[[RawBatch], None] | None = None) -> None:
        size = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        self._file_exists = os.path.exists(self.path)
        created = False
        cut_offset: int | None = None
        side: str | None = None
        damage: tuple[Damage, ...] = ()
        records = 0
        if size == 0:
            created = True
            self._file_read = True
        else:
            try:
                with fs.open_read(self.path) as f:
                    res = scan(f, size, self.max_record_bytes, visit=visit)
            except ValueError as e:
                if e.args[:1] != ("version",):
                    raise
                raise JournalVersionError(
                    f"journal format version {e.args[1]!r} is not supported (this library reads "
                    f"version 1)",
                    path=self.path,
                    reason="unsupported version",
                ) from None
            except OSError as e:
                # Without reading the file the next sequence number is unknown: refuse to start
                # rather than risk reusing a number.
                raise StorageError(
                    f"cannot read journal to recover it: {e.strerror or e}",
                    path=self.path,
                    op="read",
                    errno=e.errno,
                ) from e
            # Its records are known now: a disk that refuses from here on (a cut, opening it for
            # appending) starts the journal degraded with those records, never without them.
            self._file_read = True
            if res.header is not None:
                self._header_len = res.header_len
                self._written = self._synced = res.end
            damage = tuple(res.damage)
            first = res.damage[0] if res.damage else None
            if res.header is None:
                # Without a valid header no record can be verified.
                if mode == "absolute" or not res.tail_only:
                    assert first is not None
                    raise JournalCorruptError(
                        f"journal header is damaged: {first.reason}",
                        path=self.path,
                        offset=0,
                        reason=first.reason,
                    )
                side = self._save_side(0, size)
                self._written = self._synced = 0
                fs.truncate(self.path, 0)
                cut_offset, created = 0, True
            else:
                self._header = res.header
                self._seed = res.header.seed
                records = res.prefix_records
                self._next_seq = res.prefix_next_seq
                if first is not None:
                    tail_ok = mode == "point-in-time" or (
                        mode in ("tolerate-torn-tail", "skip-corrupted") and res.tail_only
                    )
                    if mode == "skip-corrupted" and res.after_damage:
                        self._next_seq = res.next_seq
                        side = self._salvage(res, size)
                        records = res.records
                        self._next_seq = res.next_seq
                    elif tail_ok:
                        side = self._save_side(first.offset, size)
                        fs.truncate(self.path, first.offset)
                        cut_offset = first.offset
                    else:
                        why = (
                            "a later record proves it was durable"
                            if mode == "tolerate-torn-tail"
                            else "recovery mode is absolute"
                        )
                        raise JournalCorruptError(
                            f"journal damaged at offset {first.offset}: {first.reason} ({why})",
                            path=self.path,
                            offset=first.offset,
                            reason=first.reason,
                        )
                    log.warning(
                        "journal %s: recovery %s dropped %d damaged span(s) starting at offset %d; "
                        "bytes saved to %s",
                        self.path,
                        mode,
                        len(damage),
                        first.offset,
                        side,
                    )
        self.recovery = RecoveryReport(
            mode=mode,
            created=created,
            records=records,
            cut_offset=cut_offset,
            cut_bytes=(size - cut_offset) if cut_offset is not None else 0,
            side_file=side,
            damage=damage,
        )
        if created:
            self._header = Header(new_salt(), self._next_seq)
            self._seed = self._header.seed
            fd = fs.open_append(self.path, self._file_mode)
            self._fd = fd
            self._file_exists = True
            hdr = self._header.frame()
            fs.write_all(fd, hdr)
            fs.fsync(fd)
            fs.fsync_dir(self._dir)
            self._written = self._synced = self._header_len = len(hdr)
            self._durable_seq = self._next_seq - 1
            return
        elif self._fd is None:
            self._fd = fs.open_append(self.path, self._file_mode)
            # Whatever an earlier process left unsynced becomes durable (or fails) here.
            fs.fsync(self._fd)
        self._durable_seq = self._next_seq - 1

    def _refuse_unsafe_path(self) -> None:
        """Refuse, before anything is read or written, a journal path that is not a plain file.

        A symbolic link (its target would be read, copied and written), a FIFO, device, socket or
        directory (a reader would block or read forever), or a file with more than one hard link
        (writing it would change the file under its other names too).
        """
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        why, code = "", errno.EINVAL
        if stat.S_ISLNK(st.st_mode):
            why, code = "is a symbolic link; a journal path is never followed", errno.ELOOP
        elif not stat.S_ISREG(st.st_mode):
            why = "is not a regular file (a FIFO, device, socket or directory)"
        elif st.st_nlink > 1:
            why = (
                f"has {st.st_nlink} hard links; writing it would change the same file under "
                f"its other names"
            )
        if why:
            raise StorageError(
                f"refusing to open the journal: its path {why}",
                path=self.path,
                op="open",
                errno=code,
            )

    def _nothing_to_lose(self) -> bool:
        """True when no journal file (or only an empty one) is at the path."""
        try:
            return os.lstat(self.path).st_size == 0
        except FileNotFoundError:
            return True
        except OSError:
            return False

    def _save_side(self, offset: int, size: int) -> str:
        """Copy bytes ``[offset, size)`` of the journal to a new side file; return its path."""
        base = f"{self.path}.damaged-{offset}"
        side, n = base, 0
        while os.path.lexists(side):
            n += 1
            side = f"{base}.{n}"
        fd: int | None = None
        try:
            fd = fs.create_exclusive(side, self._file_mode)
            try:
                with fs.open_read(self.path) as f:
                    f.seek(offset)
                    left = size - offset  # the span measured, however the file changes
                    while left > 0 and (chunk := f.read(min(1 << 20, left))):
                        fs.write_all(fd, chunk)
                        left -= len(chunk)
                fs.fsync(fd)
            finally:
                fs.close(fd)
            fs.fsync_dir(self._dir)
        except BaseException as e:
            # The copy is not whole (a full disk, EIO): nothing may be cut (S9). Remove the
            # partial copy, which is ours, and let the open fail.
            if fd is not None:
                try:
                    fs.unlink(side)
                except OSError:
                    pass
            if isinstance(e, OSError):
                raise StorageError(
                    f"cannot save damaged bytes [{offset}, {size}) to a side file before cutting "
                    f"them: {e.strerror or e}; nothing was cut",
                    path=side,
                    op="save-damaged",
                    errno=e.errno,
                ) from e
            raise
        return side

    def _salvage(self, res: Any, size: int) -> str:
        """skip-corrupted: save the whole file aside, rewrite it with the intact records only."""
        side = self._save_side(0, size)
        holes = tuple(sorted(set(self._header.holes) | set(res.holes)))
        hdr = Header(new_salt(), self._header.first_seq, holes)
        self._rewrite(hdr, self._intact_lines(self.path, self._seed, None, strict=False), [])
        return side

    def _intact_lines(
        self, path: str, seed: int, end: int | None, *, strict: bool
    ) -> Iterator[tuple[int, int, bytes]]:
        """Yield ``(seq, durable_mark, payload_bytes)`` of the records of ``path`` before ``end``.

        With ``strict`` a damaged record raises :class:`JournalCorruptError` (it was durable and
        must not be dropped silently); without it damaged records are skipped (salvage).
        """
        with fs.open_read(path) as f:
            stop = os.fstat(f.fileno()).st_size if end is None else end
            last = -1
            for item in read_lines(f, self._header_len, stop, self.max_record_bytes + 256):
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
                    r = got if isinstance(got, str) else checked_record(got, seed)
                    if not isinstance(r, str) and r[0] <= last:
                        # A repeated number (a spliced or replayed span) is damage, as in scan().
                        r = f"sequence {r[0]} after {last}"
                    if isinstance(r, str):
                        if strict:
                            raise JournalCorruptError(
                                f"durable record damaged at offset {off}: {r}",
                                path=path,
                                offset=off,
                                reason=r,
                            )
                        continue
                    last = r[0]
                    yield r

    def _rewrite(
        self,
        hdr: Header,
        durable: Iterator[tuple[int, int, bytes]],
        extra: list[tuple[int, bytes]],
    ) -> None:
        """Write header + records to a fresh temp file, fsync, rename over the journal, fsync dir.

        Called with ``_io_lock`` held (or before the journal is shared). Once the rename is done the
        new file *is* the journal, whatever happens next: the header, salt and durable prefix end
        are switched to it. Only when the directory fsync also succeeds does ``self._fd`` become
        the new file's descriptor (and the records in it durable); otherwise the caller stays
        degraded and a later rewrite starts from the new file's durable prefix.
        """
        tmp = f"{self.path}.rewrite-{new_salt()}.tmp"
        fd = fs.create_exclusive(tmp, self._file_mode)
        inode_lock: int | None = None
        try:
            inode_lock = fs.lock_file(tmp, self._file_mode)  # S12: locked before it is the journal
            seed = hdr.seed
            head = hdr.frame()
            chunk: list[bytes] = [head]
            size = 0
            pending = len(head)
            last = -1
            for seq, mark, payload in durable:
                chunk.append(frame_record(seed, seq, mark, payload))
                pending += len(chunk[-1])
                last = seq
                if pending >= 1 << 18:
                    data = b"".join(chunk)
                    fs.write_all(fd, data)
                    size += len(data)
                    chunk, pending = [], 0
            prefix_end = size + pending
            for seq, line in extra:
                chunk.append(frame_record(seed, seq, last, payload_of(line)))
            data = b"".join(chunk)
            fs.write_all(fd, data)
            size += len(data)
            fs.fsync(fd)
            fs.replace(tmp, self.path)
        except BaseException:
            for held in (fd, inode_lock):
                try:
                    if held is not None:
                        fs.close(held)
                except OSError:
                    pass
            try:
                fs.unlink(tmp)
            except OSError:
                pass
            raise
        old_lock, self._owned.inode_lock = self._owned.inode_lock, inode_lock
        if old_lock is not None:
            try:
                fs.close(old_lock)
            except OSError:
                pass
        old, self._fd = self._fd, None
        if old is not None:
            try:
                fs.close(old)
            except OSError:
                pass
        with self._lock:
            self._header, self._seed = hdr, hdr.seed
        self._header_len = len(head)
        self._file_exists = True
        self._written = self._synced = prefix_end
        try:
            fs.fsync_dir(self._dir)
        except BaseException:
            try:
                fs.close(fd)
            except OSError:
                pass
            raise
        self._fd = fd
        self._written = self._synced = size

    # ---------------------------------------------------------------- appending
    def append(self, payload: Any) -> Receipt:
        """Append one JSON-encodable payload; returns its :class:`Receipt`.

        ``always``: returns after the record's fsync (``durable=True``), or ``durable=False`` if
        the disk failed and the record is held in memory. ``batch``: returns at once with
        ``durable=False`` unless an fsync already covers it; use :meth:`wait_durable`. ``never``:
        the record is handed to the kernel, never fsynced.

        Note: orjson encodes NaN and infinities as ``null``; keep payloads finite.

        Raises:
            RecordEncodeError: orjson cannot encode the payload (nothing written).
            RecordTooLargeError: the encoded payload exceeds ``max_record_bytes`` (nothing written).
            MemoryBoundError: degraded and the memory bound is reached (the record was not taken).
            UsageError: the journal is closed.
        """
        try:
            data = orjson.dumps(payload)
        except (orjson.JSONEncodeError, TypeError) as e:
            raise RecordEncodeError(f"payload cannot be encoded as JSON: {e}") from None
        if len(data) > self.max_record_bytes:
            raise RecordTooLargeError(
                f"record of {len(data)} bytes exceeds max_record_bytes",
                size=len(data),
                limit=self.max_record_bytes,
            )
        with self._lock:
            if self._closed:
                raise UsageError("journal is closed")
            seq = self._next_seq
            # Frame now: the orjson buffer is dropped at once, and the durable mark is the
            # conservative "known durable at append time".
            region = b'"seq":%d,"d":%d,"p":%s' % (seq, self._durable_seq, data)
            line = b'{"v":1,"crc":"%08x",%s}\n' % (_crc32(region, self._seed), region)
            if self._degraded:
                self._append_to_memory(seq, line)
                return _receipt(Receipt, (seq, False))
            self._next_seq = seq + 1
            queue = self._queue
            if not queue:
                self._queue_since = time.monotonic()
                if self._batch:
                    self._cond.notify_all()  # start the flusher's delay clock
            queue.append((seq, line))
            if self._batch:
                if len(queue) >= self._batch_max:
                    self._cond.notify_all()  # a full batch
                    # Back-pressure: never let the queue run far ahead of the disk.
                    while len(self._queue) >= 8 * self._batch_max and not self._degraded:
                        self._cond.wait(0.05)
                return _receipt(Receipt, (seq, False))
        self._flush(sync=self.sync == "always")
        with self._lock:
            return Receipt(seq, self.sync == "always" and self._durable_seq >= seq)

    def _append_to_memory(self, seq: int, line: bytes) -> None:
        """Degraded append, with ``_lock`` held."""
        if self._mem_bytes + len(line) > self._max_mem:
            raise MemoryBoundError(
                "degraded journal's memory bound reached; record not accepted",
                path=self.path,
                op="append",
                errno=self._health.errno,
                pending=len(self._memory),
            )
        self._next_seq = seq + 1
        self._memory.append((seq, line))
        self._mem_bytes += len(line)
        self._refresh_pending()

    def wait_durable(self, seq: int, timeout: float | None = None) -> None:
        """Return once an fsync covers ``seq`` (flushing now if needed, whatever the policy).

        Raises:
            NotDurableError: the record is held in memory after a disk fault.
            TimeoutError: ``timeout`` seconds passed, after at least one flush, and the record is
                still not durable (only possible while another thread's group commit holds it).
            UsageError: ``seq`` was never appended.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        flushed = False
        while True:
            with self._lock:
                if seq >= self._next_seq or seq < 0:
                    raise UsageError(f"sequence number {seq} was never appended")
                if self._durable_seq >= seq:
                    return
                if not self._health.ok:
                    raise NotDurableError(
                        f"record {seq} is held in memory only; storage is degraded",
                        path=self.path,
                        op=self._health.op,
                        errno=self._health.errno,
                        pending=len(self._memory),
                    )
            if flushed and deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"record {seq} not durable within {timeout} s")
            flushed = True
            if not self._flush(sync=True):
                with self._lock:
                    if self._durable_seq >= seq:
                        return
                    closed = self._closed
                raise NotDurableError(
                    f"record {seq} is not durable and cannot be made so now: "
                    + (
                        "the journal was closed or abandoned"
                        if closed
                        else "the filesystem it was opened on is out of reach (shadowed by "
                        "pyfakefs)"
                    ),
                    path=self.path,
                    pending=max(0, self._next_seq - 1 - self._durable_seq),
                )

    def sync_now(self) -> int:
        """Write and fsync everything appended so far; returns the durable sequence number.

        Works under every policy (also ``never``). Returns ``-1``-based ``durable_seq`` unchanged
        if degraded (check ``health``).
        """
        self._flush(sync=True)
        return self.durable_seq

    def _flush(self, sync: bool) -> bool:
        """Write (and with ``sync`` fsync) what is queued. False when nothing can be written at
        all: the journal is closed or abandoned, or its filesystem is out of reach now."""
        with self._io_lock:
            if self._filesystem_gone():
                return False
            with self._lock:
                if self._degraded:
                    return True  # the caller sees the health
                if self._fd is None:
                    return False
                batch, self._queue = self._queue, []
                if self._batch:
                    self._cond.notify_all()  # release back-pressured appenders
            fd = self._fd
            if batch:
                data = batch[0][1] if len(batch) == 1 else b"".join([x[1] for x in batch])
                try:
                    fs.write_all(fd, data)
                except OSError as e:
                    self._degrade("write", e, batch)
                    return True
                self._written += len(data)
                self._unsynced.extend(batch)
            if sync and self._unsynced:
                try:
                    fs.fsync(fd)
                except OSError as e:
                    self._degrade("fsync", e, [])
                    return True
                with self._lock:
                    self._durable_seq = self._unsynced[-1][0]
                self._synced = self._written
                self._unsynced = []
        return True

    def _flush_loop(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._closed:
                        return
                    if self._queue and self._health.ok:
                        age = time.monotonic() - self._queue_since
                        if len(self._queue) >= self._batch_max or age >= self._batch_delay:
                            break
                        self._cond.wait(self._batch_delay - age)
                    else:
                        self._cond.wait()
            if not fs.reaches(self._owned.filesystem):
                with self._io_lock:
                    self._filesystem_gone()  # abandons the journal if its filesystem is gone
                time.sleep(0.01)  # shadowed for now (or closed): look again
                continue
            self._flush(sync=True)

    # ------------------------------------------------------------- degradation
    def _degrade(self, op: str, err: OSError, batch: list[tuple[int, bytes]]) -> None:
        """Called with ``_io_lock`` held: never trust this descriptor again (S4)."""
        with self._lock:
            moved = self._unsynced + batch + self._queue
            self._memory = moved + self._memory
            self._mem_bytes = sum(len(line) for _, line in self._memory)
            self._queue, self._unsynced = [], []
            self._health = Health(
                HealthState.DEGRADED, op, err.errno, self.path, time.time(), len(self._memory)
            )
            self._degraded = True
            self._cond.notify_all()
        fd, self._fd = self._fd, None
        self._written = self._synced
        if fd is not None and not fs.reaches(self._owned.filesystem):
            fs.forget(fd)  # never close a descriptor number on another filesystem
        elif fd is not None:
            try:
                fs.close(fd)
            except OSError:
                pass
        log.error(
            "journal %s degraded: %s failed (%s); %d record(s) held in memory, not durable",
            self.path,
            op,
            err,
            len(moved),
        )

    def _enter_degraded(self, op: str, err: OSError) -> None:
        with self._io_lock:
            self._degrade(op, err, [])

    def _refresh_pending(self) -> None:
        h = self._health
        if not h.ok:
            self._health = Health(h.state, h.op, h.errno, h.path, h.since, len(self._memory))

    @property
    def health(self) -> Health:
        """The storage health now: ``OK``, or ``DEGRADED(op, errno, path, since, pending)``."""
        with self._lock:
            return self._health

    def try_restore(self) -> bool:
        """Try to make the memory-only records durable again, in a fresh file.

        Writes the durable prefix and the memory records to a new temp file, fsyncs it, renames it
        over the journal and fsyncs the directory. Never re-fsyncs the failed descriptor.

        Returns:
            True when the journal is healthy (it was, or it is now); False when the disk still
            refused (``health`` shows the newest error; the records stay in memory), or when the
            filesystem the journal was opened on is gone (see the module docs).
        """
        with self._io_lock:
            if self._filesystem_gone():
                return False
            with self._lock:
                if self._health.ok:
                    return True
                mem = list(self._memory)
            try:
                if not os.path.isdir(self._dir):
                    fs.makedirs(self._dir)
                if self._flock is None:
                    # Started degraded before the lock could be taken (S5 still holds: a
                    # competing writer makes this raise LockHeldError).
                    self._take_lock(0)
                if self._owned.inode_lock is None:
                    self._lock_inode()
                    if not self._file_read and not self._nothing_to_lose():
                        # A journal appeared at the path meanwhile, unread by this one: never
                        # replace it (S9). Stay degraded; the caller sees it in health.
                        raise OSError(
                            errno.EEXIST,
                            "a journal this one never read is now at the path",
                            self.path,
                        )
                if self._synced > self._header_len and self._file_exists:
                    prefix: Iterator[tuple[int, int, bytes]] = self._intact_lines(
                        self.path, self._seed, self._synced, strict=True
                    )
                else:
                    prefix = iter(())
                hdr = Header(new_salt(), self._header.first_seq, self._header.holes)
                self._rewrite(hdr, prefix, mem)
            except OSError as e:
                with self._lock:
                    h = self._health
                    self._health = Health(
                        h.state, "restore", e.errno, self.path, h.since, len(self._memory)
                    )
                log.warning("journal %s: restore failed (%s); still degraded", self.path, e)
                return False
            with self._lock:
                if mem:
                    self._durable_seq = mem[-1][0]
                # Appended while the rewrite ran: framed with the old salt, so frame again.
                rest = [
                    (q, frame_record(hdr.seed, q, self._durable_seq, payload_of(line)))
                    for q, line in self._memory[len(mem) :]
                ]
                self._memory = []
                self._mem_bytes = 0
                self._health = Health()
                self._degraded = False
                if rest:
                    self._queue_since = time.monotonic()
                self._queue = rest + self._queue
                self._cond.notify_all()
        log.warning("journal %s restored: %d memory record(s) now durable", self.path, len(mem))
        return True

    # ------------------------------------------------------------------ rewriting
    def raw_batches(self) -> Iterator[RawBatch]:
        """Every record in the file, verified but not decoded, in batches of consecutive lines.

        For copying records without decoding them (compaction): each :class:`RawBatch` holds the
        records' file offsets, sequence numbers and payload JSON bytes, checked in bulk. Records
        not yet written to the file are not included: call :meth:`sync_now` first.

        Raises:
            JournalCorruptError: a record fails its checks.
        """
        f, end, seed = self._open_for_raw()
        # The file is opened now, not when iteration starts: replace_contents() holds the I/O
        # lock while it consumes an iterator over it.
        return self._raw_iter(f, end, seed)

    def raw_at(self, offsets: Iterable[int]) -> Iterator[RawBatch]:
        """Re-read and verify, in batches, the records that start at ``offsets`` (ascending, as
        found in :attr:`RawBatch.offsets`).

        Raises:
            JournalCorruptError: no intact record starts at one of the offsets.
            UsageError: the offsets are not ascending or lie outside the records.
        """
        f, end, seed = self._open_for_raw()
        return self._raw_at(f, end, seed, offsets)

    def _open_for_raw(self) -> tuple[BinaryIO | None, int, int]:
        with self._io_lock, self._lock:
            end, seed = self._written, self._seed
            f = fs.open_read(self.path) if self._file_exists and end > self._header_len else None
        return f, end, seed

    def _raw_iter(self, f: BinaryIO | None, end: int, seed: int) -> Iterator[RawBatch]:
        if f is None:
            return
        with f:
            for block in read_lines(f, self._header_len, end, self.max_record_bytes + 256):
                if isinstance(block, Gap):
                    raise self._damage(block.offset, block.reason)
                yield self._raw_batch(block.offset, block.lines, seed)

    def _raw_batch(self, pos: int, lines: list[bytes], seed: int) -> RawBatch:
        """A block of lines (without newlines) that starts at ``pos``, verified."""
        return self._verified(line_offsets(pos, lines), lines, seed, 1)

    def _verified(self, offsets: list[int], lines: list[bytes], seed: int, tail: int) -> RawBatch:
        """Verify lines in bulk; line by line (naming the damage) only if that fails. ``tail`` is
        2 for lines that keep their newline, 1 for lines split without it."""
        checked = _bulk_check(lines, seed, tail)
        if checked is not None:
            seqs, commas = checked
            return RawBatch(offsets, seqs, list(_payload_slices(lines, commas, tail)))
        nl = b"\n" if tail == 1 else b""
        rows = [self._checked(o, line + nl, seed) for o, line in zip(offsets, lines, strict=True)]
        return RawBatch(offsets, [r[0] for r in rows], [r[1] for r in rows])

    def _checked(self, off: int, line: bytes, seed: int) -> tuple[int, bytes]:
        r = checked_record(line, seed) if line else "oversized record"
        if isinstance(r, str):
            raise self._damage(off, r)
        return r[0], r[2]

    def _damage(self, offset: int, reason: str) -> JournalCorruptError:
        return JournalCorruptError(
            f"journal damaged at offset {offset}: {reason}",
            path=self.path,
            offset=offset,
            reason=reason,
        )

    def _raw_at(
        self, f: BinaryIO | None, end: int, seed: int, offsets: Iterable[int]
    ) -> Iterator[RawBatch]:
        """One sequential pass of :func:`read_lines` from the first offset, keeping the lines
        that start at the wanted offsets (the one line reader, S10)."""
        wanted = iter(offsets)
        last = -1

        def next_offset() -> int | None:
            nonlocal last
            off = next(wanted, None)
            if off is None:
                return None
            if f is None or off <= last or off < self._header_len or off >= end:
                raise UsageError(f"{off} is not a record offset in ascending order")
            last = off
            return off

        try:
            nxt = next_offset()
            if nxt is None or f is None:
                return
            offs: list[int] = []
            lines: list[bytes] = []
            for block in read_lines(f, nxt, end, self.max_record_bytes + 256):
                if isinstance(block, Gap):
                    if block.offset <= nxt < block.offset + max(block.length, 1):
                        raise self._damage(nxt, block.reason)
                    continue
                pos = block.offset
                for line in block.lines:
                    if nxt is not None and nxt < pos:
                        raise self._damage(nxt, "no record starts at this offset")
                    if pos == nxt:
                        offs.append(pos)
                        lines.append(line)
                        nxt = next_offset()
                    pos += len(line) + 1
                if len(offs) >= 1024 or (nxt is None and offs):
                    yield self._verified(offs, lines, seed, 1)
                    offs, lines = [], []
                if nxt is None:
                    return
            if offs:
                yield self._verified(offs, lines, seed, 1)
            if nxt is not None:
                raise self._damage(nxt, "no record starts at this offset")
        finally:
            if f is not None:
                f.close()

    def replace_contents(
        self, payloads: Iterable[Any], first_seq: int | None = None, *, raw: bool = False
    ) -> int:
        """Atomically replace every record with ``payloads`` (compaction, S6).

        Writes a fresh file (temp file, fsync, rename over the journal, directory fsync): at every
        instant either the old or the new file is the journal. The new records are numbered from
        ``first_seq`` (default: the next sequence number, so numbers never repeat). With
        ``raw=True`` the payloads are JSON bytes already (for example from :meth:`raw_at`)
        and are copied as they are. The caller must not append concurrently.

        Returns:
            How many records the new file holds.

        Raises:
            StorageDegradedError: the journal is degraded, or the disk refused the rewrite (the
                old file is then still the journal).
            UsageError: the journal is closed, appends are in progress, or ``first_seq`` < 0.
        """
        self.sync_now()
        with self._io_lock:
            with self._lock:
                if self._closed:
                    raise UsageError("journal is closed")
                if self._degraded:
                    raise StorageDegradedError(
                        "cannot rewrite a degraded journal",
                        path=self.path,
                        op="rewrite",
                        errno=self._health.errno,
                    )
                if self._queue:
                    raise UsageError("replace_contents() while appends are in progress")
                first = self._next_seq if first_seq is None else first_seq
            if first < 0:
                raise UsageError(f"first_seq must be >= 0, got {first}")
            count = [0]

            def numbered() -> Iterator[tuple[int, int, bytes]]:
                for p in payloads:
                    data = p if raw else orjson.dumps(p)
                    if len(data) > self.max_record_bytes:
                        raise RecordTooLargeError(
                            f"record of {len(data)} bytes exceeds max_record_bytes",
                            size=len(data),
                            limit=self.max_record_bytes,
                        )
                    yield first + count[0], first - 1, data
                    count[0] += 1

            try:
                self._rewrite(Header(new_salt(), first), numbered(), [])
            except OSError as e:
                raise StorageDegradedError(
                    f"rewrite failed: {e.strerror or e}",
                    path=self.path,
                    op="rewrite",
                    errno=e.errno,
                ) from e
            with self._lock:
                self._next_seq = first + count[0]
                self._durable_seq = self._next_seq - 1
        return count[0]

    # ------------------------------------------------------------------ reading
    def records(self, from_seq: int = 0) -> Iterator[Record]:
        """Iterate every record with ``seq >= from_seq``, verifying each checksum.

        Includes records not yet durable (queued, or memory-only while degraded), in order.

        Raises:
            JournalCorruptError: a record in the file fails its checks while being read.
        """
        with self._io_lock, self._lock:
            if self._closed:
                raise UsageError("journal is closed")
            if self._health.ok:
                end, tail = self._written, list(self._queue)
            else:
                end, tail = self._synced, list(self._memory)
            seed = self._seed
            f = fs.open_read(self.path) if self._file_exists and end > self._header_len else None
        return self._iter(f, end, seed, tail, from_seq)

    def _iter(
        self,
        f: Any,
        end: int,
        seed: int,
        tail: list[tuple[int, bytes]],
        from_seq: int,
    ) -> Iterator[Record]:
        parts: list[Iterable[Record]] = []
        if f is not None:
            chunks = self._chunks(f, end, seed, from_seq)
            parts.append(chain.from_iterable(map(_as_records, chunks)))
        parts.append(
            Record(seq, orjson.loads(payload_of(line))) for seq, line in tail if seq >= from_seq
        )
        return chain.from_iterable(parts)

    def _chunks(
        self, f: Any, end: int, seed: int, from_seq: int
    ) -> Iterator[Iterable[tuple[int, Any]]]:
        with f:
            try:
                yield from read_chunks(
                    f,
                    seed,
                    self._header_len,
                    end,
                    from_seq,
                    self._header.holes,
                    max_line=self.max_record_bytes + 256,
                )
            except ReadDamage as d:
                raise self._damage(d.offset, d.reason) from None

    # --------------------------------------------------------------- properties
    @property
    def next_seq(self) -> int:
        """The sequence number the next append will take."""
        return self._next_seq

    @property
    def durable_seq(self) -> int:
        """The highest sequence number covered by a successful fsync (-1 if none yet this open)."""
        return self._durable_seq

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Flush, fsync (unless ``never``), stop the flusher and release the lock.

        If the journal is degraded it tries :meth:`try_restore` once first.

        Raises:
            NotDurableError: memory-only records could not be written; they are lost with the
                process unless the caller saved them (``pending`` says how many).
        """
        with self._lock:
            if self._closed:
                return
        with self._io_lock:
            if self._filesystem_gone():
                if self._owned.shadowed():
                    raise UsageError(
                        "the filesystem this journal was opened on is shadowed now (pyfakefs "
                        "installed, or routing calls to the real os): close it outside that window",
                        path=self.path,
                    )
                return
        self._flush(sync=self.sync != "never")
        if not self.health.ok:
            self.try_restore()
            self._flush(sync=self.sync != "never")
        with self._lock:
            self._closed = True
            self._cond.notify_all()
            pending = len(self._memory)
            lost = f" (seq {self._memory[0][0]}..{self._memory[-1][0]})" if pending else ""
            health = self._health
        if self._flusher is not None:
            self._flusher.join()
        with self._io_lock:
            self._owned.release()
        resources.unregister(self)
        if pending:
            raise NotDurableError(
                f"journal closed with {pending} record(s) held only in memory{lost}",
                path=self.path,
                op=health.op,
                errno=health.errno,
                pending=pending,
            )

    def _filesystem_gone(self) -> bool:
        """Called with ``_io_lock`` held: True when this journal must not touch its descriptors.

        That is when the fs seam calls into another filesystem than the one the journal was opened
        on: a fake one that is gone (the journal is then abandoned for good), or a fake one that
        shadows the real one for a while (a pyfakefs test running beside a journal on real files:
        the journal waits until the real filesystem is back).
        """
        if fs.reaches(self._owned.filesystem):
            return False
        if self._owned.shadowed():
            return True  # for a while, not gone
        with self._lock:
            if not self._closed:
                log.warning(
                    "journal %s: the filesystem it was opened on is gone (a fake filesystem torn "
                    "down while the journal was open?); abandoned without touching its "
                    "descriptors, %d record(s) not written",
                    self.path,
                    len(self._queue) + len(self._memory),
                )
            self._closed = True
            self._queue, self._memory, self._unsynced = [], [], []
            self._cond.notify_all()
        self._owned.release()  # forgets both: they are of the gone filesystem
        resources.unregister(self)
        return True

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            try:
                self.close()
            except NotDurableError as e:
                log.error("%s", e)

    def __repr__(self) -> str:
        return (
            f"<Journal {self.path!r} sync={self.sync} next_seq={self._next_seq} "
            f"durable_seq={self._durable_seq} health={self._health!r}>"
        )


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
            raise JournalCorruptError(
                f"journal damaged at offset {d.offset}: {d.reason}",
                path=p,
                offset=d.offset,
                reason=d.reason,
            ) from None


_OPEN_TOKEN = object()
_crc32 = zlib.crc32
_receipt = tuple.__new__


def _as_records(rows: Iterable[tuple[int, Any]]) -> Iterator[Record]:
    return map(_receipt, repeat(Record), rows)
