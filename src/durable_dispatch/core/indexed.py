"""The ledger's indexed collections (pure, no I/O): every work ID gets a dense *index* when it
is first submitted (:class:`Ids`), and the ledger's places are kept by index, so their size is
what their runs cost, not what the campaign's size costs.

:class:`Runs` is a set of indices kept as sorted runs of consecutive ones; :class:`Items` the
work items by work ID, stored by index in their compact form (:func:`store_form`);
:class:`CommittedIds` the committed work IDs over runs; :class:`Frontier` the work IDs waiting,
in dispatch order, one queue of runs per priority level.

Payload digests (a work ID names one payload). :class:`Ids` also keeps, by index, an 8-byte digest
of each item's payload (:func:`payload_digests`: BLAKE2b of its JSON form, keys sorted), in one
bytearray: 8 bytes an item, no object of its own, so a known work ID submitted again is compared
with what it named (refused when the payload changed) at that cost, committed items included (their
payloads are not kept in memory). 8 zero bytes: not known (a state written before digests, a void
index).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import orjson

from ..schema import Invalid, is_work_item
from .decisions import WorkItem

__all__ = [
    "CommittedIds",
    "DIGEST_BYTES",
    "Frontier",
    "Ids",
    "Items",
    "Runs",
    "payload_digests",
    "store_form",
    "stored_item",
    "stored_payload_digests",
]

#: Bytes of one payload digest (:func:`payload_digests`).
DIGEST_BYTES = 8
_UNKNOWN = bytes(DIGEST_BYTES)
_SORT_KEYS = orjson.OPT_SORT_KEYS
#: A fresh BLAKE2b state of :data:`DIGEST_BYTES`: each digest starts from a copy of it (a copy
#: costs half of what a new state with its parameters costs)
_BLAKE = hashlib.blake2b(digest_size=DIGEST_BYTES)


def payload_digests(payloads: Iterable[Any]) -> bytes:
    """The digests of ``payloads``, :data:`DIGEST_BYTES` each, concatenated in order: BLAKE2b of
    each payload's JSON form with its keys sorted (so the same payload rebuilt with its keys in
    another order, or read back from the store, has the same digest).

    Raises:
        TypeError: a payload orjson cannot encode (``orjson.JSONEncodeError``).
    """
    out = bytearray()
    copy, dumps, opt = _BLAKE.copy, orjson.dumps, _SORT_KEYS
    for p in payloads:
        h = copy()
        h.update(dumps(p, option=opt))
        out += h.digest()
    return bytes(out)


def stored_payload_digests(items: Sequence[Any]) -> bytes:
    """:func:`payload_digests` of items in the submissions store's form (:func:`store_form`;
    None, a void index, gets the unknown digest); for a store written before digests.

    Raises:
        schema.Invalid: an item in neither form.
    """
    if all(type(v) is list and len(v) in (2, 3) for v in items):  # the usual form: one pass
        return payload_digests(map(_second, items))
    out = bytearray()
    for v in items:
        if type(v) is list and len(v) in (2, 3):
            out += payload_digests((v[1],))
        elif type(v) is dict and "payload" in v:
            out += payload_digests((stored_item(v).payload,))
        else:  # void, or a committed item stored by its work ID only (its payload is gone)
            out += _UNKNOWN
    return bytes(out)


def _second(v: Sequence[Any]) -> Any:
    return v[1]


def _after_ids(v: Any) -> bool:
    """A stored item's ``after``: a list of work IDs."""
    return type(v) is list and set(map(type, v)) <= {str}


