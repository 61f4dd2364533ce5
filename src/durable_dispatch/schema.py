"""Schemas of what a campaign's state directory holds, checked on every read (S11).

A record passes its checksum, but the salt is in the file's header: anyone can write a record with
a valid checksum. So every state event, defer record and snapshot body is checked here against
its schema (event kinds, members, types) before it is folded, and an invalid one is a typed
corruption error naming the path, where it is, and the field, never a ``KeyError`` or
``TypeError`` from deep inside a reader.

Theory of operation: a schema is a mapping of member name to a check (a small predicate), with
required and optional members. :func:`check_event`, :func:`check_defer_record` and
:func:`check_state_snapshot` raise :class:`Invalid` naming the first bad field; the readers in
:mod:`durable_dispatch.state` and :mod:`durable_dispatch.storage.defer` turn it into
:class:`~durable_dispatch.errors.JournalCorruptError` or
:class:`~durable_dispatch.errors.SnapshotCorruptError`. Unknown events stay allowed (forward
compatibility); unknown members too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .tokens import Token

__all__ = [
    "Invalid",
    "check_event",
    "check_defer_record",
    "check_state_snapshot",
    "check_submission_record",
    "is_work_item",
]

Check = Callable[[Any], bool]


class Invalid(ValueError):
    """A value that does not match its schema; ``field`` names the member (dotted path)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"field {field!r}: {why}")
        self.field = field
        self.why = why


def _int(v: Any) -> bool:
    return type(v) is int


def _str(v: Any) -> bool:
    return type(v) is str


def _num_or_none(v: Any) -> bool:
    return v is None or (type(v) in (int, float))


def _str_or_none(v: Any) -> bool:
    return v is None or type(v) is str


def _int_or_none(v: Any) -> bool:
    return v is None or type(v) is int


def _list_of(check: Check) -> Check:
    return lambda v: type(v) is list and all(map(check, v))


def is_work_item(v: Any) -> bool:
    """True when ``v`` is a work item object as ``WorkItem.to_json`` writes it (the ledger's
    loader reads the store's ``[work_id, payload]`` form itself)."""
    return _item(v)


def _item(v: Any) -> bool:
    """A work item as the core writes it (``WorkItem.to_json``)."""
    return (
        type(v) is dict
        and type(v.get("work_id")) is str
        and _num_or_none(v.get("timeout"))
        and type(v.get("leases") or {}) is dict
        and type(v.get("inputs") or []) is list
        and type(v.get("priority", 0)) is int
    )


def _token(v: Any) -> bool:
    """A dispatch token's wire form, ``e<epoch>-<n>`` (a snapshot's in-flight entries; a
    ``dispatched`` event's token is parsed, and so checked, once, by ``events.decode``)."""
    return type(v) is str and Token.parse(v) is not None


def _in_flight(v: Any) -> bool:
    return (
        type(v) is dict and _token(v.get("token")) and _int(v.get("rank")) and _item(v.get("work"))
    )


def _dict_of(check: Check) -> Check:
    return lambda v: type(v) is dict and all(map(check, v.values()))


_WHY: dict[Check, str] = {
    _int: "not an integer",
    _str: "not a string",
    _token: "not a dispatch token (e<epoch>-<n>)",
    _num_or_none: "not a number or null",
    _str_or_none: "not a string or null",
    _int_or_none: "not an integer or null",
    _item: "not a work item (an object with a string work_id)",
    _in_flight: "not an in-flight entry (token, rank, work)",
}

# event -> (required members, optional members). "work_id | work_ids" is handled apart.
_EVENTS: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    "epoch": ({"epoch": _int}, {"ts": _num_or_none}),
    "submitted": ({}, {"items": _list_of(_item), "first": _int, "count": _int}),
    "dispatched": ({"token": _str, "rank": _int}, {}),
    "committed": ({}, {"token": _str_or_none, "rank": _int}),
    "requeued": (
        {"work_id": _str},
        {
            "attempts": _int_or_none,
            "kind": _str_or_none,
            "error": _str_or_none,
            "source": _str_or_none,
            "split": lambda v: type(v) is bool,
        },
    ),
    "deferred": (
        {"work_id": _str, "attempts": _int, "kinds": _list_of(_str)},
        {"last_error": _str_or_none},
    ),
    "requeued_deferred": ({"work_id": _str}, {}),
    "delivered": ({"upto": _int}, {}),
}
_NAMES_WORK = ("dispatched", "committed")  # work_id, or work_ids for a multi-item dispatch


def _members(
    obj: Mapping[str, Any], required: dict[str, Check], optional: dict[str, Check]
) -> None:
    for name, check in required.items():
        if name not in obj:
            raise Invalid(name, "missing")
        if not check(obj[name]):
            raise Invalid(name, _WHY.get(check, "of the wrong type"))
    for name, check in optional.items():
        if name in obj and not check(obj[name]):
            raise Invalid(name, _WHY.get(check, "of the wrong type"))


