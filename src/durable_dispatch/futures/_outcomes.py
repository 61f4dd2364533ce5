"""How a call's outcome settles its future: a committed result resolves it (the call's value,
or the exception it raised, with the worker's traceback as its cause), and a call whose item
was deferred fails with :class:`~durable_dispatch.errors.TaskFailed` (``TaskCrashed``,
``TaskTimedOut``) after its retries. And how ``map`` reads the outcomes (:func:`gather`)."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, TimeoutError, wait
from typing import Any

from ..errors import DependencyFailed, TaskCrashed, TaskFailed, TaskTimedOut
from ._seal import Sealer

__all__ = ["failure", "gather", "resolve", "with_traceback_text"]


class _RemoteTraceback(Exception):
    """The worker's traceback of an exception a call raised (its ``__cause__``)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def with_traceback_text(e: BaseException, tb: str) -> BaseException:
    """``e``, raised by a call in a worker, with the worker's traceback text ``tb`` as its
    ``__cause__`` (as a committed single call's exception is re-raised)."""
    e.__cause__ = _RemoteTraceback(tb)
    return e


def resolve(
    fut: Future[Any],
    sealer: Sealer,
    wid: str,
    result: Any,
    cause: Callable[[str], BaseException | None] | None = None,
) -> None:
    """Settle ``fut`` with the committed ``result`` of the call ``wid`` (its sealed outcome); a
    record that does not open fails this future only. ``cause(dependency)``: the exception of
    a failed dependency, the ``__cause__`` of a :class:`DependencyFailed` outcome."""
    try:
        how, value, tb = sealer.open_result(wid, result)
    except Exception as e:  # noqa: BLE001 - a corrupt record fails this future only
        fut.set_exception(e)
        return
    if how == "ok":
        fut.set_result(value)
    else:
        if isinstance(value, DependencyFailed) and cause is not None and value.dependency:
            value.__cause__ = cause(value.dependency)
        elif tb is not None and isinstance(value, BaseException):
            value.__cause__ = _RemoteTraceback(tb)
        fut.set_exception(value)


def failure(wid: str, kinds: Iterable[str], last_error: str | None, attempts: int) -> TaskFailed:
    """The exception of a call whose item ``wid`` was deferred: its last failure's kind picks
    the class (``crash``: TaskCrashed, ``timeout``: TaskTimedOut, else TaskFailed)."""
    kinds = tuple(kinds)
    kind = kinds[-1] if kinds else None
    cls = {"crash": TaskCrashed, "timeout": TaskTimedOut}.get(kind or "", TaskFailed)
    why = (last_error or "").removeprefix(f"{wid}: ")
    return cls(
        f"the task failed ({kind}) after {attempts} attempt(s): {why}",
        work_id=wid,
        kind=kind,
        attempts=attempts,
    )


def gather(
    first: collections.deque[Future[Any]],
    refill: Callable[[], Future[Any] | None] | None,
    end: float | None,
    *,
    unordered: bool,
) -> Iterator[Any]:
    """The results of the futures ``first``, in order (or as they complete, ``unordered``): a
    result that is an exception is raised when it is reached. ``refill`` (when given) submits
    the next call, or returns None when there is none: it is called once per result read, so the
    calls submitted ahead stay as many. ``end``: a ``time.monotonic()`` deadline for all of
    them (``concurrent.futures.TimeoutError`` past it). The futures not read are cancelled
    when the iterator is closed."""

    def left() -> float | None:
        return None if end is None else max(0.0, end - time.monotonic())

    def ordered() -> Iterator[Any]:
        try:
            while first:
                f = first.popleft()
                try:
                    value = f.result(left())
                finally:
                    nxt = refill() if refill is not None else None
                    if nxt is not None:
                        first.append(nxt)
                yield value
        finally:
            for f in first:
                f.cancel()

    def any_order() -> Iterator[Any]:
        pending = set(first)
        try:
            while pending:
                done, pending = wait(pending, left(), FIRST_COMPLETED)
                if not done:
                    raise TimeoutError()
                for f in done:
                    nxt = refill() if refill is not None else None
                    if nxt is not None:
                        pending.add(nxt)
                    yield f.result()
        finally:
            for f in pending:
                f.cancel()

    return any_order() if unordered else ordered()
