"""Results are user data (U6, issue 16): kept through compaction, readable beside a running
master, and delivered to the callback at least once (results.py, state.py)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from durable_dispatch import CampaignState, WatchdogConfig, WorkItem, read_results
from durable_dispatch.campaign.admin import compact_state, view_state
from durable_dispatch.campaign.results import RESULTS_JOURNAL
from durable_dispatch.testing import inject_faults

from .helpers import fake_campaign


def _campaign(d: Path, ids: list[str], **kw: Any) -> None:
    with CampaignState.open(d, ranks=(1, 2, 3), watchdog=WatchdogConfig(30)) as s:
        s.submit(WorkItem(w, {"w": w}) for w in ids)
        fake_campaign(s, **kw)


def _ids(n: int, prefix: str = "w") -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(n)]


def test_every_committed_result_is_readable_with_where_and_when_it_committed(
    tmp_path: Path,
) -> None:
    _campaign(tmp_path, _ids(20), batch=3)
    rows = list(read_results(tmp_path))
    assert [r.work_id for r in rows] == sorted(r.work_id for r in rows) == _ids(20)
    assert all(r.result == {"done": r.work_id} for r in rows)
    assert all(r.epoch == 1 and r.rank in (1, 2, 3) and r.ts and r.token for r in rows)
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)  # commit order
    only = list(read_results(tmp_path, ["w004", "w017", "nope"]))
    assert [r.work_id for r in only] == ["w004", "w017"]


def test_compaction_moves_results_into_the_results_journal_and_drops_none(
    tmp_path: Path,
) -> None:
    """Issue 16: compaction deleted every committed result ("committed results leave the
    journal with it")."""
    _campaign(tmp_path, _ids(30))
    before = [r.as_dict() for r in read_results(tmp_path)]
    rep = compact_state(tmp_path)
    assert rep.records_after == 0
    assert [r.as_dict() for r in read_results(tmp_path)] == before
    _campaign(tmp_path, _ids(10, "x"))  # a second run after the compaction
    compact_state(tmp_path)
    compact_state(tmp_path)  # nothing new: nothing moved twice
    rows = list(read_results(tmp_path))
    assert [r.work_id for r in rows] == _ids(30) + _ids(10, "x")
    moved = (tmp_path / RESULTS_JOURNAL).read_bytes().count(b'"event":"result"')
    assert moved == 40


def test_a_compaction_that_fails_after_moving_results_moves_nothing_twice(tmp_path: Path) -> None:
    _campaign(tmp_path, _ids(12))
    with inject_faults() as faults:
        faults.fail("replace", errno.EIO, path="*.snap*")  # the new snapshot cannot be renamed
        with pytest.raises(OSError):
            compact_state(tmp_path)
    assert (tmp_path / RESULTS_JOURNAL).read_bytes().count(b'"event":"result"') == 12
    compact_state(tmp_path)
    assert (tmp_path / RESULTS_JOURNAL).read_bytes().count(b'"event":"result"') == 12
    assert [r.work_id for r in read_results(tmp_path)] == _ids(12)


def test_results_are_read_beside_a_running_master_without_changing_anything(
    tmp_path: Path,
) -> None:
    with CampaignState.open(tmp_path, ranks=(1,), watchdog=WatchdogConfig(30)) as s:
        s.submit(WorkItem(w, {"w": w}) for w in _ids(8))
        fake_campaign(s)

        # The master's own statistics thread may be writing its temporary file, or publishing
        # its first statistics, at either look; what the reader must not do is create or lock
        # anything.
        def listing() -> list[str]:
            ours = (".master-stats.", "master-stats.")
            return sorted(n for n in os.listdir(tmp_path) if not n.startswith(ours))

        files = listing()
        assert [r.work_id for r in read_results(tmp_path)] == _ids(8)
        assert listing() == files  # nothing created, no lock taken


def test_an_exception_in_the_callback_loses_nothing_it_is_delivered_again(tmp_path: Path) -> None:
    """Issue 16: an exception in on_commit lost the rest of that group for good."""
    sink: dict[str, Any] = {}
    calls = []

    def on_commit(c: Any) -> None:
        calls.append(c.work_id)
        if len(calls) == 5:
            raise RuntimeError("the user's sink failed")
        sink[c.work_id] = c.result  # an upsert keyed by work ID

    with pytest.raises(RuntimeError, match="sink failed"):
        _campaign(tmp_path, _ids(12), on_commit=on_commit, batch=2)
    assert len(sink) == 4
    with CampaignState.open(tmp_path, ranks=(1, 2, 3), watchdog=WatchdogConfig(30)) as s:
        again = s.redeliver(lambda wid, result: sink.__setitem__(wid, result))
        assert again >= 1
        s.submit(WorkItem(w, {"w": w}) for w in _ids(12))
        fake_campaign(s, on_commit=lambda c: sink.__setitem__(c.work_id, c.result))
    assert sink == {w: {"done": w} for w in _ids(12)}
    with CampaignState.open(tmp_path, ranks=(1,)) as s:  # everything was delivered
        assert s.redeliver(lambda wid, result: None) == 0


SINK_CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from durable_dispatch import CampaignState, WatchdogConfig, WorkItem
from tests.helpers import fake_campaign

state, sink_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sink = open(sink_path, "a")

def deliver(work_id, result):
    sink.write(work_id + " " + result["done"] + "\\n")
    sink.flush()
    time.sleep(0.005)  # most kills land here, inside the callback

with CampaignState.open(state, ranks=(1, 2), watchdog=WatchdogConfig(30)) as s:
    s.redeliver(deliver)
    s.submit(WorkItem(f"w{{i:03d}}", {{}}) for i in range(n))
    fake_campaign(s, on_commit=lambda c: deliver(c.work_id, c.result))
print("done", flush=True)
"""


def test_a_sigkilled_master_delivers_every_commit_to_the_sink_at_least_once(
    tmp_path: Path,
) -> None:
    """Issue 16: with the master SIGKILLed now and then (sometimes inside the callback) and
    compaction in between, the user's file ended with 397 of 400 results."""
    import random
    import signal
    import time

    root = str(Path(__file__).resolve().parent.parent)
    script = tmp_path / "child.py"
    script.write_text(SINK_CHILD.format(root=root))
    state, sink = tmp_path / "state", tmp_path / "sink.txt"
    rnd = random.Random(16)
    n, kills = 300, 0
    for run in range(20):
        p = subprocess.Popen(
            [sys.executable, str(script), str(state), str(sink), str(n)],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(rnd.uniform(0.3, 0.9))
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        kills += p.returncode == -signal.SIGKILL
        if run % 4 == 3 and state.exists():
            compact_state(state)
        if "done" in out:
            break
    final = subprocess.run(
        [sys.executable, str(script), str(state), str(sink), str(n)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert final.returncode == 0 and "done" in final.stdout, final.stderr[-2000:]
    lines = sink.read_text().splitlines()
    delivered = {line.split()[0] for line in lines}
    everything = {f"w{i:03d}" for i in range(n)}
    assert delivered == everything, sorted(everything - delivered)[:10]
    assert all(a == b for a, b in (line.split() for line in lines))  # right value per ID
    assert [r.work_id for r in read_results(state)] != [] and len(list(read_results(state))) == n
    assert view_state(state).projection.duplicate_commits == 0
    assert kills >= 3
    print(f"{kills} SIGKILLs; {len(lines)} deliveries for {n} commits")


def test_the_results_command_lists_them_all_as_jsonl_json_or_text(tmp_path: Path) -> None:
    _campaign(tmp_path, _ids(5))
    cli = [sys.executable, "-m", "durable_dispatch", "results", str(tmp_path)]
    out = subprocess.run([*cli, "--jsonl"], capture_output=True, text=True, check=True).stdout
    rows = [orjson.loads(line) for line in out.splitlines()]
    assert [(r["work_id"], r["result"]) for r in rows] == [(w, {"done": w}) for w in _ids(5)]
    out = subprocess.run([*cli, "w003", "--json"], capture_output=True, text=True, check=True)
    assert [r["work_id"] for r in orjson.loads(out.stdout)] == ["w003"]
    out = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0].split() == ["w000", '{"done":"w000"}']
    bad = subprocess.run([*cli[:-1], str(tmp_path / "nope")], capture_output=True, text=True)
    assert bad.returncode == 2 and "Error" in bad.stderr


@pytest.mark.parametrize("forged", [{"rank": "2"}, {"work_ids": []}, {"cost": {"cpu": "x"}}])
def test_a_forged_committed_record_is_damage_to_every_reader_of_results(
    tmp_path: Path, forged: dict[str, Any]
) -> None:
    """The results and the history decode the committed record as the master's replay does
    (events.py): a record it would refuse is refused by them, not read around."""
    from durable_dispatch.campaign.statedir import STATE_JOURNAL
    from durable_dispatch.errors import JournalCorruptError
    from durable_dispatch.storage.journal import Journal
    from durable_dispatch.views.history import read_history

    _campaign(tmp_path, _ids(3))
    with Journal.open(tmp_path / STATE_JOURNAL) as j:
        j.append({"event": "committed", "token": "e1-99", "work_id": "x", "result": 1, **forged})
    with pytest.raises(JournalCorruptError, match="committed|rank|work_ids|cost"):
        list(read_results(tmp_path))
    with pytest.raises(JournalCorruptError):
        read_history(tmp_path, now=0.0, running=False)
