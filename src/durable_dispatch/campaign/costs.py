"""What the attempts of a dispatch cost, as the master holds them until each item's outcome is
journaled (``LoopCalls.note_usage`` takes them from a RESULT, the delivery puts them in the
records; see :mod:`durable_dispatch.mpi.usage` for what a cost is).

A RESULT's ``costs`` come in one of two forms, both checked here before anything is kept (a
worker's word):

- by work ID, ``{"<work_id>": {"cpu", "rss", "by"}, ...}``: any mix of items, a worker of any
  version;
- a table, ``{"ids": [...], "cpu": [...], "rss": [...], "by": "<how>"}``: several items measured
  alike, one column each, in the order of ``ids``. A worker sends it for a dispatch of several
  items whose costs were all measured the same way; it is checked in one pass per column (no
  Python work per item), held as it came, and a ``committed`` record of exactly those items in
  that order keeps it as it is (``cost_table``). A master running a campaign of cheap items in
  dispatches of 64 spent more on a dict per item than on the rest of each item's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["CostTable", "is_cost_entry", "cost_entries"]

_NUMBER = frozenset((int, float, type(None)))
_INT = frozenset((int, type(None)))
_STR = frozenset((str,))
#: the longest ``by`` a record keeps (the library's own words are shorter)
BY_MAX = 32


def is_cost_entry(c: Any) -> bool:
    """True for a worker's cost entry a record may keep as it is (``schema.is_cost``, and
    nothing more: three members, a short ``by``)."""
    return (
        type(c) is dict
        and len(c) == 3
        and type(c.get("cpu")) in _NUMBER
        and type(c.get("rss")) in _INT
        and type(by := c.get("by")) is str
        and len(by) <= BY_MAX
    )


class CostTable:
    """The costs of several items of one dispatch, measured alike: columns in the order of
    :attr:`ids` (see the module docs). Read like the by-work-ID form (:meth:`get`, :meth:`pop`,
    ``len``: the items not taken yet); :meth:`columns_for` gives the record's ``cost_table``
    when a record holds exactly these items in this order."""

    __slots__ = ("ids", "cpu", "rss", "by", "_left")

    def __init__(self, ids: tuple[str, ...], cpu: list[Any], rss: list[Any], by: str) -> None:
        self.ids, self.cpu, self.rss, self.by = ids, cpu, rss, by
        self._left: dict[str, int] | None = None  # work ID -> column index, once one is taken

    @classmethod
    def parse(cls, v: dict[str, Any]) -> CostTable | None:
        """The table a RESULT's ``costs`` holds, or None when it is not a well-formed one."""
        ids, cpu, rss, by = v.get("ids"), v.get("cpu"), v.get("rss"), v.get("by")
        if not (
            len(v) == 4
            and type(ids) is list
            and type(cpu) is list
            and type(rss) is list
            and type(by) is str
            and len(by) <= BY_MAX
            and 0 < len(ids) == len(cpu) == len(rss)
        ):
            return None
        # (one C-level pass per column: the types present, and no work ID twice)
        if not (
            set(map(type, ids)) == _STR
            and set(map(type, cpu)) <= _NUMBER
            and set(map(type, rss)) <= _INT
            and len(set(ids)) == len(ids)
        ):
            return None
        return cls(tuple(ids), cpu, rss, by)

    def _index(self) -> dict[str, int]:
        if self._left is None:
            self._left = {w: i for i, w in enumerate(self.ids)}
        return self._left

    def __len__(self) -> int:
        return len(self.ids) if self._left is None else len(self._left)

    def get(self, work_id: str) -> dict[str, Any] | None:
        """The cost of ``work_id``'s attempt, or None."""
        i = self._index().get(work_id)
        return None if i is None else {"cpu": self.cpu[i], "rss": self.rss[i], "by": self.by}

    def pop(self, work_id: str, default: Any = None) -> Any:
        """The cost of ``work_id``'s attempt, taken (``default`` when not held)."""
        c = self.get(work_id)
        if c is None:
            return default
        del self._index()[work_id]
        return c

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """The costs not taken yet, by work ID."""
        for w in list(self._index()):
            c = self.get(w)
            assert c is not None
            yield w, c

    def columns_for(self, work_ids: tuple[str, ...]) -> dict[str, Any] | None:
        """The ``cost_table`` of a record of ``work_ids``: the columns as they came when they
        are exactly this table's items, in its order, none taken; else None."""
        if self._left is not None or work_ids != self.ids:
            return None
        return {"cpu": self.cpu, "rss": self.rss, "by": self.by}


def cost_entries(costs: dict[str, Any]) -> dict[str, Any] | CostTable | None:
    """What of a RESULT's ``costs`` (either form, see the module docs) may be kept: a
    :class:`CostTable`, or the well-formed entries by work ID; None when nothing is."""
    if type(costs.get("ids")) is list:  # (a cost by work ID is a dict, never a list)
        return CostTable.parse(costs)
    if len(costs) == 1:  # (batch 1: the usual RESULT, no copy)
        ((w, c),) = costs.items()
        return costs if type(w) is str and is_cost_entry(c) else None
    clean = {w: c for w, c in costs.items() if type(w) is str and is_cost_entry(c)}
    return clean or None
