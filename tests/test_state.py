"""Tests of durable_dispatch.campaign.state: durable campaign state, replay, restart, faults."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_dispatch import CampaignState, SnapshotStore
from durable_dispatch.campaign.admin import view_state
from durable_dispatch.campaign.replay import event_work_ids, replay
from durable_dispatch.campaign.statedir import STATE_JOURNAL, SUBMISSIONS
from durable_dispatch.core import Commit, Dispatcher, RetryPolicy, Send, WatchdogConfig, WorkItem
from durable_dispatch.core.ledger import Ledger
from durable_dispatch.errors import LockHeldError
from durable_dispatch.storage import Journal
from durable_dispatch.storage.journal import read_journal
from durable_dispatch.testing import inject_faults

from .helpers import examples, fake_campaign

ITEMS = [WorkItem(f"w{i}", {"i": i}) for i in range(20)]


def _open(d: Path, **kw: Any) -> CampaignState:
    kw.setdefault("ranks", (1, 2, 3))
    kw.setdefault("watchdog", WatchdogConfig(10))
    return CampaignState.open(d, **kw)


def _replayed(state: CampaignState) -> dict[str, Any]:
    snap = state.snapshots.load()
    base = snap.value if snap else {}
    after = base.get("journal_seq", -1)
    events = (r.payload for r in state.journal.records(from_seq=after + 1))
    return replay(base.get("state"), events, _stored(state)).to_snapshot()


def _stored(state: CampaignState) -> list[Any]:
    """The submissions store's records (the payloads the snapshot and the journal name)."""
    return [r.payload for r in state.submissions.records()]


def _replayed_from_the_journal(state: CampaignState) -> dict[str, Any]:
    """The state replayed from the journal's first record, with no snapshot (a campaign whose
    disk refused every snapshot restarts this way)."""
    events = (r.payload for r in state.journal.records())
    return replay(None, events, _stored(state)).to_snapshot()


def _committed_events(d: Path) -> list[str]:
    with Journal.open(d / STATE_JOURNAL) as j:
        return [
            w
            for r in j.records()
            if r.payload.get("event") == "committed"
            for w in event_work_ids(r.payload)
        ]


def test_campaign_commits_everything_once_and_resumes(tmp_path: Path) -> None:
    acked: list[str] = []
    with _open(tmp_path) as s:
        assert s.submit(ITEMS) == 20
        fake_campaign(s, on_commit=lambda c: acked.append(c.work_id))
        assert s.core.committed() == {i.work_id for i in ITEMS}
        assert s.statistics().commits_in_memory == 0
    assert sorted(acked) == sorted(i.work_id for i in ITEMS)
    with _open(tmp_path) as s:
        assert s.core.epoch == 2
        assert s.submit(ITEMS) == 0  # resume: nothing new, nothing to do
        assert s.core.done
    assert sorted(_committed_events(tmp_path)) == sorted(i.work_id for i in ITEMS)


@pytest.mark.parametrize("batch", [1, 4])
def test_replay_equals_live_state_with_faults(tmp_path: Path, batch: int) -> None:
    with _open(tmp_path, retry=RetryPolicy(1)) as s:
        s.submit(ITEMS)
        n = {"k": 0}

        def behave(send: Send) -> str:
            n["k"] += 1
            return ["ok", "silent", "malformed", "ok", "partial"][n["k"] % 5]

        fake_campaign(s, behave=behave, batch=batch)
        assert _replayed(s) == s.core.snapshot() == _replayed_from_the_journal(s)
        st_ = s.core.statistics()
        assert st_.dispatch_watchdog_timeouts > 0 and st_.invalid_result_rollbacks > 0
        assert st_.protocol_deferred_dispatches > 0
        assert len(s.defer) == st_.deferred_now
        assert st_.commits + st_.deferred_now == len(ITEMS)
        if batch > 1:  # whole-dispatch failures split; every item still ends in one place
            assert st_.batch_splits > 0 and st_.dispatches < st_.dispatched_items


def test_a_multi_item_dispatch_is_one_record_each_way_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    acked: list[str] = []
    with _open(tmp_path) as s:
        s.submit(ITEMS)
        before = s.journal.next_seq
        fake_campaign(s, on_commit=lambda c: acked.append(c.work_id), batch=8)
        kinds = [r.payload["event"] for r in s.journal.records(from_seq=before)]
        assert s.core.statistics().dispatches == 3  # 20 items in dispatches of 8, 8 and 4
    assert sorted(acked) == sorted(i.work_id for i in ITEMS)
    # one "dispatched" and one "committed" record per dispatch (and the delivery marks)
    assert sorted(k for k in kinds if k != "delivered") == ["committed"] * 3 + ["dispatched"] * 3
    assert sorted(_committed_events(tmp_path)) == sorted(i.work_id for i in ITEMS)
    with _open(tmp_path) as s:
        assert s.core.committed() == {i.work_id for i in ITEMS} and s.core.done


@settings(max_examples=examples(40), deadline=None)
@given(
    ops=st.lists(
        st.sampled_from(
            ["send", "send3", "ok", "partial", "malformed", "ready", "sweep", "snapshot", "tick"]
        ),
        max_size=60,
    )
)
def test_replay_equals_live_state_random(tmp_path_factory: Any, ops: list[str]) -> None:
    d = tmp_path_factory.mktemp("r")
    with _open(d, ranks=(1, 2), retry=RetryPolicy(1)) as s:
        s.submit(ITEMS[:6])
        now = 0.0
        sent: list[Send] = []
        for op in ops:
            core = s.core
            if op in ("send", "send3"):
                x = s.next_send(now, 3 if op == "send3" else 1)
                if x is not None:
                    s.persist(core.mark_dispatched(x.token, now))
                    sent.append(x)
            elif op in ("ok", "partial", "malformed") and sent:
                x = sent[-1]
                values = None if op == "malformed" else [1] * len(x.items)
                errors = {0: "raised"} if op == "partial" else None
                s.persist(core.on_results(x.rank, str(x.token), values, now, errors=errors))
                s.deliver(wait=True)  # the delivery point (R1)
            elif op == "ready" and sent:
                x = sent.pop()
                s.persist(core.on_ready(x.rank, str(x.token), now))
                s.persist(core.join_invalid(now))
            elif op == "sweep":
                s.persist(core.sweep(now))
            elif op == "snapshot":
                s.save_snapshot("test")
            else:
                now += 7.0
            live = s.core.snapshot()
            assert _replayed(s) == live
            assert _replayed_from_the_journal(s) == live  # snapshots are a shortcut, not a fix


def test_restart_rolls_back_in_flight_without_charging_and_rejects_old_epoch(
    tmp_path: Path,
) -> None:
    s = _open(tmp_path)
    s.submit(ITEMS[:5])
    a = s.next_send(0.0)
    b = s.next_send(0.0)
    assert a is not None and b is not None
    s.persist(s.core.mark_dispatched(a.token, 0.0))
    s.persist(s.core.mark_dispatched(b.token, 0.0))
    s.journal.sync_now()
    # Simulate the master dying: no final snapshot, just let go of the files.
    s.journal.close()
    s.submissions.close()
    s.defer.close()
    s._lock.release()
    s._closed = True  # dead: nothing may close it later
    s2 = _open(tmp_path)
    try:
        assert s2.core.epoch == 2
        assert s2.core.pending()[:2] == [a.work.work_id, b.work.work_id]
        assert s2.core.attempts(a.work.work_id) == 0
        assert s2.core.statistics().master_restart_rollbacks == 2
        out = s2.core.on_result(a.rank, str(a.token), "late", 0.0)
        assert out[0].classification.value == "STALE"  # type: ignore[union-attr]
        c = s2.next_send(0.0)
        assert c is not None and c.token.epoch == 2 and c.work.work_id == a.work.work_id
    finally:
        s2.close()


def test_second_master_gets_lock_error(tmp_path: Path) -> None:
    with _open(tmp_path):
        with pytest.raises(LockHeldError):
            _open(tmp_path)


