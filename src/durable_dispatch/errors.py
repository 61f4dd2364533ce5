"""The whole exception hierarchy of durable-dispatch.

Every error the library raises on purpose derives from :class:`DurableDispatchError`, except two
builtins raised where the builtin is the right name (``TimeoutError`` from
``Journal.wait_durable(timeout=)``, ``FileNotFoundError`` when there is no ``mpiexec``). The tree
splits *caller misuse* (:class:`UsageError` and below) from *the world misbehaving*: data too
large for a record (:class:`RecordTooLargeError`), a corrupt file (:class:`CorruptionError` and
its subclasses), a disk that refuses writes (:class:`StorageError`), another process holding a
lock (:class:`LockHeldError`). ``docs/errors.md`` lists what raises each, when, and the test
that shows it.

Every error keeps the facts it is about as read-only attributes (``path``, ``offset``, ``rank``,
``errno`` ...), renders them in ``str()``, and pickles (errors cross MPI and process pipes): each
class stores its constructor arguments and rebuilds itself from them in ``__reduce__``.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "DurableDispatchError",
    "UsageError",
    "ConfigurationError",
    "IsolationError",
    "CorruptionError",
    "JournalCorruptError",
    "JournalVersionError",
    "SnapshotCorruptError",
    "ValueCorruptError",
    "RecordTooLargeError",
    "RecordEncodeError",
    "ChangedPayloadError",
    "CampaignMismatchError",
    "StorageError",
    "StorageDegradedError",
    "MemoryBoundError",
    "NotDurableError",
    "LockHeldError",
    "NoMasterError",
    "NoOutputError",
    "ProtocolError",
    "TaskFailed",
    "DependencyFailed",
    "TaskCrashed",
    "TaskTimedOut",
]


def _fmt_path(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else os.fspath(path)


class DurableDispatchError(Exception):
    """Root of every error this library raises on purpose.

    Catch this to handle any library failure; catch a subclass to handle one cause. Each instance
    keeps the keyword facts it was built with and pickles with them.
    """

    def __init__(self, message: str, **facts: Any) -> None:
        super().__init__(message)
        self._message = message
        self._facts = facts

    @property
    def message(self) -> str:
        """The human sentence, without the facts."""
        return self._message

    def __str__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self._facts.items() if v is not None)
        return f"{self._message} ({shown})" if shown else self._message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._message, self._facts))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


def _rebuild(cls: type[DurableDispatchError], message: str, facts: dict[str, Any]) -> Any:
    err = cls.__new__(cls)
    DurableDispatchError.__init__(err, message, **facts)
    return err


class UsageError(DurableDispatchError, ValueError):
    """The caller used the API wrongly (a closed journal, an unknown sync policy, a bad argument).

    Fix the calling code; retrying will not help.
    """


class ConfigurationError(UsageError):
    """A configuration value cannot be used at all (as opposed to being clamped and reported).

    Attributes:
        name: the setting's name (for example an environment variable).
    """

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(message, name=name)

    @property
    def name(self) -> str | None:
        """The setting's name."""
        return self._facts.get("name")


class IsolationError(UsageError):
    """``run_worker(isolate=True)`` cannot run the work function in a child process: it cannot
    be found by name in a fresh interpreter (a lambda, a nested function), or the campaign
    script fails, or calls MPI, when the child imports it. Raised before the worker's first
    READY, so the job ends at once with the reason."""


