"""A journal's file and what it holds: its state (guarded by two locks), its descriptor and
writer locks (one writer at a time, even when its lock file is deleted), a view of its records
to read back (:mod:`.reader`), and the rewrite that replaces it whole (:mod:`.rewrite`).
:class:`~.journal.Journal` builds on it: the write path there, the memory fallback in
:mod:`.degraded`.

Locks: ``_lock`` (with ``_cond``) guards the queue, the memory records, health and sequence
numbers; ``_io_lock`` guards the descriptor and the file offsets. Take ``_io_lock`` first.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

import filelock
import orjson

from ..errors import LockHeldError, RecordTooLargeError, StorageDegradedError, UsageError
from . import fs, resources, rewrite
from .format import Header, frame_record, new_salt, payload_of
from .health import Health, Record, RecoveryReport
from .reader import FileView
from .scan import RawBatch

__all__ = ["JournalFile"]

log = logging.getLogger("durable_dispatch.journal")

#: Only :meth:`~.journal.Journal.open` makes a journal.
OPEN_TOKEN = object()


def _hostname() -> str:
    import socket

    return socket.gethostname()


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
        fs.let_go(fds, self.filesystem)
        if not fs.reaches(self.filesystem):
            if flock is not None:
                resources.disown_lock(flock)
            return
        if flock is not None:
            try:
                flock.release()
            except OSError:
                pass


class JournalFile:
    """The state and the file of a :class:`~.journal.Journal` (see the module docs)."""

    def __init__(self, path: str, *, _token: object = None, **kw: Any) -> None:
        if _token is not OPEN_TOKEN:
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
        # a file this open created whose directory entry no fsync covers yet (dir_sync=False):
        # the next fsync of the file does the directory's too, before anything counts durable
        self._dir_pending = False
        #: a directory fsync running beside (Journal.directory_sync_beside): True once it did
        self._dir_beside: Callable[[], bool] | None = None
        self._dir_sync = True  # Journal.open(dir_sync=...)
        self._earlier_synced: Callable[[str], bool] | None = None  # Journal.open(earlier_synced=)
        self.recovery = RecoveryReport(mode=kw["recovery"])
        #: checked before each flush: the owner claim of the state directory (S13), or None
        self._guard: Callable[[], None] | None = None
        #: set once the guard said another master owns the directory: nothing is written again
        self._fenced: LockHeldError | None = None
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

    def _take_lock(self, timeout: float) -> None:
        lock = filelock.FileLock(
            self.path + ".lock", timeout=timeout, mode=0o600, thread_local=False
        )
        try:
            fs.check_fault("open", lock.lock_file)  # filelock creates it, outside the seam
            lock.acquire()
        except filelock.Timeout:
            pid = fs.flock_holder(self.path + ".lock")
            raise LockHeldError(
                "another writer holds this journal's lock"
                + (f": pid {pid} on this host" if pid is not None else ""),
                path=self.path + ".lock",
                host=_hostname() if pid is not None else None,
                pid=pid,
            ) from None
        self._flock = lock

    def _lock_inode(self, exists: bool | None = None) -> None:
        """Lock the journal file itself (S12), after its lock file: an operator who deletes or
        replaces ``<path>.lock`` under a running writer lets a second one take the lock file, but
        never this lock. A rewrite moves it to the new file before renaming it into place. A
        state directory's master takes no ``<path>.lock`` (``directory_claim``): this lock is
        then what refuses a journal opened alone on its file. ``exists``: whether the file was
        there a moment ago (a hint that spares a lookup; None: unknown)."""
        try:
            self._owned.inode_lock = fs.lock_file(self.path, self._file_mode, exists=exists)
        except BlockingIOError:
            pid = fs.flock_holder(self.path)
            raise LockHeldError(
                "another writer holds this journal (a state directory's master, or a writer "
                "whose lock file was deleted or replaced under it)"
                + (f": pid {pid} on this host" if pid is not None else ""),
                path=self.path,
                host=_hostname() if pid is not None else None,
                pid=pid,
            ) from None

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
        seed = hdr.seed
        head = hdr.frame()
        prefix_end = [0]

        def chunks() -> Iterator[bytes]:
            chunk: list[bytes] = [head]
            pending, total, last = len(head), 0, -1
            for seq, mark, payload in durable:
                chunk.append(frame_record(seed, seq, mark, payload))
                pending += len(chunk[-1])
                last = seq
                if pending >= 1 << 18:
                    yield b"".join(chunk)
                    total += pending
                    chunk, pending = [], 0
            prefix_end[0] = total + pending
            chunk += [frame_record(seed, q, last, payload_of(line)) for q, line in extra]
            yield b"".join(chunk)

        tmp = f"{self.path}.rewrite-{new_salt()}.tmp"
        done = rewrite.replace_file(
            self.path, tmp, chunks(), self._file_mode, keep_open=True, lock=True, sync_dir=False
        )
        fd, inode_lock, size = done
        assert fd is not None
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
        self._written = self._synced = prefix_end[0]
        try:
            fs.fsync_dir(self._dir)
            self._dir_pending = False
        except BaseException:
            try:
                fs.close(fd)
            except OSError:
                pass
            raise
        self._fd = fd
        self._written = self._synced = size

    # ------------------------------------------------------------------ rewriting
    def replace_contents(
        self, payloads: Iterable[Any], first_seq: int | None = None, *, raw: bool = False
    ) -> int:
        """Atomically replace every record with ``payloads`` (compaction: the old or the
        new file is whole at every instant).

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

    if TYPE_CHECKING:  # the write path (Journal) provides it

        def sync_now(self) -> int: ...

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

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self) -> None:
        """Close the journal: :meth:`~.journal.Journal.close` (it flushes first)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ reading
    def raw_batches(self) -> Iterator[RawBatch]:
        """Every record in the file, verified but not decoded, in batches of consecutive lines.

        For copying records without decoding them (compaction): each :class:`RawBatch` holds the
        records' file offsets, sequence numbers and payload JSON bytes, checked in bulk. Records
        not yet written to the file are not included: call :meth:`sync_now` first.

        Raises:
            JournalCorruptError: a record fails its checks.
        """
        f, view = self._open_for_raw()
        # The file is opened now, not when iteration starts: replace_contents() holds the I/O
        # lock while it consumes an iterator over it.
        return view.raw_batches(f)

    def raw_at(self, offsets: Iterable[int]) -> Iterator[RawBatch]:
        """Re-read and verify, in batches, the records that start at ``offsets`` (ascending, as
        found in :attr:`RawBatch.offsets`).

        Raises:
            JournalCorruptError: no intact record starts at one of the offsets.
            UsageError: the offsets are not ascending or lie outside the records.
        """
        f, view = self._open_for_raw()
        return view.raw_at(f, offsets)

    def _open_for_raw(self) -> tuple[BinaryIO | None, FileView]:
        with self._io_lock, self._lock:
            view = self._view(self._written)
            f = fs.open_read(self.path) if self._file_exists and view.end > view.start else None
        return f, view

    def _view(self, end: int) -> FileView:
        """The file's records up to ``end``, to read (with the locks held, or before sharing)."""
        return FileView(
            self.path,
            self._header_len,
            end,
            self._seed,
            self.max_record_bytes + 256,
            self._header.holes,
        )

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
            view = self._view(end)
            f = fs.open_read(self.path) if self._file_exists and end > self._header_len else None
        return view.records(f, tail, from_seq)
