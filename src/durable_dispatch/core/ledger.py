"""The ledger: a campaign's durable facts, changed only by :mod:`events
<durable_dispatch.core.events>` (pure, no I/O).

The live :class:`~durable_dispatch.core.dispatcher.Dispatcher` keeps its durable state in a ledger
and changes it only through :meth:`Ledger.apply`; replay folds the journal's events into a ledger
with the same method; a snapshot is :meth:`Ledger.to_compact` (or the self-contained
:meth:`Ledger.to_snapshot`). So live state and replayed state are one model, and a new
durable field is added in one place.

The facts: the epoch and its dispatch counter; the frontier (work IDs in dispatch order); the work
items in flight, with the token and rank of their dispatch; the committed work IDs; the deferred
items; per work ID the failures charged (count, kinds, last error) and the ``solo`` mark (failed in
a multi-item dispatch: dispatched alone from now on); the delivery point (U6). A work ID is in
exactly one of frontier, in flight, committed and deferred. Payloads are kept once, in
:attr:`Ledger.items`, for every work ID not committed.

Dense indices (S8). Every work ID gets the next *index* when it is first submitted
(:class:`Ids`); a submission may name its first index (the submissions store's numbering), and
the indices it skips are *void* (in no place). The frontier and the committed set are kept as
runs of consecutive indices, so the compact snapshot form (:meth:`Ledger.to_compact`) costs what
the runs, the dispatches in flight and the failures cost, not what the campaign's size costs:
the payloads are in the submissions store, written once at submit.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import (
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from collections.abc import Set as AbstractSet
from typing import Any

from ..schema import Invalid, is_work_item
from ..tokens import Token
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

__all__ = [
    "Ledger",
    "LedgerLoader",
    "Frontier",
    "Ids",
    "Items",
    "Runs",
    "CommittedIds",
    "COMPACT_FORM",
    "store_form",
]

#: The ``form`` member of a compact snapshot state (:meth:`Ledger.to_compact`); a state without
#: it is the self-contained form (:meth:`Ledger.to_snapshot`).
COMPACT_FORM = 2


class Ids:
    """Work ID <-> dense index, both ways: index ``i`` names ``ids[i]`` (None: void)."""

    __slots__ = ("ids", "index")

    def __init__(self) -> None:
        self.ids: list[str | None] = []
        self.index: dict[str, int] = {}

    def assign(self, wid: str) -> int:
        """The next index, for the new work ID ``wid``."""
        i = len(self.ids)
        self.ids.append(wid)
        self.index[wid] = i
        return i

    def pad(self, first: int) -> None:
        """Make ``first`` the next index: the indices skipped are void.

        Raises:
            schema.Invalid: ``first`` is below the next index (a submission that overlaps one
                already numbered).
        """
        n = len(self.ids)
        if first < n:
            raise Invalid("first", f"index {first} overlaps the {n} already numbered")
        self.ids.extend([None] * (first - n))

    def __len__(self) -> int:
        return len(self.ids)


class Runs:
    """A set of indices as sorted, disjoint runs ``[start, end)``: adding in order, or next to
    a run, costs O(log runs); the runs are what a compact snapshot writes."""

    __slots__ = ("_starts", "_ends", "_n")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._n = 0

    @classmethod
    def of_runs(cls, runs: Iterable[Sequence[int]]) -> Runs:
        """Runs from :meth:`runs` output, sorted, disjoint and not adjacent, in O(runs).

        Raises:
            schema.Invalid: the runs are not so.
        """
        r = cls()
        last = -1
        for run in runs:
            a, b = run
            if a <= last or b <= a:
                raise Invalid("committed", f"run {[a, b]} is empty, unsorted or overlapping")
            r._starts.append(a)
            r._ends.append(b)
            r._n += b - a
            last = b
        return r

    def add(self, i: int) -> bool:
        """Add ``i``; False when it was there."""
        starts, ends = self._starts, self._ends
        if ends and ends[-1] <= i:  # the usual case: past the last run (commits come in order)
            if ends[-1] == i:
                ends[-1] = i + 1
            else:
                starts.append(i)
                ends.append(i + 1)
            self._n += 1
            return True
        k = bisect_right(starts, i)
        if k and ends[k - 1] >= i:
            if ends[k - 1] > i:
                return False
            ends[k - 1] = i + 1
            if k < len(starts) and starts[k] == i + 1:  # it closed the gap to the next run
                ends[k - 1] = ends[k]
                del starts[k], ends[k]
        elif k < len(starts) and starts[k] == i + 1:
            starts[k] = i
        else:
            starts.insert(k, i)
            ends.insert(k, i + 1)
        self._n += 1
        return True

    def __contains__(self, i: object) -> bool:
        if type(i) is not int:
            return False
        k = bisect_right(self._starts, i)
        return bool(k) and i < self._ends[k - 1]

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[int]:
        for a, b in zip(self._starts, self._ends, strict=True):
            yield from range(a, b)

    def runs(self) -> list[list[int]]:
        """The runs, ``[[start, end], ...]``, sorted."""
        return [[a, b] for a, b in zip(self._starts, self._ends, strict=True)]

    def copy(self) -> Runs:
        """A copy."""
        r = Runs()
        r._starts, r._ends, r._n = list(self._starts), list(self._ends), self._n
        return r


def store_form(item: WorkItem) -> Any:
    """How the submissions store writes ``item``: ``[work_id, payload]`` when every other member
    holds its default (most items), else ``WorkItem.to_json``."""
    if (
        item.timeout is None
        and not item.leases
        and not item.inputs
        and not item.self_contained
        and not item.priority
    ):
        return [item.work_id, item.payload]
    return item.to_json()


def _stored_item(v: Any) -> WorkItem:
    """A work item in the submissions store's form (:func:`store_form`), checked (S11).

    Raises:
        schema.Invalid: not a work item in either form.
    """
    if type(v) is list:
        if len(v) == 2 and type(v[0]) is str:
            return WorkItem(v[0], v[1])
    elif is_work_item(v):
        return WorkItem.from_json(v)
    raise Invalid("items", "not a work item ([work_id, payload] or an object with a work_id)")


class Items(MutableMapping[str, WorkItem]):
    """The open work items by work ID, kept in a list by dense index (a slot per item, no hash
    table of its own). An item loaded from the submissions store stays in the store's form
    until it is first used (a reopen of millions of items builds no work item up front)."""

    __slots__ = ("_ids", "_by", "_n")

    def __init__(self, ids: Ids) -> None:
        self._ids = ids
        self._by: list[Any] = []  # index -> WorkItem, its stored form, or None
        self._n = 0

    def __getitem__(self, wid: str) -> WorkItem:
        i = self._ids.index.get(wid)
        by = self._by
        if i is None or i >= len(by) or by[i] is None:
            raise KeyError(wid)
        v = by[i]
        if type(v) is not WorkItem:
            v = by[i] = _stored_item(v)
        return v

    def __contains__(self, wid: object) -> bool:
        i = self._ids.index.get(wid) if type(wid) is str else None
        return i is not None and i < len(self._by) and self._by[i] is not None

    def __setitem__(self, wid: str, item: WorkItem) -> None:
        i = self._ids.index[wid]  # numbered first (Ids.assign)
        by = self._by
        if i >= len(by):
            by.extend([None] * (i + 1 - len(by)))
        if by[i] is None:
            self._n += 1
        by[i] = item

    def __delitem__(self, wid: str) -> None:
        if not self.discard(wid):
            raise KeyError(wid)

    def discard(self, wid: str) -> bool:
        """Forget ``wid``'s item if there is one; True when there was."""
        i = self._ids.index.get(wid)
        by = self._by
        if i is None or i >= len(by) or by[i] is None:
            return False
        by[i] = None
        self._n -= 1
        return True

    def put(self, first: int, items: Sequence[Any]) -> None:
        """Items (or their stored forms) of the new indices ``first, first+1, ...``, at once."""
        by = self._by
        if len(by) < first:
            by.extend([None] * (first - len(by)))
        by[first : first + len(items)] = items
        self._n += len(items)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[str]:
        ids = self._ids.ids
        for i, v in enumerate(self._by):
            if v is not None:
                yield ids[i]  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"<Items of {self._n} open work IDs>"