class CorruptionError(DurableDispatchError):
    """A file on disk is damaged: its bytes do not pass the format's checks.

    Attributes:
        path: the file.
        offset: the byte offset of the first damage, when known.
        reason: what is wrong, in a few words.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        offset: int | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message, path=_fmt_path(path), offset=offset, reason=reason)

    @property
    def path(self) -> str | None:
        """The damaged file."""
        return self._facts.get("path")

    @property
    def offset(self) -> int | None:
        """Byte offset of the first damage, or None."""
        return self._facts.get("offset")

    @property
    def reason(self) -> str | None:
        """What is wrong, in a few words."""
        return self._facts.get("reason")


class JournalCorruptError(CorruptionError):
    """A journal has damage that the chosen recovery mode does not repair.

    Raised by ``Journal.open`` (for example damage before the tail under the default
    ``tolerate-torn-tail`` mode) and by readers that meet damage. Open again with
    ``recovery="point-in-time"`` or ``"skip-corrupted"`` to salvage; the dropped bytes are kept in a
    side file.
    """


class JournalVersionError(JournalCorruptError):
    """A journal was written in a format version this library does not read.

    Unlike other corruption no recovery mode touches such a file: upgrade the library instead.
    """


class SnapshotCorruptError(CorruptionError):
    """No snapshot generation in a store passed its checks (``SnapshotStore.load``).

    Raised only when every generation present is damaged; a damaged newest generation with a valid
    older one is a fallback, reported on the loaded snapshot, not an error.
    """


class ValueCorruptError(CorruptionError):
    """A stored pickle (a call or a result of ``durable_dispatch.futures``) whose HMAC tag does
    not verify with its state directory's secret, or whose side file is missing or altered.
    It was not unpickled: a forged or foreign state directory cannot run code here.
    Restore the directory from a copy you trust, or start a new one.
    """


class RecordTooLargeError(DurableDispatchError, ValueError):
    """An appended record is larger than the journal's ``max_record_bytes``. Nothing was written.

    Not a :class:`UsageError`: the data decides, not the call (a worker's result can be too
    large; the campaign state catches this and retries that item as ``result-too-large``).

    Attributes:
        size: the encoded size in bytes.
        limit: the journal's bound.
    """

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message, size=size, limit=limit)

    @property
    def size(self) -> int:
        """Encoded record size in bytes."""
        return self._facts["size"]  # type: ignore[no-any-return]

    @property
    def limit(self) -> int:
        """The journal's size bound in bytes."""
        return self._facts["limit"]  # type: ignore[no-any-return]


class RecordEncodeError(UsageError, TypeError):
    """An appended record cannot be encoded as JSON by orjson. Nothing was written."""


class ChangedPayloadError(UsageError):
    """A work ID the campaign knows (pending, in flight, committed or deferred) was submitted
    with another payload: a work ID names one payload. Nothing of that submission was
    added, and nothing has run with the stale payload because of it.

    Raised by ``CampaignState.submit`` and so by every way work arrives (a ``run_master``
    list or generator, a ``Feed``, the children an ``on_commit`` callback returns), also across
    a restart: payloads are compared by a digest of their JSON form (keys sorted), so the same
    payload rebuilt by a rerun is skipped silently as before. Unlike its neighbour
    :class:`UsageError` for a bad argument, the call was right and the *input* contradicts the
    record: give the changed item a new work ID (for example one that digests its payload), or
    start a new state directory.

    Attributes:
        work_id: the work ID submitted with another payload.
    """

    def __init__(self, message: str, *, work_id: str) -> None:
        super().__init__(message, work_id=work_id)

    @property
    def work_id(self) -> str:
        """The work ID submitted with another payload."""
        return self._facts["work_id"]  # type: ignore[no-any-return]


