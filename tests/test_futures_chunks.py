"""A chunked ``map`` (``chunksize > 1``): one work item per chunk of consecutive calls.

The chunk's ID (a digest distinct from any single call's), the worker's run of a chunk (each
call's outcome, sealed once), the iterator that yields a chunk's values and splits a chunk that
failed as a whole (driven here by fake submit functions), and, under a real ``mpiexec``, the
whole: values in order, a call that raises or crashes failing only its own position, a re-run
that runs nothing, one record per chunk, and a master SIGKILLed mid-``map``."""

from __future__ import annotations

import os
import pickle
import sys
import threading
from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import read_results
from durable_dispatch.errors import TaskCrashed
from durable_dispatch.futures._calls import call_digest, chunk_digest
from durable_dispatch.futures._chunks import chunked_map
from durable_dispatch.futures._seal import Sealer
from durable_dispatch.futures._serve import Task
from durable_dispatch.mpi.context import WorkContext
from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

ROOT = Path(__file__).resolve().parent.parent
CHILD = str(Path(__file__).parent / "children" / "futures_chunks.py")


def square(x: int) -> int:
    if x == 13:
        raise KeyError(x)
    return x * x


def lock_maker(x: int) -> Any:
    return threading.Lock() if x == 2 else x


# ---------------------------------------------------------------------- the chunk's ID
def test_a_chunks_digest_is_neither_a_single_calls_nor_another_chunks() -> None:
    calls = ((1,), (2,), (3,))
    d = chunk_digest(square, calls)
    assert d == chunk_digest(square, ((1,), (2,), (3,)))  # stable
    assert d != call_digest(square, ((1,), (2,), (3,)), {})  # the "chunk" marker
    assert d != call_digest(square, (1,), {})
    assert d != chunk_digest(square, ((1,), (2,), (4,)))  # a changed chunk is a new item
    assert d != chunk_digest(square, ((1,), (2,)))


# ---------------------------------------------------------------------- the worker's run
def test_a_chunk_runs_in_one_task_and_each_call_keeps_its_own_outcome(tmp_path: Path) -> None:
    """One task, one sealed result: the values in order, and the exception a call raised (with
    its traceback) at its position; a value pickle cannot hold fails only its own call."""
    key = os.urandom(32)
    config = pickle.dumps({"key": key, "dir": str(tmp_path), "init": None})
    task = Task(config)
    sealer = Sealer(key, str(tmp_path))
    calls = ((11,), (12,), (13,), (14,))
    payload = sealer.seal_call("c/d/0", "m:square", "d", (square, calls), len(calls))
    assert payload["chunk"] == 4 and payload["args"].startswith("4 calls: 11")
    result = task(payload, WorkContext("c/d/0", 0, None, 1.0))
    how, (values, raised), _ = sealer.open_result("c/d/0", result)
    assert how == "ok" and values == [121, 144, None, 196]
    assert list(raised) == [2] and isinstance(raised[2][0], KeyError)
    assert "KeyError: 13" in raised[2][1]
    calls = ((1,), (2,), (3,))
    payload = sealer.seal_call("c/e/0", "m:lock_maker", "e", (lock_maker, calls), 3)
    how, (values, raised), _ = sealer.open_result(
        "c/e/0", task(payload, WorkContext("c/e/0", 0, None, 1.0))
    )
    assert values == [1, None, 3] and list(raised) == [1]
    assert "pickle" in str(raised[1][0])
    payload["chunk"] = 0  # a chunk is sealed as one: it cannot pass for a single call
    with pytest.raises(Exception, match="HMAC"):
        task(payload, WorkContext("c/e/0", 0, None, 1.0))


