"""The futures executor's parts that need no MPI (issue 32): work IDs from a canonical digest of
the call, the sealed pickles (S7) and the executor's refusals. The executor itself, under a real
``mpiexec``, is in ``tests/test_mpi_futures.py``."""

from __future__ import annotations

import functools
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import futures
from durable_dispatch.errors import (
    StorageError,
    TaskCrashed,
    TaskFailed,
    TaskTimedOut,
    UsageError,
    ValueCorruptError,
)
from durable_dispatch.futures._calls import call_digest, call_id, function_name
from durable_dispatch.futures._seal import (
    INLINE_BYTES,
    KEY_FILE,
    VALUES_DIR,
    Sealer,
    load_or_create_key,
)


def add(a: int, b: int = 0) -> int:
    """A module-level function the workers can find."""
    return a + b


class Point:
    """A user class: its instances pickle by state."""

    def __init__(self, x: int) -> None:
        self.x = x


class _Trap:
    """A pickle that, if it were ever loaded, would leave a marker file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


# ---------------------------------------------------------------------- work IDs
def test_a_call_digest_is_the_same_in_every_process_and_distinguishes_types() -> None:
    """Never hash(): the digest of a call with strings, sets and dicts is the same under two
    hash seeds (string hashing is salted per process), and 1, 1.0 and True differ."""
    code = (
        "from durable_dispatch.futures._calls import call_digest\n"
        "from tests.test_futures import add\n"
        "print(call_digest(add, ({'b': 1, 'a': {'x', 'y', 'z'}}, 'é'), {'b': (1, [2.5])}))"
    )
    root = Path(__file__).resolve().parent.parent
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1
    here = call_digest(add, ({"a": {"z", "y", "x"}, "b": 1}, "é"), {"b": (1, [2.5])})
    assert outs == {here + "\n"}  # and dict and set order do not matter
    digests = {call_digest(add, (v,), {}) for v in (1, 1.0, True, "1", (1,), [1])}
    assert len(digests) == 6
    assert call_digest(add, (1, 2), {}) != call_digest(add, (1,), {"b": 2})
    assert call_digest(add, (Point(3),), {}) == call_digest(add, (Point(3),), {})
    assert call_digest(add, (Point(3),), {}) != call_digest(add, (Point(4),), {})


def test_a_partial_is_named_by_its_function_and_its_bound_arguments_count() -> None:
    assert function_name(add) == "tests.test_futures:add"
    assert function_name(pow) == "builtins:pow"
    p1, p2 = functools.partial(add, 1), functools.partial(add, 2)
    assert function_name(p1) == "tests.test_futures:add"
    assert call_digest(p1, (5,), {}) != call_digest(p2, (5,), {})
    assert call_id("m:f", "ab", 3) == "m:f/ab/3"


def test_a_lambda_or_a_nested_function_is_refused_with_its_name() -> None:
    def nested(x: int) -> int:
        return x

    with pytest.raises(TypeError, match="lambda"):
        function_name(lambda x: x)
    with pytest.raises(TypeError, match="nested"):
        function_name(nested)
    with pytest.raises(TypeError, match="not callable"):
        function_name(3)
    # an argument pickle cannot hold: the pickling error itself, unwrapped (issue 48)
    with pytest.raises(TypeError, match="cannot pickle 'generator' object") as info:
        call_digest(add, ((i for i in range(3)),), {})
    assert info.value.__cause__ is None
    with pytest.raises(ZeroDivisionError):
        call_digest(add, (Unpicklable(),), {})


class Unpicklable:
    """Its pickling raises ZeroDivisionError (mpi4py's BadPickle)."""

    def __reduce__(self) -> Any:
        return 1 / 0


# ---------------------------------------------------------------------- the key
def test_the_key_is_created_once_owner_only_and_a_loose_one_is_refused(tmp_path: Path) -> None:
    key = load_or_create_key(str(tmp_path))
    path = tmp_path / KEY_FILE
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_key(str(tmp_path)) == key  # read, not replaced
    path.chmod(0o640)
    with pytest.raises(StorageError, match="readable by no one else"):
        load_or_create_key(str(tmp_path))
    path.chmod(0o600)
    path.write_bytes(b"short")
    with pytest.raises(StorageError, match="5 bytes"):
        load_or_create_key(str(tmp_path))
    path.unlink()
    (tmp_path / "elsewhere").write_bytes(os.urandom(32))
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StorageError):
        load_or_create_key(str(tmp_path))


# ---------------------------------------------------------------------- sealed values
def test_sealed_calls_and_results_round_trip_with_their_types(tmp_path: Path) -> None:
    s = Sealer(os.urandom(32), str(tmp_path))
    value = {1: (2, 3), "p": Point(7), "b": b"\0\1"}
    payload = s.seal_call("w", "m:f", "d1", (add, (value,), {"b": 1}))
    fn, args, kwargs = s.open_call("w", payload)
    assert fn is add and args[0][1] == (2, 3) and args[0]["p"].x == 7 and kwargs == {"b": 1}
    how, back, tb = s.open_result("w", s.seal_result("w", "d1", "ok", value))
    assert how == "ok" and back[1] == (2, 3) and back["p"].x == 7 and tb is None
    how, exc, tb = s.open_result("w", s.seal_result("w", "d1", "raised", KeyError(3), "TB"))
    assert how == "raised" and isinstance(exc, KeyError) and exc.args == (3,) and tb == "TB"