class CampaignMismatchError(UsageError):
    """A state directory that belongs to another campaign: ``run_master(...,
    campaign=)``, by default the main script's file name, differs from the name the state
    directory recorded. Raised before the state is opened: nothing was added.

    Attributes:
        path: the state directory.
        recorded: the campaign name it recorded.
        given: the name of this run.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        recorded: str | None = None,
        given: str | None = None,
    ) -> None:
        super().__init__(message, path=_fmt_path(path), recorded=recorded, given=given)

    @property
    def path(self) -> str | None:
        """The state directory."""
        return self._facts.get("path")

    @property
    def recorded(self) -> str | None:
        """The campaign name the state directory recorded."""
        return self._facts.get("recorded")

    @property
    def given(self) -> str | None:
        """The campaign name of the run that was refused."""
        return self._facts.get("given")


class StorageError(DurableDispatchError, OSError):
    """The operating system refused a file operation in a way the library cannot absorb.

    Raised at start-up for errors such as permission denied or a bad path, where falling back to
    memory would hide a configuration mistake. Attributes ``path``, ``op`` and ``errno``.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        op: str | None = None,
        errno: int | None = None,
        **extra: Any,
    ) -> None:
        DurableDispatchError.__init__(
            self, message, path=_fmt_path(path), op=op, errno=errno, **extra
        )
        self.args = (message,)

    @property
    def path(self) -> str | None:
        """The file the operation was about."""
        return self._facts.get("path")

    @property
    def op(self) -> str | None:
        """The fs-seam operation that failed (``open``, ``write``, ``fsync`` ...)."""
        return self._facts.get("op")

    @property
    def errno(self) -> int | None:
        """The OS error number, when there was one."""
        return self._facts.get("errno")

    @errno.setter
    def errno(self, value: int | None) -> None:
        # code that fills in an OSError's fields after building it (``e.errno = ...``)
        self._facts["errno"] = value

    @property
    def strerror(self) -> str | None:
        """The OS message for ``errno`` (or the one assigned)."""
        given = self._facts.get("strerror")
        if given is not None:
            return str(given)
        e = self.errno
        return os.strerror(e) if e is not None else None

    @strerror.setter
    def strerror(self, value: str | None) -> None:
        self._facts["strerror"] = value

    @property
    def filename(self) -> str | None:
        """Same as ``path`` (the ``OSError`` spelling)."""
        return self.path

    @filename.setter
    def filename(self, value: Any) -> None:
        self._facts["path"] = _fmt_path(value)


class StorageDegradedError(StorageError):
    """The storage is running from memory after a disk fault and cannot do what was asked.

    For example ``Journal.wait_durable`` for a record that is memory-only, or
    ``SnapshotStore.save`` when the disk refused the write. The data is not lost: it is held in
    memory (see ``health``); call ``try_restore()`` / save again once the disk is healthy.
    """

    @property
    def pending(self) -> int | None:
        """How many records are memory-only."""
        return self._facts.get("pending")


class MemoryBoundError(StorageDegradedError):
    """A degraded journal's memory buffer is full; the record was *not* accepted.

    The caller still owns the record: retry after ``try_restore()`` succeeds, or stop.
    """


class NotDurableError(StorageDegradedError):
    """Records were accepted but are not on disk, and the operation needed them to be.

    Raised by ``wait_durable`` for a memory-only sequence number and by ``close`` when memory-only
    records would be dropped; ``pending`` says how many.
    """


class LockHeldError(DurableDispatchError):
    """Another writer holds the lock of a journal or state directory.

    Attributes:
        path: the lock file (or the state directory, or its owner record).
        host: the host name of the process that holds it, when known (from the owner record).
        pid: that process's ID, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        super().__init__(message, path=_fmt_path(path), host=host, pid=pid)

    @property
    def path(self) -> str | None:
        """The lock file."""
        return self._facts.get("path")

    @property
    def host(self) -> str | None:
        """The holder's host name, when known."""
        return self._facts.get("host")

    @property
    def pid(self) -> int | None:
        """The holder's process ID, when known."""
        return self._facts.get("pid")


class NoMasterError(UsageError):
    """An operator's command that needs a running master (``drain``) found none: none was
    running, or the master ended between a check and the command. Nothing was written.

    Attributes:
        path: the state directory.
    """

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message, path=_fmt_path(path))

    @property
    def path(self) -> str | None:
        """The state directory."""
        return self._facts.get("path")


