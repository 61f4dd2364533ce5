"""mpi4py.futures' helpers on futures (``collect``, ``compose``), for any ``Future``: written
here because importing ``mpi4py.futures`` starts MPI, which importing this package must not."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

__all__ = ["collect", "compose"]


def collect(fs: Iterable[Future[Any]]) -> Future[list[Any]]:
    """A new future whose result is the list of the results of ``fs``, in order.

    It fails with the first exception one of them fails with, and is cancelled when one of them
    is; cancelling it cancels those not done. An empty ``fs`` gives a future done with ``[]``.
    """
    fs = list(fs)
    out: Future[list[Any]] = Future()
    if not fs:
        out.set_result([])
        return out
    # re-entrant: cancelling ``out`` from one input's callback cancels the others, whose
    # callbacks run in the same thread and take the lock again
    lock = threading.RLock()
    left = set(fs)
    values: list[Any] = [None] * len(fs)

    def one_done(f: Future[Any]) -> None:
        with lock:
            if out.done() or f not in left:
                return
            if f.cancelled():
                out.cancel()
                return
            error = f.exception()
            if error is not None:
                if out.set_running_or_notify_cancel():
                    out.set_exception(error)
                return
            left.discard(f)
            if left:
                return
            for i, g in enumerate(fs):
                values[i] = g.result()
        if out.set_running_or_notify_cancel():
            out.set_result(values)

    def all_done(_: Future[list[Any]]) -> None:
        if out.cancelled():
            for f in list(left):
                f.cancel()

    out.add_done_callback(all_done)
    for f in dict.fromkeys(fs):
        f.add_done_callback(one_done)
    return out


def compose(
    future: Future[Any],
    resulthook: Callable[[Any], Any] | None = None,
    excepthook: Callable[[BaseException], Any] | None = None,
) -> Future[Any]:
    """A new future settled from ``future`` once it is done: its result passed through
    ``resulthook`` (when given), or its exception through ``excepthook`` (when given; an
    exception it returns fails the new future, any other value is its result). A hook that
    raises fails the new future; cancelling either future cancels the other.
    """
    out: Future[Any] = Future()

    def cancelled(_: Future[Any]) -> None:
        if out.cancelled():
            future.cancel()

    def done(f: Future[Any]) -> None:
        if f.cancelled():
            out.cancel()
            return
        if not out.set_running_or_notify_cancel():
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
