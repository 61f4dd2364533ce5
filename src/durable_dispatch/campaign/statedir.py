"""A state directory on disk: its file names, how to recognise one, and its master lock.

The ground floor under replay, state, results and admin (each used to keep a part of this and
import the others' part back, which made a circle). A state directory holds the snapshots
``campaign.<generation>.snap``, the state journal ``events.jsonl``, the submissions store
``submissions.jsonl``, the results journal ``results.jsonl``, the defer journal, the master's
live statistics ``master-stats.<generation>.snap`` and the master lock ``master.lock``.

One master at a time, even when the lock file is deleted: a master holds a ``flock`` on
``master.lock`` (the lock filelock takes) and one on its state journal file itself, so an operator
who deletes the lock file does not let a second master in. Where locks do not lock (Lustre's
``localflock`` seen from two nodes, NFS without a lock daemon), the owner record
``master.owner.<generation>`` keeps one writer (:mod:`.storage.owner`): it is claimed after the
``flock``, checked before each flush, and names the owner's host and pid in every refusal. Offline
operations take the same lock and claim; read-only ones only test them (:func:`_master_running`),
creating and changing nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

from ..errors import LockHeldError, StorageError
from ..storage import fs as _fs
from ..storage import owner as _owner
from ..storage.background import Beside

__all__ = [
    "STATE_JOURNAL",
    "SUBMISSIONS",
    "SUBMIT_CHUNK",
    "SUBMISSION_RECORD_BYTES",
    "SNAPSHOT_NAME",
    "LIVE_STATS_NAME",
    "LOCK_NAME",
    "RESULTS_JOURNAL",
    "RESULT_RECORD_BYTES",
    "OUTPUTS_JOURNAL",
    "OUTPUT_RECORD_BYTES",
    "is_state_dir",
]

STATE_JOURNAL = "events.jsonl"
#: The submissions store: every submitted item, payload included, once (``{"first": index,
#: "items": [...]}`` per record); snapshots and the state journal name items by index.
SUBMISSIONS = "submissions.jsonl"
#: Items per submissions store record (and per stored ``submitted`` record of the state journal).
SUBMIT_CHUNK = 512
#: A submissions store record's bound, as the state journal's by default (a record holds up to
#: 512 items and is split while larger; a single item beyond it is refused, as it always was).
SUBMISSION_RECORD_BYTES = 1 << 20
SNAPSHOT_NAME = "campaign"
#: the master's live statistics: ``master-stats.<generation>.snap`` (see ``CampaignState.tick``)
LIVE_STATS_NAME = "master-stats"
LOCK_NAME = "master.lock"
#: A results journal record's bound: a committed record and its sequence number, with room for
#: a state journal opened with a larger ``max_record_bytes``.
RESULT_RECORD_BYTES = 16 << 20
#: The outputs journal: each item's output, with isolation (:mod:`.outputs`).
OUTPUTS_JOURNAL = "outputs.jsonl"
#: An outputs journal record's bound: an item's two 64 KiB tails, escaped as JSON text.
OUTPUT_RECORD_BYTES = 1 << 20
#: The results journal's file name in a state directory.
RESULTS_JOURNAL = "results.jsonl"


def is_state_dir(directory: str | os.PathLike[str]) -> bool:
    """True when ``directory`` looks like a campaign state directory."""
    d = os.fspath(directory)
    return os.path.isdir(d) and (
        os.path.exists(os.path.join(d, STATE_JOURNAL))
        or any(n.startswith(SNAPSHOT_NAME + ".") and n.endswith(".snap") for n in os.listdir(d))
    )


def _master_running(d: str) -> bool:
    """True when a master holds ``d``; creates and changes nothing (S10).

    A master holds a ``flock`` on ``master.lock`` (the lock filelock takes) and one on its state
    journal file itself (S12, which holds when an operator deleted the lock file). A shared,
    non-blocking ``flock`` on a read-only descriptor fails exactly while a writer holds either.
    Where locks do not lock, its owner record says so (S13: a process that runs, on this host;
    a heartbeat younger than the dead-owner bound, on another).
    """
    if any(_locked(os.path.join(d, name)) for name in (LOCK_NAME, STATE_JOURNAL)):
        return True
    return _owner.running_owner(d) is not None


def _holder(d: str, path: str) -> tuple[str | None, int | None]:
    """Who holds the lock at ``path`` of state directory ``d``: the owner record's host and pid,
    or the pid of the ``flock`` holder on this host (``/proc/locks``), or (None, None)."""
    o = _owner.read_owner(d)
    if o is not None and not o.released:
        return o.host, o.pid
    pid = _fs.flock_holder(path)
    return (_owner.hostname(), pid) if pid is not None else (None, None)


def _locked(path: str) -> bool:
    """True when another open file holds an exclusive ``flock`` on ``path`` (never created)."""
    import fcntl

    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also lets go of the shared flock
    return False


class _FileLock:
    """An exclusive ``flock`` on a lock file, held by a descriptor of it (:func:`fs.lock_file`:
    the same lock filelock takes, so a master of an earlier version and this one exclude each
    other; without filelock's ``chmod`` and lookups, each a metadata operation on a slow mount).
    """

    def __init__(self, path: str, fd: int) -> None:
        self.lock_file = path
        self.fd: int | None = fd
        self.filesystem = _fs.filesystem()

    @property
    def is_locked(self) -> bool:
        """True while held."""
        return self.fd is not None

    def release(self) -> None:
        """Close the descriptor (which lets go of the lock); on a filesystem that is gone it is
        only forgotten, never closed (its number names another descriptor now)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            _fs.let_go([fd], self.filesystem)


class _MasterLock:
    """What a writer of a state directory holds: the ``flock`` on ``master.lock`` (S5) and the
    owner record's claim (S13). ``release()`` lets go of both."""

    def __init__(
        self,
        flock: _FileLock,
        claim: _owner.OwnerClaim,
        parent_sync: Beside[None] | None = None,
    ) -> None:
        self.flock = flock
        self.claim = claim
        self._parent_sync = parent_sync

    def parent_synced(self) -> None:
        """Return once the directory this lock's taking made (or found without a state
        journal) is durable in its parent: the parent's fsync runs beside the lock's file and
        the owner claim (issue 49: on a shared filesystem it costs what they cost) and is
        waited for here, before the open makes anything in it.

        Raises:
            StorageError: that fsync failed.
        """
        sync, self._parent_sync = self._parent_sync, None
        if sync is None:
            return
        try:
            sync.result()
        except OSError as e:
            raise StorageError(
                f"cannot make the new state directory durable: {e.strerror or e}",
                path=getattr(e, "filename", None),
                op="fsync",
                errno=e.errno,
            ) from e

    @property
    def lock_file(self) -> str:
        """The lock file's path."""
        return str(self.flock.lock_file)

    @property
    def is_locked(self) -> bool:
        """True while held."""
        return bool(self.flock.is_locked) and not self.claim.released

    def release(self) -> None:
        """Mark the owner record released, then release the ``flock`` (after the parent's
        fsync of a new directory, if still running: no thread outlives the lock; an interrupt
        of that wait is raised once both are released)."""
        sync, self._parent_sync = self._parent_sync, None
        interrupted = sync.wait() if sync is not None else None
        try:
            self.claim.release()
        finally:
            self.flock.release()
        if interrupted is not None:
            raise interrupted


def _take_master_lock(d: str, *, create: bool = False) -> _MasterLock:
    """Take state directory ``d``'s single-master lock (S5, S9) and claim its owner record
    (S13); ``create`` makes ``d`` first: the fsync of its parent that makes it durable runs
    beside the lock and the claim (issue 49), and :meth:`_MasterLock.parent_synced` waits for
    it (the open does, before it makes anything in ``d``).

    Raises:
        LockHeldError: another master holds it; ``host`` and ``pid`` name it when known.
        StorageError: the lock or the record cannot be created (nothing was changed).
    """
    parent_sync: list[Beside[None]] = []
    try:
        return _take(d, create, parent_sync)
    except BaseException:
        for sync in parent_sync:  # (its thread ends before the failure is raised)
            sync.wait()
        raise


def _take(d: str, create: bool, parent_sync: list[Beside[None]]) -> _MasterLock:
    path = os.path.join(d, LOCK_NAME)
    real: str | None = None
    try:
        # A directory this call made has no lock file yet: created at once, without a lookup.
        created = _fs.makedirs(d, sync_parent=False) if create else False
        if created:  # a directory, not a link: its real path is its parent's and its name
            parent_sync.append(_sync_parent(d))
            absolute = os.path.abspath(d)
            parent = os.path.realpath(os.path.dirname(absolute))
            real = os.path.join(parent, os.path.basename(absolute))
        lock = _FileLock(path, _fs.lock_file(path, 0o600, exists=not created))
    except BlockingIOError:
        host, pid = _holder(d, path)
        who = f": host {host}, pid {pid}" if pid is not None else ""
        raise LockHeldError(
            f"a master holds this state directory{who}", path=path, host=host, pid=pid
        ) from None
    except OSError as e:
        # S9: without the lock nothing is read, so nothing may be changed either.
        raise StorageError(
            f"cannot create or lock the state directory: {e.strerror or e}; nothing was changed",
            path=getattr(e, "filename", None) or path,
            op="lock",
            errno=e.errno,
        ) from e
    try:
        claim = _owner.claim(d, real_path=real)
    except OSError as e:
        lock.release()
        raise StorageError(
            f"cannot write the state directory's owner record: {e.strerror or e}; nothing was "
            "changed",
            path=getattr(e, "filename", None) or d,
            op="lock",
            errno=e.errno,
        ) from e
    except BaseException:
        lock.release()
        raise
    if create and not created and claim.listing is not None and STATE_JOURNAL not in claim.listing:
        # A directory with no state journal yet: made by hand (``mkdir``) or by an open that
        # failed before its parent's fsync ended; nothing says its entry is durable: fsync it.
        parent_sync.append(_sync_parent(d))
    return _MasterLock(lock, claim, parent_sync[0] if parent_sync else None)


def _sync_parent(d: str) -> Beside[None]:
    """The fsync of ``d``'s parent directory (what makes ``d`` durable), in a thread beside."""
    return Beside(partial(_fs.fsync_dir, os.path.dirname(os.path.abspath(d))), "fsync-new-dir")


@contextmanager
def _master_locked(directory: str | os.PathLike[str]) -> Iterator[str]:
    """Hold the master lock of ``directory`` for an offline operation; yields the path."""
    d = os.fspath(directory)
    lock = _take_master_lock(d)
    try:
        yield d
    finally:
        lock.release()
