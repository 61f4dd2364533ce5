"""What a payload and a result may hold: the user's value exactly as given, or a refusal.

A payload or a result is stored as JSON (orjson). JSON holds ``None``, ``bool``, ``int`` (64
bits), ``float``, ``str``, ``list`` and ``dict`` with ``str`` keys; a value made of those comes
back equal. Two more are kept exactly, in a stored form: NaN and the infinities (JSON has no
such number; orjson would write ``null``), and numpy scalars (stored as the equal Python
number, ``np.float64(0.5)`` as ``0.5``). Everything else would come back changed (a tuple as a
list, a ``datetime`` as a string, a set or bytes not at all) and is refused, naming where it is
in the value, its type and the fix.

:func:`stored` turns a user's value into its stored form (or raises :class:`Refused`);
:func:`restore` turns a stored form back into the user's value. The stored form of a value with
no non-finite float is the value itself (the same object when nothing needed converting); one
with non-finite floats is a one-member object::

    {"~nonfinite": [<the value, each non-finite float as null>, [[<path>, "nan"], ...]]}

where a path is the list of keys and indices from the top of the value, and the tag is one of
``"nan"``, ``"inf"``, ``"-inf"`` (a value that is itself such a one-member object is wrapped the
same way, with no paths, so no value is ever read back as something else). A reader that does
not know the form (``jq``) sees ``null`` where the non-finite floats were.

The check costs one ``orjson.dumps``/``orjson.loads`` pair and one comparison, all in C, when the
value is plain JSON; the walk in Python runs only for a value that is not.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

__all__ = [
    "Refused",
    "stored",
    "stored_raw",
    "all_plain",
    "restore",
    "restore_raw",
    "dumps_exact",
    "TAG",
]

#: The one member of the stored form of a value with non-finite floats.
TAG = "~nonfinite"
_NF = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_dumps, _loads = orjson.dumps, orjson.loads


class Refused(ValueError):
    """A value JSON cannot hold as given.

    Attributes:
        path: where in the value, as a ``jq``-like path (``.x[2]``; ``.`` for the value itself).
        type_name: the offending part's type.
        shown: a short ``repr`` of the offending part.
        fix: what to return or submit instead.
    """

    def __init__(self, path: str, type_name: str, shown: str, fix: str) -> None:
        self.path, self.type_name, self.shown, self.fix = path, type_name, shown, fix
        super().__init__(f"at {path}: {shown} of type {type_name} cannot be stored as given; {fix}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.type_name, self.shown, self.fix))


def _path_text(path: list[Any]) -> str:
    out = "".join(f"[{p}]" if type(p) is int else f".{p}" if _plain_key(p) else f"[{p!r}]"
                  for p in path)  # fmt: skip
    return out or "."


def _plain_key(k: str) -> bool:
    return k.isidentifier()


def _short(v: Any) -> str:
    try:
        r = repr(v)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the refusal
        r = f"<{type(v).__name__}>"
    return r if len(r) <= 80 else r[:77] + "..."


def _fix_for(v: Any) -> str:
    t = type(v)
    name = f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__
    if name == "numpy.ndarray":
        return "use .tolist() (nested lists of Python numbers)"
    if name.startswith("numpy."):
        return "convert it to a Python number or a str"
    if t is tuple:
        return "use a list (a tuple would come back as a list)"
    if t in (set, frozenset):
        return "use a sorted list"
    if t in (bytes, bytearray, memoryview):
        return "decode it to a str, or use base64"
    if t is complex:
        return "store the real and imaginary parts as two floats"
    if hasattr(v, "isoformat"):
        return "use its .isoformat() string"
    if t is int:
        return "store a number beyond 64 bits as a str"
    if t is str:
        return "a str with lone surrogates cannot be stored; encode it first"
    return "use None, bool, int, float, str, a list or a dict with str keys"


def _type_name(v: Any) -> str:
    t = type(v)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _refuse(path: list[Any], v: Any, fix: str | None = None) -> Refused:
    return Refused(_path_text(path), _type_name(v), _short(v), fix or _fix_for(v))


def _walk(v: Any, path: list[Any], nonfinite: list[Any]) -> Any:
    """``v`` as plain JSON (non-finite floats as None, noted in ``nonfinite``), or raise."""
    t = type(v)
    if t is str:
        if not v.isascii():
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise _refuse(path, v) from None
        return v
    if t is float:
        if v - v == 0.0:
            return v
        nonfinite.append([list(path), "nan" if v != v else "inf" if v > 0 else "-inf"])
        return None
    if v is None or t is bool:
        return v
    if t is int:
        if _INT_MIN <= v <= _INT_MAX:
            return v
        raise _refuse(path, v)
    if t is list:
        out = []
        for i, x in enumerate(v):
            path.append(i)
            out.append(_walk(x, path, nonfinite))
            path.pop()
        return out
    if t is dict:
        d = {}
        for k, x in v.items():
            if type(k) is not str:
                raise _refuse(path, k, f"its key {_short(k)} is not a str; use str keys")
            path.append(k)
            d[k] = _walk(x, path, nonfinite)
            path.pop()
        return d
    if _is_numpy_scalar(v):
        try:
            x = v.item()
        except Exception:  # noqa: BLE001
            raise _refuse(path, v) from None
        if type(x) in (int, float, bool, str) and (x == v or x != x):
            return _walk(x, path, nonfinite)
        raise _refuse(path, v)
    if isinstance(v, (str, int, float, dict, list)) and t not in (tuple,):
        # a subclass (an IntEnum, a StrEnum, an OrderedDict): kept when JSON holds an equal value
        try:
            x = _loads(_dumps(v))
        except (TypeError, orjson.JSONDecodeError):
            raise _refuse(path, v) from None
        if x == v:
            return _walk(x, path, nonfinite)
    raise _refuse(path, v)


def _is_numpy_scalar(v: Any) -> bool:
    """A numpy scalar (``numpy.generic``: ``np.float64``, ``np.int32``, ``np.bool_``...)."""
    for c in type(v).__mro__:
        if c.__module__ == "numpy" and c.__name__ == "generic":
            return True
    return False


def stored(value: Any) -> Any:
    """The stored form of ``value`` (see the module docs): ``value`` itself when it is plain JSON.

    Raises:
        Refused: ``value`` holds something JSON cannot hold as given (naming where).
    """
    try:
        if _loads(_dumps(value)) == value and not _tagged(value):
            return value
    except (TypeError, orjson.JSONDecodeError):
        pass
    return _slow(value)


def stored_raw(value: Any) -> bytes:
    """The JSON bytes of the stored form of ``value`` (what a worker sends as its result).

    Raises:
        Refused: as :func:`stored`.
    """
    try:
        raw = _dumps(value)
        if _loads(raw) == value and not _tagged(value):
            return raw
    except (TypeError, orjson.JSONDecodeError):
        pass
    return _dumps(_slow(value))


def all_plain(values: list[Any]) -> bool:
    """True when each of ``values`` is its own stored form (plain JSON, so :func:`stored` would
    return it as it is): one orjson pass over the whole list (the check of a submission)."""
    try:
        raw = _dumps(values)
        return _loads(raw) == values and _TAG_BYTES not in raw
    except (TypeError, orjson.JSONDecodeError):
        return False


_TAG_BYTES = b'"' + TAG.encode() + b'"'


def _tagged(v: Any) -> bool:
    return type(v) is dict and len(v) == 1 and TAG in v


def _slow(value: Any) -> Any:
    nonfinite: list[Any] = []
    try:
        plain = _walk(value, [], nonfinite)
    except RecursionError:
        raise Refused(".", _type_name(value), "<nested too deeply>", "nest it less") from None
    if nonfinite or _tagged(plain):
        return {TAG: [plain, nonfinite]}
    return plain


def restore(value: Any) -> Any:
    """The user's value of a stored form (see :func:`stored`); any other value as it is."""
    if type(value) is not dict or len(value) != 1 or TAG not in value:
        return value
    body = value[TAG]
    if type(body) is not list or len(body) != 2 or type(body[1]) is not list:
        return value
    plain, nonfinite = body
    if not nonfinite:
        return plain
    out = _loads(_dumps(plain))  # a copy: the stored form may be shared
    for entry in nonfinite:
        try:
            path, tag = entry
            x = _NF[tag]
            if not path:
                return x
            node = out
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = x
        except (TypeError, ValueError, KeyError, IndexError):
            return value  # not a form this module wrote: shown as it is
    return out


def restore_raw(raw: bytes | bytearray | memoryview) -> Any:
    """:func:`restore` of JSON bytes."""
    return restore(_loads(raw))


def dumps_exact(value: Any, *, indent: bool = False) -> str:
    """JSON text of a (restored) value for people and scripts: orjson's, except that a value
    with NaN or an infinity is written as Python's :mod:`json` writes it (``NaN``,
    ``Infinity``, ``-Infinity``, which ``json.loads`` and pandas read back)."""
    try:
        raw = _dumps(value, option=orjson.OPT_INDENT_2 if indent else None)
        if _loads(raw) == value:
            return raw.decode()
    except (TypeError, orjson.JSONDecodeError):
        pass
    if indent:
        return json.dumps(value, ensure_ascii=False, indent=2)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
