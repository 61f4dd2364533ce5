"""A reopen changes nothing (issue 58): a hypothesis state machine over the ledger and the
campaign state, every operation a rule, checking after each step that the state a reopen
rebuilds from the snapshot and the journal equals the state in memory, every relation included
(the waiting links of cancelled and deferred items, released dependents), and that ``stats``,
``deferred list`` and the joblog agree with it.

The rules: submit with ``after`` (on earlier items, on children, on IDs never submitted, on
cancelled and deferred items), a commit whose callback returns children, a failure (a retry,
then a deferral), an operator's cancel, retry and drain, a snapshot, an offline compaction, a
disk that refuses the state journal and heals, a master crash (the directory as a crash leaves
it: every acknowledged record is fsynced, ``sync="always"``) and a reopen. While the disk
refuses, the durable record is honestly behind (memory-only commits): the comparison waits for
the heal, and a crash meanwhile loses exactly what was memory-only. Each dispatched item's
``ctx.dependencies`` is checked against the results its dependencies committed (a memory-only
commit's result included).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from durable_dispatch import CampaignState, RetryPolicy, WorkItem
from durable_dispatch.campaign.admin import compact_state, view_state
from durable_dispatch.campaign.control import apply_command, write_command
from durable_dispatch.campaign.results import read_results
from durable_dispatch.cli import main as cli_main
from durable_dispatch.core.ledger import Ledger
from durable_dispatch.testing import FaultInjector
from durable_dispatch.views.joblog import read_joblog

IDS = [f"i{k}" for k in range(8)]


def _relations(led: Ledger, committing: Any = ()) -> dict[str, Any]:
    """What a reopen must rebuild: the durable facts and the derived waiting relations."""
    snap = led.to_snapshot(committing)
    snap.pop("counter", None)  # (an epoch's dispatch counter: a reopen starts a new epoch)
    snap.pop("epoch", None)
    snap.pop("in_flight", None)  # (a reopen rolls back what was in flight: compared apart)
    return {
        "state": snap,
        "in_flight": sorted(led.in_flight),
        "missing": dict(sorted(led.missing.items())),
        "dependents": {k: sorted(led.dependents_of(k)) for k in sorted(led.dependents)},
    }


class Reopen(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="reopen-"))
        self.d = self.tmp / "s0"
        self.gen = 0
        self.faults = FaultInjector()
        self.faults.install()
        self.refusing = False
        self.children: dict[str, list[WorkItem]] = {}
        self.results: dict[str, Any] = {}  # what each commit's callback was given
        self.n = 0
        self.st = self._open()

    # ---------------------------------------------------------------- helpers
    def _open(self) -> CampaignState:
        st = CampaignState.open(
            self.d,
            sync="always",
            ranks=(1,),
            retry=RetryPolicy(retries=1),
            on_commit=self._on_commit,
        )
        st.deliver()  # the open's redelivery, at once (the open queues it for this point)
        return st

    def _on_commit(self, wid: str, result: Any) -> Any:
        self.results[wid] = result
        return self.children.get(wid)

    @property
    def led(self) -> Ledger:
        return self.st.core.ledger

    def _durable_now(self) -> bool:
        s = self.st.statistics()
        return (
            self.st.journal.healthy
            and self.st.submissions.healthy
            and not s.commits_in_memory
            and not self.refusing
        )

    def _send(self) -> Any:
        s = self.st.next_send(0.0)
        if s is None:
            return None
        self.st.sent(s.token, 0.0)
        w = s.items[0]
        if w.after:  # each dependency's committed result, memory-only ones included
            deps = (self.st.dependencies_of(s) or {}).get(w.work_id, {})
            want = {d: self.results[d] for d in dict.fromkeys(w.after)}
            assert deps == want, (w.work_id, deps, want)
        return s

    def _answer(self, s: Any, *, fail: bool) -> None:
        if fail:
            self.st.on_results(s.rank, str(s.token), None, 0.0, failure="boom")
        else:
            self.n += 1
            self.st.on_results(s.rank, str(s.token), [{"n": self.n}], 0.0)
        self.st.on_ready(s.rank, str(s.token), 0.0)
        self.st.deliver(wait=True)
        self.st.tick(0.0)

    def _command(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        cmd = write_command(str(self.d), op, args)
        return apply_command(self.st, cmd, running=True).outcome

    def _cli(self, *args: str) -> Any:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli_main([*args, "--json"]) == 0
        return json.loads(out.getvalue())

    # ------------------------------------------------------------------ rules
    @rule(
        wid=st.sampled_from(IDS),
        after=st.lists(st.sampled_from([*IDS, "never"]), max_size=2, unique=True),
        priority=st.integers(0, 2),
    )
    def submit(self, wid: str, after: list[str], priority: int) -> None:
        if self.led.known(wid):
            return
        self.st.submit([WorkItem(wid, {"w": wid}, priority=priority, after=tuple(after))])

    @rule(
        parent=st.sampled_from(IDS),
        k=st.integers(0, 3),
        after=st.sampled_from(["parent", "none", "other"]),
    )
    def plan_child(self, parent: str, k: int, after: str) -> None:
        if parent in self.led.committed:
            return  # its callback ran: a redelivery after a crash must return the same children
        cid = f"{parent}.c{k}"
        dep = {"parent": (parent,), "none": (), "other": (IDS[(k + 1) % len(IDS)],)}[after]
        self.children.setdefault(parent, [])
        if all(c.work_id != cid for c in self.children[parent]):
            self.children[parent].append(WorkItem(cid, {"c": cid}, after=dep))

    @rule()
    def commit(self) -> None:
        s = self._send()
        if s is not None:
            self._answer(s, fail=False)

    @rule()
    def fail(self) -> None:
        s = self._send()
        if s is not None:
            self._answer(s, fail=True)

    @rule(wid=st.sampled_from(IDS))
    def cancel(self, wid: str) -> None:
        if self.refusing:
            return  # (a command whose record the disk refuses is applied again: not this test)
        self._command("cancel", {"work_ids": [wid]})
        self.st.tick(0.0)

    @rule(wid=st.sampled_from(IDS))
    def retry(self, wid: str) -> None:
        if self.refusing:
            return
        self._command("retry", {"work_ids": [wid]})
        self.st.tick(0.0)

    @rule()
    def drain(self) -> None:
        if self.refusing:
            return
        self._command("drain", {})

    @rule()
    def snapshot(self) -> None:
        self.st.save_snapshot("test")

    @precondition(lambda self: not self.refusing)
    @rule()
    def refuse(self) -> None:
        self.faults.fail("write", errno.EIO, path=f"{self.d}/events.jsonl*")
        self.faults.fail("fsync", errno.EIO, path=f"{self.d}/events.jsonl*")
        self.refusing = True

    @precondition(lambda self: self.refusing)
    @rule()
    def heal(self) -> None:
        self.faults.heal()
        self.refusing = False
        self.st.try_restore()

    @rule(compact=st.booleans())
    def reopen(self, compact: bool) -> None:
        if self.refusing:
            self.heal()
        before = _relations(self.led)
        self.st.close()
        if compact:
            compact_state(self.d)
        self.st = self._open()
        assert _relations(self.led) == before

    @rule()
    def crash(self) -> None:
        """The directory as a crash leaves it: a copy now (every acknowledged record is on
        disk; what the refusing disk held in memory is not), then the copy is opened."""
        self.gen += 1
        crashed = self.tmp / f"s{self.gen}"
        # (not the live statistics: their thread replaces them while the copy is made)
        shutil.copytree(
            self.d, crashed, ignore=shutil.ignore_patterns("master-stats.*", ".master-stats.*")
        )
        old, self.d = self.st, crashed
        if self.refusing:
            self.faults.heal()
            self.refusing = False
        before = _relations(old.core.ledger) if self._durable_now() else None
        with contextlib.suppress(Exception):
            old.close()
        self.st = self._open()
        if before is not None:
            assert _relations(self.led) == before
        # what the crash lost is not committed any more: its result runs again
        self.results = {w: r for w, r in self.results.items() if w in self.led.committed}

    # ------------------------------------------------------------- invariants
    @invariant()
    def a_snapshot_rebuilds_what_is_in_memory(self) -> None:
        """The ledger loaded from its own snapshot (either form) has every relation."""
        pending = self.st.committing()
        live = _relations(self.led, pending)
        assert _relations(Ledger.from_snapshot(self.led.to_snapshot(pending))) == live
        by_index = {
            i: WorkItem.from_json(self.led.items[w].to_json())
            for i, w in enumerate(self.led.ids.ids)
            if w is not None and w in self.led.items
        }
        stored = [
            (i, [by_index[i].to_json() if i in by_index else None if w is None else [w, None]])
            for i, w in enumerate(self.led.ids.ids)
        ]
        compact, _ = Ledger.from_compact(self.led.to_compact(pending), stored)
        assert _relations(compact) == live

    @invariant()
    def a_reopen_rebuilds_what_is_in_memory(self) -> None:
        if not self._durable_now():
            return
        disk = view_state(self.d).projection
        pending = self.st.committing()
        assert _relations(disk) == _relations(self.led, pending)

    @invariant()
    def stats_deferred_list_and_joblog_agree(self) -> None:
        if not self._durable_now():
            return
        led = self.led
        listed = {r["work_id"] for r in self._cli("deferred", "list", str(self.d))}
        stats = self._cli("stats", str(self.d))
        rows = {r.work_id: r.status for r in read_joblog(self.d)}
        assert listed == set(led.deferred) == {w for w, s in rows.items() if s == "deferred"}
        assert stats["deferred"] == len(led.deferred)
        assert stats["cancelled"] == len(led.cancelled) == list(rows.values()).count("cancelled")
        assert stats["waiting"] == len(led.waiting) == list(rows.values()).count("waiting")
        assert stats["committed"] == len(led.committed) == list(rows.values()).count("committed")

    @invariant()
    def every_committed_result_is_the_one_delivered(self) -> None:
        if not self._durable_now():
            return
        got = {r.work_id: r.result for r in read_results(self.d)}
        assert {w: got.get(w) for w in self.results} == self.results

    def teardown(self) -> None:
        try:
            self.faults.heal()
            with contextlib.suppress(Exception):
                self.st.close()
        finally:
            self.faults.uninstall()
            shutil.rmtree(self.tmp, ignore_errors=True)


Reopen.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.slow
class TestReopen(Reopen.TestCase):  # type: ignore[misc,valid-type]
    pass


#: Cases the machine found (each failed on the code before its fix), replayed as written: the
#: rules in order, every invariant after each, as the machine runs them.
FOUND: dict[str, list[tuple[str, dict[str, Any]]]] = {
    # A snapshot taken while the disk refused the journal claimed records held in memory;
    # after a crash the next master wrote its own records under their numbers (its epoch
    # among them), and a replay from that snapshot passed over them: "e2-1 is not of the
    # current epoch 1".
    "a snapshot never claims the journal's memory-only records": [
        ("submit", {"wid": "i0", "after": [], "priority": 0}),
        ("refuse", {}),
        ("fail", {}),
        ("crash", {}),
        ("commit", {}),
    ],
    # An operator's retry put a dependent back to wait for a cancelled dependency; the next
    # open deferred it again (its repair), memory kept it waiting.
    "a retried dependent of a cancelled item is deferred again at once": [
        ("submit", {"wid": "i0", "after": [], "priority": 0}),
        ("submit", {"wid": "i1", "after": [], "priority": 0}),
        ("submit", {"wid": "i3", "after": ["i0", "i1"], "priority": 0}),
        ("cancel", {"wid": "i1"}),
        ("retry", {"wid": "i3"}),
        ("crash", {}),
        ("retry", {"wid": "i3"}),
        ("reopen", {"compact": False}),
    ],
}


def run_checked(machine: Reopen, steps: list[tuple[str, dict[str, Any]]]) -> None:
    """Run ``steps`` (a rule's name and its arguments) on ``machine``, each followed by every
    invariant of the machine, as hypothesis runs them."""
    checks = [
        machine.a_snapshot_rebuilds_what_is_in_memory,
        machine.a_reopen_rebuilds_what_is_in_memory,
        machine.stats_deferred_list_and_joblog_agree,
        machine.every_committed_result_is_the_one_delivered,
    ]
    for rule_name, args in steps:
        getattr(machine, rule_name)(**args)
        for check in checks:
            check()


@pytest.mark.parametrize("steps", list(FOUND.values()), ids=list(FOUND))
def test_what_the_machine_found(steps: list[tuple[str, dict[str, Any]]]) -> None:
    machine = Reopen()
    try:
        run_checked(machine, steps)
    finally:
        machine.teardown()
