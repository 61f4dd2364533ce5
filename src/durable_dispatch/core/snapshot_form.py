"""The ledger's snapshot forms: the self-contained one (every payload) and the compact one
(indices and runs, at a cost that does not grow), and the ledger built back from the
self-contained one.

A part of :class:`~durable_dispatch.core.ledger.Ledger`; the compact form is loaded by
:class:`~durable_dispatch.core.ledger.LedgerLoader`. Pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from ..schema import Invalid
from ..tokens import Token
from .decisions import WorkItem

if TYPE_CHECKING:
    from typing import Self

    from .indexed import CommittedIds, Frontier, Ids, Items

__all__ = ["SnapshotForms", "COMPACT_FORM"]

#: The ``form`` member of a compact snapshot state (:meth:`Ledger.to_compact`); a state without
#: it is the self-contained form (:meth:`Ledger.to_snapshot`).
COMPACT_FORM = 2


class SnapshotForms:
    """The snapshot forms, a part of :class:`~durable_dispatch.core.ledger.Ledger`."""

    if not TYPE_CHECKING:  # (a part of Ledger's slots; the type checker reads Ledger's)
        __slots__ = ()

    epoch: int
    counter: int
    ids: Ids
    items: Items
    frontier: Frontier
    waiting: Frontier
    in_flight: dict[str, tuple[Token, int]]
    committed: CommittedIds
    deferred: dict[str, WorkItem]
    cancelled: dict[str, WorkItem]
    commands: dict[str, dict[str, Any]]
    attempts: dict[str, int]
    kinds: dict[str, list[str]]
    last_error: dict[str, str]
    solo: set[str]

    if TYPE_CHECKING:

        def __init__(self, epoch: int = 0) -> None: ...

        def _held(self, live: Frontier, k: int) -> Frontier: ...

        def _register_waiting(self) -> None: ...

    # ----------------------------------------------------------- snapshot form
    def to_snapshot(self, committing: Collection[str] = ()) -> dict[str, Any]:
        """The ledger as a self-contained JSON-ready dict, every payload included (a test's
        or a tool's view; O(items)). The shell saves :meth:`to_compact` instead.

        Args:
            committing: work IDs whose ``committed`` record is journaled but which the live core
                still holds in flight (a group commit in progress): they count as committed, as
                a replay of the journal counts them. Otherwise a snapshot taken between a
                commit's record and its delivery would fold the record in as in flight, and a
                restart would run the work again and record a second commit.
        """
        items = self.items
        frontier, waiting = self._held(self.frontier, 0), self._held(self.waiting, 1)
        return {
            "epoch": self.epoch,
            "counter": self.counter,
            "frontier": [items[w].to_json() for w in frontier],
            "in_flight": [
                {"token": str(t), "rank": r, "work": items[w].to_json()}
                for w, (t, r) in self.in_flight.items()
                if w not in committing
            ],
            "committed": sorted(set(self.committed).union(committing)),
            "deferred": [i.to_json() for i in self.deferred.values()],
            **({"waiting": [items[w].to_json() for w in waiting]} if waiting else {}),
            "attempts": dict(self.attempts),
            "kinds": {k: list(v) for k, v in self.kinds.items()},
            "last_error": dict(self.last_error),
            "solo": sorted(self.solo.difference(committing)),
            **self._operator(lambda w: items[w].to_json()),
        }

    def _operator(self, name: Callable[[str], Any]) -> dict[str, Any]:
        """The snapshot members of the operator's facts (O1): ``cancelled`` (each named by
        ``name(work_id)``) and ``commands``; nothing when there are none (the form of earlier
        versions, byte for byte)."""
        out: dict[str, Any] = {}
        if self.cancelled:
            out["cancelled"] = [name(w) for w in self.cancelled]
        if self.commands:
            out["commands"] = {k: dict(v) for k, v in self.commands.items()}
        return out

    def to_compact(self, committing: Collection[str] = ()) -> dict[str, Any]:
        """The ledger in the compact snapshot form: indices instead of payloads, the
        frontier and the committed set as runs. Its cost is the runs', the dispatches in
        flight's and the failures', not the campaign's size. Loading it needs the items of
        indices ``0 .. size-1`` (:meth:`from_compact`): the submissions store holds them.

        ``committing``: as for :meth:`to_snapshot`.
        """
        index = self.ids.index
        frontier, waiting = self._held(self.frontier, 0), self._held(self.waiting, 1)
        committed = self.committed.runs
        if committing:
            committed = committed.copy()
            for w in committing:
                committed.add(index[w])
        return {
            "form": COMPACT_FORM,
            "epoch": self.epoch,
            "counter": self.counter,
            "size": len(self.ids),
            "frontier": frontier.runs(),
            **self._levels(frontier),
            "in_flight": [
                [index[w], str(t), r] for w, (t, r) in self.in_flight.items() if w not in committing
            ],
            "committed": committed.runs(),
            "deferred": [index[w] for w in self.deferred],
            **({"waiting": waiting.runs()} if waiting else {}),
            "attempts": dict(self.attempts),
            "kinds": {k: list(v) for k, v in self.kinds.items()},
            "last_error": dict(self.last_error),
            "solo": sorted(self.solo.difference(committing)),
            **self._operator(index.__getitem__),
        }

    def _levels(self, f: Frontier) -> dict[str, Any]:
        """The compact form's ``priorities`` member: ``[[level, runs], ...]`` for the levels
        other than 0 of ``f`` that hold work, highest first; nothing when there are none (the
        form of earlier versions, byte for byte)."""
        levels = f.levels()
        return {"priorities": [[k, f.runs(k)] for k in levels]} if levels else {}

    @classmethod
    def from_snapshot(cls, snap: Mapping[str, Any] | None) -> Self:
        """A ledger from :meth:`to_snapshot` output (checked by the snapshot schema on load).
        Indices are numbered committed first (sorted), then frontier, deferred, in flight.

        An in-flight entry whose work ID is also committed or pending is dropped (a work ID is
        in one place; the committed or pending fact is the newer one).
        """
        snap = snap or {}
        led = cls._common(snap)
        for wid in snap.get("committed", ()):
            if wid not in led.ids.index:
                led.committed.add_index(led.ids.assign(wid))
        items = led.items
        for it in snap.get("frontier", ()):
            w = WorkItem.from_json(it)
            if w.work_id not in led.ids.index:
                led.ids.assign(w.work_id)
                items[w.work_id] = w
                led.frontier.append(w.work_id, w.priority)
        for it in snap.get("deferred", ()):
            w = WorkItem.from_json(it)
            if w.work_id not in led.ids.index:
                led.ids.assign(w.work_id)
                items[w.work_id] = w
                led.deferred[w.work_id] = w
        for it in snap.get("waiting", ()):
            w = WorkItem.from_json(it)
            if w.work_id not in led.ids.index:
                led.ids.assign(w.work_id)
                items[w.work_id] = w
                led.waiting.append(w.work_id)
        for it in snap.get("cancelled", ()):
            w = WorkItem.from_json(it)
            if w.work_id not in led.ids.index:
                led.ids.assign(w.work_id)
                items[w.work_id] = w
                led.cancelled[w.work_id] = w
        for tx in snap.get("in_flight", ()):
            w = WorkItem.from_json(tx["work"])
            token = _token(tx["token"])
            if w.work_id not in led.ids.index:
                led.ids.assign(w.work_id)
                items[w.work_id] = w
                led.in_flight[w.work_id] = (token, int(tx["rank"]))
        led._register_waiting()
        return led

    @classmethod
    def _common(cls, snap: Mapping[str, Any]) -> Self:
        led = cls(int(snap.get("epoch", 0)))
        led.counter = int(snap.get("counter", 0))
        led.attempts = {k: int(v) for k, v in snap.get("attempts", {}).items()}
        led.kinds = {k: list(v) for k, v in snap.get("kinds", {}).items()}
        led.last_error = dict(snap.get("last_error", {}))
        led.solo = set(snap.get("solo", ()))
        led.commands = {k: dict(v) for k, v in snap.get("commands", {}).items()}
        return led


def _token(value: Any) -> Token:
    token = Token.parse(value)
    if token is None:
        raise Invalid("in_flight.token", f"not a dispatch token: {value!r}")
    return token