class CommittedIds(AbstractSet[str]):
    """The committed work IDs: a set of strings, kept as :class:`Runs` of indices."""

    __slots__ = ("_runs", "_ids")

    def __init__(self, ids: Ids, runs: Runs | None = None) -> None:
        self._ids = ids
        self._runs = runs if runs is not None else Runs()

    def __contains__(self, wid: object) -> bool:
        i = self._ids.index.get(wid) if type(wid) is str else None
        if i is None:
            return False
        runs = self._runs  # Runs.__contains__, inlined: a RESULT asks it for every item
        k = bisect_right(runs._starts, i)
        return k > 0 and i < runs._ends[k - 1]

    def __iter__(self) -> Iterator[str]:
        ids = self._ids.ids
        for i in self._runs:
            w = ids[i]
            if w is not None:
                yield w

    def __len__(self) -> int:
        return len(self._runs)

    def add_index(self, i: int) -> None:
        """Index ``i`` committed."""
        self._runs.add(i)

    @property
    def runs(self) -> Runs:
        """The committed indices."""
        return self._runs

    def __repr__(self) -> str:
        return f"CommittedIds({set(self)!r})"


class Frontier:
    """The work IDs waiting for a dispatch, in order, as runs of dense indices per priority.

    The frontier serves the highest priority first and is first in, first out within one
    priority (G2). Each priority, or *level*, holds its own runs; most campaigns have only
    level 0. Taking from the head is O(levels), and so is adding at either end of a level.
    Removing from the middle (an item whose lease was free behind one whose lease was taken)
    costs O(runs of its level), as the scan that found it did. Membership is a flag per index;
    the level of a member is kept only for levels other than 0.
    """

    __slots__ = ("_levels", "_order", "_level_of", "_flag", "_n", "_ids")

    def __init__(self, ids: Ids | None = None) -> None:
        self._ids = ids if ids is not None else Ids()
        # level -> runs [start, end) of indices, in order; level 0 is always here
        self._levels: dict[int, deque[list[int]]] = {0: deque()}
        self._order: list[deque[list[int]]] = [self._levels[0]]  # the levels, highest first
        self._level_of: dict[int, int] = {}  # index -> level, for members not of level 0
        self._flag = bytearray()  # 1 where the index is in the frontier
        self._n = 0

    def _index(self, wid: str) -> int:
        i = self._ids.index.get(wid)
        if i is None:
            i = self._ids.assign(wid)  # a frontier used on its own numbers its own IDs
        return i

    def _mark(self, i: int, on: int) -> bool:
        flag = self._flag
        if i >= len(flag):
            if not on:
                return False
            flag.extend(bytes(max(i + 1 - len(flag), len(flag))))
        was = flag[i]
        flag[i] = on
        self._n += on - was
        return was != on

    def _runs_of(self, level: int) -> deque[list[int]]:
        """The runs of ``level``, made (and put in serving order) when it is new."""
        runs = self._levels.get(level)
        if runs is None:
            runs = self._levels[level] = deque()
            self._order = [self._levels[k] for k in sorted(self._levels, reverse=True)]
        return runs

    def _join(self, i: int, level: int) -> deque[list[int]]:
        if level:
            self._level_of[i] = level
        return self._runs_of(level)

    def append(self, wid: str, level: int = 0) -> None:
        """Add ``wid`` at the back of ``level`` (nothing when it is here)."""
        self.append_index(self._index(wid), level)

    def append_index(self, i: int, level: int = 0) -> None:
        """Add index ``i`` at the back of ``level`` (nothing when it is here)."""
        if not self._mark(i, 1):
            return
        runs = self._join(i, level)
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])

    def extend_range(self, a: int, b: int) -> None:
        """Add the indices ``a .. b-1``, none of them here yet, at the back of level 0, in O(1)
        Python steps."""
        if a >= b:
            return
        flag = self._flag
        if b > len(flag):
            flag.extend(bytes(max(b - len(flag), len(flag))))
        flag[a:b] = b"\x01" * (b - a)
        self._n += b - a
        runs = self._levels[0]
        if runs and runs[-1][1] == a:
            runs[-1][1] = b
        else:
            runs.append([a, b])

    def appendleft(self, wid: str, level: int = 0) -> None:
        """Add ``wid`` at the front of ``level`` (nothing when it is here)."""
        i = self._index(wid)
        if not self._mark(i, 1):
            return
        runs = self._join(i, level)
        if runs and runs[0][0] == i + 1:
            runs[0][0] = i
        else:
            runs.appendleft([i, i + 1])

    def remove(self, wid: str) -> None:
        """Remove ``wid`` if it is here."""
        i = self._ids.index.get(wid)
        flag = self._flag
        if i is None or i >= len(flag) or not flag[i]:
            return
        flag[i] = 0
        self._n -= 1
        level = self._level_of.pop(i, 0) if self._level_of else 0
        runs = self._levels[level]
        head = runs[0]
        if head[0] == i:  # the usual case: a dispatch takes the head
            head[0] = i + 1
            if head[1] == i + 1:
                runs.popleft()
                if level and not runs:
                    self._drop(level)
            return
        k = next(k for k, (a, b) in enumerate(runs) if a <= i < b)  # the flag says it is there
        run = runs[k]
        a, b = run
        if i == a:
            run[0] = a + 1
        elif i == b - 1:
            run[1] = b - 1
        else:
            run[1] = i
            runs.insert(k + 1, [i + 1, b])
        if run[0] == run[1]:
            del runs[k]

    def _drop(self, level: int) -> None:
        """Forget an emptied level (not 0), so the head is not looked for there."""
        del self._levels[level]
        self._order = [self._levels[k] for k in sorted(self._levels, reverse=True)]

    def first(self, k: int) -> list[str]:
        """The first ``k`` work IDs (fewer when the frontier is shorter), in serving order."""
        out: list[Any] = []
        ids = self._ids.ids
        for runs in self._order:
            for a, b in runs:
                out += ids[a : min(b, a + k - len(out))]
                if len(out) >= k:
                    return out
        return out

    def head(self) -> str | None:
        """The first work ID, or None when empty."""
        for runs in self._order:
            if runs:
                return self._ids.ids[runs[0][0]]
        return None

    def __contains__(self, wid: object) -> bool:
        i = self._ids.index.get(wid) if type(wid) is str else None
        return i is not None and i < len(self._flag) and self._flag[i] == 1

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[str]:
        ids = self._ids.ids
        for runs in list(self._order):
            for a, b in list(runs):
                for i in range(a, b):
                    yield ids[i]  # type: ignore[misc]

    def runs(self, level: int = 0) -> list[list[int]]:
        """The runs of indices of ``level``, ``[[start, end], ...]``, in serving order."""
        return [list(r) for r in self._levels.get(level, ())]

    def levels(self) -> list[int]:
        """The levels other than 0 that hold work, highest first."""
        return sorted((k for k, runs in self._levels.items() if k and runs), reverse=True)

    @classmethod
    def of_runs(
        cls,
        ids: Ids,
        runs: Iterable[Sequence[int]],
        levels: Iterable[tuple[int, Iterable[Sequence[int]]]] = (),
    ) -> Frontier:
        """A frontier of the indices ``runs`` at level 0 and ``levels`` (``(level, runs)``
        pairs, from :meth:`levels` and :meth:`runs`), already checked to be disjoint and inside
        ``ids``, in O(runs) Python steps (plus one step per index of a level other than 0)."""
        f = cls(ids)
        f._flag = bytearray(len(ids))
        for level, its in ((0, runs), *levels):
            out = f._runs_of(level)
            for a, b in its:
                out.append([a, b])
                f._flag[a:b] = b"\x01" * (b - a)
                f._n += b - a
                if level:
                    f._level_of.update(dict.fromkeys(range(a, b), level))
        return f