def test_storage_faults_degrade_then_heal_with_nothing_lost(tmp_path: Path) -> None:
    acked: list[str] = []
    with inject_faults() as faults:
        # sync="always": each record's fsync is the append's own, so the fault below hits the
        # campaign at the same record however fast the machine is (a batch flusher may have
        # covered everything before it, and did under load)
        s = _open(tmp_path, sync="always")
        s.submit(ITEMS)
        calls = {"n": 0}

        degraded: list[int] = []

        def on_commit(c: Commit) -> None:
            acked.append(c.work_id)
            calls["n"] += 1
            st = s.statistics()
            if st.journal_health["state"] == "DEGRADED":
                degraded.append(st.commits_in_memory)

        # The disk starts failing mid-campaign: from the third fsync on. (A fault set from the
        # callback came too late: the facade delivers a commit once its fsync returned.)
        faults.fail("fsync", errno.EIO, nth=3, from_nth=True)
        fake_campaign(s, on_commit=on_commit)
        assert degraded and max(degraded) > 0  # commits were accepted in memory meanwhile
        assert s.core.committed() == {i.work_id for i in ITEMS}  # the campaign went on
        faults.heal()
        assert s.try_restore()  # (the facade's tick retries it too, with a back-off)
        assert s.statistics().commits_in_memory == 0
        s.close()
    assert sorted(_committed_events(tmp_path)) == sorted(i.work_id for i in ITEMS)
    with _open(tmp_path) as s2:
        assert s2.core.committed() == {i.work_id for i in ITEMS}


def test_projection_ignores_duplicate_commits_and_unknown_events() -> None:
    p = Ledger()
    p.apply_record({"event": "submitted", "items": [WorkItem("a").to_json()]})
    p.apply_record({"event": "dispatched", "work_id": "a", "token": "e0-1", "rank": 1})
    p.apply_record({"event": "committed", "work_id": "a", "token": "e0-1"})
    p.apply_record({"event": "committed", "work_id": "a", "token": "e1-2"})
    p.apply_record({"event": "from-the-future"})
    assert p.duplicate_commits == 1 and p.committed == {"a"}


CHILD = Path(__file__).parent / "children" / "campaign_child.py"


