"""Work off the caller's thread: saving a display file (the master's live statistics), and a
call run beside the caller to overlap its waits on the filesystem with the caller's
(:class:`Beside`).

Theory of operation. A :class:`BackgroundSaver` owns one :class:`~.snapshot.SnapshotStore`
whose files are a *display* (``master-stats.*.snap``: what ``stats`` and ``watch`` show), not
durable campaign state. :meth:`~BackgroundSaver.submit` hands it the newest value and returns at
once; a thread of its own saves it (write, fsync, rename, directory fsync: the store's promise,
old or new and never a mix, is unchanged). A value submitted while a save runs replaces the one
waiting, so a disk that stalls for a minute costs one pending value, never a queue, and never
the caller's time:
the master loop does not wait for an fsync of a file it only shows. :meth:`~BackgroundSaver.close`
waits for the save in progress and stops the thread; the caller then writes its final value
itself.

Under pyfakefs (a fake filesystem installed when the saver was made) saves run on the caller's
thread: a thread must never reach the real filesystem with a fake path after a test tore the fake
one down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..errors import DurableDispatchError
from . import fs
from .snapshot import SnapshotStore

__all__ = ["BackgroundSaver", "Beside"]

log = logging.getLogger("durable_dispatch.state")

_T = TypeVar("_T")


class BackgroundSaver:
    """Saves the newest submitted value to ``store`` from a thread of its own.

    Args:
        store: the snapshot store to save to (used by this saver only, until :meth:`close`).
        what: a few words for the log (``"statistics"``).
    """

    def __init__(self, store: SnapshotStore, what: str = "statistics") -> None:
        self.store = store
        self.what = what
        self._filesystem = fs.filesystem()
        self._inline = self._filesystem is not fs.REAL_FILESYSTEM
        self._cond = threading.Condition()
        self._value: Any = None
        self._has = False
        self._closed = False
        self._busy_since: float | None = None
        self._thread: threading.Thread | None = None
        #: values saved, and saves the disk refused
        self.saved = 0
        self.failed = 0

    def submit(self, value: Any) -> bool:
        """Hand over ``value`` to be saved soon (replacing one still waiting); returns at once.
        False after :meth:`close`."""
        if self._inline:
            if self._closed:
                return False
            self._save(value)
            return True
        with self._cond:
            if self._closed:
                return False
            self._value, self._has = value, True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"{self.what}-writer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        return True

    @property
    def busy_seconds(self) -> float:
        """How long the save in progress has been running (0 when idle)."""
        t = self._busy_since
        return 0.0 if t is None else time.monotonic() - t

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._has and not self._closed:
                    self._cond.wait()
                if not self._has:
                    return
                value, self._value, self._has = self._value, None, False
            if not fs.reaches(self._filesystem):
                continue
            self._save(value)

    def _save(self, value: Any) -> None:
        self._busy_since = time.monotonic()
        try:
            self.store.save(value)
            self.saved += 1
        except DurableDispatchError as e:  # refused, degraded, or another master owns it
            self.failed += 1
            log.warning("%s not published: %s", self.what, e)
        finally:
            self._busy_since = None

    def close(self) -> None:
        """Save what is waiting, then stop the thread (waiting for a save in progress, however
        long the disk takes: the caller's next save must not run beside it)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()


class Beside(Generic[_T]):
    """``call()`` run in a thread of its own beside the caller, to overlap its waits on the
    filesystem with the caller's. Run at once in the caller's thread under a fake
    filesystem (pyfakefs, where no thread may reach the files) and when no thread can start
    (the interpreter is shutting down: a close from an ``atexit`` hook).

    Attributes:
        value: what ``call()`` returned, once :meth:`wait` returned (None if it raised).
        error: what ``call()`` raised, once :meth:`wait` returned (None if it returned).
    """

    def __init__(self, call: Callable[[], _T], name: str) -> None:
        self._call = call
        self.value: _T | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._done = threading.Event()  # (not Thread.join: an interrupted join can leave
        # is_alive() False while the thread runs on, CPython 3.11)
        if fs.filesystem() is fs.REAL_FILESYSTEM:
            t = threading.Thread(target=self._run, name=name, daemon=True)
            try:
                t.start()
                self._thread = t
            except RuntimeError:  # "can't create new thread at interpreter shutdown"
                pass
        if self._thread is None:
            self._run()

    def _run(self) -> None:
        try:
            self.value = self._call()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            self.error = e
        finally:
            self._done.set()

    def wait(self) -> BaseException | None:
        """Return once ``call()`` ended, however often the wait is interrupted: the first
        interrupt (``KeyboardInterrupt`` ...) is returned, for the caller to raise once it has
        dealt with what the call left (a journal it opened is closed, not leaked)."""
        interrupted: BaseException | None = None
        while not self._done.is_set():
            try:
                self._done.wait()
            except BaseException as e:  # noqa: BLE001 - returned, raised by the caller
                interrupted = interrupted or e
        return interrupted

    def result(self) -> _T:
        """Wait for ``call()`` (see :meth:`wait`); its value, or raise its error (an interrupt
        of the wait first: a second ``result()`` then gives the value)."""
        interrupted = self.wait()
        if interrupted is not None:
            raise interrupted
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # (the call returned it)
