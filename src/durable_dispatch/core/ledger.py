"""The ledger: a campaign's durable facts, changed only by :mod:`events
<durable_dispatch.core.events>` (pure, no I/O).

The live :class:`~durable_dispatch.core.dispatcher.Dispatcher` keeps its durable state in a ledger
and changes it only through :meth:`Ledger.apply`; replay folds the journal's events into a ledger
with the same method; a snapshot is :meth:`Ledger.to_compact` (or the self-contained
:meth:`Ledger.to_snapshot`). So live state and replayed state are one model, and a new
durable field is added in one place.

The facts: the epoch and its dispatch counter; the frontier (work IDs in dispatch order); the work
items in flight, with the token and rank of their dispatch; the committed work IDs; the deferred
items; the cancelled items (an operator's ``cancel``, final like a commit); per work ID the failures
charged (count, kinds, last error) and the ``solo`` mark (failed in a multi-item dispatch:
dispatched alone from now on); the delivery point (results are delivered at least once); the
operator commands applied (their IDs and outcomes). A work ID is in exactly one of frontier, in
flight, committed, deferred and cancelled. Payloads are kept once, in :attr:`Ledger.items`, for
every work ID not committed.

Dense indices. Every work ID gets the next *index* when it is first submitted
(:class:`Ids`); a submission may name its first index (the submissions store's numbering), and
the indices it skips are *void* (in no place). The frontier and the committed set are kept as
runs of consecutive indices, so the compact snapshot form (:meth:`Ledger.to_compact`) costs what
the runs, the dispatches in flight and the failures cost, not what the campaign's size costs:
the payloads are in the submissions store, written once at submit.

Dependencies. An item whose ``after`` names a work ID not committed *waits*: it is in
:attr:`Ledger.waiting` (runs of indices, so a compact snapshot stays flat with a million waiting
items), not in the frontier. Which items wait is a function of the items and the committed set,
so replay and the live core agree without an event of its own: a ``committed`` event releases
each item whose last missing dependency it committed, to the back of its priority's level of the
frontier (its priority counts from then on), in the order the items were submitted. An item
deferred with kind ``"dependency"`` stays registered under its missing dependencies, so a
dependency requeued and committed later releases it too. :attr:`Ledger.missing` and
:attr:`Ledger.dependents` are derived (rebuilt on load); a work ID is in exactly one of frontier,
waiting, in flight, committed and deferred.

Withdrawn items (not durable). :meth:`Ledger.withdraw` takes pending and waiting items out of
*this run* in memory, with no event (the futures executor's ``shutdown(cancel_futures=True)``):
the live frontier and waiting set no longer hold them, so nothing dispatches them and the
campaign can end without them, but the durable record keeps them where they were: the journal
has no event for it, both snapshot forms count them pending or waiting, and
:meth:`Ledger.put_back` returns them before the run's last view. A later run takes them up.
"""

from __future__ import annotations

