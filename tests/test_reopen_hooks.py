"""Hooks that act on the campaign do not break a reopen (issue 67): every hook submits work,
and writes an operator's cancel or retry, while a random campaign runs; after each step the
state a reopen rebuilds still equals the state in memory.

Hooks only enter their actions as input for a later step: they call ``state.submit`` (or
``submit`` on the executor), and write a command file (``control.write_command``, as
``durable-dispatch cancel`` and ``retry`` do), which the next step applies.

Three campaigns:

* the reopen machine of ``tests/test_reopen_machine.py``, with rules that plan an action for
  the next call of ``on_commit``, ``on_defer``, ``on_cancel`` or ``on_dispatch``, and a rule
  that applies the commands the hooks wrote (as the master's loop does); its invariants compare
  the reopened state with the state in memory after every step;
* ``run_master`` with in-process workers (``LocalWorkers``), a ``Feed`` and a ``progress``
  callback, where those two act too; at the end the state in memory is compared with the
  replay of the directory and with a reopen;
* the futures executor (on ``MPI.COMM_SELF``, in a process of its own), whose done-callbacks
  submit calls and write cancels and retries.

Where ``CampaignState.deliver()`` exists, the steps call it to run the hooks; else the end of a
turn (``tick``), which runs them today.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import initialize, precondition, rule

from durable_dispatch import CampaignState, RetryPolicy, WorkItem
from durable_dispatch.campaign import control
from durable_dispatch.campaign.admin import view_state
from durable_dispatch.campaign.control import apply_waiting, pending_commands, write_command
from durable_dispatch.core.ledger import Ledger
from durable_dispatch.mpi import Feed, run_master
from durable_dispatch.testing import LocalWorkers
from tests.test_reopen_machine import IDS, Reopen, _relations, run_checked

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).resolve().parent / "children" / "hooks_futures_reopen.py"

KINDS = ("on_commit", "on_defer", "on_cancel", "on_dispatch")
ACTIONS = ("submit", "cancel", "retry")


def deliver(state: CampaignState) -> None:
    """Run what waits for the delivery point: ``deliver()`` where it exists, else ``tick``."""
    step = getattr(state, "deliver", None)
    if step is not None:
        step()
    else:
        state.tick(0.0)


def act(
    state: CampaignState,
    directory: str,
    action: str,
    target: str,
    after: tuple[str, ...],
    new_id: Callable[[], str],
) -> str | None:
    """What a hook does: submit a new item (waiting for ``after``), or write an operator's
    cancel or retry of ``target``. Returns the new item's work ID, if any."""
    if action == "submit":
        wid = new_id()
        state.submit([WorkItem(wid, {"hook": wid}, after=after)])
        return wid
    write_command(directory, action, {"work_ids": [target]})
    return None


#: an action of a hook: (what, the work ID it names, the ``after`` of the item it submits)
ACTION = st.tuples(
    st.sampled_from(ACTIONS),
    st.sampled_from(IDS),
    st.lists(st.sampled_from([*IDS, "never"]), max_size=2, unique=True).map(tuple),
)


def plans(kinds: tuple[str, ...]) -> st.SearchStrategy[dict[str, list[Any]]]:
    """For each hook of ``kinds``, the actions of its next calls (one each, in order)."""
    return st.fixed_dictionaries({k: st.lists(ACTION, max_size=3) for k in kinds})