def check_event(ev: Any) -> None:
    """Check one state-journal event (``events.jsonl``).

    Raises:
        Invalid: the event is not an object, names no event kind, or a member of a known kind
            is missing or of the wrong type.
    """
    if type(ev) is not dict:
        raise Invalid("(record)", "not an object")
    kind = ev.get("event")
    if type(kind) is not str:
        raise Invalid("event", "missing or not a string")
    spec = _EVENTS.get(kind)
    if spec is None:
        return  # a later version's event: ignored by the fold
    _members(ev, *spec)
    if kind in _NAMES_WORK:
        ids = ev.get("work_ids")
        if ids is not None:
            if type(ids) is not list or not ids or not all(map(_str, ids)):
                raise Invalid("work_ids", "not a non-empty list of strings")
        elif not _str(ev.get("work_id")):
            raise Invalid("work_id", "missing or not a string (nor is work_ids given)")
    if kind == "submitted" and "items" not in ev:
        _members(ev, {"first": _int, "count": _int}, {})
        if ev["first"] < 0 or ev["count"] < 1:
            raise Invalid("count", "a stored submission of no items or at a negative index")
    if kind == "requeued" and not ev.get("split") and ev.get("source") != "master-restart":
        _members(ev, {"attempts": _int, "kind": _str}, {})


_DEFER_EVENTS: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    "deferred": (
        {"work_id": _str},
        {
            "attempts": _int,
            "kinds": _list_of(_str),
            "last_error": _str_or_none,
            "inputs": lambda v: type(v) is list,
            "self_contained": lambda v: type(v) is bool,
        },
    ),
    "resolved": ({"work_id": _str}, {"how": _str_or_none}),
}


def check_defer_record(p: Any) -> None:
    """Check one defer-journal record (``deferred`` or ``resolved``; others are ignored).

    Raises:
        Invalid: as :func:`check_event`.
    """
    if type(p) is not dict:
        raise Invalid("(record)", "not an object")
    spec = _DEFER_EVENTS.get(p.get("event"))  # type: ignore[arg-type]
    if spec is not None:
        _members(p, *spec)


_STATE: tuple[dict[str, Check], dict[str, Check]] = (
    {},
    {
        "epoch": _int,
        "counter": _int,
        "frontier": _list_of(_item),
        "in_flight": _list_of(_in_flight),
        "committed": _list_of(_str),
        "deferred": _list_of(_item),
        "attempts": _dict_of(_int),
        "kinds": _dict_of(_list_of(_str)),
        "last_error": _dict_of(_str_or_none),
        "solo": _list_of(_str),
    },
)


def _run(v: Any) -> bool:
    return type(v) is list and len(v) == 2 and all(type(x) is int and x >= 0 for x in v)


def _index_flight(v: Any) -> bool:
    return (
        type(v) is list
        and len(v) == 3
        and type(v[0]) is int
        and v[0] >= 0
        and _token(v[1])
        and _int(v[2])
    )


def _index(v: Any) -> bool:
    return type(v) is int and v >= 0


def _level(v: Any) -> bool:
    return type(v) is list and len(v) == 2 and type(v[0]) is int and _list_of(_run)(v[1])


_WHY[_run] = "not a run [start, end] of indices"
_WHY[_level] = "not a priority level [level, [[start, end], ...]]"
_WHY[_index_flight] = "not an in-flight entry [index, token, rank]"
_WHY[_index] = "not an index (an integer >= 0)"

# The compact form (``"form": 2``, Ledger.to_compact): indices, runs of them, no payloads.
_COMPACT_STATE: tuple[dict[str, Check], dict[str, Check]] = (
    {
        "form": _int,
        "size": _index,
        "frontier": _list_of(_run),
        "in_flight": _list_of(_index_flight),
        "committed": _list_of(_run),
        "deferred": _list_of(_index),
    },
    {
        k: v
        for k, v in _STATE[1].items()
        if k in ("epoch", "counter", "attempts", "kinds", "last_error", "solo")
    }
    | {"priorities": _list_of(_level)},
)

#: A submissions store record (``submissions.jsonl``): the items of indices ``first, ...``.
_SUBMISSION: tuple[dict[str, Check], dict[str, Check]] = (
    {"first": _index, "items": lambda v: type(v) is list},  # each item: as the loader takes it
    {},
)


def check_submission_record(rec: Any) -> None:
    """Check one record of the submissions store: ``first`` (an index) and ``items`` (a list
    of work items as ``WorkItem.to_json`` writes them, ``null`` for a void index; each item is
    checked as the ledger's loader takes it, in the same pass).

    Raises:
        Invalid: as :func:`check_event`.
    """
    if type(rec) is not dict:
        raise Invalid("(record)", "not an object")
    _members(rec, *_SUBMISSION)


def check_state_snapshot(body: Any) -> None:
    """Check a state directory's snapshot body: ``journal_seq``, ``delivered_seq`` (U6),
    ``state`` (the core's snapshot form) and ``stats``.

    Raises:
        Invalid: the body or one of its members is of the wrong shape (``state.frontier`` ...).
    """
    if type(body) is not dict:
        raise Invalid("(body)", "not an object")
    _members(
        body,
        {},
        {"journal_seq": _int, "delivered_seq": _int, "stats": lambda v: type(v) is dict},
    )
    state = body.get("state")
    if state is None:
        return
    if type(state) is not dict:
        raise Invalid("state", "not an object")
    try:
        _members(state, *(_COMPACT_STATE if "form" in state else _STATE))
    except Invalid as e:
        raise Invalid(f"state.{e.field}", e.why) from None