import itertools
from collections.abc import (
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any

from ..schema import Invalid, is_work_item
from ..tokens import Token
from .decisions import WorkItem
from .events import (
    Cancelled,
    CommandApplied,
    Committed,
    Deferred,
    Delivered,
    Dispatched,
    EpochStarted,
    Event,
    Requeued,
    RequeuedDeferred,
    Submitted,
    WorkerHost,
    decode,
)
from .indexed import (
    DIGEST_BYTES,
    CommittedIds,
    Frontier,
    Ids,
    Items,
    Runs,
    _after_ids,
    payload_digests,
    stored_item,
    stored_payload_digests,
)
from .snapshot_form import COMPACT_FORM, SnapshotForms, _token
from .waiting import WaitingSet
from .withdrawn import Withdrawal

__all__ = ["Ledger", "LedgerLoader", "COMPACT_FORM"]


class Ledger(WaitingSet, Withdrawal, SnapshotForms):
    """A campaign's durable facts (see the module docs); every change is an event.

    Attributes:
        epoch: the master epoch of the newest ``epoch`` event.
        counter: the highest dispatch number of this epoch so far.
        ids: work ID <-> dense index of every work ID this ledger numbered.
        items: the work item of every work ID not committed (frontier, in flight, deferred).
        frontier: pending work IDs in dispatch order.
        in_flight: work ID -> (token, rank) of its open dispatch, in dispatch order.
        committed: committed work IDs (a set).
        deferred: deferred work items by work ID, in the order they were deferred.
        waiting: work IDs waiting for a dependency, in submission order.
        missing: work ID (waiting, or deferred with kind ``"dependency"``) -> how many of its
            ``after`` IDs are not committed.
        dependents: a work ID not committed -> the items that name it in ``after`` and wait
            for it (or were deferred for it), in submission order: a work ID when there is one
            (most chains: no list of its own), else a list (see :meth:`dependents_of`).
        released: work IDs that left the deferred set because their last missing dependency
            committed; the shell takes them (to resolve their defer-journal records).
        cancelled: cancelled work items by work ID, in the order they were cancelled.
        commands: the outcome of every operator command applied, by command ID (each applied once).
        attempts, kinds, last_error: failures charged per work ID (count, kinds, last reason).
        solo: work IDs dispatched alone from now on.
        delivered: the newest journaled delivery point (delivery is at least once), -1 when none.
        duplicate_commits: second commits of a work ID seen (and ignored) by :meth:`apply`.
        withdrawn: None, or the frontier and the waiting set of the items :meth:`withdraw`
            took out of this run (in memory only: durably they are still pending or waiting).
    """

    __slots__ = (
        "epoch",
        "counter",
        "ids",
        "items",
        "frontier",
        "in_flight",
        "committed",
        "deferred",
        "waiting",
        "missing",
        "dependents",
        "released",
        "attempts",
        "kinds",
        "last_error",
        "solo",
        "delivered",
        "duplicate_commits",
        "cancelled",
        "commands",
        "withdrawn",
    )

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch
        self.counter = 0
        self.ids = Ids()
        self.items = Items(self.ids)
        self.frontier = Frontier(self.ids)
        self.in_flight: dict[str, tuple[Token, int]] = {}
        self.committed = CommittedIds(self.ids)
        self.deferred: dict[str, WorkItem] = {}
        self.waiting = Frontier(self.ids)
        self.missing: dict[str, int] = {}
        self.dependents: dict[str, str | list[str]] = {}
        self.released: list[str] = []
        self.attempts: dict[str, int] = {}
        self.kinds: dict[str, list[str]] = {}
        self.last_error: dict[str, str] = {}
        self.solo: set[str] = set()
        self.delivered = -1
        self.duplicate_commits = 0
        self.cancelled: dict[str, WorkItem] = {}
        self.commands: dict[str, dict[str, Any]] = {}
        self.withdrawn: tuple[Frontier, Frontier] | None = None

    # ----------------------------------------------------------------- events
    def apply(self, ev: Event) -> None:
        """Apply one event.

        Raises:
            schema.Invalid: the event names what this ledger does not have (a journal with
                such a record is damaged, even when its checksum holds): a dispatch of an item
                that is not pending, or under a token of another epoch; a commit of an item not
                in flight under that token (a second commit of a committed item is counted, not
                refused); a ``requeued``, ``deferred`` or ``requeued_deferred`` event for a work
                ID never submitted; a submission over indices already numbered.
        """
        apply = _APPLY.get(type(ev))
        if apply is None:
            raise TypeError(f"not a state event: {ev!r}")
        apply(self, ev)

    # One method per event type (the table _APPLY below maps each type to its method).
    def _dispatched(self, ev: Dispatched) -> None:
        if ev.token.epoch != self.epoch:
            raise Invalid("token", f"{ev.token} is not of the current epoch {self.epoch}")
        where = (ev.token, ev.rank)
        wids = ev.work_ids
        taken = self.frontier.remove_all(wids)
        flying = self.in_flight
        for wid in wids[:taken]:
            flying[wid] = where
        if taken < len(wids):
            raise Invalid("work_ids", f"{wids[taken]!r} is not a pending item of this campaign")
        if ev.token.n > self.counter:
            self.counter = ev.token.n

    def _committed(self, ev: Committed) -> None:
        index, runs, flying, solo = self.ids.index, self.committed.runs, self.in_flight, self.solo
        done: list[int] = []  # committed now: added to the runs at the end, in one step
        for wid in ev.work_ids:
            held = flying.get(wid)
            if held is None or (ev.token is not None and held[0] != ev.token):
                i = index.get(wid)
                if i is not None and (i in runs or i in done):
                    self.duplicate_commits += 1  # a second commit: the first one stands
                    continue
                why = "not in flight" if held is None else f"in flight under {held[0]}"
                runs.add_all(done)  # (as far as it got, as one add at a time left it)
                raise Invalid("work_ids", f"commit of {wid!r} under {ev.token}: it is {why}")
            del flying[wid]  # (it left the frontier when it was dispatched)
            done.append(index[wid])
            if solo:
                solo.discard(wid)
        runs.add_all(done)  # (an item in flight is never committed: each is new to the runs)
        self.items.discard_indices(done)
        if self.dependents:
            ids = self.ids.ids
            for i in done:
                self._release_dependents_of(ids[i])  # type: ignore[arg-type]

    def _requeued(self, ev: Requeued) -> None:
        wid = self._known_item(ev.work_id)
        self._leave(wid)
        self.frontier.appendleft(wid, self.items[wid].priority)
        if ev.split:
            self.solo.add(wid)
        elif ev.charged:
            self.attempts[wid] = int(ev.attempts or 0)
            self.kinds.setdefault(wid, []).append(ev.kind or "")
            self.last_error[wid] = ev.error or ""

    def _deferred(self, ev: Deferred) -> None:
        wid = self._known_item(ev.work_id)
        self._leave(wid)
        self.deferred[wid] = self.items[wid]
        self.solo.discard(wid)
        self.attempts[wid] = ev.attempts
        self.kinds[wid] = list(ev.kinds)
        self.last_error[wid] = ev.last_error or ""

    def _submitted(self, ev: Submitted) -> None:
        self._submit(ev.items, ev.first)

    def _epoch_started(self, ev: EpochStarted) -> None:
        self.epoch = ev.epoch
        self.counter = 0

    def _requeued_deferred(self, ev: RequeuedDeferred) -> None:
        wid = ev.work_id
        if wid not in self.ids.index:
            raise Invalid("work_id", f"{wid!r} names no work item of this campaign")
        if self.deferred.pop(wid, None) is not None or self.cancelled.pop(wid, None) is not None:
            self.attempts.pop(wid, None)
            self.kinds.pop(wid, None)
            self.last_error.pop(wid, None)
            if self.missing.get(wid):
                self.waiting.append(wid)  # (still registered under its missing dependencies)
            else:
                self.frontier.append(wid, self.items[wid].priority)

    def _cancelled(self, ev: Cancelled) -> None:
        wid = ev.work_id
        if wid in self.cancelled:
            return  # (a command applied again after a crash before its ``command`` record)
        wid = self._known_item(wid)
        self._leave(wid)
        self.cancelled[wid] = self.items[wid]
        self.solo.discard(wid)

    def _command_applied(self, ev: CommandApplied) -> None:
        self.commands[ev.id] = dict(ev.outcome)

    def _delivered(self, ev: Delivered) -> None:
        self.delivered = max(self.delivered, ev.upto)

    def _worker_host(self, ev: WorkerHost) -> None:
        """Where a rank runs is for the joblog (``history``): nothing of the ledger's."""

    def _submit(self, items: Sequence[WorkItem], first: int | None) -> None:
        """New items join the back of their priority's level of the frontier, numbered from
        ``first`` (default: the next index); a known work ID is ignored and its index left
        void."""
        ids = self.ids
        if first is not None:
            ids.pad(first)
        index, mine, numbered = ids.index, self.items, ids.ids
        start = len(numbered)
        new: list[int] = []  # the indices of the new items (the others are void)
        levels = False
        deps = False
        for i, item in enumerate(items, start):
            wid = item.work_id
            if wid in index:
                numbered.append(None)  # known (pending, in flight, deferred or committed)
                continue
            numbered.append(wid)
            index[wid] = i
            new.append(i)
            if item.priority:
                levels = True
            if item.after:
                deps = True
        if ids.digested() < start + len(items):  # not given by the store (nor the caller)
            _digest(ids, items, start)
        if len(new) == len(items) and not levels and not deps:  # all new, level 0: in bulk
            mine.put(start, items)
            self.frontier.extend_range(start, start + len(new))
            return
        for i in new:
            item = items[i - start]
            mine[numbered[i]] = item  # type: ignore[index]
            if item.after and self._waits(item.work_id, item.after):
                self.waiting.append_index(i)
            else:
                self.frontier.append_index(i, item.priority)

    def apply_record(
        self, rec: Any, stored: Callable[[int, int], Sequence[WorkItem]] | None = None
    ) -> None:
        """Decode one journal record and apply it (an event of a later version is ignored).

        ``stored(first, count)`` gives the items of a ``submitted`` record whose payloads are in
        the submissions store (see :func:`~durable_dispatch.core.events.decode`).

        Raises:
            schema.Invalid: the record does not match its schema, or names a work item this
                ledger never had.
        """
        ev = decode(rec, stored)
        if ev is not None:
            self.apply(ev)

    def _leave(self, wid: str) -> None:
        """``wid`` leaves wherever it is (frontier, waiting, in flight, deferred, cancelled) to
        go somewhere else."""
        if (
            self.in_flight.pop(wid, None) is None
            and self.deferred.pop(wid, None) is None
            and self.cancelled.pop(wid, None) is None
        ):
            if not self.frontier.remove(wid) and not self.waiting.remove(wid):
                held = self.withdrawn
                if held is not None and not held[0].remove(wid):
                    held[1].remove(wid)

    def _known_item(self, wid: str) -> str:
        if wid not in self.items:
            raise Invalid("work_id", f"{wid!r} names no open work item of this campaign")
        return wid

    # ---------------------------------------------------------------- queries
    def known(self, wid: str) -> bool:
        """True when ``wid`` is pending, waiting, in flight, committed, deferred or cancelled."""
        return wid in self.ids.index

    @classmethod
    def from_compact(
        cls, snap: Mapping[str, Any], stored: Iterable[tuple[int, Sequence[Any]]]
    ) -> tuple[Ledger, dict[int, WorkItem]]:
        """A ledger from :meth:`to_compact` output and the submissions store's records
        ``(first, items)``; see :class:`LedgerLoader`, which this runs in one go."""
        load = LedgerLoader(snap)
        for first, items in stored:
            load.take(first, items)
        return load.finish()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ledger):
            return NotImplemented
        return self.to_snapshot() == other.to_snapshot()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"<Ledger epoch={self.epoch} pending={len(self.frontier)} "
            f"in_flight={len(self.in_flight)} committed={len(self.committed)} "
            f"deferred={len(self.deferred)} waiting={len(self.waiting)}>"
            f"deferred={len(self.deferred)} cancelled={len(self.cancelled)}>"
        )


