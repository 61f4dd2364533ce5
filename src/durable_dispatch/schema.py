"""Schemas of what a campaign's state directory holds, checked on every read.

A record passes its checksum, but the salt is in the file's header: anyone can write a record with
a valid checksum. So every state event, defer record and snapshot body is checked here against
its schema (event kinds, members, types) before it is folded, and an invalid one is a typed
corruption error naming the path, where it is, and the field, never a ``KeyError`` or
``TypeError`` from deep inside a reader.

Theory of operation: a schema is a mapping of member name to a check (a small predicate), with
required and optional members (:func:`check_members`). Each state event states its own schema
next to its encoding (:mod:`durable_dispatch.core.events`, whose ``check_event`` uses the
checks here); :func:`check_defer_record`, :func:`check_submission_record` and
:func:`check_state_snapshot` check the other files. Each raises :class:`Invalid` naming the
first bad field; the readers in
:mod:`durable_dispatch.campaign.state` and :mod:`durable_dispatch.storage.defer` turn it into
:class:`~durable_dispatch.errors.JournalCorruptError` or
:class:`~durable_dispatch.errors.SnapshotCorruptError`. Unknown events stay allowed (forward
compatibility); unknown members too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .cost import is_cost, is_cost_or_none, is_cost_table
from .tokens import Token

__all__ = [
    "Invalid",
    "Check",
    "check_members",
    "is_int",
    "is_str",
    "is_bool",
    "is_num_or_none",
    "is_str_or_none",
    "is_int_or_none",
    "list_of",
    "check_defer_record",
    "check_state_snapshot",
    "check_submission_record",
    "is_work_item",
    "is_cost",
    "is_cost_table",
    "check_output_record",
]

Check = Callable[[Any], bool]


class Invalid(ValueError):
    """A value that does not match its schema; ``field`` names the member (dotted path)."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"field {field!r}: {why}")
        self.field = field
        self.why = why


def is_int(v: Any) -> bool:
    """True for an int (not a bool)."""
    return type(v) is int


def is_str(v: Any) -> bool:
    """True for a str."""
    return type(v) is str


def is_bool(v: Any) -> bool:
    """True for a bool."""
    return type(v) is bool


def is_num_or_none(v: Any) -> bool:
    """True for an int, a float or None."""
    return v is None or (type(v) in (int, float))


def is_str_or_none(v: Any) -> bool:
    """True for a str or None."""
    return v is None or type(v) is str


def is_int_or_none(v: Any) -> bool:
    """True for an int or None."""
    return v is None or type(v) is int


def list_of(check: Check) -> Check:
    """A check for a list whose every element passes ``check``."""
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
        and is_num_or_none(v.get("timeout"))
        and type(v.get("leases") or {}) is dict
        and type(v.get("inputs") or []) is list
        and type(v.get("priority", 0)) is int
        and _after(v.get("after"))
    )


def _after(v: Any) -> bool:
    """A work item's ``after`` member: absent, or a list of work IDs."""
    return v is None or (type(v) is list and set(map(type, v)) <= {str})


def _token(v: Any) -> bool:
    """A dispatch token's wire form, ``e<epoch>-<n>`` (a snapshot's in-flight entries; a
    ``dispatched`` event's token is parsed, and so checked, once, by ``events.decode``)."""
    return type(v) is str and Token.parse(v) is not None


def _in_flight(v: Any) -> bool:
    return (
        type(v) is dict
        and _token(v.get("token"))
        and is_int(v.get("rank"))
        and _item(v.get("work"))
    )


def _dict_of(check: Check) -> Check:
    return lambda v: type(v) is dict and all(map(check, v.values()))


_WHY: dict[Check, str] = {
    is_int: "not an integer",
    is_str: "not a string",
    _token: "not a dispatch token (e<epoch>-<n>)",
    is_num_or_none: "not a number or null",
    is_str_or_none: "not a string or null",
    is_int_or_none: "not an integer or null",
    _item: "not a work item (an object with a string work_id)",
    _in_flight: "not an in-flight entry (token, rank, work)",
    is_cost: "not a cost (an object of exactly cpu, rss and by)",
    is_cost_or_none: "not a cost (an object of exactly cpu, rss and by) or null",
    is_cost_table: "not a table of costs (cpu and rss columns of one length, and by)",
}


def check_members(
    obj: Mapping[str, Any], required: Mapping[str, Check], optional: Mapping[str, Check]
) -> None:
    """Check the ``required`` members of ``obj`` (each there, each passing its check) and its
    ``optional`` ones (each passing its check when there); unknown members are allowed.

    Raises:
        Invalid: naming the first member that is missing or of the wrong type.
    """
    for name, check in required.items():
        if name not in obj:
            raise Invalid(name, "missing")
        if not check(obj[name]):
            raise Invalid(name, _WHY.get(check, "of the wrong type"))
    for name, check in optional.items():
        if name in obj and not check(obj[name]):
            raise Invalid(name, _WHY.get(check, "of the wrong type"))


_DEFER_EVENTS: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    "deferred": (
        {"work_id": is_str},
        {
            "attempts": is_int,
            "kinds": list_of(is_str),
            "last_error": is_str_or_none,
            "inputs": lambda v: type(v) is list,
            "self_contained": lambda v: type(v) is bool,
            "traceback": is_str_or_none,
            "cost": is_cost,
        },
    ),
    "resolved": ({"work_id": is_str}, {"how": is_str_or_none}),
}