def test_a_large_result_goes_to_the_side_store_and_an_altered_side_file_is_refused(
    tmp_path: Path,
) -> None:
    s = Sealer(os.urandom(32), str(tmp_path))
    big = os.urandom(INLINE_BYTES + 1)
    sealed = s.seal_result("w", "d", "ok", big)
    assert "v" not in sealed and sealed["size"] > INLINE_BYTES
    assert len(pickle.dumps(sealed)) < 4096  # the record keeps a reference only
    assert s.open_result("w", sealed)[1] == big
    side = tmp_path / VALUES_DIR / sealed["blob"]
    assert stat.S_IMODE(side.stat().st_mode) == 0o600
    side.write_bytes(side.read_bytes()[:-1] + b"!")
    with pytest.raises(ValueCorruptError, match="does not match"):
        s.open_result("w", sealed)
    side.unlink()
    with pytest.raises(ValueCorruptError, match="unreadable"):
        s.open_result("w", sealed)


def test_a_forged_or_foreign_pickle_is_refused_and_never_loaded(tmp_path: Path) -> None:
    """S7: a payload or result whose tag fails is a ValueCorruptError, and its pickle is never
    loaded (the trap would create its marker file); a result moved to another work ID, or
    sealed with another directory's key, fails too."""
    marker = tmp_path / "pwned"
    mine, theirs = Sealer(os.urandom(32), str(tmp_path)), Sealer(os.urandom(32), str(tmp_path))
    forged_call = theirs.seal_call("w", "m:f", "d", (_Trap(str(marker)), (), {}))
    with pytest.raises(ValueCorruptError, match="HMAC"):
        mine.open_call("w", forged_call)
    forged_result = theirs.seal_result("w", "d", "ok", _Trap(str(marker)))
    with pytest.raises(ValueCorruptError, match="HMAC"):
        mine.open_result("w", forged_result)
    tampered = {**forged_call, "tag": mine.seal_call("w", "m:f", "d", 1)["tag"]}
    with pytest.raises(ValueCorruptError):
        mine.open_call("w", tampered)
    moved = mine.seal_result("w1", "d", "ok", 5)
    with pytest.raises(ValueCorruptError):
        mine.open_result("w2", moved)
    with pytest.raises(ValueCorruptError):
        mine.open_result("w1", {**moved, "how": "raised"})
    for junk in (None, 7, {}, {"how": "ok", "d": "d", "tag": "x", "v": "%%%"}):
        with pytest.raises(ValueCorruptError):
            mine.open_result("w", junk)
    assert not marker.exists()