class Ledger:
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
        attempts, kinds, last_error: failures charged per work ID (count, kinds, last reason).
        solo: work IDs dispatched alone from now on.
        delivered: the newest journaled delivery point (U6), -1 when none.
        duplicate_commits: second commits of a work ID seen (and ignored) by :meth:`apply`.
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
        self.ids = Ids()
        self.items = Items(self.ids)
        self.frontier = Frontier(self.ids)
        self.in_flight: dict[str, tuple[Token, int]] = {}
        self.committed = CommittedIds(self.ids)
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
            schema.Invalid: the event names what this ledger does not have (S11: a journal with
                such a record is damaged, even when its checksum holds): a dispatch of an item
                that is not pending, or under a token of another epoch; a commit of an item not
                in flight under that token (a second commit of a committed item is counted, not
                refused); a ``requeued``, ``deferred`` or ``requeued_deferred`` event for a work
                ID never submitted; a submission over indices already numbered.
        """
        t = type(ev)
        if t is Dispatched:
            assert isinstance(ev, Dispatched)
            if ev.token.epoch != self.epoch:
                raise Invalid("token", f"{ev.token} is not of the current epoch {self.epoch}")
            where = (ev.token, ev.rank)
            for wid in ev.work_ids:
                if wid not in self.frontier:
                    raise Invalid("work_ids", f"{wid!r} is not a pending item of this campaign")
                self.frontier.remove(wid)
                self.in_flight[wid] = where
            if ev.token.n > self.counter:
                self.counter = ev.token.n
        elif t is Committed:
            assert isinstance(ev, Committed)
            index, runs, flying = self.ids.index, self.committed.runs, self.in_flight
            for wid in ev.work_ids:
                held = flying.get(wid)
                if held is None or (ev.token is not None and held[0] != ev.token):
                    i = index.get(wid)
                    if i is not None and i in runs:
                        self.duplicate_commits += 1  # a second commit: the first one stands
                        continue
                    why = "not in flight" if held is None else f"in flight under {held[0]}"
                    raise Invalid("work_ids", f"commit of {wid!r} under {ev.token}: it is {why}")
                runs.add(index[wid])
                self._leave(wid)
                self.items.discard(wid)
                self.solo.discard(wid)
        elif t is Requeued:
            assert isinstance(ev, Requeued)
            wid = self._known_item(ev.work_id)
            self._leave(wid)
            self.frontier.appendleft(wid, self.items[wid].priority)
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
            self._submit(ev.items, ev.first)
        elif t is EpochStarted:
            assert isinstance(ev, EpochStarted)
            self.epoch = ev.epoch
            self.counter = 0
        elif t is RequeuedDeferred:
            assert isinstance(ev, RequeuedDeferred)
            wid = ev.work_id
            if wid not in self.ids.index:
                raise Invalid("work_id", f"{wid!r} names no work item of this campaign")
            if self.deferred.pop(wid, None) is not None:
                self.attempts.pop(wid, None)
                self.kinds.pop(wid, None)
                self.last_error.pop(wid, None)
                self.frontier.append(wid, self.items[wid].priority)
        elif t is Delivered:
            assert isinstance(ev, Delivered)
            self.delivered = max(self.delivered, ev.upto)
        else:
            raise TypeError(f"not a state event: {ev!r}")

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
        if len(new) == len(items) and not levels:  # all new, all of level 0: in bulk
            mine.put(start, items)
            self.frontier.extend_range(start, start + len(new))
            return
        for i in new:
            item = items[i - start]
            mine[numbered[i]] = item  # type: ignore[index]
            self.frontier.append_index(i, item.priority)

    def apply_record(
        self, rec: Any, stored: Callable[[int, int], Sequence[WorkItem]] | None = None
    ) -> None:
        """Decode one journal record and apply it (an event of a later version is ignored).

        ``stored(first, count)`` gives the items of a ``submitted`` record whose payloads are in
        the submissions store (see :func:`~durable_dispatch.core.events.decode`).

        Raises:
            schema.Invalid: the record does not match its schema, or names a work item this
                ledger never had (S11).
        """
        ev = decode(rec, stored)
        if ev is not None:
            self.apply(ev)

    def _leave(self, wid: str) -> None:
        """``wid`` leaves wherever it is (frontier, in flight, deferred) to go somewhere else."""
        if self.in_flight.pop(wid, None) is None and self.deferred.pop(wid, None) is None:
            self.frontier.remove(wid)

    def _known_item(self, wid: str) -> str:
        if wid not in self.items:
            raise Invalid("work_id", f"{wid!r} names no open work item of this campaign")
        return wid

    # ---------------------------------------------------------------- queries
    def known(self, wid: str) -> bool:
        """True when ``wid`` is pending, in flight, committed or deferred."""
        return wid in self.ids.index

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
        return {
            "epoch": self.epoch,
            "counter": self.counter,
            "frontier": [items[w].to_json() for w in self.frontier],
            "in_flight": [
                {"token": str(t), "rank": r, "work": items[w].to_json()}
                for w, (t, r) in self.in_flight.items()
                if w not in committing
            ],
            "committed": sorted(set(self.committed).union(committing)),
            "deferred": [i.to_json() for i in self.deferred.values()],
            "attempts": dict(self.attempts),
            "kinds": {k: list(v) for k, v in self.kinds.items()},
            "last_error": dict(self.last_error),
            "solo": sorted(self.solo.difference(committing)),
        }

    def to_compact(self, committing: Collection[str] = ()) -> dict[str, Any]:
        """The ledger in the compact snapshot form (S8): indices instead of payloads, the
        frontier and the committed set as runs. Its cost is the runs', the dispatches in
        flight's and the failures', not the campaign's size. Loading it needs the items of
        indices ``0 .. size-1`` (:meth:`from_compact`): the submissions store holds them.

        ``committing``: as for :meth:`to_snapshot`.
        """
        index = self.ids.index
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
            "frontier": self.frontier.runs(),
            **self._levels(),
            "in_flight": [
                [index[w], str(t), r] for w, (t, r) in self.in_flight.items() if w not in committing
            ],
            "committed": committed.runs(),
            "deferred": [index[w] for w in self.deferred],
            "attempts": dict(self.attempts),
            "kinds": {k: list(v) for k, v in self.kinds.items()},
            "last_error": dict(self.last_error),
            "solo": sorted(self.solo.difference(committing)),
        }

    def _levels(self) -> dict[str, Any]:
        """The compact form's ``priorities`` member: ``[[level, runs], ...]`` for the levels
        other than 0 that hold work, highest first; nothing when there are none (the form of
        earlier versions, byte for byte)."""
        f = self.frontier
        levels = f.levels()
        return {"priorities": [[k, f.runs(k)] for k in levels]} if levels else {}

    @classmethod
    def from_snapshot(cls, snap: Mapping[str, Any] | None) -> Ledger:
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
        for tx in snap.get("in_flight", ()):
            w = WorkItem.from_json(tx["work"])
            token = _token(tx["token"])
            if w.work_id not in led.ids.index:
                led.ids.assign(w.work_id)
                items[w.work_id] = w
                led.in_flight[w.work_id] = (token, int(tx["rank"]))
        return led

    @classmethod
    def _common(cls, snap: Mapping[str, Any]) -> Ledger:
        led = cls(int(snap.get("epoch", 0)))
        led.counter = int(snap.get("counter", 0))
        led.attempts = {k: int(v) for k, v in snap.get("attempts", {}).items()}
        led.kinds = {k: list(v) for k, v in snap.get("kinds", {}).items()}
        led.last_error = dict(snap.get("last_error", {}))
        led.solo = set(snap.get("solo", ()))
        return led

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
            f"deferred={len(self.deferred)}>"
        )


def _first(v: Sequence[Any]) -> Any:
    return v[0]


def _place(where: bytearray, a: int, b: int, code: int, name: str) -> None:
    """Mark indices ``a .. b-1`` as in place ``code`` (a compact snapshot's member ``name``)."""
    if not 0 <= a < b <= len(where):
        raise Invalid(name, f"indices {a}..{b - 1} are outside 0..{len(where) - 1}")
    if where[a:b].count(0) != b - a:
        raise Invalid(name, f"an index of {a}..{b - 1} is in two places")
    where[a:b] = bytes([code]) * (b - a)


def _token(value: Any) -> Token:
    token = Token.parse(value)
    if token is None:
        raise Invalid("in_flight.token", f"not a dispatch token: {value!r}")
    return token


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
        # where each index is: 0 void, 1 pending, 2 in flight, 3 committed, 4 deferred
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
        self._led.ids.ids.extend([None] * size)

    def take(self, first: int, items: Sequence[Any]) -> None:
        """One submissions store record.

        Raises:
            schema.Invalid: it does not start where the last one ended, or names a work ID
                already placed.
        """
        if first != self._next:
            raise Invalid("first", f"store record at index {first}, {self._next} expected")
        end = self._next = first + len(items)
        size, where, tail = self._size, self._where, self._tail
        led = self._led
        ids, index, mine = led.ids.ids, led.ids.index, led.items
        if first < end <= size and where.count(where[first], first, end) == end - first:
            if where[first] in (1, 3) and self._in_bulk(items, where[first] == 1):
                return  # the usual record: every item pending (or committed), in the usual form
        for i, item in enumerate(items, first):
            if item is None:
                if i < size and where[i]:
                    raise Invalid("items", f"index {i} is void in the store, not in the snapshot")
                continue
            if i >= size:
                tail[i] = _stored_item(item)
                continue
            w = where[i]
            if not w:
                continue
            work = _stored_item(item)
            wid = work.work_id
            if wid in index:
                raise Invalid("work_id", f"{wid!r} is stored at two indices")
            ids[i] = wid
            index[wid] = i
            if w != 3:  # committed: its work ID is all that is kept
                mine[wid] = work

    def _in_bulk(self, items: Sequence[Any], pending: bool) -> bool:
        """Take a record whose items are all pending (or all committed: only their work IDs
        are kept) in bulk, in C-level passes with no Python step per item, when each is
        ``[work_id, payload]``; False (nothing taken) otherwise, for the item-by-item path.

        Raises:
            schema.Invalid: a work ID is stored at two indices.
        """
        if set(map(type, items)) != {list} or set(map(len, items)) != {2}:
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
        for i, token, rank in snap["in_flight"]:
            wid = ids[i]
            if wid is not None:
                led.in_flight[wid] = (_token(token), int(rank))
        self._where = bytearray()
        return led, self._tail
