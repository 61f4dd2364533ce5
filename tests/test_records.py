"""``core.records.fast_init``: the cheap ``__init__`` keeps every promise of the frozen dataclass
it replaces (fields, defaults, immutability, equality, pickling)."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from durable_dispatch.core.decisions import NO_LEASES, Commit, Send, WorkItem
from durable_dispatch.core.events import Committed, Dispatched, of_decision
from durable_dispatch.core.records import fast_init
from durable_dispatch.tokens import Token


@fast_init
@dataclass(frozen=True, slots=True)
class _Rec:
    a: int
    b: str = "x"
    c: Any = field(default_factory=tuple)


def test_a_fast_record_takes_the_same_arguments_and_defaults() -> None:
    assert str(inspect.signature(_Rec.__init__)) == "(self, a, b='x', c=())"
    assert _Rec(1) == _Rec(1, "x", ()) == _Rec(a=1, c=())
    assert _Rec(1, b="y").b == "y" and _Rec(1) != _Rec(2)
    with pytest.raises(TypeError):
        _Rec()  # type: ignore[call-arg]


def test_a_fast_record_stays_frozen_and_slotted() -> None:
    r = _Rec(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.a = 2  # type: ignore[misc]
    assert not hasattr(r, "__dict__")
    assert dataclasses.replace(r, a=5) == _Rec(5)


@pytest.mark.parametrize(
    "value",
    [
        WorkItem("w", {"p": 1}, 2.0, {"k": "v"}, ("in",), True, 3),
        Send(1, Token(2, 3), (WorkItem("w"),), 4.0, 1.0, (0,)),
        Commit(1, Token(2, 3), "w", {"r": 1}),
        Dispatched(Token(2, 3), 1, ("w",)),
        Committed(Token(2, 3), 1, ("w",), (None,), 5.0),
    ],
)
def test_the_hot_records_pickle_and_compare_as_before(value: object) -> None:
    assert pickle.loads(pickle.dumps(value)) == value
    assert dataclasses.replace(value) == value  # type: ignore[type-var]


def test_a_work_item_without_leases_shares_the_one_empty_mapping_also_when_unpickled() -> None:
    assert WorkItem("a").leases is NO_LEASES and WorkItem("b").leases is NO_LEASES
    # (the shared mapping itself cannot be pickled: an item without leases could not be)
    assert pickle.loads(pickle.dumps(WorkItem("a"))).leases is NO_LEASES


def test_a_send_carries_the_event_the_core_applied_and_compares_without_it() -> None:
    t = Token(1, 1)
    ev = Dispatched(t, 3, ("w",))
    made = Send(3, t, (WorkItem("w"),), event=ev)
    assert of_decision(made) is ev
    by_hand = Send(3, t, (WorkItem("w"),))
    assert by_hand == made and of_decision(by_hand) == ev
