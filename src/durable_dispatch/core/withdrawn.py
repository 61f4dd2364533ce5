"""The ledger's withdrawn items: pending and waiting items taken out of this run in memory only.

A part of :class:`~durable_dispatch.core.ledger.Ledger` (see its module docs, "Withdrawn
items"): no event, nothing durable; the snapshot forms count them where they were. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from .indexed import Frontier

if TYPE_CHECKING:
    from .indexed import Ids, Items

__all__ = ["Withdrawal"]


class Withdrawal:
    """Withdrawing and putting back, a part of :class:`~durable_dispatch.core.ledger.Ledger`."""

    if not TYPE_CHECKING:  # (a part of Ledger's slots; the type checker reads Ledger's)
        __slots__ = ()

    ids: Ids
    items: Items
    frontier: Frontier
    waiting: Frontier
    missing: dict[str, int]
    withdrawn: tuple[Frontier, Frontier] | None

    # ------------------------------------------------- withdrawn (not durable)
    def withdraw(self, keep: Collection[str] = ()) -> int:
        """Take every pending and waiting item but those in ``keep`` out of this run, in memory
        only (see the module docs): no event, nothing to journal. The live frontier then holds
        only the items of ``keep`` that were pending (in their order), the waiting set none, so
        the campaign can end without the rest; :attr:`withdrawn` holds them, the snapshot forms
        count them where they were, and :meth:`put_back` returns them. Items in flight are not
        touched. O(1) plus O(runs) per kept item. Returns how many items were withdrawn.
        """
        frontier, waiting = self.frontier, self.waiting
        kept = [w for w in keep if w in frontier] if keep else []
        self.frontier, self.waiting = Frontier(self.ids), Frontier(self.ids)
        items = self.items
        for wid in kept:
            frontier.remove(wid)
            self.frontier.append(wid, items[wid].priority)
        n = len(frontier) + len(waiting)
        held = self.withdrawn
        if held is not None:  # withdrawn twice: one hold
            self.withdrawn = (self._joined(held[0], frontier, True), self._joined(held[1], waiting))
        elif n:
            self.withdrawn = (frontier, waiting)
        return n

    def withdraw_item(self, wid: str) -> bool:
        """Take the one item ``wid`` out of this run, as :meth:`withdraw` does, if it is pending
        or waiting (O(runs) of its level); True when it was."""
        held = self.withdrawn
        if held is None:
            held = (Frontier(self.ids), Frontier(self.ids))
        if self.frontier.remove(wid):
            held[0].append(wid, self.items[wid].priority)
        elif self.waiting.remove(wid):
            held[1].append(wid)
        else:
            return False
        self.withdrawn = held
        return True

    def put_back(self, wid: str | None = None) -> int:
        """Return the items :meth:`withdraw` took (after the items of the live frontier and
        waiting set; swapped back whole when those are empty, as at a campaign's end), so the
        live ledger is the durable one again; or only ``wid`` (to the back of its level; one
        whose dependencies committed meanwhile to the frontier). Returns how many."""
        if wid is not None:
            held = self.withdrawn
            if held is not None and held[0].remove(wid):
                self.frontier.append(wid, self.items[wid].priority)
            elif held is not None and held[1].remove(wid):
                if self.missing.get(wid):
                    self.waiting.append(wid)
                else:
                    self.frontier.append(wid, self.items[wid].priority)
            else:
                return 0
            return 1
        held, self.withdrawn = self.withdrawn, None
        if held is None:
            return 0
        frontier, waiting = held
        n = len(frontier) + len(waiting)
        self.frontier = self._joined(self.frontier, frontier, True)
        self.waiting = self._joined(self.waiting, waiting)
        return n

    def _joined(self, into: Frontier, more: Frontier, ranked: bool = False) -> Frontier:
        """``into`` with the items of ``more`` after it (each at its priority's level when
        ``ranked``, as a frontier holds them); ``more`` itself when ``into`` is empty."""
        if not into:
            return more
        items = self.items
        for wid in more:
            if ranked:
                into.append(wid, items[wid].priority)
            else:
                into.append(wid)
        return into

    def _held(self, live: Frontier, k: int) -> Frontier:
        """``live``, or a copy with the withdrawn frontier (``k`` 0) or waiting set (1) after
        it: what the durable record holds (the snapshot forms)."""
        held = self.withdrawn
        if held is None or not held[k]:
            return live
        levels = sorted(set(live.levels()) | set(held[k].levels()), reverse=True)
        return Frontier.of_runs(
            self.ids,
            live.runs() + held[k].runs(),
            [(v, live.runs(v) + held[k].runs(v)) for v in levels],
        )
