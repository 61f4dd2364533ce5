"""Honest degradation: when a write or fsync fails the journal never trusts that descriptor
again. Every record since the last good fsync moves to a bounded list in memory, ``health``
turns ``DEGRADED``, and new appends go to memory with ``durable=False`` receipts.
:meth:`Degradation.try_restore` writes the durable prefix and the memory records to a fresh file
(:mod:`.rewrite`); only then are they durable and the health ``OK`` again.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator

from ..errors import MemoryBoundError
from . import fs
from .format import Header, frame_record, new_salt, payload_of
from .health import Health, HealthState
from .journal_file import JournalFile
from .recovery import nothing_to_lose

__all__ = ["Degradation"]

log = logging.getLogger("durable_dispatch.journal")


class Degradation(JournalFile):
    """The memory fallback of a :class:`~.journal.Journal` (see the module docs)."""

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
    def healthy(self) -> bool:
        """``health.ok`` without taking the lock: a read of one flag that changes with the
        health (the master asks it for every task)."""
        return not self._degraded

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
                if self._fenced is not None:
                    return False  # another master owns the directory now (S13)
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
                    if not self._file_read and not nothing_to_lose(self.path):
                        # A journal appeared at the path meanwhile, unread by this one: never
                        # replace it (S9). Stay degraded; the caller sees it in health.
                        raise OSError(
                            errno.EEXIST,
                            "a journal this one never read is now at the path",
                            self.path,
                        )
                if self._synced > self._header_len and self._file_exists:
                    prefix: Iterator[tuple[int, int, bytes]] = self._view(
                        self._synced
                    ).intact_lines(strict=True)
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
