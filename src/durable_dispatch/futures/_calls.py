"""Calls as data: the name of a function, the digest of a call, and a call's work ID (F1).

A call's work ID is ``<module:qualname>/<digest>/<n>``: the function's importable name, the
SHA-256 of a canonical encoding of the function and its arguments, and ``n``, how many identical
calls the same executor was given before it (so two identical calls stay two tasks, and a re-run
that makes the same calls in the same order gets the same IDs). Nothing depends on ``hash()``
(salted per process for strings), an address or a dict's insertion order, so the IDs are the
same in every process and every run.

The canonical encoding is exact for ``None``, ``bool``, ``int``, ``float``, ``complex``,
``str``, ``bytes``, and for ``tuple``, ``list``, ``dict``, ``set`` and ``frozenset`` of them
(dicts and sets in the sorted order of their members' encodings, each value tagged with its type,
so ``1``, ``1.0`` and ``True`` differ). Any other value is encoded by its pickle, which is stable
for the same state of the same class; a function argument is encoded by its name.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import struct
from collections.abc import Callable
from typing import Any

__all__ = [
    "function_name",
    "call_digest",
    "chunk_digest",
    "call_id",
    "Dependency",
    "take_dependencies",
    "put_values",
]

_PICKLE = 4  # protocol of the pickles the digest reads: the same bytes on every Python >= 3.8


def function_name(fn: Any) -> str:
    """``module:qualname`` of a function the workers can import by name.

    Raises:
        TypeError: ``fn`` is not callable, or cannot be found by name in another process (a
            lambda, a function defined inside another, an object without a module).
    """
    if not callable(fn):
        raise TypeError(f"{fn!r} is not callable")
    inner = fn
    while isinstance(inner, functools.partial):
        inner = inner.func
    module = getattr(inner, "__module__", None)
    qualname = str(getattr(inner, "__qualname__", None) or type(inner).__qualname__)
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(
            f"{qualname} cannot be run by the workers: they import a task's function by its "
            "module and name, and a lambda or a nested function has none; define it at a "
            "module's top level"
        )
    try:
        pickle.dumps(fn, protocol=_PICKLE)
    except Exception as e:  # noqa: BLE001 - any failure means the workers cannot load it
        raise TypeError(f"{qualname or fn!r} cannot be sent to the workers: {e}") from e
    return f"{module or type(inner).__module__}:{qualname}"


def _encode(value: Any, out: list[bytes]) -> None:
    t = type(value)
    if value is None:
        out.append(b"N")
    elif t is bool:
        out.append(b"T" if value else b"F")
    elif t is int:
        raw = str(value).encode()
        out.append(b"i" + struct.pack(">I", len(raw)) + raw)
    elif t is float:
        out.append(b"f" + struct.pack(">d", value))
    elif t is complex:
        out.append(b"c" + struct.pack(">dd", value.real, value.imag))
    elif t is str:
        raw = value.encode("utf-8", "surrogatepass")
        out.append(b"s" + struct.pack(">I", len(raw)) + raw)
    elif t is bytes:
        out.append(b"b" + struct.pack(">I", len(value)) + value)
    elif t is tuple or t is list:
        out.append((b"(" if t is tuple else b"[") + struct.pack(">I", len(value)))
        for v in value:
            _encode(v, out)
    elif t is dict:
        pairs = sorted((_canonical(k), _canonical(v)) for k, v in value.items())
        out.append(b"{" + struct.pack(">I", len(pairs)))
        out.extend(k + v for k, v in pairs)
    elif t is set or t is frozenset:
        members = sorted(_canonical(v) for v in value)
        out.append((b"<" if t is set else b">") + struct.pack(">I", len(members)))
        out.extend(members)
    elif callable(value) and not isinstance(value, type) and hasattr(value, "__qualname__"):
        raw = function_name(value).encode()
        out.append(b"u" + struct.pack(">I", len(raw)) + raw)
    else:
        raw = pickle.dumps(value, protocol=_PICKLE)  # (its own error, as mpi4py's)
        out.append(b"p" + struct.pack(">I", len(raw)) + raw)


def _canonical(value: Any) -> bytes:
    out: list[bytes] = []
    _encode(value, out)
    return b"".join(out)


def call_digest(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The SHA-256 (hex) of the canonical encoding of ``fn(*args, **kwargs)`` (see the module
    docs); the same in every process and run.

    Raises:
        TypeError: ``fn`` cannot be found by name (see :func:`function_name`).
        Exception: an argument cannot be pickled: the pickling error itself (its own type).
    """
    h = hashlib.sha256()
    out: list[bytes] = []
    name = function_name(fn)
    bound: tuple[Any, ...] = ()
    inner: Any = fn
    while isinstance(inner, functools.partial):  # a partial's own arguments are the call's too
        bound = (inner.args, inner.keywords, *bound)
        inner = inner.func
    _encode((name, bound, args, kwargs), out)
    for part in out:
        h.update(part)
    return h.hexdigest()


