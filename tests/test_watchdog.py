"""The watchdog's deadline heap (issue 21: its own module, lazy deletion) and the adaptive
rule's window of task times (issue 19)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable_dispatch.core.watchdog import DeadlineHeap, QuantileWindow
from durable_dispatch.tokens import Token

from .helpers import examples


def test_only_current_deadlines_come_due_and_they_stay_until_the_owner_ends_them() -> None:
    h = DeadlineHeap()
    current = {Token(1, 1): 5.0, Token(1, 2): 9.0, Token(1, 3): 3.0}
    for t, dl in current.items():
        h.push(dl, t)
    h.push(4.0, Token(1, 2))  # an older deadline of 1-2, superseded by 9.0: stale
    stands = lambda t, dl: current.get(t) == dl  # noqa: E731
    assert h.due(2.0, stands) == []
    assert h.due(6.0, stands) == [Token(1, 3), Token(1, 1)]  # earliest first
    assert h.due(6.0, stands) == [Token(1, 3), Token(1, 1)]  # a query: still there
    del current[Token(1, 3)]  # its dispatch ended
    assert h.due(10.0, stands) == [Token(1, 1), Token(1, 2)]


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.floats(0, 100, allow_nan=False)), max_size=40),
    st.floats(0, 100, allow_nan=False),
)
def test_due_is_every_current_deadline_at_or_before_now(
    pushes: list[tuple[int, float]], now: float
) -> None:
    h = DeadlineHeap()
    current: dict[Token, float] = {}
    for n, dl in pushes:
        h.push(dl, Token(1, n))
        current[Token(1, n)] = dl  # the newest push is the current deadline
    got = h.due(now, lambda t, dl: current.get(t) == dl)
    want = sorted((dl, t) for t, dl in current.items() if dl <= now)
    assert got == [t for _, t in want]


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.floats(0, 100, allow_nan=False)), max_size=40),
    st.sets(st.integers(0, 5)),
    st.floats(0, 100, allow_nan=False),
)
def test_a_rebuilt_heap_gives_the_same_answers(
    pushes: list[tuple[int, float]], ended: set[int], now: float
) -> None:
    """Rebuilt from the current deadlines, the heap loses its stale entries (ended dispatches,
    superseded deadlines, repeats) and nothing ``due`` would return, before or after more
    pushes."""
    h, twin = DeadlineHeap(), DeadlineHeap()
    current: dict[Token, float] = {}
    for n, dl in [*pushes, *pushes[:3]]:  # (some entries twice)
        h.push(dl, Token(1, n))
        twin.push(dl, Token(1, n))
        current[Token(1, n)] = dl
    for n in ended:
        current.pop(Token(1, n), None)
    stands = lambda t, dl: current.get(t) == dl  # noqa: E731
    h.rebuild((dl, t) for t, dl in current.items())
    assert len(h) == len(current)
    assert h.due(now, stands) == twin.due(now, stands)
    h.push(now, Token(2, 0))
    twin.push(now, Token(2, 0))
    current[Token(2, 0)] = now
    assert h.due(now, stands) == twin.due(now, stands)


# The adaptive rule's window (issue 19) -------------------------------------------------------
@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=60),
    st.integers(1, 20),
    st.floats(0.01, 1.0),
)
def test_quantile_window_is_the_nearest_rank_quantile_of_its_last_values(
    values: list[float], size: int, q: float
) -> None:
    w = QuantileWindow(size)
    for v in values:
        w.add(v)
    kept = sorted(values[-size:])
    assert len(w) == len(kept)
    assert w.quantile(q) == kept[max(0, math.ceil(q * len(kept)) - 1)]
    assert w.quantile(1.0) == kept[-1]


def test_quantile_window_refuses_what_has_no_quantile() -> None:
    w = QuantileWindow(3)
    with pytest.raises(ValueError, match="no measurements"):
        w.quantile(0.5)
    w.add(float("nan"))  # a clock that went wrong is not a measurement
    assert len(w) == 0
    w.add(2.0)
    for q in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match="within"):
            w.quantile(q)
    for size in (0, -1, 2.5):
        with pytest.raises(ValueError, match="size"):
            QuantileWindow(size)  # type: ignore[arg-type]
    assert QuantileWindow(1).size == 1


# ------------------------------------------------------------ the observed clock (U7, issue 29)
def test_observed_clock_counts_turns_in_full_and_credits_a_pause() -> None:
    from durable_dispatch.core.watchdog import ObservedClock

    c = ObservedClock(max_step=0.25)
    assert c.observe(100.0) == 100.0
    assert c.observe(100.2) == pytest.approx(100.2)  # a turn: counted in full
    assert not c.hold and c.pauses == 0
    assert c.observe(107.2) == pytest.approx(100.45)  # a 7 s pause: 0.25 s of it counts
    assert c.hold and c.pauses == 1 and c.paused_seconds == pytest.approx(6.75)
    c.drained()
    assert not c.hold
    assert c.observe(107.3) == pytest.approx(100.55)  # then it runs with the clock again
    assert c.observe(107.0) == pytest.approx(100.55)  # a reading that goes back: the last


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.floats(0, 20), min_size=1, max_size=40))
def test_observed_clock_never_goes_back_and_never_runs_ahead(steps: list[float]) -> None:
    from durable_dispatch.core.watchdog import ObservedClock

    c = ObservedClock(max_step=0.25)
    raw, last = 0.0, c.observe(0.0)
    for step in steps:
        raw += step
        now = c.observe(raw)
        assert last <= now <= last + min(step, 0.25) + 1e-9
        assert now == pytest.approx(raw - c.paused_seconds)
        last = now


def test_observed_clock_refuses_a_step_that_is_not_positive() -> None:
    from durable_dispatch.core.watchdog import ObservedClock

    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            ObservedClock(max_step=bad)
