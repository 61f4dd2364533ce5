"""What an item's attempt cost: the one :data:`Cost` type, its encodings and its one validator.

A cost is measured by the worker (see :mod:`durable_dispatch.mpi.usage` for how), travels in
a RESULT, is held by the master until the attempt's outcome is journaled, and is kept in that
record (the joblog and the report show it). It has one form, a :data:`Cost`, ``{"cpu":
seconds or null, "rss": bytes or null, "by": how it was measured}``, and one way of writing
several costs measured alike, a *table*: one column each, the costs of a list of work IDs in
its order. Where each goes:

=============================================  ==============================================
place                                          form
=============================================  ==============================================
a RESULT's ``costs``, by work ID               ``{"<work_id>": Cost, ...}``
a RESULT's ``costs``, several measured alike   ``{"ids": [...], "cpu": [...], "rss": [...],
                                               "by": how}`` (:func:`wire_table`)
a record's ``cost`` (one item)                 a :data:`Cost`
a record's ``costs`` (several)                 ``[Cost or null, ...]`` in the order of its
                                               work IDs
a record's ``cost_table`` (several, alike)     ``{"cpu": [...], "rss": [...], "by": how}``
                                               in the order of its work IDs
=============================================  ==============================================

:func:`is_cost` is what a cost is wherever it goes: the master keeps a worker's cost only when
it passes, and a record's cost is checked with it when read, so what is written is what is
read. A cost has exactly its three members and a ``by`` of at most :data:`BY_MAX` characters
(a worker's word cannot make a record grow).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "Cost",
    "BY_MAX",
    "cost",
    "is_cost",
    "is_cost_or_none",
    "is_cost_table",
    "columns_ok",
    "wire_table",
]

#: the longest ``by`` a cost has (the library's own words are shorter)
BY_MAX = 32

_NUMBER = frozenset((int, float, type(None)))
_INT = frozenset((int, type(None)))


#: What one attempt of an item cost: ``{"cpu": CPU seconds (user + system) or None, "rss":
#: peak resident bytes or None, "by": how it was measured}`` (``"child"``, ``"child-ended"``,
#: ``"in-process"``). A plain dict: it travels and is kept as JSON as it is; :func:`cost`
#: makes one, :func:`is_cost` checks one.
Cost = dict[str, Any]


def cost(cpu: float | None, rss: int | None, by: str) -> Cost:
    """The cost of ``cpu`` seconds (rounded to the microsecond, never below 0) and ``rss``
    bytes, measured ``by``."""
    # (round(max(0.0, cpu), 6) without the call to max: a worker makes one a item)
    return {"cpu": None if cpu is None else round(cpu, 6) if cpu > 0 else 0.0, "rss": rss, "by": by}


def is_cost(v: Any) -> bool:
    """True for a :data:`Cost`: exactly ``cpu`` (a number or null), ``rss`` (an integer or
    null) and ``by`` (a string of at most :data:`BY_MAX` characters)."""
    return (
        type(v) is dict
        and len(v) == 3
        and type(v.get("cpu")) in _NUMBER
        and type(v.get("rss")) in _INT
        and type(by := v.get("by")) is str
        and len(by) <= BY_MAX
    )


def is_cost_or_none(v: Any) -> bool:
    """True for a cost (:func:`is_cost`) or None."""
    return v is None or is_cost(v)


def columns_ok(cpu: Any, rss: Any, by: Any) -> bool:
    """True for the columns of a table of costs: lists of equal length of CPU seconds (numbers
    or null) and peaks (integers or null), and a ``by`` as a cost has it (one C-level pass per
    column: no Python work per item)."""
    return (
        type(cpu) is list
        and type(rss) is list
        and len(cpu) == len(rss)
        and type(by) is str
        and len(by) <= BY_MAX
        and set(map(type, cpu)) <= _NUMBER
        and set(map(type, rss)) <= _INT
    )


def is_cost_table(v: Any) -> bool:
    """True for a record's ``cost_table``: exactly ``cpu``, ``rss`` and ``by``, whose columns
    pass :func:`columns_ok` (one entry per item, in the order of the record's work IDs)."""
    return type(v) is dict and len(v) == 3 and columns_ok(v.get("cpu"), v.get("rss"), v.get("by"))


def wire_table(
    ids: Sequence[Any],
    cpu: Sequence[float | None],
    rss: Sequence[int | None],
    by: Sequence[str | None],
) -> dict[str, Any] | None:
    """The table a RESULT carries for the costs of the items ``ids`` (in order), from the
    worker's columns (each item's CPU seconds, peak and how it was measured, None for an item
    not measured): when there are several, every one measured, all ``by`` the same way and
    every work ID a string; else None (the RESULT carries them by work ID). Checked a column
    at a time (no Python work per item)."""
    n = len(ids)
    first = by[0] if n else None
    if not (
        n > 1
        and len(cpu) == len(rss) == len(by) == n
        and type(first) is str
        and list(by).count(first) == n
        and set(map(type, ids)) == {str}
    ):
        return None
    return {"ids": list(ids), "cpu": list(cpu), "rss": list(rss), "by": first}
