"""Chaining futures, JavaScript-style (Promises/A+), as ``mpi4py.futures.aplus``:
:class:`ThenableFuture` and the functions :func:`then` and :func:`catch`.

``ThenableFuture`` is a ``concurrent.futures.Future``; ``f.then(on_success, on_failure)`` is a new
future of ``f``'s class settled from ``f`` once it is done: ``on_success(result)`` or
``on_failure(exception)``, whose value is the new future's result, or, when it is a future
itself, is followed in its turn (a chain); an exception it returns or raises fails the new
future. Cancelling ``f`` cancels the new future. A chain that would follow itself raises
``RuntimeError`` ("chain cycle detected"). Nothing here is durable or uses MPI: these are
helpers on futures, for the futures of any executor.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["ThenableFuture", "then", "catch"]


class ThenableFuture(Future[Any]):
    """A ``Future`` with :meth:`then` and :meth:`catch`."""

    def then(
        self,
        on_success: Callable[[Any], Any] | None = None,
        on_failure: Callable[[BaseException], Any] | None = None,
    ) -> Future[Any]:
        """``then(self, on_success, on_failure)``."""
        return then(self, on_success, on_failure)

    def catch(self, on_failure: Callable[[BaseException], Any] | None = None) -> Future[Any]:
        """``catch(self, on_failure)``."""
        return catch(self, on_failure)


def then(
    future: Future[Any],
    on_success: Callable[[Any], Any] | None = None,
    on_failure: Callable[[BaseException], Any] | None = None,
) -> Future[Any]:
    """A new future of ``future``'s class, settled once ``future`` is done.

    On success its result is ``on_success(result)`` (the result itself when ``on_success`` is
    None); on failure, ``on_failure(exception)``: an exception it returns fails the new future,
    any other value is its result (when ``on_failure`` is None the new future fails with the
    same exception). A future that either returns is followed: the new future settles as it
    does. A hook that raises fails the new future, and an exception ``on_success`` raises goes
    to ``on_failure``. Cancelling ``future`` cancels the new future.
    """
    new: Future[Any] = type(future)()
    future.add_done_callback(lambda old: _settle(new, old, on_success, on_failure))
    return new


def catch(
    future: Future[Any], on_failure: Callable[[BaseException], Any] | None = None
) -> Future[Any]:
    """``then(future, None, on_failure)``; with no ``on_failure`` the failure is swallowed (the
    new future's result is None)."""
    return then(future, None, on_failure if on_failure is not None else (lambda _: None))


_chains_lock = threading.Lock()
_chains: weakref.WeakKeyDictionary[Future[Any], weakref.WeakSet[Future[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _follow(new: Future[Any], other: Future[Any]) -> None:
    """Settle ``new`` as ``other`` settles; a cycle is a RuntimeError."""
    if other is new:
        raise RuntimeError(f"chain cycle detected: Future {other} chained with itself")
    with _chains_lock:
        seen = _chains.setdefault(new, weakref.WeakSet())
        if other in seen:
            raise RuntimeError(f"chain cycle detected: Future {other} already in chain")
        seen.add(other)
    other.add_done_callback(lambda old: _settle(new, old, None, None))


def _settle(
    new: Future[Any],
    old: Future[Any],
    on_success: Callable[[Any], Any] | None,
    on_failure: Callable[[BaseException], Any] | None,
) -> None:
    if old.cancelled() or new.cancelled():
        new.cancel()
        try:
            new.set_running_or_notify_cancel()  # (tell its waiters)
        except RuntimeError:
            pass
        return
    error = old.exception()
    if error is None:
        try:
            value = old.result()
            if on_success is not None:
                value = on_success(value)
            if isinstance(value, Future):
                _follow(new, value)
            else:
                new.set_result(value)
            return
        except BaseException as e:  # noqa: BLE001 - to on_failure, as a failure of old
            error = e
    if on_failure is None:
        new.set_exception(error)
        return
    try:
        reason = on_failure(error)
        if isinstance(reason, Future):
            _follow(new, reason)
        elif isinstance(reason, BaseException):
            new.set_exception(reason)
        else:
            new.set_result(reason)
    except BaseException as e:  # noqa: BLE001 - the hook's error is the new future's
        new.set_exception(e)
