"""One visible place where user code runs (issue 67): every hook the library calls runs inside
``CampaignState.deliver()``, and nowhere else.

Each test hands the library hooks that record the Python call stack at every call, runs a
campaign that calls each of them, and asserts that a frame of ``CampaignState.deliver`` (the
function ``deliver`` of ``campaign/state.py``) is on the stack at every call. The hooks: a
commit's callback (``on_commit`` given to ``run_master``, to ``CampaignState.open`` and to
``redeliver``), the state's ``on_defer``, ``on_cancel`` and ``on_dispatch``, ``run_master``'s
``progress``, a ``Feed``'s ``refill``, and the done-callbacks of the futures executor's futures.

The campaigns: an in-process ``run_master`` (``LocalWorkers``) fed by a ``Feed`` subclass, with
items that always raise (deferred once their retries are spent), an operator's cancel (a
command file, as ``durable-dispatch cancel`` writes it) and the dependent it defers; a callback
that raises, and the reopen that delivers its commits again; a state closed with a commit not
yet delivered; an executor on a communicator of one rank, whose calls run in its manager
thread (in a process of its own: MPI is not started in the test process).

A hook that runs where no ``deliver`` frame is, is reported as having run outside, with the
library functions that called it; so where ``deliver`` does not exist every call is outside,
and the failure names each hook and where it ran from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import CampaignState, RetryPolicy, WorkItem
from durable_dispatch.campaign import control
from durable_dispatch.campaign.control import write_command
from durable_dispatch.mpi import Feed, run_master
from durable_dispatch.testing import LocalWorkers

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "children" / "hooks_futures.py"

#: the function that is the one delivery point, and the file it is defined in
DELIVER = ("deliver", "campaign/state.py")


def _frames(start: types.FrameType | None) -> Iterable[types.FrameType]:
    f = start
    while f is not None:
        yield f
        f = f.f_back


def _inside_deliver(start: types.FrameType | None = None) -> bool:
    """True when a frame of ``CampaignState.deliver`` is on the call stack (from ``start``, or
    from the caller's frame): the function ``deliver`` of ``campaign/state.py``."""
    name, file = DELIVER
    for f in _frames(start if start is not None else sys._getframe(1)):
        code = f.f_code
        if code.co_name == name and code.co_filename.replace(os.sep, "/").endswith(file):
            return True
    return False


def _library_callers(start: types.FrameType | None = None, depth: int = 5) -> str:
    """The innermost frames of the library on the stack, as ``file:function < ...`` (the file
    relative to the package), innermost first: where a hook was called from."""
    out: list[str] = []
    for f in _frames(start if start is not None else sys._getframe(1)):
        path = f.f_code.co_filename.replace(os.sep, "/")
        if "/durable_dispatch/" not in path or "/tests/" in path:
            continue
        out.append(f"{path.rsplit('/durable_dispatch/', 1)[1]}:{f.f_code.co_name}")
        if len(out) == depth:
            break
    return " < ".join(out) or "(no library frame)"


def _called_by_add_done_callback(start: types.FrameType | None = None) -> bool:
    """True when ``Future.add_done_callback`` itself runs the callback (the future was done when
    it was added: the standard library calls it at once, in the caller's thread; not a call of
    the library's)."""
    for f in _frames(start if start is not None else sys._getframe(1)):
        code = f.f_code
        if code.co_name == "add_done_callback" and "concurrent/futures" in code.co_filename:
            return True
    return False


class Calls:
    """The calls of each hook: (hook, inside ``deliver``, the library frames that called it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, str]] = []

    def hit(self, hook: str) -> None:
        """Record a call of ``hook`` (called by the hook itself)."""
        caller = sys._getframe(1)
        self.calls.append((hook, _inside_deliver(caller), _library_callers(caller)))

    def hook(self, name: str, then: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """A hook named ``name`` that records its calls, then returns ``then(*args)``."""

        def hook(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, _inside_deliver(), _library_callers()))
            return then(*args, **kwargs) if then is not None else None

        return hook

    def kinds(self) -> set[str]:
        return {h for h, _, _ in self.calls}


def assert_every_call_inside_deliver(
    calls: Iterable[tuple[str, bool, str]], expected: Iterable[str]
) -> None:
    """Each hook of ``expected`` was called, and every call of every hook ran with a frame of
    ``CampaignState.deliver`` on the stack; the failure names each hook that ran outside it,
    how often and where from."""
    calls = list(calls)
    seen = {h for h, _, _ in calls}
    missing = sorted(set(expected) - seen)
    assert not missing, f"hooks never called by this campaign (the test is wrong): {missing}"
    outside: dict[str, list[str]] = defaultdict(list)
    total: dict[str, int] = defaultdict(int)
    for hook, inside, where in calls:
        total[hook] += 1
        if not inside:
            outside[hook].append(where)
    if not outside:
        return
    has = hasattr(CampaignState, "deliver")
    lines = [
        "user code ran outside CampaignState.deliver() "
        + ("" if has else "(CampaignState has no deliver(): every call is outside) ")
        + "for these hooks:"
    ]
    for hook in sorted(outside):
        wheres = sorted(set(outside[hook]), key=outside[hook].index)
        lines.append(f"  {hook}: {len(outside[hook])} of {total[hook]} calls, called from")
        lines += [f"      {w}" for w in wheres[:4]]
    raise AssertionError("\n".join(lines))


def test_the_stack_check_finds_a_deliver_frame_and_only_that() -> None:
    """The check itself: a call made from a function ``deliver`` of a file ``campaign/state.py``
    is inside; from a ``deliver`` elsewhere, or from ``tick`` of that file, it is not."""
    calls = Calls()
    hook = calls.hook("probe")
    for name, file in (
        ("deliver", "/x/durable_dispatch/campaign/state.py"),
        ("deliver", "/x/durable_dispatch/campaign/delivery.py"),
        ("tick", "/x/durable_dispatch/campaign/state.py"),
    ):
        scope: dict[str, Any] = {}
        exec(compile(f"def {name}(hook):\n    return hook()\n", file, "exec"), scope)
        scope[name](hook)
    assert [inside for _, inside, _ in calls.calls] == [True, False, False]
    assert calls.calls[0][2] == "campaign/state.py:deliver"


# ----------------------------------------------------------------- a campaign, in-process
def _work(payload: Any) -> Any:
    if isinstance(payload, dict) and payload.get("raise"):
        raise ValueError(f"always fails: {payload}")
    return payload


class _HookedFeed(Feed):
    """A user's feed: submits the work in turns, sets the state's hooks, and has an operator
    cancel an item that waits (for an item this feed submits only once the cancel is in)."""

    def __init__(self, calls: Calls, state_dir: Path) -> None:
        self.calls, self.dir = calls, str(state_dir)
        self.exhausted = False
        self.turn = 0

    def attach(self, state: CampaignState) -> None:
        super().attach(state)
        state.on_defer = self.calls.hook("on_defer")
        state.on_cancel = self.calls.hook("on_cancel")
        state.on_dispatch = self.calls.hook("on_dispatch")

    def refill(self) -> None:
        self.calls.hit("Feed.refill")
        state, self.turn = self.state, self.turn + 1
        if self.turn == 1:
            state.submit([WorkItem(f"ok{i}", {"i": i}) for i in range(4)])
            state.submit([WorkItem("bad", {"raise": True})])  # retried, then deferred
            # "held" waits for "gate" (not submitted yet); "dep" waits for "held"
            state.submit([WorkItem("held", {"h": 1}, after=("gate",))])
            state.submit([WorkItem("dep", {"d": 1}, after=("held",))])
            write_command(self.dir, "cancel", {"work_ids": ["held"]})  # (as the CLI writes it)
        elif "held" in state.core.ledger.cancelled and not self.exhausted:
            state.submit([WorkItem("gate", {"g": 1}), WorkItem("late", {"l": 1})])
            self.exhausted = True


@pytest.fixture
def quick_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The master looks at ``control/`` every turn (not every half second)."""
    monkeypatch.setattr(control, "POLL_SECONDS", 0.0)


def test_every_hook_of_an_in_process_campaign_runs_inside_deliver(
    tmp_path: Path, quick_commands: None
) -> None:
    calls = Calls()
    d = tmp_path / "state"
    feed = _HookedFeed(calls, d)
    report = run_master(
        feed,
        d,
        on_commit=calls.hook("on_commit"),
        comm=LocalWorkers(_work, workers=2),
        progress=calls.hook("progress"),
        progress_interval=0.0,
        retry=RetryPolicy(retries=1),
        linger=0,
        max_seconds=60,
    )
    # what the campaign did (so that each hook had its reason to run)
    assert report.finished, report.reason
    led = feed.state.core.ledger
    assert set(led.committed) == {"ok0", "ok1", "ok2", "ok3", "gate", "late"}
    assert set(led.deferred) == {"bad", "dep"} and set(led.cancelled) == {"held"}
    assert_every_call_inside_deliver(
        calls.calls,
        ["on_commit", "on_defer", "on_cancel", "on_dispatch", "progress", "Feed.refill"],
    )


def _undelivered(d: Path, calls: Calls) -> None:
    """A state directory with commits whose callback raised (not delivered: the next open
    delivers them again)."""
    hook = calls.hook("on_commit", _FailsOnce())
    st = CampaignState.open(d, ranks=(1,), sync="always", on_commit=hook)
    try:
        st.submit([WorkItem("u0", 0)])
        s = st.next_send(0.0)
        assert s is not None
        st.sent(s.token, 0.0)
        st.on_results(s.rank, str(s.token), [0], 0.0)
        st.on_ready(s.rank, str(s.token), 0.0)
        with pytest.raises(RuntimeError, match="fails once"):
            _deliver(st)
    finally:
        st.close()


def _deliver(st: CampaignState) -> None:
    """The delivery point: ``deliver()`` where it exists, else the end of a turn (``tick``)."""
    deliver = getattr(st, "deliver", None)
    if deliver is not None:
        deliver()
    else:
        st.tick(0.0)


def test_a_redelivery_at_a_reopen_and_the_close_run_inside_deliver(tmp_path: Path) -> None:
    """A callback that raised: the next open hands its commit (and every later one) to the
    callback again, in ``run_master``, in ``CampaignState.open`` and in ``redeliver``; a state
    closed with a commit not yet delivered delivers it as it closes."""
    calls = Calls()
    items = [WorkItem(f"w{i}", i) for i in range(4)]
    # run_master: the callback raises on the first commit; the next run delivers it again
    d = tmp_path / "master"
    with pytest.raises(RuntimeError, match="fails once"):
        run_master(
            items, d, calls.hook("on_commit", _FailsOnce()), comm=LocalWorkers(_work, 1), linger=0
        )
    got: dict[str, Any] = {}
    again = calls.hook("on_commit (run_master after a failed callback)", got.__setitem__)
    report = run_master(items, d, again, comm=LocalWorkers(_work, 1), linger=0)
    assert report.finished and got == {f"w{i}": i for i in range(4)}
    # CampaignState.open(on_commit=) delivers them again as it opens
    _undelivered(tmp_path / "open", calls)
    st = CampaignState.open(tmp_path / "open", ranks=(1,), on_commit=calls.hook("open(on_commit)"))
    try:
        _deliver(st)  # (in case the open only queued them)
    finally:
        st.close()
    # and redeliver() does, on a state opened without a callback
    _undelivered(tmp_path / "redeliver", calls)
    st = CampaignState.open(tmp_path / "redeliver", ranks=(1,))
    try:
        st.redeliver(calls.hook("redeliver(on_commit)"))
        _deliver(st)  # (in case redeliver only queued them)
    finally:
        st.close()
    # the close: a commit journaled, not delivered when the state closes
    st = CampaignState.open(tmp_path / "close", ranks=(1,), on_commit=calls.hook("close"))
    try:
        st.submit([WorkItem("c0", 0)])
        s = st.next_send(0.0)
        assert s is not None
        st.sent(s.token, 0.0)
        st.on_results(s.rank, str(s.token), [0], 0.0)
    finally:
        st.close()
    assert_every_call_inside_deliver(
        calls.calls,
        [
            "on_commit",
            "on_commit (run_master after a failed callback)",
            "open(on_commit)",
            "redeliver(on_commit)",
            "close",
        ],
    )


class _FailsOnce:
    """A commit callback that raises on its first call only."""

    def __init__(self) -> None:
        self.raised = False

    def __call__(self, wid: str, result: Any) -> None:
        if not self.raised:
            self.raised = True
            raise RuntimeError("the user's callback fails once")


# ----------------------------------------------------------------------- the futures face
def test_the_done_callbacks_of_the_futures_executor_run_inside_deliver(tmp_path: Path) -> None:
    """An executor on ``MPI.COMM_SELF`` (its calls run in its manager thread, as mpi4py's):
    futures that resolve with a value, with the call's own exception, with an operator's
    cancel (``TaskFailed``) and with the cancelled call's dependent (``DependencyFailed``);
    every done-callback added with ``Future.add_done_callback`` before the future was done."""
    out = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    body = json.loads(out.stdout.splitlines()[-1])
    assert body["outcomes"] == {
        "first": "value 0",
        "slow": "value 1",
        "square": "value 9",
        "boom": "KeyError",
        "cancelled": "TaskFailed",
        "dependent": "DependencyFailed",
    }, body
    calls = [(c["hook"], c["inside"], c["where"]) for c in body["calls"]]
    assert_every_call_inside_deliver(
        calls,
        [
            f"done-callback ({k})"
            for k in ("first", "slow", "square", "boom", "cancelled", "dependent")
        ],
    )
