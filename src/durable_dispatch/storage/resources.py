"""Which storage objects are open, so a test harness can close what a test left open.

Theory of operation: a :class:`~durable_dispatch.storage.journal.Journal` (and so a defer journal)
and a :class:`~durable_dispatch.campaign.state.CampaignState` register here once they are open and
unregister when they close. The pytest plugin asks :func:`open_since` at a test's teardown, before
pyfakefs tears down its fake filesystem, and closes what the test left open. Nothing else reads the
registry. It holds weak references, so it never keeps an object alive, except while a harness asked
it to :func:`track` (the plugin does, during each test): then an object the test dropped without
closing stays reachable until the harness closed it.

A counter stamps every registration, so "opened during this test" is a number comparison and
closing goes newest first (a campaign state before the journals it opened).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Protocol

__all__ = [
    "Closable",
    "register",
    "unregister",
    "mark",
    "open_since",
    "is_open",
    "track",
    "disown_lock",
]


class Closable(Protocol):
    """What the registry holds: an object with ``close()`` and a ``closed`` flag."""

    @property
    def closed(self) -> bool:
        """True once the object is closed."""

    def close(self) -> None:
        """Close the object."""


_lock = threading.Lock()
_stamps = itertools.count(1)
_open: weakref.WeakKeyDictionary[Closable, int] = weakref.WeakKeyDictionary()
_kept: dict[int, Closable] = {}  # stamp -> object, strong, while tracking
_tracking = 0


def track(on: bool) -> None:
    """Hold strong references to objects registered from now on (``on``), or stop doing so.

    Calls nest: tracking stays on until each ``track(True)`` was matched by a ``track(False)``.
    Stopping drops the strong references of objects that were never closed.
    """
    global _tracking
    with _lock:
        _tracking = max(0, _tracking + (1 if on else -1))
        if not _tracking:
            _kept.clear()


def register(obj: Closable) -> None:
    """Record ``obj`` as open (called by the object once its open succeeded)."""
    with _lock:
        stamp = _open[obj] = next(_stamps)
        if _tracking:
            _kept[stamp] = obj


def unregister(obj: Closable) -> None:
    """Forget ``obj`` (called by its ``close``); unknown objects are ignored."""
    with _lock:
        stamp = _open.pop(obj, None)
        if stamp is not None:
            _kept.pop(stamp, None)


def mark() -> int:
    """A stamp: objects registered after this call have larger stamps."""
    with _lock:
        return next(_stamps)


def open_since(stamp: int) -> list[Closable]:
    """The objects registered after ``stamp`` and still open, newest first."""
    with _lock:
        found = [(s, o) for o, s in _open.items() if s > stamp and not o.closed]
    return [o for _, o in sorted(found, key=lambda x: x[0], reverse=True)]


def is_open(obj: Closable) -> bool:
    """True while ``obj`` is registered and not closed."""
    with _lock:
        return obj in _open and not obj.closed


_disowned: list[Any] = []


def disown_lock(lock: Any) -> None:
    """Make sure a ``filelock`` lock whose filesystem is gone is never released.

    Its descriptor number now names an unrelated real descriptor, and filelock releases (closes)
    a lock when it is collected and again at interpreter exit. The lock is kept alive here, and
    marked as created by no process, which is how filelock recognises (and skips) a lock it
    inherited through ``fork()``.
    """
    inner = getattr(lock, "flock", None)  # a state directory's lock: its flock and claim
    if inner is not None:
        claim = getattr(lock, "claim", None)
        if claim is not None:
            claim._stop.set()  # its heartbeat thread stops; the record is left as it is
        lock = inner
    _disowned.append(lock)
    try:
        lock._creator_pid = -1
    except AttributeError:  # a filelock without that bookkeeping: being kept alive is enough
        pass