# ---------------------------------------------------------------------- the executor's refusals
def test_an_executor_outside_the_runner_or_without_a_state_dir_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No silent undurable mode and no hang: outside the runner (and outside a
    DurableCommExecutor) there are no workers; without a state directory nothing is kept."""
    monkeypatch.delenv(futures.STATE_DIR_ENV, raising=False)
    with pytest.raises(UsageError, match="python -m durable_dispatch.futures"):
        futures.DurableExecutor(state_dir=tmp_path)
    from durable_dispatch.futures import _executor

    monkeypatch.setitem(_executor.JOB, "runner", True)
    with pytest.raises(UsageError, match="state directory"):
        futures.DurableExecutor()
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="max_workers"):
            futures.DurableExecutor(max_workers=bad, state_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="task_timeout"):
        futures.DurableExecutor(task_timeout=0, state_dir=tmp_path)
    with pytest.raises(TypeError, match="initializer"):
        futures.DurableExecutor(initializer=3, state_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="root"):
        futures.DurableCommExecutor(None, 1)


def test_the_executors_state_dir_comes_from_the_runner_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_dispatch.futures import _executor

    monkeypatch.setitem(_executor.JOB, "made", 0)
    monkeypatch.setitem(_executor.JOB, "state_dir", None)
    monkeypatch.setenv(futures.STATE_DIR_ENV, str(tmp_path / "env"))
    assert _executor._state_dir(None) == str(tmp_path / "env" / "executor-1")
    monkeypatch.setitem(_executor.JOB, "state_dir", str(tmp_path / "run"))
    assert _executor._state_dir(None) == str(tmp_path / "run" / "executor-2")
    assert _executor._state_dir(tmp_path / "own") == str(tmp_path / "own")


def test_the_stdlib_names_are_the_same_objects_and_the_errors_pickle() -> None:
    import concurrent.futures as cf

    for name in (
        "Future",
        "wait",
        "as_completed",
        "FIRST_COMPLETED",
        "FIRST_EXCEPTION",
        "ALL_COMPLETED",
        "CancelledError",
        "TimeoutError",
        "BrokenExecutor",
        "InvalidStateError",
    ):
        assert getattr(futures, name) is getattr(cf, name), name
    assert futures.MPIPoolExecutor is futures.DurableExecutor
    assert futures.MPICommExecutor is futures.DurableCommExecutor
    for cls in (TaskFailed, TaskCrashed, TaskTimedOut):
        e = cls("x", work_id="w", kind="crash", attempts=2)
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and (back.work_id, back.kind, back.attempts) == ("w", "crash", 2)
    assert issubclass(TaskCrashed, TaskFailed) and not issubclass(TaskTimedOut, TimeoutError)


def test_collect_and_compose_settle_as_mpi4pys() -> None:
    """mpi4py.futures.collect/compose on plain futures: results in order (a future named twice
    counts twice), the first exception, cancellation both ways, and hooks."""
    from concurrent.futures import Future

    a: Future[int] = Future()
    b: Future[int] = Future()
    both = futures.collect([a, b, a])
    b.set_result(2)
    assert not both.done()
    a.set_result(1)
    assert both.result() == [1, 2, 1] and futures.collect([]).result() == []
    c: Future[int] = Future()
    d: Future[int] = Future()
    failed = futures.collect([c, d])
    c.set_exception(KeyError("k"))
    assert isinstance(failed.exception(), KeyError)
    e: Future[int] = Future()
    f: Future[int] = Future()
    gathered = futures.collect([e, f])
    assert gathered.cancel() and e.cancelled() and f.cancelled()
    g: Future[int] = Future()
    doubled = futures.compose(g, lambda v: v * 2)
    g.set_result(21)
    assert doubled.result() == 42
    h: Future[int] = Future()
    handled = futures.compose(h, excepthook=lambda e: f"handled {type(e).__name__}")
    rethrown = futures.compose(h, excepthook=lambda e: ValueError(str(e)))
    h.set_exception(OSError("disk"))
    assert handled.result() == "handled OSError" and isinstance(rethrown.exception(), ValueError)
    i: Future[int] = Future()
    out = futures.compose(i)
    assert out.cancel() and i.cancelled()


def test_collect_survives_an_input_cancelled_while_another_is_pending() -> None:
    """Cancelling one input of ``collect`` cancels the collected future, whose callback cancels
    the other inputs, whose callbacks run in the same thread: no deadlock on the collector's own
    lock (it hung forever). Run in a thread so a hang fails the test instead of the run."""
    import threading
    from concurrent.futures import Future

    fs: list[Future[int]] = [Future(), Future()]
    out = futures.collect(fs)
    t = threading.Thread(target=fs[1].cancel, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "collect deadlocked in its cancel callbacks"
    assert out.cancelled() and fs[0].cancelled() and fs[1].cancelled()


def test_collect_and_compose_cancel_the_rest_and_keep_the_inputs_class() -> None:
    """As mpi4py's: when one input fails, the inputs still pending are cancelled (the done ones
    are not); the new future is of the inputs' class (a subclass stays itself); compose's too."""
    from concurrent.futures import Future

    class Mine(Future):  # type: ignore[type-arg]
        pass

    fs: list[Future[int]] = [Mine() for _ in range(4)]
    out = futures.collect(fs)
    assert type(out) is Mine
    fs[1].set_result(1)
    fs[3].set_exception(KeyError("k"))
    assert isinstance(out.exception(), KeyError)
    assert fs[0].cancelled() and fs[2].cancelled() and not fs[1].cancelled()
    base = Mine()
    composed = futures.compose(base, lambda v: v + 1)
    assert type(composed) is Mine
    base.set_result(1)
    assert composed.result() == 2


def test_thenable_futures_chain_as_mpi4pys_aplus() -> None:
    """``aplus.ThenableFuture``: then/catch with values, exceptions, a returned future that is
    followed, cancellation forward, and a chain that would follow itself refused."""
    from durable_dispatch.futures.aplus import ThenableFuture

    base = ThenableFuture()
    doubled = base.then(lambda v: v * 2)
    followed = base.then(lambda v: inner)
    inner = ThenableFuture()
    caught = base.then(lambda v: 1 / 0).catch(lambda e: type(e).__name__)
    base.set_result(21)
    assert doubled.result() == 42 and caught.result() == "ZeroDivisionError"
    assert type(doubled) is ThenableFuture and not followed.done()
    inner.set_result("inner")
    assert followed.result() == "inner"
    failing = ThenableFuture()
    as_error = failing.then(None, lambda e: ValueError(str(e)))
    swallowed = failing.catch()
    failing.set_exception(OSError("disk"))
    assert isinstance(as_error.exception(), ValueError) and swallowed.result() is None
    cancelled = ThenableFuture()
    after = cancelled.then()
    assert cancelled.cancel() and after.cancelled()
    me = ThenableFuture()
    out = me.then(lambda v: out)
    me.set_result(0)
    assert isinstance(out.exception(), RuntimeError) and "cycle" in str(out.exception())
