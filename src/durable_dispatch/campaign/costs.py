"""What the attempts of a dispatch cost, as the master holds them until each item's outcome is
journaled (``LoopCalls.note_usage`` takes them from a RESULT, the delivery puts them in the
records; see :mod:`durable_dispatch.cost` for what a cost is and its forms).

A RESULT's ``costs`` come in one of two forms, both checked here with the one validator of a
cost (:func:`~durable_dispatch.cost.is_cost`, :func:`~durable_dispatch.cost.columns_ok`) before
anything is kept (a worker's word):

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

from ..cost import Cost, columns_ok, is_cost

__all__ = ["CostTable", "cost_entries", "record_members"]

_STR = frozenset((str,))


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
        ids: Any
        cpu: Any
        rss: Any
        by: Any
        ids, cpu, rss, by = v.get("ids"), v.get("cpu"), v.get("rss"), v.get("by")
        if not (len(v) == 4 and type(ids) is list and ids and columns_ok(cpu, rss, by)):
            return None
        # (one C-level pass per column: the types present, and no work ID twice)
        if not (len(ids) == len(cpu) and set(map(type, ids)) == _STR and len(set(ids)) == len(ids)):
            return None
        return cls(tuple(ids), cpu, rss, by)

    def _index(self) -> dict[str, int]:
        if self._left is None:
            self._left = {w: i for i, w in enumerate(self.ids)}
        return self._left

    def __len__(self) -> int:
        return len(self.ids) if self._left is None else len(self._left)

    def get(self, work_id: str) -> Cost | None:
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

    def items(self) -> Iterator[tuple[str, Cost]]:
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
        return costs if type(w) is str and is_cost(c) else None
    clean = {w: c for w, c in costs.items() if type(w) is str and is_cost(c)}
    return clean or None


def record_members(held: dict[str, Cost] | CostTable, work_ids: tuple[str, ...]) -> dict[str, Any]:
    """The members a ``committed`` record of ``work_ids`` carries for what their attempts cost,
    from the costs held for their dispatch (the inverse of
    :func:`durable_dispatch.core.events.record_costs`): ``cost`` for one item; ``cost_table``,
    the worker's columns as they came, when ``held`` is a table of exactly these items in its
    order, none taken; else ``costs``, one per item or null. {} when one item has none held."""
    if len(work_ids) == 1:
        c = held.get(work_ids[0])
        return {} if c is None else {"cost": c}
    if type(held) is CostTable and (table := held.columns_for(work_ids)) is not None:
        return {"cost_table": table}
    return {"costs": [held.get(w) for w in work_ids]}
