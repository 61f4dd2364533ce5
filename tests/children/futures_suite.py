"""The futures executor's own conformance suite (issue 32), run by pytest on rank 0 under the
runner: ``mpiexec -n 3 python -m durable_dispatch.futures -m pytest futures_suite.py``
(``tests/test_mpi_futures.py`` does). The cases are those mpi4py's ``test_futures.py`` and
CPython's ``test_concurrent_futures`` check, in our words, plus durability: a second executor on
the same state directory resolves committed calls from the record without running them.

Calls count their executions in ``COUNT`` files (one line per run), so "not run again" is
measured, not assumed. The file is not named ``test_*``: the ordinary suite, which has no
workers, does not collect it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import read_results
from durable_dispatch.core import RetryPolicy
from durable_dispatch.errors import ValueCorruptError
from durable_dispatch.futures import (
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    BrokenExecutor,
    CancelledError,
    DependencyFailed,
    DurableExecutor,
    MPIPoolExecutor,
    TaskCrashed,
    TaskTimedOut,
    TimeoutError,
    as_completed,
    wait,
)
from durable_dispatch.futures._calls import call_digest, call_id, function_name
from durable_dispatch.futures._seal import KEY_FILE, VALUES_DIR

WORKERS = int(os.environ.get("FUTURES_WORKERS", "2"))
_state: dict[str, Any] = {}


class Point:
    """A user class: it must come back as itself."""

    def __init__(self, x: int) -> None:
        self.x = x


def add(a: int, b: int = 0) -> int:
    return a + b


def div(a: float, b: float) -> float:
    return a / b


def counted(path: str, x: int) -> int:
    with open(path, "a") as f:
        f.write(f"{x}\n")
    return x * 10


def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def echo(value: Any) -> Any:
    return value


def segfault() -> None:
    ctypes.string_at(0)


def hang() -> None:
    time.sleep(3600)


def big(n: int) -> bytes:
    return b"x" * n


def set_flag(value: str) -> None:
    _state["flag"] = value


def get_flag(_: int) -> str | None:
    return _state.get("flag")


def fail_init() -> None:
    raise RuntimeError("initializer failed on purpose")


def step(kind: str, marker: str) -> str:
    """A call of the batching tests: ``add`` returns at once, ``raise`` raises at once,
    ``block`` sleeps :data:`BLOCK` seconds, then leaves ``marker`` (so a test can tell whether
    it had ended, with no clock)."""
    if kind == "raise":
        raise ValueError(f"raised at once ({marker})")
    if kind == "block":
        time.sleep(BLOCK)
        Path(marker).write_text("ended")
    return kind


BLOCK = 3.0


def wait_for(marker: str) -> str:
    """Return once the file ``marker`` exists (a test lets it go; no clock)."""
    while not os.path.exists(marker):
        time.sleep(0.01)
    return marker


def block_on(started: str, go: str, i: int) -> int:
    """Leave ``started/<i>.<pid>`` (which process runs it: a worker's), then return ``i`` once
    the file ``go`` exists: a worker that takes it is blocked until the test lets it go."""
    Path(started, f"{i}.{os.getpid()}").write_text("")
    wait_for(go)
    return i


def spawn_and_wait(marker: str) -> int:
    """Start a grandchild (a process of this call's own tree) and return once ``marker``
    exists, with the grandchild still alive: a kill of another session's child must not reach
    either of them."""
    import subprocess

    p = subprocess.Popen(["sleep", "300"])
    wait_for(marker)
    alive = p.poll() is None
    p.kill()
    p.wait()
    return int(alive)


class GoodPickle:
    """Counts its pickling and unpickling (mpi4py's test_futures.py has one of these)."""

    def __init__(self, value: int = 0) -> None:
        self.value, self.pickled, self.unpickled = value, False, False

    def __getstate__(self) -> tuple[int]:
        self.pickled = True
        return (self.value,)

    def __setstate__(self, state: tuple[int]) -> None:
        self.value, self.pickled, self.unpickled = state[0], False, True


class BadPickle:
    """Cannot be pickled: ``__getstate__`` raises ZeroDivisionError."""

    def __getstate__(self) -> None:
        _ = 1 / 0

    def __setstate__(self, state: Any) -> None:
        pass


class BadUnpickle:
    """Pickles, but cannot be unpickled: ``__setstate__`` raises ZeroDivisionError."""

    def __getstate__(self) -> tuple[None]:
        return (None,)

    def __setstate__(self, state: Any) -> None:
        _ = 1 / 0


def runs(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_submit_map_starmap_and_values_keep_their_types(tmp_path: Path) -> None:
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        f = ex.submit(add, 1, b=2)
        assert f.result() == 3 and f.work_id.startswith(f"{__name__}:add/")
        assert list(ex.map(add, [1, 2, 3], [10, 20, 30])) == [11, 22, 33]
        assert list(ex.starmap(add, [(1, 1), (2, 2)])) == [2, 4]
        assert list(ex.map(add, [])) == []
        value = {1: (2, 3), "p": Point(4), "s": {5, 6}, "b": b"\0"}
        back = ex.submit(echo, value).result()
        assert back[1] == (2, 3) and back["p"].x == 4 and back["s"] == {5, 6} and back["b"] == b"\0"
        a, b = ex.submit(add, 7, 7), ex.submit(add, 7, 7)  # two identical calls stay two
        assert a.work_id != b.work_id and a.work_id.endswith("/0") and b.work_id.endswith("/1")
        assert a.result() == b.result() == 14


def test_map_raises_at_the_failing_element_with_the_workers_traceback(tmp_path: Path) -> None:
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        it = ex.map(div, [1, 1, 2], [1, 0, 1])
        assert next(it) == 1.0
        with pytest.raises(ZeroDivisionError) as info:
            next(it)
        assert "in div" in str(info.value.__cause__)  # the worker's traceback
        f = ex.submit(div, 1, 0)
        assert isinstance(f.exception(), ZeroDivisionError)


def test_map_timeout_counts_from_the_call_and_bad_sizes_are_value_errors(tmp_path: Path) -> None:
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        it = ex.map(sleep_for, [1.5], timeout=0.2)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            next(it)
        assert time.monotonic() - start < 1.4
        with pytest.raises(ValueError):
            ex.map(add, [1], chunksize=0)
        with pytest.raises(ValueError):
            ex.map(add, [1], buffersize=0)
        assert list(ex.map(add, range(20), chunksize=7, buffersize=3)) == list(range(20))
        assert sorted(ex.map(add, range(20), unordered=True)) == list(range(20))


def test_cancel_shutdown_and_the_context_manager(tmp_path: Path) -> None:
    ex = MPIPoolExecutor(max_workers=1, state_dir=tmp_path / "s")
    first = ex.submit(sleep_for, 0.5)
    while not first.running():  # in the frontier: no longer cancellable
        time.sleep(0.001)
    assert not first.cancel()
    rest = [ex.submit(add, i) for i in range(1000)]
    assert rest[-1].cancel() and rest[-1].cancelled()
    ex.shutdown(wait=True, cancel_futures=True)
    assert first.result() == 0.5
    assert any(f.cancelled() for f in rest[:-1])
    assert all(f.done() for f in rest)
    with pytest.raises(RuntimeError):
        ex.submit(add, 1)
    ex.shutdown()  # twice is fine
    with MPIPoolExecutor(state_dir=tmp_path / "t") as ex2:
        assert ex2.bootup() is ex2 and ex2.num_workers == WORKERS
        assert ex2.submit(add, 2).result() == 2
    with pytest.raises(RuntimeError):
        ex2.submit(add, 1)


def test_wait_as_completed_and_callbacks(tmp_path: Path) -> None:
    seen: list[int] = []
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        fs = [ex.submit(add, i) for i in range(10)]
        fs[0].add_done_callback(lambda f: seen.append(f.result()))
        done, not_done = wait(fs, timeout=60, return_when=ALL_COMPLETED)
        assert len(done) == 10 and not not_done
        assert sorted(f.result() for f in as_completed(fs)) == list(range(10))
    assert seen == [0]


def test_max_workers_and_executors_open_at_once(tmp_path: Path) -> None:
    """As under mpi4py's runner, several executors open at once share the workers (issue 48),
    each with its own state directory; nested ones too."""
    with MPIPoolExecutor(max_workers=1, state_dir=tmp_path / "s") as ex:
        assert ex.num_workers == 1
        assert list(ex.map(add, range(5))) == list(range(5))
        with MPIPoolExecutor(state_dir=tmp_path / "t") as other:
            assert other.num_workers == WORKERS
            assert list(other.map(add, range(5), range(5))) == list(range(0, 10, 2))
            assert ex.submit(add, 7).result() == 7
    with MPIPoolExecutor(max_workers=99, state_dir=tmp_path / "u") as ex:
        assert ex.num_workers == WORKERS


def test_two_executors_open_at_once_interleave_their_calls(tmp_path: Path) -> None:
    """Two pools (one per stage), calls submitted in turn to each, results read in turn: each
    future gets its own executor's call, each state directory holds its own calls only, and
    isolated and in-process sessions serve side by side."""
    a = MPIPoolExecutor(state_dir=tmp_path / "a")
    b = MPIPoolExecutor(state_dir=tmp_path / "b", isolate=False)
    try:
        fa, fb = [], []
        for i in range(30):
            fa.append(a.submit(add, i, 1000))
            fb.append(b.submit(add, i, 2000))
        for i in range(30):
            assert fb[i].result(timeout=120) == i + 2000
            assert fa[i].result(timeout=120) == i + 1000
        fc = [b.submit(counted, str(tmp_path / "count"), i) for i in range(10)]
        assert [f.result(timeout=120) for f in fc] == [i * 10 for i in range(10)]
    finally:
        a.shutdown()
        b.shutdown()
    ra = {r.work_id: r for r in read_results(tmp_path / "a")}
    rb = {r.work_id: r for r in read_results(tmp_path / "b")}
    assert set(ra) == {f.work_id for f in fa}
    assert set(rb) == {f.work_id for f in fb + fc}
    assert sorted(runs(tmp_path / "count")) == list(range(10))  # each call ran once


def test_a_timeout_in_one_executor_kills_none_of_the_others_calls(tmp_path: Path) -> None:
    """Isolation kills a timed-out call's process tree, and only its own: calls of another
    executor open at once, running in their own children on the same worker ranks (with a
    child of their own), live on and return."""
    marker = str(tmp_path / "go")
    slow = MPIPoolExecutor(state_dir=tmp_path / "slow")
    try:
        held = [slow.submit(spawn_and_wait, marker) for _ in range(WORKERS)]
        while not all(f.running() for f in held):
            time.sleep(0.01)
        with MPIPoolExecutor(task_timeout=1, retry=RetryPolicy(0), state_dir=tmp_path / "t") as ex:
            stuck = [ex.submit(hang) for _ in range(WORKERS)]
            for f in stuck:
                with pytest.raises(TaskTimedOut):
                    f.result(timeout=120)
            assert ex.submit(add, 3).result(timeout=120) == 3
        Path(marker).write_text("go")
        assert [f.result(timeout=120) for f in held] == [1] * WORKERS  # alive to the end
    finally:
        Path(marker).write_text("go")
        slow.shutdown()


@pytest.mark.parametrize("isolate", [True, False])
def test_the_initializer_runs_where_the_calls_run(tmp_path: Path, isolate: bool) -> None:
    with MPIPoolExecutor(
        initializer=set_flag, initargs=("on",), isolate=isolate, state_dir=tmp_path / "s"
    ) as ex:
        assert set(ex.map(get_flag, range(6))) == {"on"}


@pytest.mark.parametrize("isolate", [True, False])
def test_a_failing_initializer_breaks_the_executor(tmp_path: Path, isolate: bool) -> None:
    ex = MPIPoolExecutor(initializer=fail_init, isolate=isolate, state_dir=tmp_path / "s")
    f = ex.submit(add, 1)
    with pytest.raises(BrokenExecutor):
        f.result(timeout=60)
    with pytest.raises(BrokenExecutor):
        ex.submit(add, 2)
    ex.shutdown()
    with MPIPoolExecutor(state_dir=tmp_path / "t") as ok:  # the workers serve the next one
        assert ok.submit(add, 3).result() == 3


def test_calls_the_workers_cannot_find_are_refused_at_submit(tmp_path: Path) -> None:
    def nested() -> None:
        pass

    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        with pytest.raises(TypeError, match="lambda"):
            ex.submit(lambda: 1)
        with pytest.raises(TypeError, match="nested"):
            ex.submit(nested)


def test_submit_as_names_one_call(tmp_path: Path) -> None:
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        assert ex.submit_as("mine", add, 1, 2).result() == 3
        with pytest.raises(ValueError, match="another call"):
            ex.submit_as("mine", add, 1, 3)
        again = ex.submit_as("mine", add, 1, 2)
        assert again.work_id == "mine" and again.result() == 3
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:  # and after a restart
        with pytest.raises(ValueError, match="another call"):
            ex.submit_as("mine", div, 1, 2)


def test_a_segfault_or_a_hang_costs_only_its_own_future(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="concurrent.futures")
    with MPIPoolExecutor(task_timeout=2, retry=RetryPolicy(0), state_dir=tmp_path / "s") as ex:
        crash, stuck = ex.submit(segfault), ex.submit(hang)
        fine = [ex.submit(add, i) for i in range(20)]
        with pytest.raises(TaskCrashed, match="SIGSEGV") as c:
            crash.result(timeout=60)
        assert c.value.work_id == crash.work_id and c.value.kind == "crash"
        with pytest.raises(TaskTimedOut) as t:
            stuck.result(timeout=60)
        assert t.value.kind == "timeout" and t.value.attempts == 1
        assert [f.result() for f in fine] == list(range(20))
        assert ex.submit(add, 5).result() == 5  # the ranks serve on
    with MPIPoolExecutor(task_timeout=2, retry=RetryPolicy(0), state_dir=tmp_path / "s") as ex:
        with pytest.raises(TaskCrashed):  # a re-run fails it from the record, at once
            ex.submit(segfault).result(timeout=1)
    # each future's state was set in the order concurrent.futures expects: it logged nothing
    # ("Future ... in unexpected state: RUNNING", CRITICAL, before each failure)
    assert not [r for r in caplog.records if r.name == "concurrent.futures"], caplog.text


def test_a_call_deferred_for_a_crashed_dependency_names_it_not_one_that_raised(
    tmp_path: Path,
) -> None:
    """A call given the futures of a call that raised and of one that crashed is deferred for
    the crash: its DependencyFailed names that one, caused by its TaskCrashed, in the run and
    from the record (it named the one that raised, with the crashed one's error in its text)."""
    for _ in range(2):  # the run, then a re-run that resolves everything from the record
        with MPIPoolExecutor(retry=RetryPolicy(0), state_dir=tmp_path / "s") as ex:
            raised, crashed = ex.submit(div, 1, 0), ex.submit(segfault)
            both = ex.submit(add, raised, crashed)
            with pytest.raises(DependencyFailed) as e:
                both.result(timeout=60)
            assert e.value.dependency == crashed.work_id, e.value
            assert isinstance(e.value.__cause__, TaskCrashed)
            assert raised.work_id not in str(e.value)
            with pytest.raises(ZeroDivisionError):
                raised.result(timeout=60)


def test_a_large_result_goes_to_the_side_store(tmp_path: Path) -> None:
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        assert ex.submit(big, 3 << 20).result() == b"x" * (3 << 20)
    assert len(os.listdir(tmp_path / "s" / VALUES_DIR)) == 1
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        assert ex.submit(big, 3 << 20).result() == b"x" * (3 << 20)


def test_a_rerun_resolves_committed_calls_from_the_record_without_running_them(
    tmp_path: Path,
) -> None:
    """F1: the same calls on the same state directory resolve at submit (done at once), nothing
    runs again, raised exceptions are raised again; a chunked map's chunk is one task of its
    own (its ID digests its calls), resolved from the record in its turn."""
    count = tmp_path / "count"
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        assert list(ex.map(counted, [str(count)] * 10, range(10))) == [x * 10 for x in range(10)]
        with pytest.raises(ZeroDivisionError):
            ex.submit(div, 1, 0).result()
    assert sorted(runs(count)) == list(range(10))
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        fs = [ex.submit(counted, str(count), x) for x in range(10)]
        assert all(f.done() for f in fs)
        assert [f.result() for f in fs] == [x * 10 for x in range(10)]
        again = ex.submit(div, 1, 0)
        assert again.done() and isinstance(again.exception(), ZeroDivisionError)
    assert sorted(runs(count)) == list(range(10))
    for _ in range(2):
        with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
            more = list(ex.map(counted, [str(count)] * 12, range(12), chunksize=64))
            assert more == [x * 10 for x in range(12)]
        # one chunk of 12 calls, a task of its own: it ran once, then came from the record
        assert sorted(runs(count)) == sorted([*range(10), *range(12)])
    ids = {r.work_id for r in read_results(tmp_path / "s")}
    assert len(ids) == 12 and all(i.startswith(f"{__name__}:") for i in ids)


def test_a_foreign_key_makes_the_directory_refused_before_anything_is_unpickled(
    tmp_path: Path,
) -> None:
    """S7: the record of another key (a forged or copied directory) is refused when the
    executor opens it: a typed error, nothing unpickled; then the real key works again."""
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        ex.submit(add, 1).result()
    key = tmp_path / "s" / KEY_FILE
    real = key.read_bytes()
    key.write_bytes(os.urandom(32))
    with pytest.raises(ValueCorruptError, match="HMAC"):
        MPIPoolExecutor(state_dir=tmp_path / "s")
    key.write_bytes(real)
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        assert ex.submit(add, 1).done()


def test_the_state_directory_is_an_ordinary_campaign_directory(tmp_path: Path) -> None:
    """read_results and the CLI read it; the CLI shows the sealed pickles opaque (type, size)
    and never loads them."""
    import json
    import subprocess
    import sys

    with DurableExecutor(state_dir=tmp_path / "s") as ex:
        ex.submit(add, 40, 2).result()
        ex.submit(echo, Point(1)).result()
        ex.submit(div, 1, 0).exception()
    rows = list(read_results(tmp_path / "s"))
    assert len(rows) == 3 and all("tag" in r.result for r in rows)
    out = subprocess.run(
        [sys.executable, "-m", "durable_dispatch", "results", str(tmp_path / "s"), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    shown = sorted((r["result"]["sealed"], r["result"]["type"]) for r in json.loads(out.stdout))
    assert shown == [
        ("ok", "int"),
        ("ok", f"{__name__}.Point"),
        ("raised", "builtins.ZeroDivisionError"),
    ]
    verify = subprocess.run(
        [sys.executable, "-m", "durable_dispatch", "verify", str(tmp_path / "s")],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_journal_that_fails_at_the_first_submission_still_resolves_every_call(
    tmp_path: Path,
) -> None:
    """The journal degrades (EIO at the third fsync of events.jsonl, right at the first
    submission): every call still runs and resolves, and shutdown says the record is not
    durable (NotDurableError) instead of returning quietly."""
    from durable_dispatch.errors import NotDurableError
    from durable_dispatch.testing import inject_faults

    with inject_faults() as faults:
        faults.fail("fsync", path=f"{tmp_path}/s/events.jsonl*", nth=3, from_nth=True)
        ex = MPIPoolExecutor(state_dir=tmp_path / "s")
        assert list(ex.map(add, range(5), range(5), timeout=60)) == [0, 2, 4, 6, 8]
        with pytest.raises(NotDurableError):
            ex.shutdown()


def test_a_call_deferred_while_the_disk_was_full_fails_from_the_record_in_the_next_run(
    tmp_path: Path,
) -> None:
    """The defer journal cannot write as a crashed call is deferred (ENOSPC): that executor's
    shutdown says so (NotDurableError), and the next executor on the directory fails the same
    call from the record at once (torture seed 60472493's re-run waited for it forever)."""
    import errno

    from durable_dispatch.errors import NotDurableError
    from durable_dispatch.testing import inject_faults

    deferrals = f"{tmp_path}/s/.dispatch_protocol_deferred.jsonl*"
    with inject_faults() as faults:
        faults.fail("write", errno.ENOSPC, path=deferrals)
        faults.fail("fsync", errno.ENOSPC, path=deferrals)
        ex = MPIPoolExecutor(retry=RetryPolicy(0), state_dir=tmp_path / "s")
        with pytest.raises(TaskCrashed):
            ex.submit(segfault).result(timeout=60)
        with pytest.raises(NotDurableError):
            ex.shutdown()
    with MPIPoolExecutor(retry=RetryPolicy(0), state_dir=tmp_path / "s") as ex:
        again = ex.submit(segfault)
        assert isinstance(again.exception(timeout=30), TaskCrashed)


# ------------------------------------------------------- issue 48: call by call, as mpi4py
def _dispatches(state: Path) -> dict[str, str]:
    """work ID -> the token of the (last) dispatch that carried it, read from the journal."""
    from durable_dispatch.storage.journal import read_journal

    out: dict[str, str] = {}
    for rec in read_journal(state / "events.jsonl"):
        ev = rec.payload
        if ev.get("event") == "dispatched":
            for wid in ev.get("work_ids") or [ev.get("work_id")]:
                out[wid] = ev["token"]
    return out


def _ramped(state: Path) -> MPIPoolExecutor:
    """One worker, its dispatches grown to many calls each (batch="auto" measured the fast
    calls of a map first)."""
    ex = MPIPoolExecutor(max_workers=1, state_dir=state)
    assert list(ex.map(step, ["add"] * 1000, [""] * 1000)) == ["add"] * 1000
    return ex


@pytest.mark.parametrize("how", ["wait", "as_completed", "map"])
def test_a_call_that_raised_settles_before_a_blocking_batch_mate_ends(
    tmp_path: Path, how: str
) -> None:
    """Issue 48: with batch="auto" ramped up (one worker, dispatches of many calls), a call that
    raises at once travels in one dispatch with a call that blocks for BLOCK seconds. Its
    future settles when it ends, not when the dispatch does: wait(FIRST_EXCEPTION),
    as_completed and map(unordered=True) see it while the blocker still runs (the blocker's
    marker file does not exist yet). Attempts whose two calls the master happened to send in
    two dispatches (read from the journal) prove nothing and are made again; two that did
    are enough (each costs a ramp and the blocker's BLOCK seconds)."""
    shared = 0
    for attempt in range(4):
        if shared == 2:
            break
        state, marker = tmp_path / f"s{attempt}", str(tmp_path / f"ended-{attempt}")
        ex = _ramped(state)
        kinds = ["add"] * 300 + ["raise", "block"]
        try:
            if how == "map":
                it = ex.map(step, kinds, [marker] * len(kinds), unordered=True)
                with pytest.raises(ValueError, match="raised at once"):
                    for _ in it:
                        pass
                blocker_ended = os.path.exists(marker)
                it.close()
            else:
                fs = [ex.submit(step, k, marker) for k in kinds]
                raiser = fs[-2]
                if how == "wait":
                    done, _ = wait(fs, return_when=FIRST_EXCEPTION)
                    assert raiser in done
                else:
                    for f in as_completed(fs):
                        if f.exception() is not None:
                            assert f is raiser
                            break
                blocker_ended = os.path.exists(marker)
        finally:
            ex.shutdown()
        tokens = _dispatches(state)
        name = function_name(step)
        ids = [call_id(name, call_digest(step, (k, marker), {}), 0) for k in kinds[-2:]]
        if tokens[ids[0]] != tokens[ids[1]]:
            continue  # not batched together: nothing to see here
        shared += 1
        assert not blocker_ended, f"the raised call waited for its batch-mate ({how})"
    assert shared, "the raising and the blocking call never shared a dispatch"


def test_num_workers_bootup_and_submit_after_shutdown(tmp_path: Path) -> None:
    """mpi4py: num_workers is 0 once shut down; bootup and submit after shutdown raise
    RuntimeError; shutdown may be called again, with any arguments."""
    ex = MPIPoolExecutor(max_workers=1, state_dir=tmp_path / "s")
    assert ex.bootup(wait=False) is ex and ex.bootup() is ex and ex.num_workers == 1
    ex.shutdown()
    assert ex.num_workers == 0
    with pytest.raises(RuntimeError):
        ex.bootup()
    with pytest.raises(RuntimeError):
        ex.submit(add, 1)
    for wait_, cancel in ((False, False), (False, True), (True, True)):
        ex.shutdown(wait=wait_, cancel_futures=cancel)


@pytest.mark.parametrize("workers", [1, WORKERS])
def test_shutdown_cancel_futures_cancels_every_call_not_handed_to_a_worker(
    tmp_path: Path, workers: int
) -> None:
    """mpi4py's test_submit_shutdown_cancel_wait: the calls the workers run finish; every
    call behind them is cancelled and never runs, those the frontier held ahead of the workers
    too (issue 48), and the two last calls are cancelled."""
    count, marker = tmp_path / "count", str(tmp_path / "go")
    ex = MPIPoolExecutor(max_workers=workers, state_dir=tmp_path / "s")
    first = [ex.submit(wait_for, marker) for _ in range(workers)]
    rest = [ex.submit(counted, str(count), i) for i in range(100)]
    last = [ex.submit(sleep_for, 0), ex.submit(sleep_for, 0)]
    try:
        while not all(f.running() for f in first):
            time.sleep(0.01)
        ex.shutdown(wait=False, cancel_futures=True)
    finally:
        Path(marker).write_text("go")
    done, not_done = wait([*first, *last], timeout=120)
    assert not not_done and all(f.result() == marker for f in first)
    ex.shutdown(wait=True, cancel_futures=True)
    ran = [f for f in rest if not f.cancelled()]
    assert all(f.cancelled() for f in last) and all(f.done() for f in rest)
    assert not ran and not runs(count)  # every worker was busy: no call behind them was sent


def test_a_call_cancelled_in_the_frontier_never_runs_and_a_rerun_runs_it(tmp_path: Path) -> None:
    """Issue 48: a call is running once a dispatch sends it, not when it enters the frontier
    ahead of the workers: until then ``cancel()`` succeeds, its waiters are told, and the call
    never runs (it is withdrawn from the run); the calls given its future as an argument never
    run either (DependencyFailed caused by the CancelledError); nothing of them is recorded as
    ended, so a re-run that submits them runs them (or this run, under the same work ID). A
    call sent to the busy worker is not cancellable."""
    count, marker, state = tmp_path / "count", str(tmp_path / "go"), tmp_path / "s"

    def submit(ex: DurableExecutor) -> tuple[Any, list[Any], list[Any]]:
        first = ex.submit(wait_for, marker)
        rest = [ex.submit(counted, str(count), 0)]
        near = [ex.submit(add, rest[0], 1)]  # (waits in the state, or still in the executor)
        rest += [ex.submit(counted, str(count), i) for i in range(1, 6)]
        return first, rest, [*near, ex.submit(add, rest[1], 2)]

    ex = MPIPoolExecutor(max_workers=1, state_dir=state)
    try:
        first, rest, deps = submit(ex)
        while not first.running():  # sent: the worker is busy until the marker exists
            time.sleep(0.001)
        assert not first.cancel() and not any(f.running() for f in rest)
        assert rest[0].cancel() and rest[1].cancel()  # the frontier's (pending until sent)
        done, _ = wait(rest[:2], timeout=60)
        assert done == set(rest[:2]) and all(f.cancelled() for f in rest[:2])
    finally:
        Path(marker).write_text("go")
    for f, cancelled in zip(deps, rest[:2], strict=True):
        e = f.exception(timeout=60)
        assert isinstance(e, DependencyFailed) and e.dependency == cancelled.work_id
        assert isinstance(e.__cause__, CancelledError)
    assert [f.result(timeout=60) for f in rest[2:]] == [20, 30, 40, 50]
    assert ex.submit_as(rest[0].work_id, counted, str(count), 0).result(timeout=60) == 0
    ex.shutdown(wait=True)
    assert sorted(runs(count)) == [0, 2, 3, 4, 5]  # the cancelled calls never ran (until asked)
    with MPIPoolExecutor(max_workers=1, state_dir=state) as again:
        first, rest, deps = submit(again)
        assert [f.result() for f in rest] == [0, 10, 20, 30, 40, 50]
        assert [f.result() for f in deps] == [1, 12]
    assert sorted(runs(count)) == [0, 1, 2, 3, 4, 5]  # the re-run ran them, and only them


def test_calls_cancelled_as_soon_as_submitted_never_run(tmp_path: Path) -> None:
    """Issue 48: a call cancelled right after ``submit`` (before or after the executor's loop
    took it, in the frontier or not) never runs, whatever the timing of the two threads; the
    calls kept run and resolve."""
    count, marker = tmp_path / "count", str(tmp_path / "go")
    with MPIPoolExecutor(max_workers=1, state_dir=tmp_path / "s") as ex:
        try:
            ex.submit(wait_for, marker)  # the one worker is busy with it until the marker
            kept = []
            for i in range(300):
                f = ex.submit(counted, str(count), i)
                if i % 3:
                    assert f.cancel() and f.cancelled()
                else:
                    kept.append(f)
        finally:
            Path(marker).write_text("go")
        assert [f.result(timeout=60) for f in kept] == [i * 10 for i in range(0, 300, 3)]
    assert sorted(runs(count)) == list(range(0, 300, 3))


def _dispatch_order(state: Path) -> list[tuple[str, ...]]:
    """The work IDs of each dispatch the state journal records, in order."""
    from durable_dispatch.core.events import Dispatched
    from durable_dispatch.storage.journal import read_journal

    return [
        Dispatched.decode(r.payload).work_ids
        for r in read_journal(state / "events.jsonl")
        if r.payload.get("event") == "dispatched"
    ]


def test_shutdown_cancel_futures_withdraws_the_calls_the_frontier_held_ahead(
    tmp_path: Path,
) -> None:
    """Issue 48: with batch="auto" ramped up, every worker blocked inside a dispatch of several
    calls and the next dispatches' calls in the frontier ahead of the workers,
    shutdown(wait=False, cancel_futures=True) cancels (before it returns) every call not sent
    to a worker: no dispatch is made after it (the journal says so), the dispatches sent run
    whole and their futures resolve, no cancelled call ran (each call leaves a side effect),
    and a re-run on the same state directory runs exactly the cancelled calls."""
    count, started, go, state = (
        tmp_path / "count",
        tmp_path / "started",
        tmp_path / "go",
        tmp_path / "s",
    )
    started.mkdir()

    def submit(ex: DurableExecutor) -> list[tuple[str, int, Any]]:
        return [
            ("block", i, ex.submit(block_on, str(started), str(go), i))
            if i % 7 == 0
            else ("count", i, ex.submit(counted, str(count), i))
            for i in range(700)
        ]

    ex = MPIPoolExecutor(state_dir=state)
    try:
        assert list(ex.map(add, range(3000))) == list(range(3000))  # batch="auto" ramps up
        calls = submit(ex)
        deadline = time.monotonic() + 120
        while len({n.split(".")[1] for n in os.listdir(started)}) < WORKERS:  # all blocked
            assert time.monotonic() < deadline, "the workers never took the blocking calls"
            time.sleep(0.01)
        frontier = ex._feed.state.core.ledger.frontier  # (the next dispatches' calls)
        while ex._board.queue or not frontier:  # the manager took every call, and some went ahead
            assert time.monotonic() < deadline, "no call went into the frontier"
            time.sleep(0.01)
        ex.shutdown(wait=False, cancel_futures=True)
        cancelled = {i for _, i, f in calls if f.cancelled()}  # settled when shutdown returned
        blocked = {int(n.split(".")[0]) for n in os.listdir(started)}
    finally:
        go.write_text("go")
    ex.shutdown(wait=True)
    assert ex._report is not None and (ex._report.finished, ex._report.reason) == (
        False,
        "withdrawn",  # (the cancelled calls are pending: a later run does them)
    )
    assert ex._broken is None and len(blocked) == WORKERS and not blocked & cancelled
    for kind, i, f in calls:
        assert f.done() and (f.cancelled() == (i in cancelled))
        if i not in cancelled:
            assert f.result() == (i if kind == "block" else i * 10)
    ran = set(runs(count)) | {int(n.split(".")[0]) for n in os.listdir(started)}
    assert ran == {i for _, i, _ in calls} - cancelled and len(runs(count)) == len(set(runs(count)))
    by_id = {f.work_id: i for _, i, f in calls}
    dispatches = [[by_id[w] for w in ids if w in by_id] for ids in _dispatch_order(state)]
    last = max(k for k, d in enumerate(dispatches) if blocked & set(d))
    assert not dispatches[last + 1 :], "calls were dispatched after the shutdown"
    assert max(len(d) for d in dispatches) > 1  # batched: each sent whole, all its calls ran
    assert cancelled  # the frontier held some ahead (else the calls behind all ran first)
    ran_before = len(runs(count))
    with MPIPoolExecutor(state_dir=state) as again:  # a re-run: the cancelled calls run now
        assert list(again.map(add, range(3000))) == list(range(3000))
        for kind, i, f in submit(again):
            assert f.result() == (i if kind == "block" else i * 10)
    rerun = set(runs(count)[ran_before:]) | {
        int(n.split(".")[0]) for n in os.listdir(started) if int(n.split(".")[0]) in cancelled
    }
    assert rerun == cancelled and len(runs(count)) == len(set(runs(count)))


def test_map_argument_errors_are_mpi4pys(tmp_path: Path) -> None:
    """chunksize and buffersize: TypeError for a non-integer, ValueError below 1, and
    buffersize with unordered is a ValueError (mpi4py 4.1; CPython 3.14 for buffersize),
    raised by the call to map, not later."""
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        with pytest.raises(TypeError):
            ex.map(add, range(3), buffersize="1")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            ex.map(add, range(3), chunksize=2.0)  # type: ignore[arg-type]
        for bad in (0, -1):
            with pytest.raises(ValueError):
                ex.map(add, range(3), buffersize=bad)
            with pytest.raises(ValueError):
                ex.starmap(add, [(1,)], chunksize=bad)
        with pytest.raises(ValueError):
            ex.map(add, range(3), buffersize=1, unordered=True)
        for bs in (1, 2, 9, 10, 11):
            assert list(ex.map(pow, range(10), range(10), buffersize=bs)) == [
                pow(x, x) for x in range(10)
            ]


def test_the_module_has_mpi4py_futures_names() -> None:
    """Every name of mpi4py.futures that a script imports is here, the standard library's
    ones as the same objects; the two local pools are mpi4py's own, attributes that are not
    in ``__all__`` (a ``*`` import must not start MPI)."""
    import concurrent.futures as cf

    import mpi4py.futures

    from durable_dispatch import futures

    missing = set(mpi4py.futures.__all__) - set(futures.__all__)
    assert missing == {"ThreadPoolExecutor", "ProcessPoolExecutor"}
    for name in missing:
        assert getattr(futures, name) is getattr(mpi4py.futures, name)
    for name in ("Executor", "Future", "wait", "as_completed", "BrokenExecutor"):
        assert getattr(futures, name) is getattr(cf, name)


def test_collect_and_compose_work_on_its_futures(tmp_path: Path) -> None:
    from durable_dispatch.futures import collect, compose

    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        assert collect([ex.submit(add, i) for i in range(4)]).result() == [0, 1, 2, 3]
        assert compose(ex.submit(add, 20), lambda x: x * 2).result() == 40


def test_a_value_that_cannot_be_pickled_fails_with_its_own_error(tmp_path: Path) -> None:
    """mpi4py's pickle tests: an argument that cannot be pickled fails its future with that
    error (its own type, no cause); one that cannot be unpickled by the worker, and a result
    that cannot be pickled there, fail with theirs and the worker's traceback as the cause;
    a result that cannot be unpickled here fails with its own; the executor serves on."""
    with MPIPoolExecutor(max_workers=1, state_dir=tmp_path / "s") as ex:
        good = GoodPickle(42)
        back = ex.submit(echo, good).result()
        assert good.pickled and back.unpickled and back.value == 42
        bad = ex.submit(echo, BadPickle())
        e = bad.exception()
        assert type(e) is ZeroDivisionError and e.__cause__ is None
        assert bad.work_id is None
        e = ex.submit(echo, BadUnpickle()).exception()
        assert type(e) is ZeroDivisionError and "ZeroDivisionError" in str(e.__cause__)
        assert type(ex.submit(BadPickle).exception()) is ZeroDivisionError
        assert type(ex.submit(BadUnpickle).exception()) is ZeroDivisionError
        assert ex.submit(abs, -42).result() == 42


def test_wait_and_as_completed_with_settled_and_cancelled_futures(tmp_path: Path) -> None:
    """The standard library's wait cases with futures settled outside the executor mixed in
    (CPython's test_wait.py, mpi4py's WaitTestMixin)."""
    from concurrent.futures import Future

    ok: Future[int] = Future()
    ok.set_result(1)
    failed: Future[int] = Future()
    failed.set_exception(OSError("x"))
    cancelled: Future[int] = Future()
    cancelled.cancel()
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        slow = ex.submit(sleep_for, 5)
        fast = ex.submit(add, 21, 21)
        done, pending = wait([cancelled, fast, slow], return_when=FIRST_COMPLETED)
        assert done == {fast} and pending == {cancelled, slow}
        boom = ex.submit(div, 1, 0)
        done, pending = wait([ok, boom, slow], return_when=FIRST_EXCEPTION)
        assert boom in done and ok in done and slow in pending
        done, pending = wait([failed, slow], return_when=FIRST_EXCEPTION)
        assert done == {failed} and pending == {slow}
        assert next(as_completed([fast, fast, ok])) in (fast, ok)
        assert set(as_completed([fast, ok, failed])) == {fast, ok, failed}
        with pytest.raises(TimeoutError):
            list(as_completed([slow], timeout=0))
        ex.shutdown(wait=False, cancel_futures=True)