# ---------------------------------------------------------------------- the iterator
class _Fake:
    """Submit functions that run the calls at once: a chunk with a ``bad`` element fails
    as a whole (``TaskCrashed``), as a chunk whose process crashed; ``hold``: chunks stay
    pending until :meth:`release`."""

    def __init__(self, bad: int | None = None, hold: bool = False) -> None:
        self.bad, self.hold = bad, hold
        self.chunks: list[tuple[Any, ...]] = []
        self.singles: list[tuple[Any, ...]] = []
        self.held: list[tuple[Future[Any], tuple[Any, ...]]] = []

    def _outcome(self, fn: Any, calls: tuple[Any, ...]) -> tuple[list[Any], dict[int, Any]]:
        values: list[Any] = []
        raised: dict[int, Any] = {}
        for i, args in enumerate(calls):
            try:
                values.append(fn(*args))
            except Exception as e:  # noqa: BLE001
                values.append(None)
                raised[i] = (e, "TB")
        return values, raised

    def submit_chunk(self, fn: Any, calls: tuple[Any, ...]) -> Future[Any] | None:
        self.chunks.append(calls)
        fut: Future[Any] = Future()
        if self.hold:
            self.held.append((fut, calls))
        elif self.bad is not None and (self.bad,) in calls:
            fut.set_exception(TaskCrashed("crashed", work_id="c", kind="crash", attempts=2))
        else:
            fut.set_result(self._outcome(fn, calls))
        return fut

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        self.singles.append(args)
        fut: Future[Any] = Future()
        if args == (self.bad,):
            fut.set_exception(TaskCrashed("crashed", work_id="s", kind="crash", attempts=2))
        else:
            fut.set_result(fn(*args))
        return fut

    def release(self) -> None:
        for fut, calls in self.held:
            if not fut.done() and fut.set_running_or_notify_cancel():
                fut.set_result(self._outcome(square, calls))


def _map(fake: _Fake, n: int, k: int, **kw: Any) -> Any:
    kw = {"end": None, "buffersize": None, "unordered": False, **kw}
    args = [(x,) for x in range(n)]
    return chunked_map(fake.submit_chunk, fake.submit, square, args, k, **kw)


def test_the_values_come_in_order_one_chunk_per_k_calls_and_a_raise_at_its_position() -> None:
    fake = _Fake()
    assert list(_map(fake, 12, 5)) == [x * x for x in range(12)]
    assert [len(c) for c in fake.chunks] == [5, 5, 2] and not fake.singles
    it = _map(_Fake(), 20, 8)
    got = [next(it) for _ in range(13)]
    assert got == [x * x for x in range(13)]
    with pytest.raises(KeyError) as info:
        next(it)
    assert str(info.value.__cause__) == "TB"  # the worker's traceback
    assert sorted(_map(_Fake(), 12, 5, unordered=True)) == [x * x for x in range(12)]


def test_a_chunk_that_failed_as_a_whole_is_split_so_only_its_bad_call_fails() -> None:
    fake = _Fake(bad=6)
    it = _map(fake, 12, 4)
    assert [next(it) for _ in range(6)] == [x * x for x in range(6)]
    with pytest.raises(TaskCrashed) as info:
        next(it)
    assert info.value.work_id == "s"  # the single call's failure, not the chunk's
    assert fake.singles == [(4,), (5,), (6,), (7,)]  # the chunk's calls, one by one
    fake = _Fake(bad=6)
    got = []
    with pytest.raises(TaskCrashed):
        for v in _map(fake, 12, 4, unordered=True):
            got.append(v)
    assert 36 not in got and fake.singles == [(4,), (5,), (6,), (7,)]  # (in any order)


def test_buffersize_counts_chunks_and_closing_the_iterator_cancels_the_chunks_not_read() -> None:
    fake = _Fake(hold=True)
    it = _map(fake, 40, 4, buffersize=2)
    assert len(fake.chunks) == 2  # two chunks ahead, not two calls
    fake.release()
    assert next(it) == 0 and len(fake.chunks) == 3  # a chunk read, the next submitted
    fake.release()
    it.close()
    assert all(f.cancelled() for f, _ in fake.held[3:]) and len(fake.held) == 3
    fake = _Fake(hold=True)
    it = _map(fake, 8, 4)
    fake.held[0][0].cancel()  # a chunk cancelled is not split: its error is raised
    with pytest.raises(CancelledError):
        next(it)
    assert not fake.singles and fake.held[1][0].cancelled()


def test_a_chunk_that_cannot_be_one_task_is_submitted_as_single_calls() -> None:
    fake = _Fake()
    fake.submit_chunk = lambda fn, calls: None  # type: ignore[method-assign]
    assert list(_map(fake, 5, 2)) == [0, 1, 4, 9, 16]
    assert fake.singles == [(x,) for x in range(5)]


# ---------------------------------------------------------------------- under mpiexec
def _runner(n: int, state: Path, *argv: str) -> list[str]:
    return mpiexec_command(
        n, [sys.executable, "-m", "durable_dispatch.futures", "--state-dir", str(state), *argv]
    )


