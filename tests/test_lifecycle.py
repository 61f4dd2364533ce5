"""A run's fixed cost: the fsyncs and metadata operations a campaign run makes from its open to
its close, counted through the fs seam (a count, not a time), each one's purpose, and a crash
right after each fsync recovered.

On a shared filesystem each fsync costs about 5 ms and each one in a row adds to the run's
open and close; the count below cannot grow without this file saying why.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from durable_dispatch.campaign.identity import recorded_name
from durable_dispatch.campaign.publication import STATS_SECONDS
from durable_dispatch.campaign.replay import event_work_ids
from durable_dispatch.campaign.statedir import STATE_JOURNAL
from durable_dispatch.storage.journal import read_journal

ROOT = Path(__file__).resolve().parent.parent
N = 128  # two dispatches of 64

#: Every fsync of a fresh run but the state journal's group commits, with its purpose.
FIXED = {
    # the new state directory's entry in its parent (beside the lock and the claim)
    ("dir-fsync", "parent directory"): 1,
    # the owner record's claim at the open (before its link), its release at the close
    # (beside the closing snapshot; renamed over the claim once the journals closed)
    ("fsync", "owner record"): 2,
    # the entries of the three journals the open created (one for all three, beside the
    # open); the campaign name's entry (beside the name's own fsync); the closing snapshot's
    # rename
    ("dir-fsync", "state directory"): 3,
    # the campaign's name, made under its own name
    ("fsync", "campaign name"): 1,
    # the items, durable before the first dispatch
    ("fsync", "submissions.jsonl"): 1,
    # the closing snapshot, before its rename
    ("fsync", "snapshot"): 1,
}
#: Every create, rename, link, unlink and mkdir of a fresh run but the statistics' (a display,
#: saved as often as its period allows: this depends on timing).
METADATA = {
    ("mkdir", "state directory"): 1,
    ("create", "master.lock"): 1,
    # the claim (a temporary file linked to its name, then unlinked) and the release (a
    # temporary file renamed over the claim)
    ("create", "owner record"): 2,
    ("link", "owner record"): 1,
    ("unlink", "owner record"): 1,
    ("replace", "owner record"): 1,
    ("create", ".dispatch_protocol_deferred.jsonl"): 1,
    ("create", "submissions.jsonl"): 1,
    ("create", "events.jsonl"): 1,
    # made under its own name: no temporary file, no rename
    ("create", "campaign name"): 1,
    ("create", "snapshot"): 1,
    ("replace", "snapshot"): 1,
}
#: The statistics' saves (each a create and a rename): the first, the last, and one at most
#: every STATS_SECONDS between them.
#: The state journal's group commits (the epoch beside the open, the dispatches and commits,
#: the close's last records) are as many as the flusher's batches, which depends on timing: at
#: most one for each record of the journal, never one with nothing new to make durable.


def _run(state: Path, out: Path, kill_at: int = 0) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tests.children.fixedcost_run", str(state), str(out), str(N)]
    if kill_at:
        cmd.append(str(kill_at))
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def _operations(state: Path, out: Path) -> tuple[list[tuple[str, str]], float]:
    """What the run on ``state`` did, in order, and how long it took (seconds)."""
    res = _run(state, out)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["finished"]
    return [(op, kind) for op, kind in got["operations"]], float(got["seconds"])


def _committed_once(state: Path) -> None:
    """Every item committed, none twice, the name recorded."""
    commits: Counter[str] = Counter()
    for rec in read_journal(state / STATE_JOURNAL):
        if rec.payload.get("event") == "committed":
            commits.update(event_work_ids(rec.payload))
    assert set(commits) == {f"t{i}" for i in range(N)}, sorted(set(commits))[:5]
    assert max(commits.values()) == 1, commits.most_common(3)
    assert recorded_name(state) == "fixedcost"


def test_a_fresh_run_makes_these_fsyncs_and_metadata_operations_and_no_more(
    tmp_path: Path,
) -> None:
    """A fresh run of 128 items at batch 64 from open to close: the fixed fsyncs and metadata
    operations exactly, the state journal's group commits and the statistics' saves bounded.
    (The campaign name was written to a temporary file renamed into place, its fsync and its
    directory's one after the other: a rename and a wait more in a row than now.)"""
    seen, took = _operations(tmp_path / "s", tmp_path / "out.json")
    syncs = Counter(o for o in seen if o[0].endswith("fsync"))
    events = syncs.pop(("fsync", "events.jsonl"), 0)
    assert dict(syncs) == FIXED, seen
    records = sum(1 for _ in read_journal(tmp_path / "s" / STATE_JOURNAL))
    assert 1 <= events <= records, (events, records, seen)
    meta = Counter(o for o in seen if not o[0].endswith("fsync"))
    stats = meta.pop(("create", "statistics"), 0)
    assert meta.pop(("replace", "statistics"), 0) == stats, seen
    assert stats <= 2 + took / STATS_SECONDS, (stats, took, seen)
    assert dict(meta) == METADATA, seen
    _committed_once(tmp_path / "s")


def test_a_crash_right_after_each_fsync_of_a_run_is_recovered(tmp_path: Path) -> None:
    """The run SIGKILLed right after each of its fsyncs in turn, then run again on the same
    directory: every item is committed once, the name recorded, the directory opens. What
    each fsync made durable is what the next open starts from."""
    first, _ = _operations(tmp_path / "count", tmp_path / "count.json")
    for k in range(1, sum(op.endswith("fsync") for op, _ in first) + 1):
        state = tmp_path / f"s{k}"
        res = _run(state, tmp_path / f"killed{k}.json", kill_at=k)
        # (a run makes at least the fixed fsyncs and one group commit; past those, one whose
        # flusher batched more makes fewer than the run counted, and ends unkilled)
        fewer = res.returncode == 0 and k > sum(FIXED.values()) + 1
        assert res.returncode == -signal.SIGKILL or fewer, (k, res.returncode, res.stderr[-3000:])
        again = _run(state, tmp_path / f"again{k}.json")
        assert again.returncode == 0, (k, again.stderr[-3000:])
        assert json.loads((tmp_path / f"again{k}.json").read_text())["finished"], k
        _committed_once(state)


@pytest.mark.parametrize("damaged", [b"", b'{"campaign": '])
def test_a_name_file_a_crash_left_empty_or_torn_is_replaced(tmp_path: Path, damaged: bytes) -> None:
    """The name is made under its own name now, so a crash before its fsync can leave it empty
    or torn: it reads as no name, and the next run records it whole (a temporary file, its
    fsync, a rename, the directory's fsync)."""
    from durable_dispatch.campaign.identity import CAMPAIGN_FILE, record_name

    d = tmp_path / "s"
    d.mkdir()
    (d / CAMPAIGN_FILE).write_bytes(damaged)
    assert recorded_name(d) is None
    assert record_name(d, "fixedcost")
    assert recorded_name(d) == "fixedcost"
    assert sorted(p.name for p in d.iterdir()) == [CAMPAIGN_FILE]


def test_a_resume_fsyncs_the_earlier_run_s_journals_side_by_side(tmp_path: Path) -> None:
    """What an earlier run left unsynced in the three journals is fsynced at the resume before
    it counts as durable: one journal after the other before (three fsyncs' waits in a row on
    a shared filesystem), side by side now. Each of the three fsyncs waits here until all three
    are under way: one after the other, they never are (the wait gives up after 10 s)."""
    import threading

    from durable_dispatch import CampaignState, WorkItem
    from durable_dispatch.storage import fs

    d = tmp_path / "s"
    with CampaignState.open(d) as s:
        s.submit([WorkItem("a")])
    names = {STATE_JOURNAL, "submissions.jsonl", ".dispatch_protocol_deferred.jsonl"}
    assert names <= {p.name for p in d.iterdir()}
    barrier = threading.Barrier(3, timeout=10)
    met: list[str] = []
    alone: list[str] = []

    def hook(op: str, path: str) -> None:
        if op == "fsync" and Path(path).name in names and Path(path).parent == d:
            if len(met) + len(alone) >= 3:
                return  # (the run's own fsyncs after the open)
            try:
                barrier.wait()
                met.append(Path(path).name)
            except threading.BrokenBarrierError:
                alone.append(Path(path).name)

    prev = fs.set_fault_hook(hook)
    try:
        CampaignState.open(d).close()
    finally:
        fs.set_fault_hook(prev)
    assert sorted(met) == sorted(names) and not alone, (met, alone)


def test_an_earlier_run_s_journal_whose_fsync_fails_at_the_resume_is_not_fsynced_again(
    tmp_path: Path,
) -> None:
    """The fsync beside the open fails (EIO): the journal's open takes that failure as its own
    (the journal starts degraded, its records kept in memory) and never fsyncs the file again
    to find it succeed (a second fsync after a failed one may report success for lost
    data)."""
    import errno

    from durable_dispatch import CampaignState, WorkItem
    from durable_dispatch.storage.health import HealthState
    from durable_dispatch.testing import inject_faults

    d = tmp_path / "s"
    with CampaignState.open(d) as s:
        s.submit([WorkItem("a")])
    with inject_faults() as f:
        rule = f.fail("fsync", errno.EIO, path=str(d / STATE_JOURNAL), nth=1)
        s = CampaignState.open(d)
        try:
            assert rule.fired == 1
            assert s.journal.health.state is HealthState.DEGRADED, s.journal.health
        finally:
            try:
                s.close()
            except Exception:  # noqa: BLE001 - a degraded journal's close may refuse
                pass
