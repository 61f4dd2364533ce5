"""A chunked ``map`` (``chunksize > 1``): one task per chunk of consecutive calls.

A chunk is the calls ``fn(*args)`` of up to ``chunksize`` consecutive elements, submitted as one
work item (:meth:`DurableExecutor._submit_chunk`): its work ID digests the function and the
chunk's calls in one pass after a ``"chunk"`` marker (:func:`._calls.chunk_digest`), numbered
like a call's among identical chunks; one worker runs its calls in order and seals their
outcomes once (:meth:`._serve.Task`), and the chunk commits as one record. Its value is
``(values, raised)``: the values in order, and for each call that raised, its position ->
``(exception, traceback text)``. The iterator here yields the values in order and raises a
call's own exception at its position, so the master keeps no future, no work item and no record
per call.

A chunk that fails as a whole (its process crashed or hung in each of its attempts, its result
could not be kept, or an argument could not be unpickled) is split: its calls are submitted
one by one, with the work IDs ``chunksize=1`` gives, so each resolves or fails alone; a re-run
finds the chunk failed in the record, splits it again, and the single calls resolve from the
record. A chunk that cannot be one task (an argument the digest or the pickle refuses, or a
future of the executor among its arguments: a dependency) is submitted as single calls at once.
A chunk cancelled (by the iterator's close, a ``shutdown(cancel_futures=True)`` or an operator)
or whose executor broke is not split: its error is raised at its first position.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, CancelledError, Future, wait
from typing import Any

from ..errors import TaskFailed
from ._outcomes import with_traceback_text

__all__ = ["chunked_map"]

Calls = tuple[tuple[Any, ...], ...]


class _Chunk:
    """One chunk of the map: its calls, and either its future (one task) or, once split or
    when it cannot be one task, its calls' own futures (``singles``)."""

    __slots__ = ("calls", "fut", "singles")

    def __init__(self, calls: Calls, fut: Future[Any] | None) -> None:
        self.calls = calls
        self.fut = fut
        self.singles: collections.deque[Future[Any]] = collections.deque()

    def cancel(self) -> None:
        if self.fut is not None:
            self.fut.cancel()
        for f in self.singles:
            f.cancel()


def _splits(error: BaseException) -> bool:
    """True when a chunk that failed with ``error`` is split into single calls: not when it was
    cancelled (by the iterator, a shutdown or an operator) or its executor broke."""
    if isinstance(error, (CancelledError, BrokenExecutor)):
        return False
    if isinstance(error, TaskFailed):
        return error.kind != "cancelled"
    return isinstance(error, Exception)


def _each(values: list[Any], raised: dict[int, tuple[BaseException, str]]) -> Iterator[Any]:
    """A chunk's values in order; a call that raised raises its exception at its position."""
    if not raised:
        yield from values
        return
    for i, v in enumerate(values):
        if i in raised:
            e, tb = raised[i]
            raise with_traceback_text(e, tb)
        yield v


def chunked_map(
    submit_chunk: Callable[[Callable[..., Any], Calls], Future[Any] | None],
    submit: Callable[..., Future[Any]],
    fn: Callable[..., Any],
    iterable: Iterable[Iterable[Any]],
    chunksize: int,
    end: float | None,
    buffersize: int | None,
    unordered: bool,
) -> Iterator[Any]:
    """``fn(*args)`` for each ``args`` of ``iterable``, in chunks of ``chunksize`` (see the
    module docs), as mpi4py's chunked ``starmap``: ``buffersize`` counts the chunks submitted
    ahead of the results read, ``end`` is the ``time.monotonic()`` deadline of all results
    (``TimeoutError`` past it), and the chunks not read are cancelled when the iterator is
    closed or raises. ``submit_chunk`` submits a chunk as one task (None: it cannot be one),
    ``submit`` one call."""
    args = iter(iterable)

    def take() -> _Chunk | None:
        calls = tuple(
            a if type(a) is tuple else tuple(a) for a in itertools.islice(args, chunksize)
        )
        if not calls:
            return None
        c = _Chunk(calls, submit_chunk(fn, calls))
        if c.fut is None:
            c.singles.extend(submit(fn, *a) for a in calls)
        return c

    def split(c: _Chunk, error: BaseException) -> None:
        if not _splits(error):
            raise error
        try:
            c.singles.extend(submit(fn, *a) for a in c.calls)
        except (RuntimeError, BrokenExecutor):  # shut down or broken since: the chunk's error
            raise error from None
        c.fut = None

    def left() -> float | None:
        return None if end is None else max(0.0, end - time.monotonic())

    chunks: collections.deque[_Chunk] = collections.deque()
    limit = buffersize if buffersize is not None else -1
    while limit:
        c = take()
        if c is None:
            break
        chunks.append(c)
        limit -= 1

    def refill() -> None:
        if buffersize is not None:
            c = take()
            if c is not None:
                chunks.append(c)

    def ordered() -> Iterator[Any]:
        try:
            while chunks:
                c = chunks[0]
                if c.fut is not None:
                    try:
                        values, raised = c.fut.result(left())
                    except BaseException as e:
                        if not c.fut.done():  # the map's timeout, or an interrupt
                            raise
                        split(c, e)
                        continue
                    chunks.popleft()
                    refill()
                    yield from _each(values, raised)
                    continue
                singles = c.singles
                while singles:
                    value = singles[0].result(left())
                    singles.popleft()
                    if not singles:
                        chunks.popleft()
                        refill()
                    yield value
        finally:
            for c in chunks:
                c.cancel()

    def any_order() -> Iterator[Any]:
        pending: dict[Future[Any], _Chunk | None] = {}
        for c in chunks:
            if c.fut is not None:
                pending[c.fut] = c
            else:
                pending.update(dict.fromkeys(c.singles))
        chunks.clear()
        try:
            while pending:
                done, _ = wait(pending, left(), FIRST_COMPLETED)
                if not done:
                    raise TimeoutError()
                for f in done:
                    owner = pending.pop(f)
                    if owner is None:
                        yield f.result()
                        continue
                    try:
                        values, raised = f.result()
                    except BaseException as e:  # noqa: BLE001 - split, or raised by split
                        split(owner, e)
                        pending.update(dict.fromkeys(owner.singles))
                        continue
                    yield from _each(values, raised)
        finally:
            for f in pending:
                f.cancel()

    return any_order() if unordered else ordered()