def _ran(count: Path) -> list[int]:
    return [int(x) for x in count.read_text().split()] if count.exists() else []


EXPECTED = [
    "map True",
    "starmap True",
    "unordered True",
    "raised bad 37 True True",
    "crashed crash True True",
    "dependency True",
    "unpicklable True",
    "deadline True",
    "hung timeout True",
]


def test_a_chunked_map_under_the_runner_and_a_rerun_that_runs_nothing(tmp_path: Path) -> None:
    """``mpiexec -n 4``: values in order (``map``, ``starmap``, unordered); a call that raises
    is raised at its position; a call whose isolated child SIGKILLs itself fails alone with
    ``TaskCrashed`` under its single call's ID (its chunk crashed in both attempts, then its
    calls ran one by one); a future argument and an argument that cannot be pickled fall back
    to single calls. A chunk's deadline is ``task_timeout`` per call, and a call that hangs in
    a chunk fails alone with ``TaskTimedOut``. Each chunk is one committed record. A re-run on
    the same state directory prints the same and runs no call (the chunks, the split chunk's
    single calls and the crashed call all come from the record)."""
    state, count = tmp_path / "state", tmp_path / "count"
    first = run_mpiexec(_runner(4, state, CHILD, str(count), "checks"), timeout=240, cwd=ROOT)
    assert not first.timed_out and first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.splitlines() == EXPECTED, first.stdout + first.stderr[-3000:]
    ran = _ran(count)
    assert ran.count(151) == 4 and ran.count(144) >= 3  # the chunk twice, then alone (twice)
    assert ran.count(300) == 1 and ran.count(312) == 2  # in its chunk's deadline; hung twice
    rows = list(read_results(state / "executor-1", with_payload=True))
    chunks = [r for r in rows if r.payload.get("chunk") and r.payload["fn"].endswith(":work")]
    sizes = sorted(r.payload["chunk"] for r in chunks)
    assert sizes == [6, 6, 7, 7, 8, 8, 8, 8], sizes  # one record per chunk of work's maps
    assert len({r.work_id for r in rows}) == len(rows)
    second = run_mpiexec(_runner(4, state, CHILD, str(count), "checks"), timeout=240, cwd=ROOT)
    assert not second.timed_out and second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.splitlines() == EXPECTED, second.stdout + second.stderr[-3000:]
    assert _ran(count) == ran  # nothing ran again


def test_a_master_killed_mid_chunked_map_reruns_only_the_chunks_not_committed(
    tmp_path: Path,
) -> None:
    """Rank 0 SIGKILLs itself after 45 of 200 results (chunks of 8); the re-run prints every
    value once, in order, and runs exactly the calls of the chunks not committed."""
    state, count = tmp_path / "state", tmp_path / "count"
    first = run_mpiexec(_runner(4, state, CHILD, str(count), "45"), timeout=240, cwd=ROOT)
    assert not first.timed_out and first.returncode != 0
    assert len([x for x in first.stdout.splitlines() if x.startswith("result")]) == 45
    rows = list(read_results(state / "executor-1", with_payload=True))
    committed = sum(r.payload["chunk"] for r in rows)
    assert len(rows) >= 6 and committed == 8 * len(rows) >= 45
    ran_first = _ran(count)
    second = run_mpiexec(_runner(4, state, CHILD, str(count), "-1"), timeout=240, cwd=ROOT)
    assert not second.timed_out and second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.splitlines() == [f"result {x * x}" for x in range(200)] + ["done"]
    ran_second = _ran(count)[len(ran_first) :]
    assert len(ran_second) == 200 - committed
    assert set(ran_first) | set(ran_second) == set(range(200))


def test_a_chunked_map_on_comm_self_runs_in_a_thread_and_resumes_from_the_record(
    tmp_path: Path,
) -> None:
    """``MPICommExecutor(MPI.COMM_SELF)`` (the calls run in a thread of rank 0): a chunked
    ``map`` and ``starmap`` give the values in order, one record per chunk; a second executor
    on the same directory resolves every chunk from the record, running nothing."""
    cmd = mpiexec_command(
        1, [sys.executable, CHILD, str(tmp_path / "count"), "self", str(tmp_path)]
    )
    res = run_mpiexec(cmd, timeout=120, cwd=ROOT)
    assert not res.timed_out and res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.splitlines() == ["self True True 8", "again True 0"], res.stdout