# ------------------------------------------------------------------ the reopen machine
class HookedReopen(Reopen):
    """The reopen machine, with hooks that act (see the module docs). A hook acts once per
    planned action (a redelivery after a crash runs it again, with nothing left to do), and
    not while the state opens (a reopen must rebuild what was, before anything new comes)."""

    def __init__(self) -> None:
        self.plans: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {k: [] for k in KINDS}
        self.opening = False
        self.hooked = 0
        self.acted: list[str] = []  # "<hook> <action>", in order
        self.commands_at_crash = False
        self.crashed = False  # the crashed master's copy is closing: it runs no hook
        super().__init__()

    def _open(self) -> CampaignState:
        self.opening = True
        try:
            state = super()._open()
        finally:
            self.opening = False
        state.on_defer = lambda d: self._hook("on_defer")
        state.on_cancel = lambda wid: self._hook("on_cancel")
        state.on_dispatch = lambda s: self._hook("on_dispatch")
        return state

    def _on_commit(self, wid: str, result: Any) -> Any:
        children = super()._on_commit(wid, result)
        self._hook("on_commit")
        return children

    def _new_id(self) -> str:
        self.hooked += 1
        return f"h{self.hooked}"

    def _hook(self, kind: str) -> None:
        if self.opening or self.crashed or not self.plans[kind]:
            return
        action, target, after = self.plans[kind].pop(0)
        self.acted.append(f"{kind} {action}")
        if currently_in_test_context():  # (shown by --hypothesis-show-statistics)
            event(f"{kind} {action}")
        act(self.st, str(self.d), action, target, after, self._new_id)

    def _answer(self, s: Any, *, fail: bool) -> None:
        super()._answer(s, fail=fail)
        deliver(self.st)

    def _command(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        out = super()._command(op, args)
        deliver(self.st)
        return out

    # ------------------------------------------------------------------ rules
    @initialize(first=plans(KINDS))
    def plan_hooks(self, first: dict[str, list[Any]]) -> None:
        """What the hooks do first."""
        for k, todo in first.items():
            self.plans[k] += todo

    @rule(kind=st.sampled_from(KINDS), action=ACTION)
    def plan_hook(self, kind: str, action: tuple[str, str, tuple[str, ...]]) -> None:
        """The next call of hook ``kind`` without an action planned does ``action``."""
        self.plans[kind].append(action)

    @precondition(lambda self: not self.refusing)
    @rule()
    def steer(self) -> None:
        """Run the hooks that wait for the delivery point and apply the commands the hooks
        wrote, as the master's loop does, until nothing waits (a hook told of a command's
        outcome may write another; an item a hook submits may be deferred at once, which calls
        ``on_defer`` again).

        The delivery comes first: a step that does not deliver (the ``submit`` of an item
        deferred at once for a deferred dependency queues ``on_defer``) leaves a hook waiting,
        which ``close`` would run after a reopen had taken the state in memory to compare."""
        for _ in range(100):
            deliver(self.st)
            if not apply_waiting(self.st, running=True) and not self.st.queued:
                return
        raise AssertionError("the hooks kept acting")

    @rule(compact=st.booleans())
    def reopen(self, compact: bool) -> None:
        if self.refusing:
            self.heal()
        self.steer()  # (a command still waiting would be applied by the open)
        super().reopen(compact)

    @rule()
    def crash(self) -> None:
        if not self.refusing:
            self.steer()
        # else commands may still wait: the open of the crashed copy applies them, so it
        # need not equal what was in memory (the comparison is left out, as while the disk
        # refuses)
        self.commands_at_crash = bool(pending_commands(str(self.d)))
        # a crashed master runs no more hooks: the close of its copy must not (a hook it ran
        # would write its command into the crashed directory, which the open then applies)
        self.crashed = True
        try:
            super().crash()
        finally:
            self.commands_at_crash = False
            self.crashed = False

    def _durable_now(self) -> bool:
        return not self.commands_at_crash and super()._durable_now()


HookedReopen.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class TestHookedReopen(HookedReopen.TestCase):  # type: ignore[misc,valid-type]
    pass


class LongHookedReopen(HookedReopen):
    """The same machine, run longer (the slow tier)."""


LongHookedReopen.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=35,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.slow
class TestLongHookedReopen(LongHookedReopen.TestCase):  # type: ignore[misc,valid-type]
    pass


#: Each hook does each action once, in one campaign: the rules in order, every invariant after
#: each (as the machine runs them). Items i0 to i4, i5 waiting for i4; what each hook does:
EACH: list[tuple[str, dict[str, Any]]] = [
    *[("submit", {"wid": f"i{k}", "after": [], "priority": 0}) for k in range(5)],
    ("submit", {"wid": "i5", "after": ["i4"], "priority": 0}),
    (
        "plan_hooks",
        {
            "first": {
                "on_dispatch": [("submit", "i0", ()), ("cancel", "i3", ()), ("retry", "i3", ())],
                "on_commit": [
                    ("submit", "i0", ("never",)),
                    ("cancel", "i4", ()),
                    ("retry", "i4", ()),
                ],
                "on_cancel": [("submit", "i0", ("i1",)), ("cancel", "i2", ()), ("retry", "i2", ())],
                "on_defer": [("submit", "i0", ("i5",)), ("cancel", "i1", ()), ("retry", "i5", ())],
            }
        },
    ),
    *[(r, {}) for r in ("commit", "steer", "fail", "fail", "steer", "commit", "steer")],
    ("reopen", {"compact": False}),
    *[(r, {}) for r in ("commit", "fail", "fail", "steer", "crash", "commit", "steer")],
    ("reopen", {"compact": True}),
]


def test_each_hook_does_each_action_and_a_reopen_rebuilds_every_step() -> None:
    machine = HookedReopen()
    try:
        run_checked(machine, EACH)
        assert set(machine.acted) == {f"{k} {a}" for k in KINDS for a in ACTIONS}, machine.acted
    finally:
        machine.teardown()


SUBMIT = ("submit", "i0", ())


def _deferred_at_once(then: tuple[str, str, tuple[str, ...]]) -> list[tuple[str, dict[str, Any]]]:
    """i0 deferred (its second failure; ``on_defer`` submits h1), then i4 submitted after it
    and deferred at once, which queues ``on_defer`` (to do ``then``) for the delivery point;
    no step delivers after it."""
    plan = {"on_commit": [], "on_cancel": [], "on_dispatch": [], "on_defer": [SUBMIT, then]}
    return [
        ("plan_hooks", {"first": plan}),
        ("submit", {"wid": "i0", "after": [], "priority": 0}),
        ("submit", {"wid": "i1", "after": [], "priority": 0}),
        ("fail", {}),
        ("fail", {}),
        ("submit", {"wid": "i4", "after": ["i0", "i1"], "priority": 0}),
    ]


#: A case the machine found (the reopen), and the same at a crash, replayed as written: every
#: invariant after each step (each failed before the machine's fix). The machine was wrong, not
#: the library: the close ran the hook that waited (a submit of h2 after i0, deferred at once as
#: i4 was; or a cancel) after the reopen had taken the state in memory to compare; and the close
#: of a crashed master's copy ran it, which a crashed master never does, writing its command
#: into the crashed directory, which the open then applied.
FOUND: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "reopen": [*_deferred_at_once(("submit", "i0", ("i0",))), ("reopen", {"compact": False})],
    "reopen, compacted": [
        *_deferred_at_once(("submit", "i0", ("i0",))),
        ("reopen", {"compact": True}),
    ],
    "crash": [*_deferred_at_once(("cancel", "i1", ())), ("crash", {})],
    "crash, the disk refusing": [
        *_deferred_at_once(("cancel", "i1", ())),
        ("refuse", {}),
        ("crash", {}),
    ],
}


