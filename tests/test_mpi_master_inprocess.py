"""run_master's loop in-process, driven by LocalWorkers (issue 21): the turn order (W3) has a fast
test, and a campaign can be tested without mpiexec. The same loop under a real mpiexec is in
test_mpi_master.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import CampaignState, WatchdogConfig, WorkItem
from durable_dispatch.campaign.admin import view_state
from durable_dispatch.mpi import Feed, run_master
from durable_dispatch.testing import LocalWorkers

STEPS = ("on_ready", "on_heartbeat", "next_send", "sent", "on_results", "tick")


def _logged(monkeypatch: pytest.MonkeyPatch, log: list[tuple[Any, ...]]) -> None:
    """Log each facade call the loop makes, in the transport's log, so one list shows the
    messages, the sends and the loop's steps in the order they happened."""
    for name in STEPS:
        real = getattr(CampaignState, name)

        def wrapped(self: Any, *a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            out = _real(self, *a, **kw)
            if _name != "next_send" or out is not None:
                log.append((_name,))
            return out

        monkeypatch.setattr(CampaignState, name, wrapped)


def _turns(log: list[tuple[Any, ...]]) -> list[list[str]]:
    turns, cur = [], []
    for entry in log:
        cur.append(entry[0])
        if entry[0] == "tick":
            turns.append(cur)
            cur = []
    return turns


def test_each_turn_takes_readies_then_dispatches_then_results_then_joins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W3: (1) every READY and HEARTBEAT of the drain, (2) dispatch, (3) every RESULT, (4, 5)
    join and sweep. A RESULT and its READY arrive in one drain (the worker sends them in that
    order): the READY is seen first but the rank is freed only by the RESULT after the
    dispatch step, so nothing is ever joined as a missing result, and the rank gets its next
    work in the next turn."""
    workers = LocalWorkers(lambda p: p * 2, workers=3)
    _logged(monkeypatch, workers.log)
    got: dict[str, int] = {}
    items = [WorkItem(f"w{i:02d}", i) for i in range(30)]
    report = run_master(items, tmp_path / "state", got.__setitem__, comm=workers, linger=0)
    assert report.finished and got == {f"w{i:02d}": 2 * i for i in range(30)}
    core = report.stats["core"]
    assert core["commits"] == 30 and core["invalid_result_rollbacks"] == 0
    assert workers.log[-1] == ("stop", [1, 2, 3])
    turns = _turns(workers.log)
    assert len(turns) >= 10
    for steps in turns:
        first = {s: steps.index(s) for s in reversed(steps)}
        last = {s: i for i, s in enumerate(steps)}
        if "on_ready" in steps and "send" in steps:
            assert last["on_ready"] < first["send"], steps  # 1 before 2
        if "send" in steps and "on_results" in steps:
            assert last["send"] < first["on_results"], steps  # 2 before 3
        if "receive" in steps:
            assert first["receive"] == 0, steps  # the drain opens the turn
        assert steps[-1] == "tick"
    # a rank freed by a RESULT is sent new work only in a later turn (never inside its own)
    for steps, nxt in zip(turns, turns[1:], strict=False):
        if "on_results" in steps:
            assert "send" not in steps[steps.index("on_results") :]
            assert "send" in nxt or "on_results" not in nxt


def _silent_once(silent: set[str]) -> Any:
    """A LocalWorkers ``answer`` hook: the first WORK carrying one of ``silent`` is never answered
    (a hung worker)."""

    def answer(rank: int, token: str, work_ids: list[str]) -> bool:
        hang = bool(silent.intersection(work_ids))
        silent.difference_update(work_ids)
        return not hang

    return answer


def test_a_hung_worker_is_parked_and_its_work_moves(tmp_path: Path) -> None:
    """A worker that never answers its first WORK: the watchdog moves the item to another rank
    and parks the silent one; every item commits once."""
    workers = LocalWorkers(lambda p: p, workers=2, answer=_silent_once({"w03"}))
    items = [WorkItem(f"w{i:02d}", i) for i in range(8)]
    report = run_master(
        items, tmp_path / "state", comm=workers, watchdog=WatchdogConfig(0.3), linger=0
    )
    assert report.finished
    assert report.stats["core"]["dispatch_watchdog_timeouts"] == 1
    assert report.stats["core"]["parked_ranks_now"] == 1
    view = view_state(tmp_path / "state")
    assert view.projection.committed == {i.work_id for i in items}
    assert view.projection.duplicate_commits == 0


def test_the_adaptive_watchdog_recovers_a_hang_long_before_its_cap(tmp_path: Path) -> None:
    # w30 comes after enough measured dispatches for the fitted deadline to hold
    workers = LocalWorkers(lambda p: p, workers=2, answer=_silent_once({"w30"}))
    items = [WorkItem(f"w{i:02d}", i) for i in range(40)]
    wd = WatchdogConfig(3600, quantile=0.9, min_samples=5, floor=0.2)
    report = run_master(
        items, tmp_path / "state", comm=workers, watchdog=wd, linger=0, max_seconds=120
    )
    assert report.finished, report.reason  # the fixed rule would have waited an hour
    core = report.stats["core"]
    assert core["dispatch_watchdog_timeouts"] == 1
    assert core["watchdog_seconds"] == 3600 and core["watchdog_deadline_now"] == 0.2
    assert view_state(tmp_path / "state").projection.kinds["w30"] == ["timeout"]


def test_a_function_that_raises_is_retried_then_deferred(tmp_path: Path) -> None:
    def fn(p: int) -> int:
        if p == 5:
            raise ValueError("five")
        return p

    from durable_dispatch import RetryPolicy

    workers = LocalWorkers(fn, workers=2)
    items = [WorkItem(f"w{i}", i) for i in range(8)]
    report = run_master(items, tmp_path / "state", comm=workers, retry=RetryPolicy(2), linger=0)
    assert report.finished
    view = view_state(tmp_path / "state")
    assert set(view.projection.deferred) == {"w5"}
    assert view.projection.kinds["w5"] == ["error"] * 3
    assert len(view.projection.committed) == 7


def test_bad_workers_argument_and_no_mpi_is_loaded(tmp_path: Path) -> None:
    from durable_dispatch.errors import UsageError

    with pytest.raises(UsageError):
        LocalWorkers(lambda p: p, workers=0)
    run_master([WorkItem("a", 1)], tmp_path / "s", comm=LocalWorkers(lambda p: p), linger=0)
    assert "mpi4py.MPI" not in sys.modules or sys.modules["mpi4py.MPI"].Is_initialized() is False


PROGRESS_CAMPAIGN = """
import sys, time
from durable_dispatch import WorkItem
from durable_dispatch.mpi import run_master
from durable_dispatch.testing import LocalWorkers

def work(p):
    time.sleep(0.01)
    return p

items = [WorkItem(f"w{i}", i) for i in range(40)]
r = run_master(items, sys.argv[1], comm=LocalWorkers(work, 2), progress=True,
               progress_interval=0.05, linger=0)
sys.stderr.write("AFTER\\n")
print("REPORT", r.finished)
"""


def test_progress_true_draws_on_a_terminal_and_ends_its_line(tmp_path: Path) -> None:
    """Issue 18: run_master(progress=True) shows a progress line on rank 0's stderr when it is
    a terminal (a pty here), redrawn in place and ended with a newline; nothing when it is not
    a terminal."""
    import subprocess

    from .helpers import on_a_terminal

    script = tmp_path / "c.py"
    script.write_text(PROGRESS_CAMPAIGN)
    _rc, text, out = on_a_terminal([sys.executable, str(script), str(tmp_path / "s1")])
    assert b"REPORT True" in out
    assert "\rcommitted " in text and "\x1b[K" in text, text
    assert text.count("\r") >= 2  # redrawn in place
    last = text.rindex("committed ")
    assert "committed 40" in text[last:] and text.rstrip("\r\n").endswith("AFTER"), text[-200:]
    assert "\nAFTER" in text.replace("\r\n", "\n")  # the line was ended before what follows
    plain = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s2")], capture_output=True, text=True
    )
    assert "REPORT True" in plain.stdout and plain.stderr == "AFTER\n", plain.stderr


@pytest.mark.parametrize("heals", [False, True])
def test_commits_in_memory_only_at_the_end_are_retried_then_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, heals: bool
) -> None:
    """A disk that refuses the journal until the end of the campaign (the torture harness's
    tmpfs, filled): the commits live in memory only. run_master retries the disk for a few
    seconds at the end: if it frees, the campaign finishes durably; if not, closing the state
    raises NotDurableError (never a quiet ``finished=True``), and a later run does those
    items again."""
    import errno

    from durable_dispatch.errors import NotDurableError
    from durable_dispatch.mpi import masterloop
    from durable_dispatch.testing import inject_faults

    monkeypatch.setattr(masterloop, "PERSIST_SECONDS", 1.0)
    items = [WorkItem(f"w{i:02d}", i) for i in range(10)]
    state = tmp_path / "state"
    with inject_faults() as faults:
        # the journal's fsyncs fail from the 3rd on (its rewrites too): commits go to memory
        faults.fail("fsync", errno.ENOSPC, path=str(state / "events.jsonl*"), nth=3, from_nth=True)
        if heals:
            real = masterloop.persisted

            def disk_frees(st: CampaignState, seconds: float) -> bool:
                faults.heal()  # the ballast is removed as the campaign ends
                return real(st, seconds)

            monkeypatch.setattr(masterloop, "persisted", disk_frees)
            report = run_master(items, state, comm=LocalWorkers(lambda p: p, workers=2), linger=0)
            assert report.finished and report.stats["commits_in_memory"] == 0
        else:
            with pytest.raises(NotDurableError):
                run_master(items, state, comm=LocalWorkers(lambda p: p, workers=2), linger=0)
    if not heals:
        again = run_master(items, state, comm=LocalWorkers(lambda p: p, workers=2), linger=0)
        assert again.finished  # the disk works again: the rest is done, durably
    assert set(view_state(state).projection.committed) == {i.work_id for i in items}


def test_a_draining_turn_counts_the_work_in_flight_without_mapping_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: while a signal drains the campaign, every turn asked whether anything is
    still in flight by building the map of every item in flight (64 x 10,000 entries a turn
    at batch 64 on 10,000 ranks). It now asks their count (O(1))."""
    import signal

    from durable_dispatch.core import Dispatcher
    from durable_dispatch.mpi.masterloop import Stopping

    st = CampaignState.open(tmp_path / "s", watchdog=WatchdogConfig(60), ranks=range(1, 3))
    try:
        st.submit([WorkItem("a"), WorkItem("b")])
        s = st.next_send(0.0)
        assert s is not None
        st.sent(s.token, 0.0)

        def mapped(self: object) -> None:
            raise AssertionError("a turn mapped every item in flight")

        monkeypatch.setattr(Dispatcher, "in_flight", mapped)
        stopping = Stopping(0.0, None, 5.0, drain_seconds=60.0)
        assert stopping.reason(1.0, st, [signal.SIGTERM], 1.0) is None  # one in flight: drain
        assert stopping.draining
        st.on_results(s.rank, str(s.token), [1], 2.0)
        st.on_ready(s.rank, str(s.token), 2.0)
        st.deliver(wait=True)
        assert stopping.reason(2.0, st, [signal.SIGTERM], 2.0) == "signal"  # nothing left
    finally:
        monkeypatch.undo()
        st.close()


class _WithdrawingFeed(Feed):
    """Submits its items, then, once some are dispatched, withdraws every other one from the
    run (as the futures executor's ``shutdown(cancel_futures=True)`` does)."""

    def __init__(self, items: list[WorkItem]) -> None:
        self.items, self.exhausted, self.sent, self.withdrawn = items, False, set(), -1
        self.snapshots_while_withdrawn = 0

    def attach(self, state: CampaignState) -> None:
        super().attach(state)
        state.on_dispatch = lambda s: self.sent.update(w.work_id for w in s.items)
        save = state.save_snapshot

        def counted(reason: str = "") -> bool:
            self.snapshots_while_withdrawn += state.core.ledger.withdrawn is not None
            return save(reason)

        state.save_snapshot = counted  # type: ignore[method-assign]

    def refill(self) -> None:
        if not self.exhausted:
            self.state.submit(self.items)
            self.exhausted = True
        elif self.withdrawn < 0 and self.sent:
            self.withdrawn = self.state.withdraw(keep=self.sent)


def test_work_a_feed_withdraws_ends_the_run_pending_and_a_later_run_does_it(
    tmp_path: Path,
) -> None:
    """Issue 48: a Feed withdraws the pending and waiting work from the run (in memory): the
    loop ends once the work dispatched is done (a call that failed and was requeued meanwhile
    runs again, its rollback's snapshot taken while work was withdrawn), the report says
    ``finished=False``, ``reason="withdrawn"``, nothing withdrawn is committed or deferred,
    the state directory holds it pending (a waiting item released meanwhile too), and a later
    run does exactly that work."""
    from durable_dispatch import RetryPolicy

    ran: list[int] = []
    failed_once: set[int] = set()

    def fn(p: int) -> int:
        if p == 0 and p not in failed_once:
            failed_once.add(p)
            raise ValueError("once")
        ran.append(p)
        return p

    items = [WorkItem(f"w{i}", i) for i in range(20)]
    items.append(WorkItem("z", 99, after=("w0",)))  # waits for w0, which is dispatched first
    state = tmp_path / "state"
    feed = _WithdrawingFeed(items)
    report = run_master(
        feed, state, comm=LocalWorkers(fn, workers=2), retry=RetryPolicy(2), linger=0
    )
    assert (report.finished, report.reason) == (False, "withdrawn")
    sent = {int(w[1:]) for w in feed.sent}
    assert 0 in sent and 0 < len(sent) < 20 and sorted(ran) == sorted(sent)
    assert feed.withdrawn == 21 - len(sent)
    view = view_state(state)
    assert view.projection.committed == feed.sent and not view.projection.deferred
    pending = set(view.projection.frontier) | set(view.projection.waiting)
    assert pending == {f"w{i}" for i in range(20) if i not in sent} | {"z"}
    assert report.view is not None and report.view.pending == len(pending)
    assert feed.snapshots_while_withdrawn  # the requeue's (S8), with the work withdrawn
    ran.clear()
    again = run_master(items, state, comm=LocalWorkers(fn, workers=2), linger=0)
    assert again.finished and sorted(ran) == sorted({i for i in range(20) if i not in sent} | {99})


class _PostingWorkers(LocalWorkers):
    """LocalWorkers whose WORK goes through ``post``, as MpiTransport's non-blocking send
    does; the first one is lost (its worker never gets it) and ``unsent`` reports it a turn
    later."""

    def __init__(self, fn: Any, workers: int) -> None:
        super().__init__(fn, workers=workers)
        self.lost: list[tuple[Any, str]] = []
        self.posted = 0

    def post(self, rank: int, tag: int, data: bytes, key: Any) -> str | None:
        self.posted += 1
        if self.posted == 1:
            self.lost.append((key, "MPI_ERR_PROC_FAILED"))
            return None
        return self.send(rank, tag, data)

    def unsent(self) -> list[tuple[Any, str]]:
        lost, self.lost = self.lost, []
        return lost


def test_a_work_send_that_fails_after_it_started_is_compensated(tmp_path: Path) -> None:
    """A WORK posted without waiting whose send fails later: its dispatch is rolled back as a
    failed send (its items go to another worker, each committed once)."""
    workers = _PostingWorkers(lambda p: p + 1, workers=3)
    got: dict[str, int] = {}

    def keep(wid: str, value: int) -> None:
        assert wid not in got
        got[wid] = value

    items = [WorkItem(f"w{i:02d}", i) for i in range(12)]
    report = run_master(items, tmp_path / "state", keep, comm=workers, linger=0, batch=2)
    assert report.finished and got == {f"w{i:02d}": i + 1 for i in range(12)}
    core = report.stats["core"]
    assert core["send_failures"] == 1 and core["commits"] == 12
    assert workers.posted > 1
