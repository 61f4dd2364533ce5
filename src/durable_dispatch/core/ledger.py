"""The ledger: a campaign's durable facts, changed only by :mod:`events
<durable_dispatch.core.events>` (pure, no I/O).

The live :class:`~durable_dispatch.core.dispatcher.Dispatcher` keeps its durable state in a ledger
and changes it only through :meth:`Ledger.apply`; replay folds the journal's events into a ledger
with the same method; a snapshot is :meth:`Ledger.to_snapshot`. So live state and replayed state
are one model (issue 16), and a new durable field is added in one place.

The facts: the epoch and its dispatch counter; the frontier (work IDs in dispatch order); the work
items in flight, with the token and rank of their dispatch; the committed work IDs; the deferred
items; per work ID the failures charged (count, kinds, last error) and the ``solo`` mark (failed in
a multi-item dispatch: dispatched alone from now on); the delivery point (U6). A work ID is in
exactly one of frontier, in flight, committed and deferred. Payloads are kept once, in
:attr:`Ledger.items`, for every work ID not committed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from ..schema import Invalid
from .decisions import WorkItem
from .events import (
    Committed,
    Deferred,
    Delivered,
    Dispatched,
    EpochStarted,
    Event,
    Requeued,
    RequeuedDeferred,
    Submitted,
    decode,
)
from .tokens import Token

__all__ = ["Ledger", "Frontier"]


class Frontier:
    """The work IDs waiting for a dispatch, in order: a deque and a set.

    Taking from the head is O(1), and so is every removal the dispatcher makes in order (a
    dispatch takes the head). Removing from the middle (an item whose lease was free behind one
    whose lease was taken) costs O(n), as the scan that found it did.
    """

    __slots__ = ("_queue", "_members")

    def __init__(self) -> None:
        self._queue: deque[str] = deque()
        self._members: set[str] = set()

    def append(self, wid: str) -> None:
        """Add ``wid`` at the back."""
        self._queue.append(wid)
        self._members.add(wid)

    def appendleft(self, wid: str) -> None:
        """Add ``wid`` at the front."""
        self._queue.appendleft(wid)
        self._members.add(wid)

    def remove(self, wid: str) -> None:
        """Remove ``wid`` if it is here."""
        if wid not in self._members:
            return
        self._members.discard(wid)
        if self._queue[0] == wid:
            self._queue.popleft()
        else:
            self._queue.remove(wid)

    def head(self) -> str | None:
        """The first work ID, or None when empty."""
        return self._queue[0] if self._queue else None

    def __contains__(self, wid: object) -> bool:
        return wid in self._members

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[str]:
        return iter(self._queue)


class Ledger:
    """A campaign's durable facts (see the module docs); every change is an event.

    Attributes:
        epoch: the master epoch of the newest ``epoch`` event.
        counter: the highest dispatch number of this epoch so far.
        items: the work item of every work ID not committed (frontier, in flight, deferred).
        frontier: pending work IDs in dispatch order.
        in_flight: work ID -> (token, rank) of its open dispatch, in dispatch order.
        committed: committed work IDs.
        deferred: deferred work items by work ID, in the order they were deferred.
        attempts, kinds, last_error: failures charged per work ID (count, kinds, last reason).
        solo: work IDs dispatched alone from now on.
        delivered: the newest journaled delivery point (U6), -1 when none.
        duplicate_commits: second commits of a work ID seen (and ignored) by :meth:`apply`.
    """

    __slots__ = (
        "epoch",
        "counter",
        "items",
        "frontier",
        "in_flight",
        "committed",
        "deferred",
        "attempts",
        "kinds",
        "last_error",
        "solo",
        "delivered",
        "duplicate_commits",
    )

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch
        self.counter = 0
        self.items: dict[str, WorkItem] = {}
        self.frontier = Frontier()
        self.in_flight: dict[str, tuple[Token, int]] = {}
        self.committed: set[str] = set()
        self.deferred: dict[str, WorkItem] = {}
        self.attempts: dict[str, int] = {}
        self.kinds: dict[str, list[str]] = {}
        self.last_error: dict[str, str] = {}
        self.solo: set[str] = set()
        self.delivered = -1
        self.duplicate_commits = 0

    # ----------------------------------------------------------------- events
    def apply(self, ev: Event) -> None:
        """Apply one event.

        Raises:
            schema.Invalid: a ``requeued`` or ``deferred`` event names a work item this ledger
                never had (S11: a journal with such a record is damaged).
        """
        t = type(ev)
        if t is Dispatched:
            assert isinstance(ev, Dispatched)
            where = (ev.token, ev.rank)
            for wid in ev.work_ids:
                self.frontier.remove(wid)
                self.in_flight[wid] = where
            if ev.token.epoch == self.epoch and ev.token.n > self.counter:
                self.counter = ev.token.n
        elif t is Committed:
            assert isinstance(ev, Committed)
            for wid in ev.work_ids:
                if wid in self.committed:
                    self.duplicate_commits += 1
                    continue
                self._leave(wid)
                self.items.pop(wid, None)
                self.committed.add(wid)
                self.solo.discard(wid)
        elif t is Requeued:
            assert isinstance(ev, Requeued)
            wid = self._known_item(ev.work_id)
            self._leave(wid)
            self.frontier.appendleft(wid)
            if ev.split:
                self.solo.add(wid)
            elif ev.charged:
                self.attempts[wid] = int(ev.attempts or 0)
                self.kinds.setdefault(wid, []).append(ev.kind or "")
                self.last_error[wid] = ev.error or ""
        elif t is Deferred:
            assert isinstance(ev, Deferred)
            wid = self._known_item(ev.work_id)
            self._leave(wid)
            self.deferred[wid] = self.items[wid]
            self.solo.discard(wid)
            self.attempts[wid] = ev.attempts
            self.kinds[wid] = list(ev.kinds)
            self.last_error[wid] = ev.last_error or ""
        elif t is Submitted:
            assert isinstance(ev, Submitted)
            for item in ev.items:
                wid = item.work_id
                if wid not in self.items and wid not in self.committed:
                    self.items[wid] = item
                    self.frontier.append(wid)
        elif t is EpochStarted:
            assert isinstance(ev, EpochStarted)
            self.epoch = ev.epoch
            self.counter = 0
        elif t is RequeuedDeferred:
            assert isinstance(ev, RequeuedDeferred)
            wid = ev.work_id
            if self.deferred.pop(wid, None) is not None:
                self.attempts.pop(wid, None)
                self.kinds.pop(wid, None)
                self.last_error.pop(wid, None)
                self.frontier.append(wid)
        elif t is Delivered:
            assert isinstance(ev, Delivered)
            self.delivered = max(self.delivered, ev.upto)
        else:
            raise TypeError(f"not a state event: {ev!r}")

    def apply_record(self, rec: Any) -> None:
        """Decode one journal record and apply it (an event of a later version is ignored).

        Raises:
            schema.Invalid: the record does not match its schema, or names a work item this
                ledger never had (S11).
        """
        ev = decode(rec)
        if ev is not None:
            self.apply(ev)

    def _leave(self, wid: str) -> None:
        """``wid`` leaves wherever it is (frontier, in flight, deferred) to go somewhere else."""
        if self.in_flight.pop(wid, None) is None and self.deferred.pop(wid, None) is None:
            self.frontier.remove(wid)

    def _known_item(self, wid: str) -> str:
        if wid not in self.items or wid in self.committed:
            raise Invalid("work_id", f"{wid!r} names no open work item of this campaign")
        return wid

    # ---------------------------------------------------------------- queries
    def known(self, wid: str) -> bool:
        """True when ``wid`` is pending, in flight, committed or deferred."""
        return wid in self.items or wid in self.committed

    # ----------------------------------------------------------- snapshot form
    def to_snapshot(self, committing: Collection[str] = ()) -> dict[str, Any]:
        """The ledger as the JSON-ready dict a snapshot body keeps under ``state``.

        Args:
            committing: work IDs whose ``committed`` record is journaled but which the live core
                still holds in flight (a group commit in progress): they count as committed, as
                a replay of the journal counts them. Otherwise a snapshot taken between a
                commit's record and its delivery would fold the record in as in flight, and a
                restart would run the work again and record a second commit.
        """
        items = self.items
        return {
            "epoch": self.epoch,
            "counter": self.counter,
            "frontier": [items[w].to_json() for w in self.frontier],
            "in_flight": [
                {"token": str(t), "rank": r, "work": items[w].to_json()}
                for w, (t, r) in self.in_flight.items()
                if w not in committing
            ],
            "committed": sorted(self.committed.union(committing)),
            "deferred": [i.to_json() for i in self.deferred.values()],
            "attempts": dict(self.attempts),
            "kinds": {k: list(v) for k, v in self.kinds.items()},
            "last_error": dict(self.last_error),
            "solo": sorted(self.solo.difference(committing)),
        }

    @classmethod
    def from_snapshot(cls, snap: Mapping[str, Any] | None) -> Ledger:
        """A ledger from :meth:`to_snapshot` output (checked by the snapshot schema on load).

        An in-flight entry whose work ID is also committed or pending is dropped (a work ID is
        in one place; the committed or pending fact is the newer one).
        """
        snap = snap or {}
        led = cls(int(snap.get("epoch", 0)))
        led.counter = int(snap.get("counter", 0))
        led.committed = set(snap.get("committed", ()))
        led.attempts = {k: int(v) for k, v in snap.get("attempts", {}).items()}
        led.kinds = {k: list(v) for k, v in snap.get("kinds", {}).items()}
        led.last_error = dict(snap.get("last_error", {}))
        led.solo = set(snap.get("solo", ()))
        items = led.items
        for it in snap.get("frontier", ()):
            w = WorkItem.from_json(it)
            if w.work_id not in items and w.work_id not in led.committed:
                items[w.work_id] = w
                led.frontier.append(w.work_id)
        for it in snap.get("deferred", ()):
            w = WorkItem.from_json(it)
            if w.work_id not in items and w.work_id not in led.committed:
                items[w.work_id] = w
                led.deferred[w.work_id] = w
        for tx in snap.get("in_flight", ()):
            w = WorkItem.from_json(tx["work"])
            token = Token.parse(tx["token"])
            if token is None:
                raise Invalid("in_flight.token", f"not a dispatch token: {tx['token']!r}")
            if w.work_id not in items and w.work_id not in led.committed:
                items[w.work_id] = w
                led.in_flight[w.work_id] = (token, int(tx["rank"]))
        return led

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ledger):
            return NotImplemented
        return self.to_snapshot() == other.to_snapshot()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"<Ledger epoch={self.epoch} pending={len(self.frontier)} "
            f"in_flight={len(self.in_flight)} committed={len(self.committed)} "
            f"deferred={len(self.deferred)}>"
        )