#: Event type -> the Ledger method that applies it (Ledger.apply).
_APPLY: dict[type, Callable[[Ledger, Any], None]] = {
    Dispatched: Ledger._dispatched,
    Committed: Ledger._committed,
    Requeued: Ledger._requeued,
    Deferred: Ledger._deferred,
    Submitted: Ledger._submitted,
    EpochStarted: Ledger._epoch_started,
    RequeuedDeferred: Ledger._requeued_deferred,
    Delivered: Ledger._delivered,
    WorkerHost: Ledger._worker_host,
    Cancelled: Ledger._cancelled,
    CommandApplied: Ledger._command_applied,
}


def _first(v: Sequence[Any]) -> Any:
    return v[0]


def _third(v: Sequence[Any]) -> Any:
    return v[2]


def _digest(ids: Ids, items: Sequence[WorkItem], start: int) -> None:
    """Set the payload digests of ``items`` (indices from ``start``) that are not set yet. A
    payload that is not JSON (a core used without a store, in a test) gets none."""
    k = max(ids.digested() - start, 0)
    try:
        ids.set_digests(start + k, payload_digests(w.payload for w in items[k:]))
    except TypeError:
        for i, w in enumerate(items[k:], start + k):
            try:
                ids.set_digests(i, payload_digests((w.payload,)))
            except TypeError:
                ids.set_digests(i, bytes(DIGEST_BYTES))


