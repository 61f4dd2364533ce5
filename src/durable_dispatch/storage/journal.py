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

Honest degradation. When a write or fsync fails the journal never trusts that descriptor
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

import logging
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import orjson

from ..errors import (
    JournalVersionError,
    LockHeldError,
    NotDurableError,
    RecordEncodeError,
    RecordTooLargeError,
    StorageError,
    UsageError,
)
from . import fs, owner, resources
from .degraded import Degradation
from .format import Header, frame_record, new_salt
from .health import Health, HealthState, Receipt, Record, RecoveryReport
from .journal_file import OPEN_TOKEN
from .reader import read_journal
from .recovery import (
    CUT,
    RECOVERY_MODES,
    RESTART,
    SALVAGE,
    nothing_to_lose,
    plan_recovery,
    refuse_unsafe_path,
    save_side,
)
from .scan import Damage, RawBatch, scan

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


class _Degraded(Exception):
    """Internal: an open-time step failed with a degradable errno."""

    def __init__(self, op: str, err: OSError) -> None:
        super().__init__(op)
        self.op = op
        self.err = err


class Journal(Degradation):
    """An append-only, checksummed JSON Lines journal with one writer process.

    Open with :meth:`Journal.open`; use as a context manager or call :meth:`close`.
    """

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
        dir_sync: bool = True,
        directory_claim: owner.OwnerClaim | None = None,
        earlier_synced: Callable[[str], bool] | None = None,
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
            dir_sync: False: a file this open creates is not fsynced yet, nor its directory: the
                journal's first fsync of a record covers its header too, and then fsyncs the
                directory (before anything counts as durable), or waits for the caller's fsync
                of it (:meth:`directory_sync_beside`: one directory fsync for several journals
                created together). A crash before that first fsync
                leaves no file, an empty one or a torn header, each of which the next open
                takes for a new journal (no record was durable, so none is lost).
            directory_claim: the owner claim of the state directory the journal is in,
                held by this process together with that directory's master lock: what a
                state directory's master passes (``CampaignState.open``). The journal then
                takes no ``<path>.lock`` of its own (the directory's lock already keeps every
                other writer out of it, and a journal opened alone on the same file is still
                refused by the lock on the file itself) and checks this claim before each
                flush. Without it (a journal used alone) the journal takes its own lock file.
            earlier_synced: for a caller that fsyncs the existing file beside the open, once
                it holds the file's writers out (the journals of a state directory at once,
                :func:`fs.fsync_path`): called with the path where the open would fsync what
                an earlier process left unsynced, in a file the open neither cut nor
                rewrote. It returns True once that fsync ended (the open then does not fsync
                the file again), False if it made none (the open fsyncs it), or raises what
                that fsync raised (as the open's own fsync would have: never retried, since a
                second fsync after a failed one may report success for lost data).

        Returns:
            The open journal; ``journal.recovery`` reports what opening found and did, and
            ``journal.health`` is ``DEGRADED`` if the disk refused to let it start on disk.

        Raises:
            UsageError: an unknown sync policy or recovery mode, or a non-positive bound.
            LockHeldError: another writer holds ``<path>.lock`` or the file itself (for
                a state directory's master, which takes no ``<path>.lock`` for its journals).
            JournalCorruptError: damage the recovery mode does not repair (offset included).
            JournalVersionError: the file is of a format version this library does not read.
            StorageError: the OS refused with a non-disk error (permission denied, not a file ...),
                or the disk refused (EROFS, ENOSPC, EDQUOT, EIO) before the existing file was read,
                verified and repaired, for example its lock file could not be created, or the
                copy of damaged bytes to their side file failed: the journal is left as it was.
                A disk that refuses only after that, or when no file exists yet, starts
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
            _token=OPEN_TOKEN,
            sync=sync,
            recovery=recovery,
            max_record_bytes=max_record_bytes,
            batch_max_records=batch_max_records,
            batch_max_delay=float(batch_max_delay),
            max_memory_bytes=max_memory_bytes,
            mode=mode,
        )
        j._dir_sync = dir_sync
        j._earlier_synced = earlier_synced
        j._start(recovery, lock_timeout, visit, directory_claim)
        resources.register(j)
        return j

    def _start(
        self,
        recovery: str,
        lock_timeout: float,
        visit: Callable[[RawBatch], None] | None = None,
        claim: owner.OwnerClaim | None = None,
    ) -> None:
        try:
            try:
                held = claim is not None and os.path.abspath(claim.directory) == self._dir
                listing = claim.listing if claim is not None and held else None
                if listing is not None and os.path.basename(self.path) not in listing:
                    exists = False  # nothing there when the claim listed the directory
                else:
                    exists = refuse_unsafe_path(self.path)
                if not exists and not held and not os.path.isdir(self._dir):
                    fs.makedirs(self._dir)
                if claim is not None and held:
                    self._guard = claim.check  # S13: before each flush
                else:
                    self._take_lock(lock_timeout)
                try:
                    self._lock_inode(exists)
                except FileExistsError:  # it appeared since: what is it?
                    self._lock_inode(refuse_unsafe_path(self.path))
                if self._guard is None:
                    self._guard = owner.guard_for(self.path)  # S13: before each flush
                self._recover_and_open(recovery, visit)
            except StorageError:
                raise
            except OSError as e:
                # S9: the disk may refuse and the journal start degraded only once the existing
                # file was read, verified and repaired (its records are then known and kept), or
                # when there is no file to lose. Before that, fail closed: a typed error, and
                # nothing was changed.
                if not fs.is_degradable(e) or not (self._file_read or nothing_to_lose(self.path)):
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

    def _recover_and_open(self, mode: str, visit: Callable[[RawBatch], None] | None = None) -> None:
        # The file the lock is on is the journal (lock_file checked it names the path): its size
        # now, without another lookup of the path.
        assert self._owned.inode_lock is not None
        size = os.fstat(self._owned.inode_lock).st_size
        self._file_exists = True
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
            plan = plan_recovery(res, mode, self.path)
            if plan.action == RESTART:
                side = save_side(self.path, 0, size, self._file_mode)
                self._written = self._synced = 0
                fs.truncate(self.path, 0)
                cut_offset, created = 0, True
            else:
                assert res.header is not None
                self._header = res.header
                self._seed = res.header.seed
                records = res.prefix_records
                self._next_seq = res.prefix_next_seq
                if plan.action == SALVAGE:
                    side = self._salvage(res, size)
                    records = res.records
                    self._next_seq = res.next_seq
                elif plan.action == CUT:
                    side = save_side(self.path, plan.offset, size, self._file_mode)
                    fs.truncate(self.path, plan.offset)
                    cut_offset = plan.offset
            if side is not None:
                log.warning(
                    "journal %s: recovery %s dropped %d damaged span(s) starting at offset %d; "
                    "bytes saved to %s",
                    self.path,
                    mode,
                    len(damage),
                    damage[0].offset,
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
            if self._dir_sync:
                fs.fsync(fd)
                fs.fsync_dir(self._dir)
            else:  # the first fsync of a record covers the header, then the directory entry
                self._dir_pending = True  # (unless the caller fsynced the directory)
            self._written = self._synced = self._header_len = len(hdr)
            self._durable_seq = self._next_seq - 1
            return
        elif self._fd is None:
            self._fd = fs.open_append(self.path, self._file_mode)
            # Whatever an earlier process left unsynced becomes durable (or fails) here, or
            # did beside (the file as it was: nothing cut)
            synced = self._earlier_synced
            if cut_offset is not None or synced is None or not synced(self.path):
                fs.fsync(self._fd)
        self._durable_seq = self._next_seq - 1

    def _salvage(self, res: Any, size: int) -> str:
        """skip-corrupted: save the whole file aside, rewrite it with the intact records only."""
        side = save_side(self.path, 0, size, self._file_mode)
        holes = tuple(sorted(set(self._header.holes) | set(res.holes)))
        hdr = Header(new_salt(), self._header.first_seq, holes)
        self._rewrite(hdr, self._view(size).intact_lines(strict=False), [])
        return side

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
            LockHeldError: another master claimed the state directory: nothing is written
                from then on (the journal is fenced; close it).
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
            if self._fenced is not None:
                raise self._fenced
            seq = self._next_seq
            # Frame now: the orjson buffer is dropped at once, and the durable mark is the
            # conservative "known durable at append time".
            line = frame_record(self._seed, seq, self._durable_seq, data)
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
                n = len(queue)
                if n >= self._batch_max:
                    if n == self._batch_max:
                        # A full batch: wake the flusher once (a flusher busy with the last
                        # batch finds this one full when it looks again).
                        self._cond.notify_all()
                    # Back-pressure: never let the queue run far ahead of the disk.
                    while (
                        len(self._queue) >= 8 * self._batch_max
                        and not self._degraded
                        and self._fenced is None
                    ):
                        self._cond.wait(0.05)
                return _receipt(Receipt, (seq, False))
        self._flush(sync=self.sync == "always")
        with self._lock:
            if self._fenced is not None:
                raise self._fenced  # another master owns the directory: not written (S13)
            return Receipt(seq, self.sync == "always" and self._durable_seq >= seq)

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
                if self._fenced is not None:
                    raise self._fenced
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

    def directory_sync_beside(self, synced: Callable[[], bool]) -> None:
        """The caller fsyncs this journal's directory beside (one fsync for several journals an
        open created): the journal's first fsync waits for it, ``synced()`` returning
        True once it did (False: it failed, and the journal fsyncs the directory itself),
        instead of fsyncing the directory itself. ``synced`` is called without this journal's
        locks held by the directory fsync's side, and may be called more than once."""
        with self._io_lock:
            if self._dir_pending:
                self._dir_beside = synced

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
                if self._degraded or self._fenced is not None:
                    return True  # the caller sees the health, or the fence
                if self._fd is None:
                    return False
            if self._guard is not None and (self._queue or (sync and self._unsynced)):
                # S13: another master may have claimed the directory: never write after it.
                try:
                    self._guard()
                except LockHeldError as e:
                    with self._lock:
                        self._fenced = e
                        self._cond.notify_all()
                    return True
            with self._lock:
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
                    if self._dir_pending:  # a new file: its entry is durable first (S1)
                        beside = self._dir_beside
                        if beside is None or not beside():
                            fs.fsync_dir(self._dir)
                        self._dir_pending, self._dir_beside = False, None
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
                    if self._queue and self._health.ok and self._fenced is None:
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

    # --------------------------------------------------------------- properties
    @property
    def next_seq(self) -> int:
        """The sequence number the next append will take."""
        return self._next_seq

    @property
    def durable_seq(self) -> int:
        """The highest sequence number covered by a successful fsync (-1 if none yet this open)."""
        return self._durable_seq

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
        if not self.health.ok and self._fenced is None:
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
        if self._fenced is not None:
            raise self._fenced  # what was appended after it was not written (S13)
        if pending:
            raise NotDurableError(
                f"journal closed with {pending} record(s) held only in memory{lost}",
                path=self.path,
                op=health.op,
                errno=health.errno,
                pending=pending,
            )

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


_receipt = tuple.__new__
