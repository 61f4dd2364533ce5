"""batch="auto" (issue 17): dispatch sizes from measured item durations (pure, and in the core)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from durable_dispatch.core import Dispatcher, Send, WatchdogConfig, WorkItem
from durable_dispatch.core.batching import MAX_ITEMS, TARGET_SECONDS, BatchSizer

from .helpers import examples


def test_it_starts_alone_and_grows_by_doubling_to_the_cap_for_trivial_tasks() -> None:
    s = BatchSizer()
    assert s.size(120.0) == 1  # nothing measured: one item
    sizes = []
    for _ in range(10):
        k = s.size(120.0)
        sizes.append(k)
        s.observe(k, k * 20e-6)  # 20 us per item
    assert sizes == [1, 2, 4, 8, 16, 32, 64, 64, 64, 64]


def test_tasks_of_the_target_length_or_more_stay_one_per_dispatch() -> None:
    s = BatchSizer()
    for _ in range(20):
        s.observe(1, TARGET_SECONDS * 1.5)
    assert s.size(120.0) == 1
    for _ in range(20):
        s.observe(1, TARGET_SECONDS / 4.5)  # 11 ms: about 4 fit in the target
    assert s.size(120.0) == 2  # and never more than twice the largest measured (1)


def test_a_dispatch_stays_within_a_quarter_of_its_deadline() -> None:
    s = BatchSizer()
    s.observe(64, 64 * 1e-4)  # 0.1 ms per item: 500 would fit the target, 64 is the cap
    assert s.size(None) == MAX_ITEMS
    assert s.size(0.004) == 10  # a quarter of 4 ms holds 10 items of 0.1 ms


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 64), st.floats(0, 10, allow_nan=False)), max_size=30),
    st.one_of(st.none(), st.floats(0.001, 1000)),
)
def test_the_size_is_always_within_its_bounds(
    obs: list[tuple[int, float]], wd: float | None
) -> None:
    s = BatchSizer()
    for items, seconds in obs:
        s.observe(items, seconds)
        k = s.size(wd)
        assert 1 <= k <= min(MAX_ITEMS, max(1, 2 * s.largest))
        if s.per_item and wd and k > 1:
            assert k * s.per_item <= 0.25 * wd + 1e-6 * s.per_item + 1e-12


def test_the_core_measures_each_dispatch_from_its_send_to_its_result() -> None:
    d = Dispatcher(1, WatchdogConfig(60), ranks=(1,))
    d.submit(WorkItem(f"w{i}") for i in range(200))
    now, sizes = 0.0, []
    while not d.done:
        x = d.reserve(now, d.auto_batch())
        assert isinstance(x, Send)
        sizes.append(len(x.items))
        d.mark_dispatched(x.token, now)
        now += 0.001 * len(x.items)  # 1 ms per item
        for _ in d.on_results(1, str(x.token), [0] * len(x.items), now):
            pass
        d.commit_done(x.token)
        d.on_ready(1, str(x.token), now)
    assert sizes[:6] == [1, 2, 4, 8, 16, 32] and max(sizes) == 50  # 50 ms of 1 ms items
    assert d.statistics().auto_batch_now == 50


def test_run_master_with_batch_auto_batches_trivial_tasks(tmp_path: Path) -> None:
    from durable_dispatch.mpi import run_master
    from durable_dispatch.testing import LocalWorkers

    items = [WorkItem(f"w{i}", i) for i in range(600)]
    got: dict[str, int] = {}
    report = run_master(
        items, tmp_path / "s", got.__setitem__, comm=LocalWorkers(lambda p: p), batch="auto"
    )
    core = report.stats["core"]
    assert report.finished and len(got) == 600 and core["commits"] == 600
    assert core["dispatches"] < 100  # instead of 600


def test_a_bad_batch_is_refused() -> None:
    import pytest

    from durable_dispatch.errors import UsageError
    from durable_dispatch.mpi import run_master
    from durable_dispatch.testing import LocalWorkers

    for bad in (0, "fast", 2.5):
        with pytest.raises(UsageError, match="auto"):
            run_master([], "/nonexistent/x", comm=LocalWorkers(lambda p: p), batch=bad)