def _place(where: bytearray, a: int, b: int, code: int, name: str) -> None:
    """Mark indices ``a .. b-1`` as in place ``code`` (a compact snapshot's member ``name``)."""
    if not 0 <= a < b <= len(where):
        raise Invalid(name, f"indices {a}..{b - 1} are outside 0..{len(where) - 1}")
    if where[a:b].count(0) != b - a:
        raise Invalid(name, f"an index of {a}..{b - 1} is in two places")
    where[a:b] = bytes([code]) * (b - a)


class LedgerLoader:
    """Builds a ledger from a snapshot state (either form) and the submissions store's records,
    taken one at a time (so a store of millions of items is never decoded all at once).

    For the compact form (:meth:`Ledger.to_compact`), each record ``(first, items)`` (item JSON,
    ``None`` for a void index, of indices ``first, first+1, ...``, in order) puts the items of
    indices below the snapshot's ``size`` in their place: pending, in flight, committed (its
    work ID only) or deferred. Items of later indices, and every item under the self-contained
    form, are kept by index for the journal's stored ``submitted`` records to take up.
    """

    __slots__ = ("_snap", "_led", "_where", "_next", "_tail", "_size")

    def __init__(self, snap: Mapping[str, Any] | None) -> None:
        snap = snap or {}
        self._next = 0
        self._tail: dict[int, WorkItem] = {}
        if snap.get("form") is None:
            self._snap: Mapping[str, Any] | None = None
            self._led = Ledger.from_snapshot(snap)
            self._where = bytearray()
            self._size = 0
            return
        if snap["form"] != COMPACT_FORM:
            raise Invalid("form", f"snapshot form {snap['form']!r} is not known to this version")
        self._snap = snap
        self._led = Ledger._common(snap)
        self._size = size = int(snap["size"])
        # where each index is: 0 void, 1 pending, 2 in flight, 3 committed, 4 deferred,
        # 5 waiting, 6 cancelled
        self._where = where = bytearray(size)
        for a, b in snap["frontier"]:
            _place(where, a, b, 1, "frontier")
        for _level, runs in snap.get("priorities", ()):
            for a, b in runs:
                _place(where, a, b, 1, "priorities")
        for flight in snap["in_flight"]:
            _place(where, flight[0], flight[0] + 1, 2, "in_flight")
        for a, b in snap["committed"]:
            _place(where, a, b, 3, "committed")
        for i in snap["deferred"]:
            _place(where, i, i + 1, 4, "deferred")
        for a, b in snap.get("waiting", ()):
            _place(where, a, b, 5, "waiting")
        for i in snap.get("cancelled", ()):
            _place(where, i, i + 1, 6, "cancelled")
        self._led.ids.ids.extend([None] * size)

    def take(self, first: int, items: Sequence[Any], digests: bytes | None = None) -> None:
        """One submissions store record; ``digests``: its items' payload digests, as the record
        holds them (computed from the items when None: a store written before digests).

        Raises:
            schema.Invalid: it does not start where the last one ended, or names a work ID
                already placed.
        """
        if first != self._next:
            raise Invalid("first", f"store record at index {first}, {self._next} expected")
        end = self._next = first + len(items)
        size, where, tail = self._size, self._where, self._tail
        led = self._led
        led.ids.set_digests(first, stored_payload_digests(items) if digests is None else digests)
        ids, index, mine = led.ids.ids, led.ids.index, led.items
        if first < end <= size and where.count(where[first], first, end) == end - first:
            if where[first] in (1, 3, 5) and self._in_bulk(items, where[first] != 3):
                return  # the usual record: every item pending, waiting or committed, in the
                # usual form
        for i, item in enumerate(items, first):
            if item is None:
                if i < size and where[i]:
                    raise Invalid("items", f"index {i} is void in the store, not in the snapshot")
                continue
            if i >= size:
                tail[i] = stored_item(item)
                continue
            w = where[i]
            if not w:
                continue
            work: Any
            if type(item) is dict and is_work_item(item):  # checked; built when first used
                wid, work = item["work_id"], item
            elif (
                type(item) is list
                and 2 <= len(item) <= 3
                and type(item[0]) is str
                and (len(item) == 2 or _after_ids(item[2]))
            ):
                wid, work = item[0], item
            else:
                work = stored_item(item)
                wid = work.work_id
            if wid in index:
                raise Invalid("work_id", f"{wid!r} is stored at two indices")
            ids[i] = wid
            index[wid] = i
            if w != 3:  # committed: its work ID is all that is kept
                mine[wid] = work  # (a WorkItem, or its stored form: Items takes either)

    def _in_bulk(self, items: Sequence[Any], pending: bool) -> bool:
        """Take a record whose items are all pending (or all committed: only their work IDs
        are kept) in bulk, in C-level passes with no Python step per item, when each is
        ``[work_id, payload]`` (or each ``[work_id, payload, after]``, G4); False (nothing
        taken) otherwise, for the item-by-item path.

        Raises:
            schema.Invalid: a work ID is stored at two indices.
        """
        if set(map(type, items)) != {list}:
            return False
        lens = set(map(len, items))
        if lens == {3}:
            afters = list(map(_third, items))
            if set(map(type, afters)) != {list} or not set(
                map(type, itertools.chain.from_iterable(afters))
            ) <= {str}:
                return False
        elif lens != {2}:
            return False
        wids = list(map(_first, items))
        if set(map(type, wids)) != {str}:
            return False
        first = self._next - len(items)
        index = self._led.ids.index
        before = len(index)
        index.update(zip(wids, range(first, self._next), strict=True))
        if len(index) != before + len(wids):
            raise Invalid("work_id", "a work ID is stored at two indices")
        self._led.ids.ids[first : self._next] = wids
        if pending:
            self._led.items.put(first, items)  # each becomes a WorkItem when first used
        return True

    @property
    def stored(self) -> int:
        """The indices the records taken so far cover."""
        return self._next

    def finish(self) -> tuple[Ledger, dict[int, WorkItem]]:
        """The ledger, and the items of the indices it has not placed, by index.

        Raises:
            schema.Invalid: the store does not cover the compact snapshot's indices.
        """
        led, snap = self._led, self._snap
        if snap is None:
            return led, self._tail
        if self._next < self._size:
            raise Invalid("size", f"the submissions store holds {self._next} of {self._size}")
        ids, items = led.ids.ids, led.items
        led.committed = CommittedIds(led.ids, Runs.of_runs(snap["committed"]))
        led.frontier = Frontier.of_runs(led.ids, snap["frontier"], snap.get("priorities", ()))
        for i in snap["deferred"]:
            wid = ids[i]
            if wid is not None:
                led.deferred[wid] = items[wid]
        for i in snap.get("cancelled", ()):
            wid = ids[i]
            if wid is not None:
                led.cancelled[wid] = items[wid]
        for i, token, rank in snap["in_flight"]:
            wid = ids[i]
            if wid is not None:
                led.in_flight[wid] = (_token(token), int(rank))
        if snap.get("waiting"):
            led.waiting = Frontier.of_runs(led.ids, snap["waiting"])
        led._register_waiting()
        self._where = bytearray()
        return led, self._tail