class NoOutputError(DurableDispatchError):
    """``durable-dispatch output`` found no kept output for a work item of the campaign, and says
    why: it ran without isolation (its prints went to the worker's standard output, the job's
    log), it has not run yet, its run printed nothing, or the outputs journal holds none for it
    (an earlier version, or a disk that refused it). An ID the campaign does not know is a
    :class:`UsageError` instead.

    Attributes:
        work_id: the item.
        path: the state directory.
    """

    def __init__(
        self,
        message: str,
        *,
        work_id: str | None = None,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(message, work_id=work_id, path=_fmt_path(path))

    @property
    def work_id(self) -> str | None:
        """The item."""
        return self._facts.get("work_id")

    @property
    def path(self) -> str | None:
        """The state directory."""
        return self._facts.get("path")


class ProtocolError(DurableDispatchError):
    """A peer (a worker rank) sent a message that breaks the protocol.

    Not raised by this version (kept so that code catching it keeps working): the master
    classifies every such message (stale, unowned, malformed, duplicate), counts it in
    ``DispatchStats`` and goes on, and a worker ignores a WORK message it cannot read. It
    carries ``rank`` and ``reason``.
    """

    def __init__(self, message: str, *, rank: int | None = None, reason: str | None = None) -> None:
        super().__init__(message, rank=rank, reason=reason)

    @property
    def rank(self) -> int | None:
        """The sending rank, when known."""
        return self._facts.get("rank")

    @property
    def reason(self) -> str | None:
        """What is wrong with the message."""
        return self._facts.get("reason")


class TaskFailed(DurableDispatchError):
    """A task of ``durable_dispatch.futures`` failed for a reason of its own process, not of its
    code, and its retries are spent: its future's ``exception()``. An exception ``fn`` raised is
    not this: it is re-raised as it was, as in the standard library.

    Attributes:
        work_id: the task's work ID.
        kind: the last failure's kind (``timeout``, ``crash``, ``result-too-large`` ...).
        attempts: how many times it was dispatched.
    """

    def __init__(
        self,
        message: str,
        *,
        work_id: str | None = None,
        kind: str | None = None,
        attempts: int | None = None,
    ) -> None:
        super().__init__(message, work_id=work_id, kind=kind, attempts=attempts)

    @property
    def work_id(self) -> str | None:
        """The task's work ID."""
        return self._facts.get("work_id")

    @property
    def kind(self) -> str | None:
        """The last failure's kind."""
        return self._facts.get("kind")

    @property
    def attempts(self) -> int | None:
        """How many times the task was dispatched."""
        return self._facts.get("attempts")


class TaskCrashed(TaskFailed):
    """The task's process died by a signal (a segfault, ``abort()``, the kernel's OOM killer)
    each time it ran (kind ``crash``; the message names the signal). Only its future fails."""


class DependencyFailed(TaskFailed):
    """A task of ``durable_dispatch.futures`` was given a future of the same executor as an
    argument, and that dependency failed (raised, crashed, timed out, or failed for a dependency
    of its own): the task never ran (kind ``dependency``). Its ``__cause__`` is the dependency's
    exception, as the dependency's own future raises it.

    Attributes:
        dependency: the work ID of the dependency that failed.
    """

    def __init__(
        self,
        message: str,
        *,
        work_id: str | None = None,
        kind: str | None = "dependency",
        attempts: int | None = None,
        dependency: str | None = None,
    ) -> None:
        DurableDispatchError.__init__(
            self, message, work_id=work_id, kind=kind, attempts=attempts, dependency=dependency
        )

    @property
    def dependency(self) -> str | None:
        """The work ID of the dependency that failed."""
        return self._facts.get("dependency")


class TaskTimedOut(TaskFailed):
    """The task ran past its ``task_timeout`` (or the watchdog's deadline) each time it ran and
    was killed (kind ``timeout``). Not a ``TimeoutError``: that one means a ``result(timeout)``
    wait ran out, while the task may still finish."""