@pytest.mark.parametrize("name", list(FOUND))
def test_a_hook_waiting_for_the_delivery_point_at_a_reopen_or_a_crash(name: str) -> None:
    machine = HookedReopen()
    try:
        run_checked(machine, FOUND[name])
        led = machine.led
        if name.startswith("reopen"):
            # h2 is deferred for i0 as i4 is, each registered under what it misses, in memory
            # and reopened alike
            assert list(led.deferred) == ["i0", "i4", "h2"]
            assert led.kinds["h2"] == led.kinds["i4"] == ["dependency"]
            assert led.missing == {"i4": 2, "h2": 1}
            assert list(led.dependents_of("i0")) == ["i4", "h2"]
        elif name == "crash":
            assert "i1" in led.cancelled  # the cancel ran before the crash
        else:
            assert "i1" in led.frontier  # the crash lost the hook that waited
    finally:
        machine.teardown()


# ------------------------------------------------------- run_master, in-process workers
def _work(payload: Any) -> Any:
    if isinstance(payload, dict) and payload.get("fail"):
        raise ValueError("this item always fails")
    return payload


ITEMS = st.lists(
    st.tuples(
        st.booleans(),  # fails always (deferred once its retries are spent)
        st.lists(st.sampled_from([*IDS, "never"]), max_size=2, unique=True).map(tuple),
    ),
    min_size=len(IDS),
    max_size=len(IDS),
)