def test_sigkill_master_at_random_points_loses_nothing_and_commits_once(tmp_path: Path) -> None:
    """SIGKILL the master at random points at least 50 times across campaigns; check each one."""
    import random
    import signal
    import subprocess
    import sys
    import time

    n = 200
    rnd = random.Random(20261129)
    kills = 0
    campaigns: dict[Path, set[str]] = {}
    d = tmp_path / "c0"
    campaigns[d] = set()
    while kills < 50:
        p = subprocess.Popen(
            [sys.executable, str(CHILD), str(d), str(n)], stdout=subprocess.PIPE, text=True
        )
        time.sleep(rnd.uniform(0.2, 0.6))
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        kills += p.returncode == -signal.SIGKILL
        campaigns[d].update(x.split()[1] for x in out.splitlines() if x.startswith("ack "))
        if "done" in out:  # finished before the kill landed: start another campaign
            d = tmp_path / f"c{len(campaigns)}"
            campaigns[d] = set()
    everything = {f"w{i:04d}" for i in range(n)}
    for d, acked in campaigns.items():
        final = subprocess.run(
            [sys.executable, str(CHILD), str(d), str(n), "0"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert final.returncode == 0, final.stderr[-2000:]
        acked.update(x.split()[1] for x in final.stdout.splitlines() if x.startswith("ack "))
        events = _committed_events(d)
        assert set(events) == everything, "work lost"
        assert len(events) == len(everything), "a work ID was committed twice in the record"
        assert acked <= set(events), "an acknowledged commit did not survive"
    print(f"checked {kills} SIGKILLs over {len(campaigns)} campaigns of {n} work items")
    assert kills >= 50


def test_compaction_folds_the_journal_in_the_open_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compact_state reads a clean journal once (the open's scan feeds the fold) and reports its
    progress; after a repaired torn tail it reads the records again. Either way the folded state
    equals the replayed one."""
    from durable_dispatch.campaign.admin import compact_state, view_state

    root = tmp_path / "s"
    with CampaignState.open(root, ranks=(1, 2)) as s:
        s.submit(WorkItem(f"w{i}") for i in range(300))
        fake_campaign(s)
    committed = view_state(root).projection.committed
    reads: list[int] = []
    real = Journal.records

    def counting(j: Journal, *a: Any, **kw: Any) -> Any:
        if j.path.endswith(STATE_JOURNAL):  # the submissions store is read again after a repair
            reads.append(1)
        return real(j, *a, **kw)

    seen: list[tuple[int, int]] = []
    with monkeypatch.context() as m:
        m.setattr(Journal, "records", counting)
        rep = compact_state(root, progress=lambda done, total: seen.append((done, total)))
    assert reads == [] and rep.records_before > 300
    assert seen and all(t == rep.bytes_before for _d, t in seen)
    assert [d for d, _t in seen] == sorted(d for d, _t in seen) and seen[-1][0] < rep.bytes_before
    assert view_state(root).projection.committed == committed
    # Once more, with new work journaled and a torn tail to cut: the fold starts over after the
    # repair, and keeps what the repair kept.
    with CampaignState.open(root, ranks=(1,)) as s:
        s.submit([WorkItem("extra")])
    with (root / STATE_JOURNAL).open("ab") as f:
        f.write(b'{"v":1,"crc":"00')
    with monkeypatch.context() as m:
        m.setattr(Journal, "records", counting)
        compact_state(root)
    assert reads == [1]
    v = view_state(root)
    assert v.projection.committed == committed and "extra" in v.projection.frontier


def test_compaction_names_an_intact_record_that_is_not_json(tmp_path: Path) -> None:
    """A checksummed payload that does not decode is damage to report; nothing is changed."""
    import orjson

    from durable_dispatch.campaign.admin import compact_state
    from durable_dispatch.errors import JournalCorruptError

    root = tmp_path / "s"
    with CampaignState.open(root, ranks=(1,)) as s:
        s.submit(WorkItem(f"w{i}") for i in range(3))
    jpath = root / STATE_JOURNAL
    with Journal.open(jpath, sync="always") as j:
        good = [orjson.dumps(r.payload) for r in j.records()]
        j.replace_contents([*good, b"{nope"], first_seq=0, raw=True)
    data = jpath.read_bytes()
    with pytest.raises(JournalCorruptError) as ei:
        compact_state(root)
    assert ei.value.reason == "payload is not JSON"
    assert ei.value.offset == len(data) - len(data.splitlines(keepends=True)[-1])
    assert jpath.read_bytes() == data


def test_open_replays_the_journal_in_the_open_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A master restart reads a clean state journal once; the replayed state is the same."""
    from durable_dispatch.campaign.admin import view_state

    root = tmp_path / "s"
    s = CampaignState.open(root, ranks=(1, 2))
    s.submit(WorkItem(f"w{i}") for i in range(200))
    fake_campaign(s)
    # The master "dies" here: everything is durable, but no final snapshot is written.
    s.deliver(wait=True)
    s.journal.close()
    s.submissions.close()
    s.defer.close()
    s._lock.release()
    s._closed = True
    expect = view_state(root).projection.to_snapshot()
    real = Journal.records

    def only_other_journals(j: Journal, *a: Any, **k: Any) -> Any:
        if j.path.endswith(STATE_JOURNAL):
            pytest.fail("the state journal's records were read again")
        return real(j, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Journal, "records", only_other_journals)
        with CampaignState.open(root, ranks=(1, 2)) as s:
            got = s.core.snapshot()
            replayed = s.statistics().replayed_records
    assert replayed > 200
    for k in ("committed", "deferred", "frontier", "attempts"):
        assert got[k] == expect[k], k


def test_a_failed_open_releases_the_state_journal(tmp_path: Path) -> None:
    """When opening fails after the state journal was opened (here: the defer journal is
    damaged), the journal's writer lock is released with the master lock."""
    from durable_dispatch.errors import JournalCorruptError
    from durable_dispatch.storage.defer import DEFAULT_DEFER_NAME

    root = tmp_path / "s"
    with CampaignState.open(root, ranks=(1,)) as s:
        s.submit(WorkItem(f"w{i}") for i in range(3))
        for i in range(3):
            s.defer.defer(f"d{i}", {}, attempts=1)
    dpath = root / DEFAULT_DEFER_NAME
    good = dpath.read_bytes()
    lines = good.splitlines(keepends=True)
    assert b'"d0"' in lines[1]
    lines[1] = lines[1].replace(b'"d0"', b'"dX"')  # a durable record: later ones prove it
    dpath.write_bytes(b"".join(lines))
    with pytest.raises(JournalCorruptError):
        CampaignState.open(root, ranks=(1,))
    dpath.write_bytes(good)
    with CampaignState.open(root, ranks=(1,)) as s:  # no LockHeldError from the first attempt
        assert sorted(s.core.pending()) == ["w0", "w1", "w2"]


def test_a_failed_open_closes_the_defer_journal_it_opened_beside_the_state_journal(
    tmp_path: Path,
) -> None:
    """Issue 49: a defer journal the open creates opens in a thread beside the state journal's
    open. When the state journal is damaged, the defer journal that opened meanwhile is closed
    too: its writer
    lock (the file's own flock) is released with the master lock, so the next open is not
    refused by this process's own leftover."""
    from durable_dispatch.errors import JournalCorruptError
    from durable_dispatch.storage.defer import DEFAULT_DEFER_NAME

    root = tmp_path / "s"
    with CampaignState.open(root, ranks=(1,)) as s:
        s.submit(WorkItem(f"w{i}") for i in range(3))
    (root / DEFAULT_DEFER_NAME).unlink()  # (no deferral in it): the open creates it, beside
    events = root / STATE_JOURNAL
    good = events.read_bytes()
    _forge(events, {"event": "committed", "token": 7})
    with pytest.raises(JournalCorruptError):
        CampaignState.open(root, ranks=(1,))
    events.write_bytes(good)
    with CampaignState.open(root, ranks=(1,)) as s:  # no LockHeldError from the first attempt
        assert sorted(s.core.pending()) == ["w0", "w1", "w2"]


def test_a_refused_open_leaves_an_existing_defer_journal_as_it_was(tmp_path: Path) -> None:
    """S9 with issue 49's overlap: only a defer journal the open creates opens beside the state
    journal. One that exists (here with a torn tail its open would cut, into a side file)
    is not touched by an open that the damaged state journal refuses."""
    from durable_dispatch.errors import JournalCorruptError
    from durable_dispatch.storage.defer import DEFAULT_DEFER_NAME

    root = tmp_path / "s"
    with CampaignState.open(root, ranks=(1,)) as s:
        s.submit([WorkItem("a")])
    CampaignState.open(root, ranks=(1,)).close()  # its records prove the first run's durable
    events = root / STATE_JOURNAL
    lines = events.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"', b"'", 3)  # a damaged record, durable (not a torn write)
    events.write_bytes(b"\n".join(lines))
    defer = root / DEFAULT_DEFER_NAME
    with open(defer, "ab") as f:
        f.write(b'{"torn')

    def campaign_files() -> dict[str, bytes]:  # (not the owner records: each open claims)
        return {p.name: p.read_bytes() for p in root.iterdir() if "owner" not in p.name}

    before = campaign_files()
    with pytest.raises(JournalCorruptError):
        CampaignState.open(root, ranks=(1,))
    assert campaign_files() == before


def test_a_state_closes_and_reopens_from_a_thread_after_the_main_thread_ended(
    tmp_path: Path,
) -> None:
    """Issue 49's threads beside the open and the close: a state closed by a thread that runs
    on after the main thread returned (the interpreter is shutting down: no new executor
    thread may start), and one closed by an ``atexit`` hook, write their snapshot, release the
    directory, and the next open works (a failed open must not keep the master lock)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import atexit, os, sys, threading, time
        from durable_dispatch import CampaignState
        from durable_dispatch.core import WorkItem

        d, how = sys.argv[1], sys.argv[2]
        st = CampaignState.open(d, ranks=(1,))
        st.submit([WorkItem("a"), WorkItem("b")])

        def later():
            if how == "thread":
                time.sleep(0.3)  # the main thread has returned
            st.close()
            snaps = [n for n in os.listdir(d) if n.startswith("campaign.")]
            for _ in range(2):
                with CampaignState.open(d, ranks=(1,)) as s2:
                    print("pending", sorted(s2.core.pending()), len(snaps), flush=True)

        if how == "thread":
            threading.Thread(target=later).start()
        else:
            atexit.register(later)
        """
    )
    for how in ("thread", "atexit"):
        d = tmp_path / how
        out = subprocess.run(
            [sys.executable, "-c", script, str(d), how], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, (how, out.stderr)
        assert out.stdout.splitlines() == ["pending ['a', 'b'] 1"] * 2, (how, out.stdout)
        assert "Traceback" not in out.stderr, (how, out.stderr)


def test_a_wait_beside_that_is_interrupted_waits_for_the_call_to_end_then_says_so() -> None:
    """An interrupt (a signal's exception) while the open waits for the defer journal opening
    beside it must not leave that journal open and unowned: the wait goes on to the call's
    end and hands the interrupt back, with the call's value, to be dealt with first."""
    import os
    import signal
    import threading

    from durable_dispatch.storage.background import Beside as _Beside

    class Interrupted(Exception):
        pass

    started, release = threading.Event(), threading.Event()

    def call() -> str:
        started.set()
        release.wait(10)
        return "a journal"

    def on_signal(signum: int, frame: object) -> None:
        release.set()  # the call ends only after the interrupt reached the waiting thread
        raise Interrupted

    old = signal.signal(signal.SIGUSR1, on_signal)
    try:
        beside = _Beside(call, "test")
        assert started.wait(10)
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        interrupted = beside.wait()
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert isinstance(interrupted, Interrupted)
    assert beside.value == "a journal" and beside.error is None
    assert beside.result() == "a journal"


def test_a_snapshot_is_not_renamed_into_place_when_the_claim_was_lost_during_its_wait(
    tmp_path: Path,
) -> None:
    """S13 with issue 49's overlap: a snapshot waits for the journal's fsync after its file is
    written; the owner record is checked again after that wait, right before the rename. A
    takeover during the wait (another master's record of the next generation) leaves no new
    generation and no temporary file."""
    from durable_dispatch.campaign.statedir import SNAPSHOT_NAME
    from durable_dispatch.storage.owner import OWNER_PREFIX

    d = tmp_path / "s"
    s = _open(d, sync="never")
    try:
        s.submit(ITEMS[:3])
        store = SnapshotStore(d, name=SNAPSHOT_NAME)
        before = sorted(os.listdir(d))
        gen = max(int(n[len(OWNER_PREFIX) :]) for n in before if n.startswith(OWNER_PREFIX))
        s.journal.sync_now()  # (so the wait returns at once, without the journal's own check)
        wait = s.wait_durable

        def taken_over(seq: int) -> bool:
            (d / f"{OWNER_PREFIX}{gen + 1}").write_bytes(b"{}")
            return wait(seq)

        s.wait_durable = taken_over  # type: ignore[method-assign]
        with pytest.raises(LockHeldError):
            s.save_snapshot("a test")
        after = sorted(os.listdir(d))
        assert store.generations() == SnapshotStore(d, name=SNAPSHOT_NAME).generations()
        assert [n for n in after if n not in before] == [f"{OWNER_PREFIX}{gen + 1}"]
    finally:
        with contextlib.suppress(LockHeldError):
            s.close()


def test_no_dispatch_leaves_before_its_epoch_is_durable(tmp_path: Path) -> None:
    """Issue 49: the open does not wait for its epoch record's fsync (it runs beside the
    submission's); the first dispatch does. A token of an epoch a crash could forget would
    name another dispatch after the restart, which starts that epoch again. Under the policy
    ``never`` no fsync runs unless someone waits, so only that wait makes it durable here."""
    with _open(tmp_path / "s", sync="never") as s:
        epoch_seq = s.journal.next_seq - 1
        s.submit(ITEMS[:2])
        assert s.journal.durable_seq < epoch_seq  # the open did not wait
        send = s.next_send(0.0)
        assert send is not None and send.token.epoch == s.core.epoch
        assert s.journal.durable_seq >= epoch_seq
        on_disk = [r.payload for r in read_journal(tmp_path / "s" / STATE_JOURNAL)]
        assert {"event": "epoch", "epoch": s.core.epoch}.items() <= on_disk[0].items()


def test_a_snapshot_is_renamed_into_place_only_once_the_journal_it_folds_is_durable(
    tmp_path: Path,
) -> None:
    """Issue 49: the snapshot's file is written while the journal's fsync runs; it is renamed
    into place only after an fsync covers the journal's last record it folds (a crash between
    the two must not leave a snapshot ahead of the journal). Under ``never`` nothing else
    fsyncs the journal."""
    from durable_dispatch.campaign.statedir import SNAPSHOT_NAME

    d = tmp_path / "s"
    with _open(d, sync="never") as s:
        s.submit(ITEMS[:3])
        last = s.journal.next_seq - 1
        assert s.journal.durable_seq < last
        store = SnapshotStore(d, name=SNAPSHOT_NAME)
        before = set(store.generations())
        wait = s.wait_durable
        seen: list[set[int]] = []  # the generations on disk when the snapshot waits
        s.wait_durable = lambda seq: seen.append(set(store.generations())) or wait(seq)  # type: ignore[method-assign]
        s.save_snapshot("a test")
        assert seen == [before] and s.journal.durable_seq >= last
        (gen,) = set(store.generations()) - before
        snap = store.load()
        assert snap is not None and snap.generation == gen
        assert snap.value["journal_seq"] == last


@pytest.mark.parametrize("batch", [1, 3])
def test_a_snapshot_during_a_group_commit_keeps_the_journaled_commits(
    tmp_path: Path, batch: int
) -> None:
    """The master journals commits without waiting (``wait=False``) and delivers them when an fsync
    covers them; a rollback in the same turn writes a snapshot before that. The snapshot folds in
    the commit records, so it must count them as committed: a restart from it must not run the
    work again and record a second commit (found by the crash harness)."""
    import shutil

    live = tmp_path / "live"
    with _open(live, ranks=(1, 2), retry=RetryPolicy(1)) as s:
        s.submit(ITEMS[:6])
        core = s.core
        good = s.next_send(0.0, batch)
        bad = s.next_send(0.0, batch)
        assert good is not None and bad is not None
        s.persist(core.mark_dispatched(good.token, 0.0))
        s.persist(core.mark_dispatched(bad.token, 0.0))
        values = [1] * len(good.items)
        s.persist(core.on_results(good.rank, str(good.token), values, 0.0))
        s.persist(core.on_results(bad.rank, str(bad.token), None, 0.0, failure="garbled"))
        s.persist(core.on_ready(bad.rank, str(bad.token), 0.0))
        # The rollback writes its snapshot while the commit is still in progress (journaled, not
        # delivered); the commit is delivered right after it, and a crash may come before any
        # later snapshot: the disk as that crash leaves it.
        s.persist(core.join_invalid(0.0))
        shutil.copytree(live, tmp_path / "crashed")
    with _open(tmp_path / "crashed") as s2:
        assert {w.work_id for w in good.items} <= s2.core.committed()
        assert s2.statistics().duplicate_commits_in_journal == 0


def test_commits_too_large_for_one_record_are_split_and_an_oversized_result_is_retried(
    tmp_path: Path,
) -> None:
    """A dispatch's results may not fit one journal record: they go in several records (one
    commit_done when the last is delivered). A single result over the record bound can never be
    recorded: it is charged like a failed item, never a crash of the master."""
    acked: list[str] = []
    small = {"max_record_bytes": 2048}
    with _open(tmp_path, ranks=(1,), retry=RetryPolicy(0), journal_options=small) as s:
        s.submit(ITEMS[:3])
        core = s.core
        x = s.next_send(0.0, 3)
        assert x is not None and len(x.items) == 3
        s.persist(core.mark_dispatched(x.token, 0.0))
        values = [{"r": "a" * 900}, {"r": "b" * 3000}, {"r": "c" * 900}]
        s.redeliver(lambda wid, _result: acked.append(wid))  # (the callback of what follows)
        before = s.journal.next_seq
        s.persist(core.on_results(1, str(x.token), values, 0.0))
        s.deliver(wait=True)  # the delivery point (R1)
        s.persist(core.on_ready(1, str(x.token), 0.0))
        w0, w1, w2 = (w.work_id for w in x.items)
        assert sorted(acked) == sorted([w0, w2])
        assert core.committed() == {w0, w2} and set(core.deferred()) == {w1}
        assert core.idle_ranks() == [1] and len(s.defer) == 1
        assert s.journal.next_seq - before == 3  # committed w0, committed w2, deferred w1
        assert _replayed(s) == core.snapshot()
    with _open(tmp_path) as s2:
        assert s2.core.committed() == {w0, w2} and set(s2.core.deferred()) == {w1}


def test_a_second_master_is_refused_after_the_lock_files_were_deleted(tmp_path: Path) -> None:
    """Issue 13, example 4 (S12): ``rm state/*.lock`` under a running master (in another
    process) lets no second master in, and read-only commands still see the master."""
    from durable_dispatch.campaign.admin import view_state

    from .test_journal import _held_elsewhere

    d = tmp_path / "st"
    with _held_elsewhere("state", d):
        for lock in d.glob("*.lock"):
            lock.unlink()
        before = {p.name: p.read_bytes() for p in d.iterdir()}
        with pytest.raises(LockHeldError):
            CampaignState.open(d, ranks=[1])
        assert {p.name: p.read_bytes() for p in d.iterdir() if p.name in before} == before
        assert view_state(d).master_running
    assert not view_state(d).master_running


# ------------------------------------------------------------------ schemas on read (S11)
def _forge(path: Path, payload: dict[str, Any]) -> None:
    """Append a record with a valid checksum (the salt is in the header: anyone can)."""
    from durable_dispatch.storage.format import frame_record, parse_header
    from durable_dispatch.storage.journal import read_journal

    hdr = parse_header(path.read_bytes().split(b"\n", 1)[0] + b"\n")
    assert not isinstance(hdr, str)
    last = max((r.seq for r in read_journal(path)), default=hdr.first_seq - 1)
    with open(path, "ab") as f:
        f.write(frame_record(hdr.seed, last + 1, last, orjson.dumps(payload)))


FORGERIES = [
    ({"event": "committed", "token": "e1-1"}, "work_id"),
    ({"event": "submitted", "items": [1]}, "items"),
    ({"event": "dispatched", "token": 7, "rank": 1, "work_id": "w0"}, "token"),
    ({"event": "deferred", "work_id": "nobody", "attempts": 1, "kinds": []}, "work_id"),
    ({"event": "requeued", "work_id": "w0", "attempts": "2", "kind": "timeout"}, "attempts"),
    (["not", "an", "object"], "(record)"),
    # issue 29.5: references, not shapes (a KeyError at open, and compact exited with one)
    ({"event": "dispatched", "token": "e1-1", "rank": 1, "work_id": "ghost"}, "work_ids"),
    ({"event": "committed", "token": "e1-9", "rank": 1, "work_id": "w1"}, "work_ids"),
    ({"event": "committed", "token": "e1-9", "rank": 1, "work_id": "ghost"}, "work_ids"),
    ({"event": "dispatched", "token": "e7-1", "rank": 1, "work_id": "w2"}, "token"),
    ({"event": "requeued_deferred", "work_id": "ghost"}, "work_id"),
]


@pytest.mark.parametrize(("forged", "field"), FORGERIES, ids=[f for _, f in FORGERIES])
def test_a_forged_event_with_a_valid_checksum_is_typed_corruption(
    tmp_path: Path, forged: Any, field: str
) -> None:
    """Issue 13, example 5: these passed verify and ended inspect, stats, compact, deferred and
    CampaignState.open in KeyError/TypeError/AttributeError tracebacks."""
    import subprocess
    import sys

    from durable_dispatch.errors import JournalCorruptError

    d = tmp_path / "st"
    with _open(d) as s:
        s.submit(ITEMS[:3])
    _forge(d / "events.jsonl", forged)
    with pytest.raises(JournalCorruptError) as ei:
        CampaignState.open(d, ranks=[1])
    assert repr(field) in str(ei.value) and ei.value.path == str(d / "events.jsonl")
    assert ei.value.offset is not None  # where the record starts
    with pytest.raises(JournalCorruptError):
        view_state(d)
    for argv in (
        ["verify", str(d)],
        ["inspect", str(d)],
        ["stats", str(d)],
        ["compact", "--dry-run", str(d)],
        ["compact", str(d)],
        ["deferred", "requeue", str(d), "w0"],
    ):
        out = subprocess.run(
            [sys.executable, "-m", "durable_dispatch", *argv], capture_output=True, text=True
        )
        assert out.returncode == 1 and "Traceback" not in out.stderr, (argv, out.stderr)


def test_a_snapshot_body_of_the_wrong_shape_is_passed_over(tmp_path: Path) -> None:
    """Issue 13, example 5: a snapshot body of [] crashed every reader."""
    from durable_dispatch.campaign.statedir import SNAPSHOT_NAME
    from durable_dispatch.errors import SnapshotCorruptError
    from durable_dispatch.storage.snapshot import encode_snapshot

    d = tmp_path / "st"
    with _open(d) as s:
        s.submit(ITEMS[:3])
    store = SnapshotStore(d, name=SNAPSHOT_NAME)
    newest = max(store.generations())
    Path(store.path_of(newest + 1)).write_bytes(encode_snapshot(newest + 1, b"[]"))
    with _open(d) as s:  # falls back to the last valid generation
        assert len(s.core.pending()) == 3
    for gen in store.generations():
        Path(store.path_of(gen)).write_bytes(encode_snapshot(gen, b'{"state":{"frontier":7}}'))
    with pytest.raises(SnapshotCorruptError, match="state.frontier"):
        _open(d)


def test_an_ill_typed_defer_record_is_typed_corruption(tmp_path: Path) -> None:
    from durable_dispatch.errors import JournalCorruptError
    from durable_dispatch.storage import DeferJournal

    path = tmp_path / "defer.jsonl"
    DeferJournal.open(path).close()
    _forge(path, {"event": "deferred", "work_id": "w", "attempts": "x"})
    with pytest.raises(JournalCorruptError, match="attempts"):
        DeferJournal.open(path)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4) | st.floats(0, 2),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
_MEMBERS = [
    "work_id",
    "work_ids",
    "token",
    "rank",
    "items",
    "epoch",
    "attempts",
    "kind",
    "kinds",
    "error",
    "last_error",
    "source",
    "split",
    "result",
    "results",
]


@st.composite
def _forged_events(draw: Any) -> Any:
    """Mostly well-formed-looking events of every kind with some members dropped or retyped."""
    kind = draw(
        st.sampled_from(
            [
                "epoch",
                "submitted",
                "dispatched",
                "committed",
                "requeued",
                "deferred",
                "requeued_deferred",
                "future-kind",
                7,
            ]
        )
    )
    ev: dict[str, Any] = {"event": kind}
    for name in draw(st.lists(st.sampled_from(_MEMBERS), max_size=5, unique=True)):
        ev[name] = draw(
            st.one_of(
                _JSON,
                st.sampled_from(["w0", "w1", "ghost", "e1-1", "e1-2", "e9-3"]),
                st.just(["w0"]),
                st.just(["ghost"]),
                st.just([{"work_id": "w0"}]),
            )
        )
    return draw(st.one_of(st.just(ev), _JSON))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(_forged_events(), min_size=1, max_size=4))
def test_semantic_forgeries_are_typed_errors_or_folded(events: list[Any]) -> None:
    """The fuzzer of issue 13: records with a valid checksum and any content. Folding them is
    either fine or a schema error (which the readers turn into JournalCorruptError), never a
    KeyError, TypeError or AttributeError; and a state that folded them restores a core."""
    from durable_dispatch.schema import Invalid

    proj = Ledger()
    proj.apply_record({"event": "epoch", "epoch": 1})
    proj.apply_record({"event": "submitted", "items": [{"work_id": "w0"}, {"work_id": "w1"}]})
    for ev in events:
        try:
            proj.apply_record(ev)
        except Invalid:
            return
    Dispatcher.restore(proj.to_snapshot(), epoch=proj.epoch + 1, ranks=[1])


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(events=st.lists(_forged_events(), min_size=1, max_size=3))
def test_forged_records_in_a_state_directory_open_or_are_typed_corruption(
    tmp_path_factory: Any, events: list[Any]
) -> None:
    """Issue 29.5, the same forgeries on disk, checksummed, behind a real campaign's records:
    CampaignState.open and compaction either succeed or raise JournalCorruptError, and a
    refused journal is left as it was."""
    from durable_dispatch.campaign.admin import compact_state
    from durable_dispatch.errors import JournalCorruptError

    d = tmp_path_factory.mktemp("forged")
    with _open(d) as s:
        s.submit(ITEMS[:3])
        sent = s.next_send(1.0)
        assert isinstance(sent, Send)
        s.sent(sent.token, 1.0)
    journal = d / "events.jsonl"
    for ev in events:
        _forge(journal, ev)
    before = journal.read_bytes()
    try:
        _open(d).close()
    except JournalCorruptError:
        assert journal.read_bytes() == before
        with pytest.raises(JournalCorruptError):
            compact_state(d)
        assert journal.read_bytes() == before
        return
    compact_state(d)
    _open(d).close()


def test_the_facade_loop_of_the_readme_runs_a_campaign_with_faults(tmp_path: Path) -> None:
    """Issue 16: the shell paired every core call with state.persist(...) and had to remember
    complete_commits(); the README's loop now calls only the facade. Silent, malformed and
    partial workers all recover; every item commits once and the callback sees each once."""
    import time

    from durable_dispatch.core import Send

    seen: list[str] = []
    with CampaignState.open(tmp_path, ranks=(1, 2, 3), watchdog=WatchdogConfig(5)) as state:
        state.redeliver(lambda wid, result: seen.append(wid))
        state.submit(WorkItem(f"w{i:02d}", {"i": i}) for i in range(30))
        now, late, turn = 0.0, [], 0
        while not state.core.done:
            turn += 1
            assert turn < 5000, "the campaign did not finish"
            for rank, token in [(r, t) for when, r, t in late if when <= now]:
                state.on_ready(rank, token, now)
            late = [x for x in late if x[0] > now]
            answers = []
            failed_send = turn == 3  # one send fails: its rank stays parked (W6)
            while (s := state.next_send(now, 2)) is not None:
                assert isinstance(s, Send)
                state.sent(s.token, now, "link down" if failed_send else None)
                ids = [w.work_id for w in s.items]
                if failed_send:
                    failed_send = False
                    continue

                def first(wid: str, ids: list[str] = ids) -> bool:
                    return wid in ids and state.core.attempts(wid) == 0

                if first("w05"):
                    late.append((now + 10, s.rank, str(s.token)))  # silent: the watchdog
                    continue
                values = [{"done": w} for w in ids]
                errors = {ids.index("w09"): "raised"} if first("w09") else None
                if first("w13"):
                    values = None  # malformed: the READY joins it
                answers.append((s.rank, str(s.token), values, errors))
            for rank, token, values, errors in answers:
                state.on_results(rank, token, values, now, errors=errors)
            for rank, token, _, _ in answers:
                state.on_ready(rank, token, now)
            now += 1.0
            state.tick(now)
            time.sleep(0.001)  # a real loop waits for messages; the group commit's fsync runs
        state.deliver(wait=True)
    assert sorted(seen) == [f"w{i:02d}" for i in range(30)]  # each delivered once
    p = view_state(tmp_path).projection
    assert len(p.committed) == 30 and p.duplicate_commits == 0
    assert {"w05", "w09", "w13"} <= set(p.kinds)


# ------------------------------------------------------- the compact form and the store (S8)
def _die(s: CampaignState) -> None:
    """The master dies: no final snapshot, its files just let go of."""
    s.journal.close()
    s.submissions.close()
    s.defer.close()
    s._lock.release()
    s._closed = True


def _some_fail(send: Send) -> str:
    """Every fourth dispatch hangs, every fourth after it is malformed."""
    return ("ok", "silent", "ok", "malformed")[send.token.n % 4]


def _newest_state(d: Path) -> dict[str, Any]:
    from durable_dispatch.campaign.statedir import SNAPSHOT_NAME

    snap = SnapshotStore(d, name=SNAPSHOT_NAME).load()
    assert snap is not None
    return dict(snap.value["state"])


def test_snapshots_name_items_by_index_and_a_reopen_equals_live(tmp_path: Path) -> None:
    items = [WorkItem(f"w{i}", {"seed": i, "pad": "x" * 50}) for i in range(3000)]
    s = _open(tmp_path, retry=RetryPolicy(2))
    s.submit(items)
    with pytest.raises(AssertionError, match="did not finish"):  # stopped part way
        fake_campaign(s, max_turns=40, behave=_some_fail)  # rollbacks: S8 snapshots
    s.save_snapshot("test")
    live = s.core.snapshot()
    state = _newest_state(tmp_path)
    assert state["form"] == 2 and state["size"] == 3000
    assert len(orjson.dumps(state)) < 4000  # runs and indices: no payload of 3,000 items
    assert live["frontier"] and live["committed"]
    _die(s)
    with _open(tmp_path) as s2:
        back = s2.core.snapshot()
    for k in ("committed", "deferred", "attempts", "kinds", "solo"):
        assert back[k] == live[k], k
    # the rollback of the restart puts what was in flight first; the rest keeps its order
    pending = [w["work"]["work_id"] for w in live["in_flight"][::-1]] + [
        w["work_id"] for w in live["frontier"]
    ]
    assert sorted(w["work_id"] for w in back["frontier"]) == sorted(pending)
    payloads = {w["work_id"]: w["payload"] for w in back["frontier"]}
    assert all(payloads[i.work_id] == i.payload for i in items if i.work_id in payloads)


OLD = Path(__file__).parent / "testdata" / "state-95632d3"


def test_a_state_directory_of_the_last_version_opens_and_moves_to_the_store(
    tmp_path: Path,
) -> None:
    """A directory written by 95632d3 (snapshots holding every payload, no submissions store,
    a master that died with w04 in flight) opens with nothing lost; its items move to the
    store and the next snapshots are compact."""
    import shutil

    from durable_dispatch.campaign.results import read_results
    from durable_dispatch.campaign.statedir import SUBMISSIONS

    d = tmp_path / "old"
    shutil.copytree(OLD, d)
    assert not (d / SUBMISSIONS).exists()
    with CampaignState.open(d, ranks=(1,)) as s:
        core = s.core
        assert core.committed() == {"w00", "w01", "w03"} and set(core.deferred()) == {"w02"}
        assert core.pending() == [f"w{i:02d}" for i in range(4, 15)]  # w04 rolled back first
        assert core.ledger.items["w05"].payload == {"seed": 5, "name": "item 5"}
        assert core.ledger.items["w13"].payload == {"seed": 13}
        assert core.statistics().master_restart_rollbacks == 1
    assert _newest_state(d)["form"] == 2
    stored = [w for r in read_journal(d / SUBMISSIONS) for w in r.payload["items"]]
    assert len(stored) == 15
    with CampaignState.open(d, ranks=(1,)) as s:
        assert s.core.pending() == [f"w{i:02d}" for i in range(4, 15)]
        assert s.core.ledger.items["w05"].payload == {"seed": 5, "name": "item 5"}
    assert sorted(r.work_id for r in read_results(d)) == ["w00", "w01", "w03"]


def test_items_stored_before_a_crash_are_submitted_at_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between the store's fsync and the journal's record of a submission: the items
    were durable, so the next open submits them (once), in order."""
    s = _open(tmp_path)
    s.submit(ITEMS[:3])

    def crash(*a: Any, **k: Any) -> None:
        raise KeyboardInterrupt("the master dies")

    monkeypatch.setattr(s._admission, "_announce", crash)  # (the part that announces)
    with pytest.raises(KeyboardInterrupt):
        s.submit(ITEMS[3:])
    _die(s)
    with _open(tmp_path) as s2:
        assert s2.core.pending() == [i.work_id for i in ITEMS]
        assert s2.core.ledger.items["w7"].payload == {"i": 7}
        assert s2.submit(ITEMS) == 0  # the work source again: all known
    with _open(tmp_path) as s3:
        assert s3.core.pending() == [i.work_id for i in ITEMS]


def test_a_store_that_is_not_durable_keeps_submissions_in_the_journal(tmp_path: Path) -> None:
    """When the submissions store cannot be fsynced, the journal's records carry the items and
    no snapshot names what the store may lose; a crash then loses nothing."""
    from durable_dispatch.campaign.statedir import SUBMISSIONS

    items = [WorkItem(f"w{i}", {"i": i}) for i in range(700)]  # more than one record
    s = _open(tmp_path)
    s.submit(items[:5])
    with inject_faults() as faults:
        faults.fail("fsync", errno.EIO, path=f"*{SUBMISSIONS}")
        s.submit(items[5:])
        assert s.statistics().submissions_health["state"] == "DEGRADED"
        assert s.save_snapshot("test") is False
        assert s.statistics().snapshot_failures == 1
    recs = [r.payload for r in s.journal.records() if r.payload["event"] == "submitted"]
    assert [(r["first"], len(r["items"])) for r in recs[1:]] == [(5, 512), (517, 183)]
    assert recs[1]["items"][0]["work_id"] == "w5"
    _die(s)
    with _open(tmp_path) as s2:
        assert s2.core.pending() == [i.work_id for i in items]
        assert s2.core.ledger.items["w619"].payload == {"i": 619}
    with _open(tmp_path) as s3:  # its own snapshot, of the compact form, loads too
        assert s3.core.pending() == [i.work_id for i in items]
    assert _newest_state(tmp_path)["form"] == 2


def test_a_submission_is_durable_when_submit_returns(tmp_path: Path) -> None:
    """Even one item at a time: the store is fsynced before the journal names the items, and
    the journal's records name them by index (the crash harness checks the durability)."""
    from durable_dispatch.storage import fs

    syncs: list[str] = []
    with _open(tmp_path) as s:
        prev = fs.set_recorder(
            lambda op, path, detail: syncs.append(path) if op == "fsync" else None
        )
        try:
            for item in ITEMS[:5]:
                s.submit([item])
        finally:
            fs.set_recorder(prev)
        assert len([p for p in syncs if p.endswith(SUBMISSIONS)]) == 5
        recs = [r.payload for r in s.journal.records() if r.payload["event"] == "submitted"]
        assert [(r["first"], r["count"]) for r in recs] == [(i, 1) for i in range(5)]
    with _open(tmp_path) as s2:
        assert s2.core.pending() == [i.work_id for i in ITEMS[:5]]


def test_an_item_too_large_to_store_is_refused_after_the_ones_before_it(tmp_path: Path) -> None:
    from durable_dispatch.errors import RecordTooLargeError

    huge = WorkItem("huge", "x" * (2 << 20))  # beyond a record's bound (1 MiB by default)
    with _open(tmp_path) as s:
        with pytest.raises(RecordTooLargeError, match="huge"):
            s.submit([*ITEMS, huge, WorkItem("after")])
        assert s.core.pending() == [i.work_id for i in ITEMS]
    with _open(tmp_path) as s2:
        assert s2.core.pending() == [i.work_id for i in ITEMS]
        assert s2.core.status("huge") is None and s2.core.status("after") is None


def test_compaction_keeps_every_payload_in_the_store(tmp_path: Path) -> None:
    from durable_dispatch.campaign.admin import compact_state

    items = [WorkItem(f"w{i}", {"i": i, "blob": "y" * i}) for i in range(600)]
    with _open(tmp_path) as s:
        s.submit(items)
        with pytest.raises(AssertionError, match="did not finish"):
            fake_campaign(s, max_turns=30, behave=_some_fail)
        pending = s.core.pending()
    rep = compact_state(tmp_path)
    assert rep.records_after == 0 and pending
    with _open(tmp_path) as s2:
        assert s2.core.pending()[-10:] == pending[-10:]
        assert all(
            s2.core.ledger.items[w].payload == {"i": int(w[1:]), "blob": "y" * int(w[1:])}
            for w in pending
        )
        fake_campaign(s2)
        assert s2.core.committed() | set(s2.core.deferred()) == {i.work_id for i in items}


def test_the_facade_tells_the_loop_when_it_cannot_go_on(tmp_path: Path) -> None:
    """Issue 30: stop_reason, on_gone and done are the facade's, so a hand-written loop stops
    where run_master stops: every worker parked for the grace, or every worker gone."""
    with _open(tmp_path, ranks=(1, 2), watchdog=WatchdogConfig(5)) as s:
        s.submit(ITEMS[:4])
        a, b = s.next_send(0.0), s.next_send(0.0)
        assert isinstance(a, Send) and isinstance(b, Send)
        s.sent(a.token, 0.0)
        s.sent(b.token, 0.0)
        assert s.stop_reason(1.0, grace=3.0) is None and not s.done
        s.tick(6.0)  # both deadlines passed: both ranks parked
        assert sorted(s.core.parked_ranks()) == [1, 2]
        assert s.stop_reason(6.0, grace=3.0) is None  # the grace starts now
        assert s.stop_reason(9.5, grace=3.0) == "every worker parked"
        s.on_ready(1, str(a.token), 10.0)  # its exact READY: it serves again
        assert s.stop_reason(10.0, grace=3.0) is None
        assert s.on_gone(1, "IsolationError: cannot load", 11.0) == []  # it held no work
        s.on_gone(1, "again", 11.0)  # a second GONE of a lost rank is ignored
        assert s.stop_reason(11.0, grace=3.0) is None  # rank 2 is parked, not gone
        s.rank_lost(2, 12.0)
        assert s.stop_reason(12.0, grace=3.0) == "no workers left"
        assert not s.done and len(s.core.pending()) == 4  # nothing lost: it resumes later


def test_priorities_are_served_first_and_kept_by_snapshots_and_the_journal(
    tmp_path: Path,
) -> None:
    """G2 (issue 31) on real files: higher priority first, FIFO within one, through rollbacks
    (compact S8 snapshots with levels), items submitted after the last snapshot (the journal),
    a master death and a reopen; every item commits once."""
    low = [WorkItem(f"low{i:03d}", {"i": i}) for i in range(120)]
    high = [WorkItem(f"hi{i:02d}", {"i": i}, priority=4) for i in range(12)]
    s = _open(tmp_path, retry=RetryPolicy(5))
    s.submit(low + high + [WorkItem("last", priority=-3)])
    with pytest.raises(AssertionError, match="did not finish"):
        fake_campaign(s, max_turns=2, behave=_some_fail)  # rollbacks: S8 snapshots
    state = _newest_state(tmp_path)
    assert [level for level, _runs in state.get("priorities", ())] == [4, -3], state
    s.submit([WorkItem(f"top{i}", priority=9) for i in range(3)])  # in the journal only
    live = [w["work_id"] for w in s.core.snapshot()["frontier"]]
    flying = {w["work"]["work_id"] for w in s.core.snapshot()["in_flight"]}
    _die(s)
    with _open(tmp_path, retry=RetryPolicy(5)) as s2:
        back = [w["work_id"] for w in s2.core.snapshot()["frontier"]]
        # the restart's rollback puts what was in flight at the front of its own priority
        assert [w for w in back if w not in flying] == live
        prio = {w["work_id"]: w.get("priority", 0) for w in s2.core.snapshot()["frontier"]}
        assert [prio[w] for w in back] == sorted(prio.values(), reverse=True)
        assert back[:3] == ["top0", "top1", "top2"] and back[-1] == "last"
        fake_campaign(s2)
    order = _committed_events(tmp_path)
    assert len(order) == len(set(order)) == 136
    first_low = min(order.index(w.work_id) for w in low)
    assert all(order.index(w.work_id) < first_low for w in high)
    assert order.index("last") > max(order.index(w.work_id) for w in low)


def test_a_deferral_the_defer_journal_lost_is_recorded_again_at_the_next_open(
    tmp_path: Path,
) -> None:
    """The disk fills as an item is deferred: the state journal's ``deferred`` event is
    durable, the defer journal's record only in memory, and the master ends (NotDurableError).
    The next open records it again from the state journal: ``deferred list`` shows it, and the
    futures executor, which reads failures there, does not wait for it forever (torture seed
    60472493 hung so)."""
    from durable_dispatch.errors import NotDurableError

    with inject_faults() as f:
        s = _open(tmp_path, ranks=(1,), retry=RetryPolicy(0))
        s.submit(ITEMS[:1])
        f.fail("fsync", errno.ENOSPC, path=f"{tmp_path}/.dispatch_protocol_deferred.jsonl*")
        f.fail("write", errno.ENOSPC, path=f"{tmp_path}/.dispatch_protocol_deferred.jsonl*")
        x = s.next_send(0.0)
        assert x is not None
        s.persist(s.core.mark_dispatched(x.token, 0.0))
        s.persist(s.core.on_results(1, str(x.token), [None], 0.0, errors={0: "boom"}))
        s.persist(s.core.on_ready(1, str(x.token), 0.0))
        s.persist(s.core.join_invalid(0.0))
        assert set(s.core.deferred()) == {"w0"} and "w0" in s.defer
        with pytest.raises(NotDurableError):
            s.close()
    with _open(tmp_path, ranks=(1,)) as s2:
        assert set(s2.core.deferred()) == {"w0"}
        d = s2.defer.get("w0")
        assert d is not None and d.attempts == 1 and list(d.kinds) == ["error"]
        assert "boom" in (d.last_error or "")


def test_a_bulk_submit_freezes_its_items_and_the_last_close_unfreezes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50: the items of a bulk build go to the collector's permanent generation, so no
    collection walks the queue again; the state's close gives them back."""
    import gc

    from durable_dispatch.campaign import replay

    monkeypatch.setattr(replay, "_built", 0)
    # From a clean slate: under `-n 2` this process ran other modules' tests before, and twice
    # (of seven full runs) objects were still frozen here (144,988; 130,564). One cause is
    # found and fixed (a freeze under a closing state: the tests below); the other is not
    # known. What this test checks is its own state's freeze and the close that gives it back.
    replay._holders.clear()  # (no state is open between two tests, so no holder is live)
    gc.unfreeze()
    _bulk_submit_freezes_and_the_last_close_unfreezes(tmp_path, monkeypatch)


def _bulk_submit_freezes_and_the_last_close_unfreezes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    from durable_dispatch.campaign import replay

    assert gc.get_freeze_count() == 0
    st = CampaignState.open(tmp_path / "s", ranks=[1])
    st.submit([WorkItem(f"w{i}", i) for i in range(100)])  # a small one: not frozen
    assert gc.get_freeze_count() == 0
    st.submit(WorkItem(f"b{i}", {"i": i}) for i in range(replay.FREEZE_AT + 1000))
    assert gc.get_freeze_count() > replay.FREEZE_AT
    assert not gc.is_tracked(st.core.ledger.ids.index)  # (work ID -> index: no container)
    other = CampaignState.open(tmp_path / "t", ranks=[1])
    other.close()  # froze nothing: unfreezes nothing
    assert gc.get_freeze_count() > replay.FREEZE_AT
    st.close()
    assert gc.get_freeze_count() == 0
    # small submits freeze once FREEZE_EVERY objects piled up, after a full collection
    monkeypatch.setattr(replay, "FREEZE_EVERY", 3000)
    with CampaignState.open(tmp_path / "t", ranks=[1]) as st:
        for k in range(0, 5000, 500):
            st.submit([WorkItem(f"s{i}", {"i": i}) for i in range(k, k + 500)])
        assert gc.get_freeze_count() > 0
        young = {id(o) for o in gc.get_objects()}
        left = sum(id(w) in young for w in st.core.ledger.items.values())
        assert left <= 2000  # the items since the last freeze (at 3,000) only
    assert gc.get_freeze_count() == 0
    # a reopen of a large state freezes what it built, until it closes
    with CampaignState.open(tmp_path / "s", ranks=[1]) as st:
        assert gc.get_freeze_count() > replay.FREEZE_AT
    assert gc.get_freeze_count() == 0


def test_children_submitted_by_the_close_s_last_delivery_are_not_left_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50's freeze outlived a closed state: its close gave the frozen objects back first,
    then delivered the commits its last fsync covered; a callback that returned children
    submitted them, that submit froze (``FREEZE_EVERY`` reached) under the closing state, and
    no close came after it: ``gc.freeze()`` freezes every object alive, so the whole process's
    cycles were never collected again. (Under ``-n 2`` one full run found 144,988 objects
    frozen before the test above.) The close now gives them back last."""
    import gc

    from durable_dispatch.campaign import replay

    replay._holders.clear()  # (from a clean slate: see the test above; no state is open
    gc.unfreeze()  # between two tests, so no holder is live)
    monkeypatch.setattr(replay, "_built", 0)
    monkeypatch.setattr(replay, "FREEZE_EVERY", 10)

    def children(wid: str, _result: Any) -> list[WorkItem] | None:
        return None if "." in wid else [WorkItem(f"{wid}.c{i}") for i in range(20)]

    state = CampaignState.open(tmp_path / "s", ranks=[1], on_commit=children)
    state.submit([WorkItem("a")])
    assert gc.get_freeze_count() == 0
    real = state.deliver
    # the commit's fsync has not come back before the close: only the close delivers it
    monkeypatch.setattr(state, "deliver", lambda wait=False: wait and real(wait=True))
    send = state.next_send(0.0, 1)
    assert send is not None
    state.sent(send.token, 0.0)
    state.on_results(send.rank, str(send.token), [1], 0.0)
    assert gc.get_freeze_count() == 0  # (not delivered yet: no children)
    state.close()  # delivers "a": its 20 children are submitted, and that froze
    assert gc.get_freeze_count() == 0 and not replay._holders
    assert view_state(tmp_path / "s").summary()["pending"] == 20


def test_frozen_items_are_freed_as_they_commit_not_held_for_the_campaign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50: a frozen object is still freed by reference counting when it dies, so a
    campaign fed in bulk chunks (each frozen) holds only what is queued, not what it ran."""
    import gc

    from durable_dispatch.campaign import replay
    from durable_dispatch.mpi import master as master_mod
    from durable_dispatch.mpi import run_master
    from durable_dispatch.testing import LocalWorkers

    monkeypatch.setattr(replay, "FREEZE_AT", 250)
    monkeypatch.setattr(master_mod._Source, "CHUNK", 1000)
    monkeypatch.setattr(master_mod._Source, "LOW", 250)
    seen: list[int] = []

    class Watch(LocalWorkers):
        def receive(self, limit: int) -> Any:
            seen.append(gc.get_freeze_count())
            return super().receive(limit)

    n = 20_000  # 20 chunks, each a bulk build that froze
    items = (WorkItem(f"w{i:06d}", {"i": i, "pad": "x" * 20}) for i in range(n))
    report = run_master(items, tmp_path / "s", comm=Watch(lambda p: p["i"], 4), batch=64)
    assert report.finished
    frozen = [x for x in seen if x]  # the first freeze took the whole heap (pytest's too)
    assert frozen and max(frozen) - min(frozen) < n // 4  # a few chunks' items, not n
    assert gc.get_freeze_count() == 0  # closed: unfrozen


@pytest.mark.parametrize("outcome", ["ok", "fails"])
def test_the_open_does_not_wait_for_its_journals_directory_fsync_and_nothing_is_durable_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    """Issue 49: one directory fsync makes the journals a fresh open created durable; it runs
    beside the rest of the open (on a shared filesystem one fsync's wait less before the first
    submission). Held here until the test lets it go: the open returns meanwhile, and a
    journal's fsync waits for it, so what the journal reports durable is durable; if it fails,
    the journal fsyncs the directory itself (S1)."""
    import errno
    import threading
    import time

    from durable_dispatch.storage import fs

    d = tmp_path / "s"
    real = fs.fsync_dir
    held, calls = threading.Event(), []

    def fsync_dir(directory: str) -> None:
        if os.path.abspath(directory) == str(d):
            calls.append(threading.current_thread().name)
            if len(calls) == 1:
                assert held.wait(30)
                if outcome == "fails":
                    raise OSError(errno.EIO, "injected", directory)
        real(directory)

    monkeypatch.setattr(fs, "fsync_dir", fsync_dir)
    opened: list[CampaignState] = []
    t = threading.Thread(target=lambda: opened.append(CampaignState.open(d)))
    t.start()
    synced: list[int] = []
    try:
        t.join(15)
        assert opened, "the open waited for its journals' directory fsync"
        state = opened[0]  # (its epoch record waits in the journal, not durable yet)
        s = threading.Thread(target=lambda: synced.append(state.journal.sync_now()))
        s.start()
        time.sleep(0.3)
        assert not synced and state.journal.durable_seq < 0  # nothing durable before it
        assert calls == ["fsync-state-dir"]
        held.set()
        s.join(30)
        assert synced and synced[0] >= 0 and state.journal.durable_seq == synced[0]
        if outcome == "ok":
            assert calls == ["fsync-state-dir"]  # one for the three journals
        else:  # each journal that fsynced since did the directory's itself first
            assert calls[0] == "fsync-state-dir" and len(calls) >= 2, calls
    finally:
        held.set()
        t.join(30)
        for st_ in opened:
            st_.close()
    with CampaignState.open(d) as again:  # the epoch it made was durable
        assert again.core.epoch == 2


def test_an_interrupt_while_the_close_waits_for_the_directory_fsync_is_raised_after_closing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C (here a signal's exception) while the close waits for the journals' directory
    fsync (still running beside, on a stalled shared filesystem say) is not lost: the close
    goes on to its end, then raises it; the lock is let go and the next open works."""
    import signal
    import threading

    from durable_dispatch.campaign.statedir import _master_running
    from durable_dispatch.storage import fs

    class Interrupted(Exception):
        pass

    d = tmp_path / "s"
    real = fs.fsync_dir
    held, entered = threading.Event(), threading.Event()

    def fsync_dir(directory: str) -> None:
        if os.path.abspath(directory) == str(d) and not entered.is_set():
            entered.set()
            assert held.wait(30)
        real(directory)

    def on_signal(signum: int, frame: object) -> None:
        held.set()  # the fsync ends only after the interrupt reached the closing thread
        raise Interrupted

    monkeypatch.setattr(fs, "fsync_dir", fsync_dir)
    old = signal.signal(signal.SIGUSR1, on_signal)
    try:
        state = CampaignState.open(d)
        assert entered.wait(15)
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        with pytest.raises(Interrupted):
            state.close()
    finally:
        held.set()
        signal.signal(signal.SIGUSR1, old)
    assert state.closed and not _master_running(str(d))
    with CampaignState.open(d) as again:
        assert again.core.epoch == 2


def test_a_submit_to_a_closed_state_freezes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50's freeze under a closed holder would never be given back (its close came
    first): a submit during or after the close (a Feed's thread, a callback's children) that
    finds the small builds' count over ``FREEZE_EVERY`` freezes nothing."""
    import gc

    from durable_dispatch.campaign import replay

    replay._holders.clear()  # (a clean slate: see the tests above)
    gc.unfreeze()
    state = CampaignState.open(tmp_path / "s", ranks=[1])
    state.close()
    monkeypatch.setattr(replay, "_built", replay.FREEZE_EVERY + 1)
    with pytest.raises(Exception):  # noqa: B017 - whatever a closed journal raises
        state.submit([WorkItem("late")])
    assert gc.get_freeze_count() == 0 and not replay._holders


def test_a_result_that_fits_a_record_only_without_its_cost_is_kept(tmp_path: Path) -> None:
    """What an attempt cost rides in its commit's record (issue 62); a result that fits the
    record bound alone but not beside its cost was refused (retried, then deferred as
    "result too large"): the result is the user's, the cost the library's. It is kept, its
    cost left out."""
    import time

    from durable_dispatch.core.events import Committed

    bound = 2048
    cost = {"cpu": 0.25, "rss": 123456789, "by": "in-process"}  # (about 55 bytes in a record)
    with _open(
        tmp_path, ranks=(1,), retry=RetryPolicy(0), journal_options={"max_record_bytes": bound}
    ) as s:
        s.submit(ITEMS[:1])
        core = s.core
        x = s.next_send(0.0, 1)
        assert x is not None
        s.persist(core.mark_dispatched(x.token, 0.0))
        w0 = x.items[0].work_id
        empty = Committed(x.token, 1, (w0,), ({"r": ""},), time.time()).encode()
        size = bound - 20 - len(orjson.dumps(empty))  # fits alone, not with the cost
        s.note_usage(1, str(x.token), {w0: cost})
        s.persist(core.on_results(1, str(x.token), [{"r": "a" * size}], 0.0))
        s.deliver(wait=True)
        assert core.committed() == {w0} and not core.deferred()
    with _open(tmp_path) as s2:
        assert s2.core.committed() == {w0}
