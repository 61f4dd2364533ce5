"""``core.indexed``: the bulk paths a dispatch takes give what the one-by-one ones give."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_dispatch.core.decisions import WorkItem
from durable_dispatch.core.indexed import Frontier, Ids, Items, Runs

from .helpers import examples


def _frontier(ops: list[tuple[str, int, int]]) -> Frontier:
    f = Frontier(Ids())
    for op, i, level in ops:
        wid = f"w{i}"
        if op == "append":
            f.append(wid, level)
        elif op == "appendleft":
            f.appendleft(wid, level)
        else:
            f.remove(wid)
    return f


def _state(f: Frontier) -> tuple[list[str], int, list[list[int]], list[int]]:
    return list(f), len(f), f.runs(0), f.levels()


OPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "append", "appendleft", "remove"]),
        st.integers(0, 30),
        st.sampled_from([0, 0, 0, 1]),
    ),
    max_size=60,
)


@settings(max_examples=examples(300), deadline=None)
@given(OPS, st.integers(1, 8), st.integers(0, 3), st.booleans())
def test_remove_all_is_remove_one_by_one(ops: list, k: int, skip: int, head: bool) -> None:
    """At the head (the fast path) or anywhere, with members missing or repeated: the same
    frontier, and the count of those removed before the first that was not there."""
    fast, slow = _frontier(ops), _frontier(ops)
    members = list(fast)
    wids = members[:k] if head else [f"w{i}" for i in range(skip, skip + k)]
    wids = wids or ["w99"]
    n = 0
    for wid in wids:
        if not slow.remove(wid):
            break
        n += 1
    assert fast.remove_all(wids) == n
    assert _state(fast) == _state(slow)


def test_remove_all_of_the_head_run_takes_it_whole() -> None:
    f = Frontier(Ids())
    for i in range(10):
        f.append(f"w{i}")
    assert f.remove_all(["w0", "w1", "w2"]) == 3
    assert f.runs(0) == [[3, 10]] and len(f) == 7 and "w2" not in f and "w3" in f
    assert f.remove_all([f"w{i}" for i in range(3, 10)]) == 7
    assert f.runs(0) == [] and len(f) == 0 and not f
    assert f.remove_all(["w1", "w2"]) == 0  # gone: nothing removed


def test_items_of_gives_each_item_once_made_from_its_stored_form() -> None:
    ids = Ids()
    for w in ("a", "b", "c"):
        ids.assign(w)
    items = Items(ids)
    items.put(0, [WorkItem("a"), ["b", {"p": 1}], None])
    got = items.of(["b", "a"])
    assert [w.work_id for w in got] == ["b", "a"] and got[0].payload == {"p": 1}
    assert items.of(["b"])[0] is got[0]  # made once, kept
    with pytest.raises(KeyError):
        items.of(["c"])


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(st.integers(0, 80), max_size=30),
    st.integers(0, 90),
    st.integers(1, 12),
    st.booleans(),
)
def test_runs_add_all_is_add_one_by_one(before: list, a: int, k: int, block: bool) -> None:
    """A dispatch's committed indices go in with Runs.add_all (issue 34): a block past the
    last run (the fast path) or any others, the same runs as adding them one at a time."""
    fast, slow = Runs(), Runs()
    for i in before:
        fast.add(i)
        slow.add(i)
    top = max(before, default=-1) + 1
    new = list(range(max(a, top), max(a, top) + k)) if block else [a + 3 * j for j in range(k)]
    new = [i for i in new if i not in slow]
    for i in new:
        slow.add(i)
    fast.add_all(new)
    assert fast.runs() == slow.runs() and len(fast) == len(slow)
