"""The shell's side of dependencies: the committed results a dispatched item's ``after``
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
from typing import Any

import orjson

from ..core import Commits, Dispatcher, Send, WorkItem
from .results import stored_results
from .statedir import RESULT_RECORD_BYTES

__all__ = ["DependencyResults", "DEPENDENCIES_BYTES"]

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


class DependencyResults:
    """The committed results that open items name in ``after``, held for their WORK messages
    (see the module docs). Owned by the campaign's facade; it decides nothing: an item whose
    dependencies' results are too large is returned to the facade to defer."""

    def __init__(self, core: Dispatcher, directory: str) -> None:
        self._core = core
        self._directory = directory
        #: dependency work ID -> [its committed result, how many open items may still need it]
        self._results: dict[str, list[Any]] = {}
        #: True once any item with ``after`` was seen (no cost otherwise)
        self.has_after = False
        #: work IDs whose dependencies' size was checked (each is checked once)
        self._sized: set[str] = set()
        #: work ID -> (journal seq, result) of each memory-only commit, until an fsync covers
        #: its record: a dependent dispatched meanwhile gets it from here, not from the disk
        self._held: dict[str, tuple[int, Any]] = {}

    def load(self) -> None:
        """At open: the results of the committed work IDs that open items name in ``after``
        (one pass over the results; nothing when no item names any)."""
        self._results = {}
        led = self._core.ledger
        items = led.items
        refs: dict[str, int] = {}
        by = items.stored_forms  # (an item with ``after`` is stored as a dict)
        if not len(led.committed):  # no result to load: only whether any item has after
            self.has_after = bool(led.waiting) or any(
                v is not None and (type(v) is not list or len(v) == 3) and items_after(v)
                for v in by()
            )
            return
        for v in by():
            t = type(v)
            if t is list:
                after = v[2] if len(v) == 3 else ()
            else:
                after = v.after if t is WorkItem else (v.get("after") if t is dict else ())
            for dep in after or ():
                refs[dep] = refs.get(dep, 0) + 1
            if after:
                self.has_after = True
        committed = led.committed
        wanted = {d for d in refs if d in committed} if len(committed) else set()
        if not wanted:
            return
        for r in stored_results(self._directory, wanted):
            self._results[r.work_id] = [r.result, refs[r.work_id]]

    def note_commits(self, commits: Commits) -> None:
        """Commits being journaled: keep the result of each that an item waits for, and count
        down the results each committed dependent needed."""
        if not self.has_after:
            return
        led = self._core.ledger
        dependents, items, cache = led.dependents, led.items, self._results
        for wid, result in zip(commits.work_ids, commits.results, strict=True):
            if wid in dependents:
                cache[wid] = [result, len(led.dependents_of(wid))]
            item = items.get(wid)
            if item is not None and item.after:
                self._forget_results(item.after)
                self._sized.discard(wid)

    def _forget_results(self, after: Iterable[str]) -> None:
        cache = self._results
        for dep in dict.fromkeys(after):
            held = cache.get(dep)
            if held is not None:
                held[1] -= 1
                if held[1] <= 0:
                    del cache[dep]

    def dependencies_of(self, send: Send) -> dict[str, dict[str, Any]] | None:
        """The committed results of the ``after`` IDs of each item of ``send`` that has any, by
        the item's work ID (None when none has: the usual WORK message)."""
        if not self.has_after:
            return None
        out: dict[str, dict[str, Any]] = {}
        for w in send.items:
            if w.after:
                out[w.work_id] = self._results_for(w.after)
        return out or None

    def _results_for(self, after: Iterable[str]) -> dict[str, Any]:
        cache = self._results
        missing = [d for d in dict.fromkeys(after) if d not in cache]
        if missing and self._held:  # memory-only commits: their results are here
            held = self._held
            for d in [d for d in missing if d in held]:
                cache[d] = [held[d][1], 1]
            missing = [d for d in missing if d not in cache]
        if missing:  # submitted after its dependency committed (a Feed, a later run): read
            for r in stored_results(self._directory, missing):
                cache[r.work_id] = [r.result, 1]
        return {d: cache[d][0] for d in dict.fromkeys(after) if d in cache}

    def hold(self, seq: int, commits: Commits) -> None:
        """Keep the results of memory-only commits (the journal degraded) until an fsync covers
        their record (:meth:`forget_durable`)."""
        held = self._held
        for wid, result in zip(commits.work_ids, commits.results, strict=True):
            held[wid] = (seq, result)

    def forget_durable(self, durable: int) -> None:
        """The journal is durable through ``durable``: the results held for commits up to it
        are on disk."""
        held = self._held
        for wid in [w for w, (seq, _) in held.items() if seq <= durable]:
            del held[wid]

    def too_large(self, max_items: int) -> list[tuple[str, str]]:
        """Each item at the head of the frontier whose dependencies' results are too large for
        its WORK message, with why (each item is checked once): the facade defers them (kind
        ``"dependency"``) before they are dispatched."""
        out: list[tuple[str, str]] = []
        if not self.has_after:
            return out
        led = self._core.ledger
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
                out.append((wid, error))
        return out