def chunk_digest(fn: Callable[..., Any], calls: tuple[tuple[Any, ...], ...]) -> str:
    """The SHA-256 (hex) of a chunk of a ``map``: the canonical encoding of ``("chunk", fn's
    name, a partial's bound arguments)`` followed by that of ``calls`` (the argument tuples, in
    order, encoded in one pass), so that a chunk's digest is never a single call's (see
    :func:`call_digest`).

    Raises:
        TypeError: ``fn`` cannot be found by name (see :func:`function_name`).
        Exception: an argument cannot be pickled: the pickling error itself (its own type).
    """
    out: list[bytes] = []
    name = function_name(fn)
    bound: tuple[Any, ...] = ()
    inner: Any = fn
    while isinstance(inner, functools.partial):
        bound = (inner.args, inner.keywords, *bound)
        inner = inner.func
    _encode(("chunk", name, bound), out)
    _encode_calls(calls, out)
    return hashlib.sha256(b"".join(out)).hexdigest()


_LENGTH = struct.Struct(">I").pack


def _encode_calls(calls: tuple[tuple[Any, ...], ...], out: list[bytes]) -> None:
    """``_encode(calls, out)``, byte for byte, with the arguments most maps are given (ints and
    strings) encoded inline: a chunk's digest costs little more than its encoding."""
    append = out.append
    append(b"(" + _LENGTH(len(calls)))
    for args in calls:
        append(b"(" + _LENGTH(len(args)))
        for v in args:
            t = type(v)
            if t is int:
                raw = str(v).encode()
                append(b"i" + _LENGTH(len(raw)) + raw)
            elif t is str:
                raw = v.encode("utf-8", "surrogatepass")
                append(b"s" + _LENGTH(len(raw)) + raw)
            else:
                _encode(v, out)


def call_id(name: str, digest: str, n: int) -> str:
    """The work ID of the ``n``-th identical call (from 0): ``<module:qualname>/<digest>/<n>``."""
    return f"{name}/{digest}/{n}"


class Dependency:
    """What a call's argument holds in place of a future of the same executor (G4): the
    dependency's work ID. Its pickle (this class's name and the work ID) is what the call's
    digest reads, so the call's work ID digests the dependency's work ID, not its value; the
    worker puts the dependency's value in its place (:func:`put_values`)."""

    __slots__ = ("work_id",)

    def __init__(self, work_id: str) -> None:
        self.work_id = work_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (Dependency, (self.work_id,))

    def __repr__(self) -> str:
        return f"<result of {self.work_id}>"


def take_dependencies(
    args: tuple[Any, ...], kwargs: dict[str, Any], is_mine: Callable[[Any], str | None]
) -> tuple[tuple[Any, ...], dict[str, Any], list[str]]:
    """``args`` and ``kwargs`` with each future ``is_mine`` names a work ID for (an argument,
    or an element of a list, tuple or dict argument, one level deep) replaced by a
    :class:`Dependency`; and the work IDs, in order of first appearance."""
    found: dict[str, None] = {}

    def swap(v: Any) -> Any:
        wid = is_mine(v)
        if wid is None:
            return v
        found[wid] = None
        return Dependency(wid)

    new_args = tuple(_one_level(a, swap) for a in args)
    new_kwargs = {k: _one_level(v, swap) for k, v in kwargs.items()}
    return new_args, new_kwargs, list(found)


def _one_level(v: Any, swap: Callable[[Any], Any]) -> Any:
    """``swap`` applied to ``v``, or to each member of a list, tuple or dict ``v`` (one level
    deep, as a future may be passed)."""
    t = type(v)
    if t is list:
        return [swap(x) for x in v]
    if t is tuple:
        return tuple(swap(x) for x in v)
    if t is dict:
        return {k: swap(x) for k, x in v.items()}
    return swap(v)


def put_values(
    args: tuple[Any, ...], kwargs: dict[str, Any], value: Callable[[str], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inverse of :func:`take_dependencies`: each :class:`Dependency` replaced by
    ``value(work_id)``."""

    def swap(v: Any) -> Any:
        return value(v.work_id) if type(v) is Dependency else v

    return tuple(_one_level(a, swap) for a in args), {
        k: _one_level(v, swap) for k, v in kwargs.items()
    }
