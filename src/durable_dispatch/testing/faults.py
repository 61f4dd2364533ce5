"""Fault injection on the fs seam: make chosen fs operations fail, on real files or under pyfakefs.

Every durable write of this library goes through one module (the fs seam,
``durable_dispatch.storage.fs``). These helpers install a hook there that raises ``OSError`` with a
chosen errno for chosen operations, paths and call numbers, until healed. Because the hook sits in
front of the real call, it works the same on real files and under pyfakefs's ``fs`` fixture. This
module stands on the storage layer only (it is below the core and the MPI shell); users import it
as :mod:`durable_dispatch.testing`.

Operations: ``open`` (file creation and opening for write, directory creation), ``write``,
``fsync``, ``dir-fsync``, ``replace``, ``close``, ``truncate``, ``unlink``, ``read``.
"""

from __future__ import annotations

import errno as _errno
import fnmatch
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ..errors import UsageError
from ..storage import fs as _fs

__all__ = [
    "FaultInjector",
    "FaultRule",
    "inject_faults",
    "read_only_filesystem",
    "disk_full",
    "MUTATING_OPERATIONS",
    "StorageLeftOpenWarning",
]

#: The operations a read-only filesystem refuses.
MUTATING_OPERATIONS = ("open", "write", "fsync", "replace", "truncate", "unlink")


class StorageLeftOpenWarning(UserWarning):
    """A test opened a journal or a campaign state and did not close it.

    Issued by the pytest plugin at that test's teardown, after it closed the object for the test
    (before pyfakefs, if used, tore down its fake filesystem). Close storage objects in the test,
    or open them with ``with``; ``-W error::durable_dispatch.testing.StorageLeftOpenWarning``
    makes the slip fail the test.
    """


@dataclass
class FaultRule:
    """One injected fault: which operation, on which paths, on which calls, with which errno.

    Attributes:
        op: an fs operation name (see the module docs) or ``"*"`` for all.
        errno: the error number raised (``errno.EIO`` by default).
        path: a glob matched against the full path and against its base name. A file keeps
            matching after the library replaced it whole (a journal's restore or compaction, a
            snapshot): the temporary copy written to replace it matches as the file it will
            become, and so does that copy's descriptor once renamed, so "the disk is gone for
            good" stays gone.
        nth: fail only the n-th matching call (1-based, counted from when the rule was added);
            None fails every matching call.
        from_nth: with ``nth``, keep failing every matching call from the n-th on.
        calls: how many matching calls the rule has seen.
        fired: how many times it raised.
    """

    op: str
    errno: int = _errno.EIO
    path: str = "*"
    nth: int | None = None
    from_nth: bool = False
    calls: int = 0
    fired: int = 0

    def matches(self, op: str, path: str) -> bool:
        """True when this rule is about ``op`` on ``path``."""
        if self.op != "*" and self.op != op:
            return False
        if self.path == "*" or self._glob(path):
            return True
        target = _fs.becomes(path)  # a copy written to replace a file: matched as that file
        return target is not None and self._glob(target)

    def _glob(self, path: str) -> bool:
        return fnmatch.fnmatch(path, self.path) or fnmatch.fnmatch(
            os.path.basename(path), self.path
        )


@dataclass
class FaultInjector:
    """A set of fault rules installed on the fs seam (use :func:`inject_faults` to make one).

    Attributes:
        rules: the active rules, checked in order (the first that fires wins).
        seen: how many calls of each operation went through the seam while installed.
        log: ``(op, path, errno)`` of every injected failure, in order.
    """

    rules: list[FaultRule] = field(default_factory=list)
    seen: Counter[str] = field(default_factory=Counter)
    log: list[tuple[str, str, int]] = field(default_factory=list)
    _previous: Any = None
    _installed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(
        self,
        op: str,
        err: int = _errno.EIO,
        *,
        path: str = "*",
        nth: int | None = None,
        from_nth: bool = False,
    ) -> FaultRule:
        """Make ``op`` fail with ``err`` (every call, the ``nth`` call, or from the ``nth`` on).

        Returns:
            The rule (its ``calls`` and ``fired`` counters show what happened).

        Raises:
            UsageError: an unknown operation name or a non-positive ``nth`` (a ValueError).
        """
        if op != "*" and op not in _fs.OPERATIONS:
            raise UsageError(f"unknown fs operation {op!r}; use one of {_fs.OPERATIONS}")
        if nth is not None and nth < 1:
            raise UsageError("nth counts from 1")
        rule = FaultRule(op, err, path, nth, from_nth)
        with self._lock:
            self.rules.append(rule)
        return rule

    def heal(self, rule: FaultRule | None = None) -> None:
        """Remove one rule, or all of them: the disk works again."""
        with self._lock:
            if rule is None:
                self.rules.clear()
            else:
                self.rules.remove(rule)

    def __call__(self, op: str, path: str) -> None:
        with self._lock:
            self.seen[op] += 1
            for rule in self.rules:
                if not rule.matches(op, path):
                    continue
                rule.calls += 1
                if (
                    rule.nth is None
                    or rule.calls == rule.nth
                    or (rule.from_nth and rule.calls >= rule.nth)
                ):
                    rule.fired += 1
                    self.log.append((op, path, rule.errno))
                    raise OSError(rule.errno, f"{os.strerror(rule.errno)} (injected)", path)

    def install(self) -> FaultInjector:
        """Put this injector in front of the fs seam (the previous hook is restored later)."""
        if not self._installed:
            self._previous = _fs.set_fault_hook(self)
            self._installed = True
        return self

    def uninstall(self) -> None:
        """Remove this injector and restore the hook that was there before."""
        if self._installed:
            _fs.set_fault_hook(self._previous)
            self._installed = False

    def __enter__(self) -> FaultInjector:
        return self.install()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()


def inject_faults() -> FaultInjector:
    """A new :class:`FaultInjector`; use it as a context manager (``with inject_faults() as f``).

    Also available as the pytest fixture ``inject_faults`` through the plugin.
    """
    return FaultInjector()


def read_only_filesystem(injector: FaultInjector, path: str = "*") -> list[FaultRule]:
    """Make every mutating operation under ``path`` fail with ``EROFS`` (until healed).

    Works on real files and under pyfakefs; ``path`` is a glob (``"/state/*"``).
    """
    return [injector.fail(op, _errno.EROFS, path=path) for op in MUTATING_OPERATIONS]


def disk_full(fake_fs: Any, free_bytes: int = 0, path: str = "/") -> None:
    """Under pyfakefs: make the filesystem at ``path`` have only ``free_bytes`` left.

    Writes past that fail with ``ENOSPC`` from pyfakefs itself (not from the hook). Lift it with
    ``fake_fs.set_disk_usage(a_large_number, path)``.

    Args:
        fake_fs: pyfakefs's ``FakeFilesystem`` (the ``fs`` fixture).
        free_bytes: how many bytes may still be written.
        path: a path on the filesystem to limit.
    """
    used = fake_fs.get_disk_usage(path).used
    fake_fs.set_disk_usage(used + free_bytes, path)