_OUTPUT: tuple[dict[str, Check], dict[str, Check]] = (
    {"work_id": is_str},
    {
        "token": is_str_or_none,
        "ts": is_num_or_none,
        "stdout": is_str,
        "stderr": is_str,
        "stdout_b64": is_str,
        "stderr_b64": is_str,
        "stdout_dropped": is_int,
        "stderr_dropped": is_int,
    },
)


def check_output_record(p: Any) -> None:
    """Check one record of the outputs journal (``outputs.jsonl``): an item's ``work_id``, its
    dispatch's ``token``, ``ts``, and for each stream its text (``stdout``) or bytes in base64
    (``stdout_b64``) and how many bytes before them were dropped (``stdout_dropped``).

    Raises:
        Invalid: naming the first member that is missing or of the wrong type.
    """
    if type(p) is not dict:
        raise Invalid("(record)", "not an object")
    check_members(p, *_OUTPUT)


def check_defer_record(p: Any) -> None:
    """Check one defer-journal record (``deferred`` or ``resolved``; others are ignored).

    Raises:
        Invalid: naming the first member that is missing or of the wrong type.
    """
    if type(p) is not dict:
        raise Invalid("(record)", "not an object")
    spec = _DEFER_EVENTS.get(p.get("event"))  # type: ignore[arg-type]
    if spec is not None:
        check_members(p, *spec)


_STATE: tuple[dict[str, Check], dict[str, Check]] = (
    {},
    {
        "epoch": is_int,
        "counter": is_int,
        "frontier": list_of(_item),
        "in_flight": list_of(_in_flight),
        "committed": list_of(is_str),
        "deferred": list_of(_item),
        "waiting": list_of(_item),
        "attempts": _dict_of(is_int),
        "kinds": _dict_of(list_of(is_str)),
        "last_error": _dict_of(is_str_or_none),
        "solo": list_of(is_str),
        "cancelled": list_of(_item),  # O1 (issue 52): absent when none
        "commands": _dict_of(lambda v: type(v) is dict),
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
        and is_int(v[2])
    )


def _index(v: Any) -> bool:
    return type(v) is int and v >= 0


def _level(v: Any) -> bool:
    return type(v) is list and len(v) == 2 and type(v[0]) is int and list_of(_run)(v[1])


_WHY[_run] = "not a run [start, end] of indices"
_WHY[_level] = "not a priority level [level, [[start, end], ...]]"
_WHY[_index_flight] = "not an in-flight entry [index, token, rank]"
_WHY[_index] = "not an index (an integer >= 0)"

# The compact form (``"form": 2``, Ledger.to_compact): indices, runs of them, no payloads.
_COMPACT_STATE: tuple[dict[str, Check], dict[str, Check]] = (
    {
        "form": is_int,
        "size": _index,
        "frontier": list_of(_run),
        "in_flight": list_of(_index_flight),
        "committed": list_of(_run),
        "deferred": list_of(_index),
    },
    {
        k: v
        for k, v in _STATE[1].items()
        if k in ("epoch", "counter", "attempts", "kinds", "last_error", "solo", "commands")
    }
    | {"priorities": list_of(_level), "waiting": list_of(_run), "cancelled": list_of(_index)},
)

#: A submissions store record (``submissions.jsonl``): the items of indices ``first, ...``, and
#: (since U11) ``digests``, their payload digests in hex, 16 digits an item.
_SUBMISSION: tuple[dict[str, Check], dict[str, Check]] = (
    {"first": _index, "items": lambda v: type(v) is list},  # each item: as the loader takes it
    {"digests": is_str},
)


def check_submission_record(rec: Any) -> None:
    """Check one record of the submissions store: ``first`` (an index) and ``items`` (a list
    of work items as ``WorkItem.to_json`` writes them, ``null`` for a void index; each item is
    checked as the ledger's loader takes it, in the same pass).

    Raises:
        Invalid: naming the first member that is missing or of the wrong type.
    """
    if type(rec) is not dict:
        raise Invalid("(record)", "not an object")
    check_members(rec, *_SUBMISSION)
    if "digests" in rec and len(rec["digests"]) != 16 * len(rec["items"]):
        raise Invalid("digests", "not 16 hex digits for each item")


def submission_digests(rec: Mapping[str, Any]) -> bytes | None:
    """The payload digests of a checked submissions store record (None: a record written
    before digests).

    Raises:
        Invalid: its ``digests`` member is not hex.
    """
    h = rec.get("digests")
    if h is None:
        return None
    try:
        return bytes.fromhex(h)
    except ValueError:
        raise Invalid("digests", "not hex") from None


def check_state_snapshot(body: Any) -> None:
    """Check a state directory's snapshot body: ``journal_seq``, ``delivered_seq`` (the
    delivery point), ``state`` (the core's snapshot form) and ``stats``.

    Raises:
        Invalid: the body or one of its members is of the wrong shape (``state.frontier`` ...).
    """
    if type(body) is not dict:
        raise Invalid("(body)", "not an object")
    check_members(
        body,
        {},
        {"journal_seq": is_int, "delivered_seq": is_int, "stats": lambda v: type(v) is dict},
    )
    state = body.get("state")
    if state is None:
        return
    if type(state) is not dict:
        raise Invalid("state", "not an object")
    try:
        check_members(state, *(_COMPACT_STATE if "form" in state else _STATE))
    except Invalid as e:
        raise Invalid(f"state.{e.field}", e.why) from None
