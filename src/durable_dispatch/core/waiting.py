"""The ledger's waiting set: which items wait for a dependency, and their release.

A part of :class:`~durable_dispatch.core.ledger.Ledger` (see its module docs, "Dependencies"):
an item whose ``after`` names a work ID not committed is registered under each such ID
(:attr:`Ledger.dependents`, :attr:`Ledger.missing`); a commit releases the items whose last
missing dependency it committed. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from .decisions import WorkItem

if TYPE_CHECKING:
    from .indexed import CommittedIds, Frontier, Ids, Items

__all__ = ["WaitingSet"]


class WaitingSet:
    """The waiting set's rules, a part of :class:`~durable_dispatch.core.ledger.Ledger`."""

    if not TYPE_CHECKING:  # (a part of Ledger's slots; the type checker reads Ledger's)
        __slots__ = ()

    ids: Ids
    items: Items
    frontier: Frontier
    waiting: Frontier
    committed: CommittedIds
    deferred: dict[str, WorkItem]
    cancelled: dict[str, WorkItem]
    missing: dict[str, int]
    dependents: dict[str, str | list[str]]
    released: list[str]
    attempts: dict[str, int]
    kinds: dict[str, list[str]]
    last_error: dict[str, str]
    solo: set[str]
    withdrawn: tuple[Frontier, Frontier] | None

    def _release_dependents_of(self, wid: str) -> None:
        """``wid`` committed: each item waiting (or deferred) for it has one dependency less;
        those with none left go to the back of their level of the frontier."""
        held = self.dependents.pop(wid, None)
        if not held:
            return
        waiting = (held,) if type(held) is str else held
        missing, items = self.missing, self.items
        for dep in waiting:
            n = missing.get(dep)
            if n is None:
                continue
            if n > 1:
                missing[dep] = n - 1
                continue
            del missing[dep]
            if self.waiting.remove(dep):
                self.frontier.append(dep, items[dep].priority)
            elif self.deferred.pop(dep, None) is not None:
                self._forget_failures(dep)
                self.released.append(dep)
                self.frontier.append(dep, items[dep].priority)
            elif self.withdrawn is not None and self.withdrawn[1].remove(dep):
                self.withdrawn[0].append(dep, items[dep].priority)  # (still withdrawn)

    def _forget_failures(self, wid: str) -> None:
        self.attempts.pop(wid, None)
        self.kinds.pop(wid, None)
        self.last_error.pop(wid, None)
        self.solo.discard(wid)

    def _waits(self, wid: str, after: Sequence[str]) -> bool:
        """Register ``wid`` under each of its ``after`` IDs not committed; True when there is
        one (it waits). Naming itself is a dependency that never commits (a cycle)."""
        n = 0
        committed: Collection[str] = self.committed if len(self.committed) else ()
        dependents = self.dependents
        for dep in dict.fromkeys(after):
            if dep not in committed:
                n += 1
                held = dependents.get(dep)
                if held is None:
                    dependents[dep] = wid
                elif type(held) is str:
                    dependents[dep] = [held, wid]
                else:
                    held.append(wid)  # type: ignore[union-attr]
        if n:
            self.missing[wid] = n
        return n > 0

    def waiting_dependents(self, wid: str) -> list[str]:
        """The items that wait (not deferred) for ``wid``, directly or through another waiting
        item, in the order found (breadth first): what ending ``wid`` for good without a commit
        defers. O(the items found)."""
        out: list[str] = []
        seen = {wid}
        todo = [wid]
        waiting = self.waiting
        while todo:
            nxt: list[str] = []
            for w in todo:
                for dep in self.dependents_of(w):
                    if dep not in seen and dep in waiting:
                        seen.add(dep)
                        out.append(dep)
                        nxt.append(dep)
            todo = nxt
        return out

    def dependents_of(self, wid: str) -> Sequence[str]:
        """The items registered as waiting (or deferred) for ``wid``, in submission order."""
        held = self.dependents.get(wid)
        if held is None:
            return ()
        return (held,) if type(held) is str else held

    def blocker(self, wid: str) -> str | None:
        """The first of ``wid``'s ``after`` IDs not committed, or None."""
        item = self.items.get(wid)
        for dep in item.after if item is not None else ():
            if dep not in self.committed:
                return dep
        return None

    def _register_waiting(self) -> None:
        """Rebuild :attr:`missing` and :attr:`dependents` from the waiting, deferred and
        cancelled items (a loaded snapshot), in index order, as the live ledger keeps them (a
        cancelled item stays registered under its missing dependencies: a ``retry`` puts it
        back to wait for them); a waiting item whose dependencies are all committed (a
        snapshot taken while their commits were delivered) goes to the frontier."""
        if not self.waiting and not self.deferred and not self.cancelled:
            return
        index, after_of = self.ids.index, self.items.after_of
        found = [i for a, b in self.waiting.runs() for i in range(a, b)]
        found += [index[w] for w in self.deferred if after_of(w)]
        found += [index[w] for w in self.cancelled if after_of(w)]
        found.sort()
        # as _waits, item by item, with what it looks up hoisted (a reopen of 1M waiting items)
        committed: Collection[str] = self.committed if len(self.committed) else ()
        missing, dependents = self.missing, self.dependents
        by, ids = self.items._by, self.ids.ids
        for i in found:
            v = by[i]
            wid: str = ids[i]  # type: ignore[assignment]
            t = type(v)
            if t is list:
                after = v[2] if len(v) == 3 else ()
            else:
                after = v.after if t is WorkItem else (v.get("after") or ())
            n = 0
            for dep in after if len(after) == 1 else dict.fromkeys(after):
                if dep not in committed:
                    n += 1
                    held = dependents.get(dep)
                    if held is None:
                        dependents[dep] = wid
                    elif type(held) is str:
                        dependents[dep] = [held, wid]
                    else:
                        held.append(wid)  # type: ignore[union-attr]
            if n:
                missing[wid] = n
            elif self.waiting.remove(wid):
                self.frontier.append(wid, self.items[wid].priority)
