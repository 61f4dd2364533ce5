"""The shell's side of dependencies (G4): the committed results a dispatched item's ``after``
IDs carry to its work function (``ctx.dependencies``), and the end of a campaign whose waiting
items can never run.

Which items wait, and when they are released, is the core's (:class:`~durable_dispatch.core.
ledger.Ledger`: a ``committed`` event releases the items whose last missing dependency it
committed, so a dependent is dispatched only after its dependencies' commits are durable). This
part of :class:`~durable_dispatch.campaign.state.CampaignState` keeps, in memory, the result of each
committed work ID that an open item names in ``after`` (taken from its ``committed`` record as it
is journaled; after a restart read once from the state directory's results), hands them to the
WORK message of each dependent, and forgets one once no open item names it.

Durability contract: nothing here is written; the results are the committed records' own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson

from ..core import Commit, Decision, Dispatcher, Send, WorkItem
from .results import stored_results
from .statedir import RESULT_RECORD_BYTES

__all__ = ["Dependencies", "DEPENDENCIES_BYTES"]

log = logging.getLogger("durable_dispatch.state")

#: The bound of one item's dependency results in a WORK message, as JSON (the record bound of a
#: result: an item's inputs may be as large as one result, not more). An item over it is deferred
#: with kind ``"dependency"`` without running; the campaign goes on.
DEPENDENCIES_BYTES = RESULT_RECORD_BYTES


def items_after(v: Any) -> Any:
    """The ``after`` of an item in the ledger's :class:`~durable_dispatch.core.indexed.Items`
    (a work item, or its stored form)."""
    t = type(v)
    if t is list:
        return v[2] if len(v) == 3 else ()
    if t is WorkItem:
        return v.after
    return v.get("after") if t is dict else ()


class Dependencies:
    """The results of dependencies, for :class:`~durable_dispatch.campaign.state.CampaignState`."""

    core: Dispatcher
    directory: str
    #: dependency work ID -> [its committed result, how many open items may still need it]
    _dep_results: dict[str, list[Any]]
    #: True once any item with ``after`` was seen (no cost otherwise)
    _has_after: bool
    #: work IDs whose dependencies' size was checked (each is checked once)
    _sized: set[str]
    _pending_commits: list[Any]
    _held_results: dict[str, tuple[int, Any]]

    if TYPE_CHECKING:  # provided by CampaignState / Delivery

        def _apply(self, decisions: Iterable[Decision], *a: Any, **k: Any) -> list[Decision]: ...

    def _load_dependency_results(self) -> None:
        """At open: the results of the committed work IDs that open items name in ``after``
        (one pass over the results; nothing when no item names any)."""
        self._dep_results = {}
        led = self.core.ledger
        items = led.items
        refs: dict[str, int] = {}
        by = items._by  # (the stored forms: an item with ``after`` is stored as a dict)
        if not len(led.committed):  # no result to load: only whether any item has after
            self._has_after = bool(led.waiting) or any(
                v is not None and (type(v) is not list or len(v) == 3) and items_after(v)
                for v in by
            )
            return
        for v in by:
            if v is None:
                continue
            t = type(v)
            if t is list:
                after = v[2] if len(v) == 3 else ()
            else:
                after = v.after if t is WorkItem else (v.get("after") if t is dict else ())
            for dep in after or ():
                refs[dep] = refs.get(dep, 0) + 1
            if after:
                self._has_after = True
        committed = led.committed
        wanted = {d for d in refs if d in committed} if len(committed) else set()
        if not wanted:
            return
        for r in stored_results(self.directory, wanted):
            self._dep_results[r.work_id] = [r.result, refs[r.work_id]]

    def _note_commits(self, commits: Iterable[Commit]) -> None:
        """Commits being journaled: keep the result of each that an item waits for, and count
        down the results each committed dependent needed."""
        led = self.core.ledger
        dependents, items, cache = led.dependents, led.items, self._dep_results
        for c in commits:
            wid = c.work_id
            if wid in dependents:
                cache[wid] = [c.result, len(led.dependents_of(wid))]
            item = items.get(wid)
            if item is not None and item.after:
                self._forget_results(item.after)
                self._sized.discard(wid)

    def _forget_results(self, after: Iterable[str]) -> None:
        cache = self._dep_results
        for dep in dict.fromkeys(after):
            held = cache.get(dep)
            if held is not None:
                held[1] -= 1
                if held[1] <= 0:
                    del cache[dep]

    def dependencies_of(self, send: Send) -> dict[str, dict[str, Any]] | None:
        """The committed results of the ``after`` IDs of each item of ``send`` that has any, by
        the item's work ID (None when none has: the usual WORK message)."""
        if not self._has_after:
            return None
        out: dict[str, dict[str, Any]] = {}
        for w in send.items:
            if w.after:
                out[w.work_id] = self._results_for(w.after)
        return out or None

    def _results_for(self, after: Iterable[str]) -> dict[str, Any]:
        cache = self._dep_results
        missing = [d for d in dict.fromkeys(after) if d not in cache]
        if missing and self._held_results:  # memory-only commits: their results are here
            held = self._held_results
            for d in [d for d in missing if d in held]:
                cache[d] = [held[d][1], 1]
            missing = [d for d in missing if d not in cache]
        if missing:  # submitted after its dependency committed (a Feed, a later run): read
            for r in stored_results(self.directory, missing):
                cache[r.work_id] = [r.result, 1]
        return {d: cache[d][0] for d in dict.fromkeys(after) if d in cache}

    def _check_dependency_sizes(self, max_items: int) -> None:
        """Defer (kind ``"dependency"``) each item at the head of the frontier whose
        dependencies' results are too large for its WORK message, before it is dispatched."""
        if not self._has_after:
            return
        led = self.core.ledger
        for wid in led.frontier.first(max_items):
            item = led.items[wid]
            if not item.after or wid in self._sized:
                continue
            self._sized.add(wid)
            size = len(orjson.dumps(self._results_for(item.after)))
            if size > DEPENDENCIES_BYTES:
                error = (
                    f"the results of its dependencies take {size} bytes, over the bound of "
                    f"{DEPENDENCIES_BYTES} for an item's inputs"
                )
                log.error("%s: %s", wid, error)
                self._apply(self.core.defer_for_dependency(wid, error))

    def settle_waiting(self) -> int:
        """Once nothing else can run (nothing pending or in flight, every commit delivered, the
        work source exhausted), defer every waiting item: it waits for a work ID never
        submitted, deferred, or in a cycle (kind ``"dependency"``, G4). Returns how many.
        Nothing while a commit waits for its delivery (it may release them)."""
        if self._pending_commits or not self.core.ledger.waiting:
            return 0
        out = self._apply(self.core.defer_unreachable())
        return len(out)
