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
import os
import time
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import read_results
from durable_dispatch.core import RetryPolicy
from durable_dispatch.errors import UsageError, ValueCorruptError
from durable_dispatch.futures import (
    ALL_COMPLETED,
    BrokenExecutor,
    DurableExecutor,
    MPIPoolExecutor,
    TaskCrashed,
    TaskTimedOut,
    TimeoutError,
    as_completed,
    wait,
)
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
        assert sorted(ex.map(add, range(9), unordered=True, buffersize=2)) == list(range(9))


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


def test_max_workers_and_one_executor_at_a_time(tmp_path: Path) -> None:
    with MPIPoolExecutor(max_workers=1, state_dir=tmp_path / "s") as ex:
        assert ex.num_workers == 1
        assert list(ex.map(add, range(5))) == list(range(5))
        with pytest.raises(UsageError, match="another executor"):
            MPIPoolExecutor(state_dir=tmp_path / "t")
    with MPIPoolExecutor(max_workers=99, state_dir=tmp_path / "u") as ex:
        assert ex.num_workers == WORKERS


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


def test_a_segfault_or_a_hang_costs_only_its_own_future(tmp_path: Path) -> None:
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
    runs again, raised exceptions are raised again; work IDs do not depend on chunksize."""
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
    with MPIPoolExecutor(state_dir=tmp_path / "s") as ex:
        more = list(ex.map(counted, [str(count)] * 12, range(12), chunksize=64))
        assert more == [x * 10 for x in range(12)]
    assert sorted(runs(count)) == list(range(10)) + [10, 11]  # only the two new ones ran
    ids = {r.work_id for r in read_results(tmp_path / "s")}
    assert len(ids) == 13 and all(i.startswith(f"{__name__}:") for i in ids)


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
