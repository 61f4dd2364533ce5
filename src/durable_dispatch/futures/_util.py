"""mpi4py.futures' helpers on futures (``collect``, ``compose``), for any ``Future``: written
here because importing ``mpi4py.futures`` starts MPI, which importing this package must not.
Their semantics are mpi4py's: the new future is of the class of the inputs (``type(fs[0])()``),
and the inputs still pending are cancelled once the new future is done (failed or cancelled)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

__all__ = ["collect", "compose"]


def collect(fs: Iterable[Future[Any]]) -> Future[list[Any]]:
    """A new future whose result is the list of the results of ``fs``, in order (a future
    named twice counts twice); of the class of the first of them.

    It fails with the first exception one of them fails with, and is cancelled when one of them
    is; once it is done (so failed or cancelled too), those of ``fs`` not done are cancelled.
    An empty ``fs`` gives a plain ``Future`` done with ``[]``.
    """
    fs = list(fs)
    if not fs:
        empty: Future[list[Any]] = Future()
        empty.set_result([])
        return empty
    out: Future[list[Any]] = type(fs[0])()
    # re-entrant: cancelling ``out`` from one input's callback cancels the others, whose
    # callbacks run in the same thread and take the lock again
    lock = threading.RLock()
    where: dict[Future[Any], list[int]] = {}
    for i, f in enumerate(fs):
        where.setdefault(f, []).append(i)
    values: list[Any] = [None] * len(fs)
    live = [True]  # False once ``out`` is done: the inputs' callbacks do nothing after

    def one_done(f: Future[Any]) -> None:
        with lock:
            if not live[0]:
                return
            if f.cancelled():
                out.cancel()
                return
            error = f.exception()
            if error is not None:
                if out.set_running_or_notify_cancel():
                    out.set_exception(error)
                return
            for i in where.pop(f, ()):
                values[i] = f.result()
            if not where and out.set_running_or_notify_cancel():
                out.set_result(values)

    def all_done(_: Future[list[Any]]) -> None:
        with lock:
            live[0] = False
            pending = list(where)
            where.clear()
        for f in pending:
            f.cancel()
        if out.cancelled():
            try:
                out.set_running_or_notify_cancel()  # (tell its waiters)
            except RuntimeError:
                pass

    out.add_done_callback(all_done)
    for f in list(where):
        f.add_done_callback(one_done)
    return out


def compose(
    future: Future[Any],
    resulthook: Callable[[Any], Any] | None = None,
    excepthook: Callable[[BaseException], Any] | None = None,
) -> Future[Any]:
    """A new future, of ``future``'s class, settled from ``future`` once it is done: its result
    passed through ``resulthook`` (when given), or its exception through ``excepthook`` (when
    given; an exception it returns fails the new future, any other value is its result). A hook
    that raises fails the new future; cancelling either future cancels the other.
    """
    out: Future[Any] = type(future)()

    def cancelled(_: Future[Any]) -> None:
        if out.cancelled():
            try:
                out.set_running_or_notify_cancel()  # (tell its waiters)
            except RuntimeError:
                pass
            future.cancel()

    def done(f: Future[Any]) -> None:
        if f.cancelled():
            out.cancel()
            return
        if out.done():
            return
        try:
            error = f.exception()
            if error is None:
                value = f.result()
                out.set_result(resulthook(value) if resulthook is not None else value)
                return
            reason: Any = excepthook(error) if excepthook is not None else error
            if isinstance(reason, BaseException):
                out.set_exception(reason)
            else:
                out.set_result(reason)
        except BaseException as e:  # noqa: BLE001 - a hook's error is the new future's
            out.set_exception(e)

    out.add_done_callback(cancelled)
    future.add_done_callback(done)
    return out