class Ids:
    """Work ID <-> dense index, both ways: index ``i`` names ``ids[i]`` (None: void); and the
    payload digest of each index (see the module docs)."""

    __slots__ = ("ids", "index", "digests")

    def __init__(self) -> None:
        self.ids: list[str | None] = []
        self.index: dict[str, int] = {}
        #: :data:`DIGEST_BYTES` per index, from index 0; shorter when the last ones are unknown
        self.digests = bytearray()

    def set_digests(self, first: int, digests: bytes) -> None:
        """The payload digests of indices ``first, first+1, ...`` (:func:`payload_digests`)."""
        a = first * DIGEST_BYTES
        d = self.digests
        if len(d) < a:
            d.extend(bytes(a - len(d)))
        d[a : a + len(digests)] = digests

    def digested(self) -> int:
        """The indices below this one have their digest set (or are void)."""
        return len(self.digests) // DIGEST_BYTES

    def digest_of(self, wid: str) -> bytes | None:
        """The payload digest of the known work ID ``wid``, or None when it is not known (a
        state written before digests)."""
        i = self.index[wid] * DIGEST_BYTES
        d = bytes(self.digests[i : i + DIGEST_BYTES])
        return d if len(d) == DIGEST_BYTES and d != _UNKNOWN else None

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

    def add_all(self, indices: Sequence[int]) -> None:
        """Add each of ``indices``, none of them here (a dispatch's committed items): a block
        of consecutive indices past the last run, the usual case, in a few C-level steps; any
        others one by one (:meth:`add`)."""
        k = len(indices)
        ends = self._ends
        if k > 1 and ends and ends[-1] <= indices[0]:
            a = indices[0]
            if indices[-1] == a + k - 1 and list(indices) == list(range(a, a + k)):
                if ends[-1] == a:
                    ends[-1] = a + k
                else:
                    self._starts.append(a)
                    ends.append(a + k)
                self._n += k
                return
        for i in indices:
            self.add(i)

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
    holds its default (most items), ``[work_id, payload, after]`` when only ``after`` does not
    (a waiting item reopens as cheaply as a queued one), else ``WorkItem.to_json``."""
    if (
        item.timeout is None
        and not item.leases
        and not item.inputs
        and not item.self_contained
        and not item.priority
    ):
        if item.after:
            return [item.work_id, item.payload, list(item.after)]
        return [item.work_id, item.payload]
    return item.to_json()


def stored_item(v: Any) -> WorkItem:
    """A work item in the submissions store's form (:func:`store_form`), checked against its schema.

    Raises:
        schema.Invalid: not a work item in either form.
    """
    if type(v) is list:
        if len(v) == 2 and type(v[0]) is str:
            return WorkItem(v[0], v[1])
        if len(v) == 3 and type(v[0]) is str and _after_ids(v[2]):
            return WorkItem(v[0], v[1], after=tuple(v[2]))
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
            v = by[i] = stored_item(v)
        return v

    def of(self, wids: Iterable[str]) -> list[WorkItem]:
        """The items of ``wids`` (each one open), in order: one call for a dispatch's items.

        Raises:
            KeyError: a work ID without an open item.
        """
        index, by, out = self._ids.index, self._by, []
        for wid in wids:
            i = index.get(wid)
            v = by[i] if i is not None and i < len(by) else None
            if v is None:
                raise KeyError(wid)
            if type(v) is not WorkItem:
                v = by[i] = stored_item(v)  # type: ignore[index]
            out.append(v)
        return out

    def after_of(self, wid: str) -> Sequence[str]:
        """The ``after`` IDs of the open item ``wid`` (its dependencies), read from its stored
        form without building the item.

        Raises:
            KeyError: no open item ``wid``.
        """
        i = self._ids.index.get(wid)
        by = self._by
        if i is None or i >= len(by) or by[i] is None:
            raise KeyError(wid)
        v = by[i]
        if type(v) is WorkItem:
            return v.after
        if type(v) is dict:
            return v.get("after") or ()
        return v[2] if len(v) == 3 else ()  # [work_id, payload(, after)]

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

    def discard_indices(self, indices: Iterable[int]) -> None:
        """Forget the items of ``indices`` (each one there: a dispatch's committed items)."""
        by = self._by
        for i in indices:
            by[i] = None
            self._n -= 1

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

    def stored_forms(self) -> Iterator[Any]:
        """Each open item as it is kept: a work item, or the submissions store's form of one not
        used yet (no work item is built: a reopen of millions reads them without one each)."""
        return (v for v in self._by if v is not None)

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
    priority. Each priority, or *level*, holds its own runs; most campaigns have only
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

    def remove_all(self, wids: Sequence[str]) -> int:
        """Remove each of ``wids`` in turn, up to the first that is not here; returns how many
        were removed (``len(wids)`` when all were). A dispatch's items at the head of level 0,
        in order (the usual case), go in a few C-level steps; any others one by one
        (:meth:`remove`)."""
        k = len(wids)
        if k == 1:  # a one-item dispatch
            return int(self.remove(wids[0]))
        index = self._ids.index
        if k > 1 and not self._level_of:
            a = index.get(wids[0])
            runs = self._levels[0]
            if (
                a is not None
                and runs
                and runs[0][0] == a
                and runs[0][1] >= a + k
                and list(map(index.get, wids)) == list(range(a, a + k))
            ):
                self._flag[a : a + k] = bytes(k)  # (all set: inside the head run)
                self._n -= k
                head = runs[0]
                head[0] = a + k
                if head[0] == head[1]:
                    runs.popleft()
                return k
        for n, wid in enumerate(wids):
            if not self.remove(wid):
                return n
        return k

    def remove(self, wid: str) -> bool:
        """Remove ``wid`` if it is here; True when it was."""
        i = self._ids.index.get(wid)
        flag = self._flag
        if i is None or i >= len(flag) or not flag[i]:
            return False
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
            return True
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
        return True

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