class _ActingFeed(Feed):
    """Submits the items over the first turns (a few a turn), then acts as its plan says; ends
    once every item is in, no command waits and two turns passed with nothing new from a hook
    (what a hook does in a turn's last step is seen by the next turn)."""

    def __init__(self, directory: str, items: list[WorkItem], plans: dict[str, list[Any]]):
        self.dir, self.items, self.plans = directory, list(items), plans
        self.hooked = 0
        self.quiet = 0
        self.done = False
        self.acted: list[str] = []

    @property
    def exhausted(self) -> bool:  # type: ignore[override]
        return self.done

    def attach(self, state: CampaignState) -> None:
        super().attach(state)
        state.on_defer = lambda d: self.hook("on_defer")
        state.on_cancel = lambda wid: self.hook("on_cancel")
        state.on_dispatch = lambda s: self.hook("on_dispatch")

    def _new_id(self) -> str:
        self.hooked += 1
        return f"h{self.hooked}"

    def hook(self, kind: str) -> None:
        if self.done or not self.plans[kind]:
            return
        action, target, after = self.plans[kind].pop(0)
        self.acted.append(f"{kind} {action}")
        self.quiet = 0
        act(self.state, self.dir, action, target, after, self._new_id)

    def refill(self) -> None:
        if self.items:
            self.state.submit(self.items[:3])
            del self.items[:3]
        self.hook("refill")
        if self.items or pending_commands(self.dir):
            self.quiet = 0
        else:
            self.quiet += 1
        self.done = self.quiet >= 2


def _check_reopen(d: Path, led: Ledger) -> str:
    """Compare ``led`` (the campaign's state in memory, closed) with the replay of ``d`` and
    with a reopen of ``d``; returns what the reopen met (commands still waiting or not)."""
    assert _relations(view_state(d).projection) == _relations(led)
    if pending_commands(str(d)):
        # a hook of the last step wrote a command no later step read: the open applies it;
        # its state must still be the replay's
        with CampaignState.open(d, ranks=(1,)) as again:
            opened = _relations(again.core.ledger)
        assert _relations(view_state(d).projection) == opened
        return "commands left for the open"
    with CampaignState.open(d, ranks=(1,)) as again:
        assert _relations(again.core.ledger) == _relations(led)
    return "nothing left"


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    items=ITEMS,
    plans=plans((*KINDS, "progress", "refill")),
    retries=st.integers(0, 1),
    workers=st.integers(1, 3),
)
def test_hooks_that_submit_cancel_and_retry_during_a_campaign_keep_a_reopen_equal(
    items: list[tuple[bool, tuple[str, ...]]],
    plans: dict[str, list[Any]],
    retries: int,
    workers: int,
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hooks-"))
    d = tmp / "state"
    work = [
        WorkItem(wid, {"fail": fail, "w": wid}, after=tuple(a for a in after if a != wid))
        for wid, (fail, after) in zip(IDS, items, strict=True)
    ]
    feed = _ActingFeed(str(d), work, {k: list(v) for k, v in plans.items()})

    def on_commit(wid: str, result: Any) -> None:
        feed.hook("on_commit")

    def progress(stats: dict[str, Any]) -> None:
        feed.hook("progress")

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(control, "POLL_SECONDS", 0.0)  # the loop reads control/ every turn
            report = run_master(
                feed,
                d,
                on_commit,
                comm=LocalWorkers(_work, workers),
                progress=progress,
                progress_interval=0.0,
                retry=RetryPolicy(retries=retries),
                sync="always",
                linger=0,
                max_seconds=30,
            )
        assert report.finished, report.reason
        for what in feed.acted:
            event(what)
        event(_check_reopen(d, feed.state.core.ledger))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------ the futures face
def test_done_callbacks_that_submit_cancel_and_retry_keep_a_reopen_equal(tmp_path: Path) -> None:
    """Executors on ``MPI.COMM_SELF``, one per seed, whose done-callbacks submit calls and
    write cancels and retries (in a process of its own: MPI is not started in the test
    process); each state in memory equals its replay and its reopen."""
    seeds = ["1", "2", "3", "4", "5", "6"]
    out = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), *seeds],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["seed"] for r in runs] == seeds, out.stdout + out.stderr[-3000:]
    for r in runs:
        assert r["finished"] and r["replay_is_memory"] and r["reopen_is_memory"], r
    acted = {a for r in runs for a in r["acted"]}
    assert {"submit", "cancel", "retry"} <= acted, acted
    said = {o for r in runs for o in r["outcomes"]}  # (what the commands did, by their acks)
    assert "cancel: cancelled" in said and "retry: requeued" in said, said
