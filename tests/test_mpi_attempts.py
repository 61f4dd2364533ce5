"""What each attempt cost (CPU seconds, peak memory) and what each isolated item wrote, from the
worker to the joblog, the report and ``durable-dispatch output``, through a reopen and a
compaction (issue 62: "Per attempt, what it cost" and "Each item's output").

The mpiexec runs (tests/children/cost_campaign.py, one worker, items in order in one child):
an item that burns 0.3 s of its own CPU clock and touches 96 MiB, a small one after it in the
same child, one that crashes with SIGSEGV after 0.3 s of CPU and 160 MiB, one killed at its own
timeout while it spins on 64 MiB, one that prints 1 MiB, one whose first attempt prints and
raises; and the same without isolation (marked in-process). CPU
figures are compared with CPU time the item itself measured (``time.process_time``), never with
wall time, so a loaded machine changes nothing.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from durable_dispatch import WorkItem
from durable_dispatch.campaign.admin import compact_state
from durable_dispatch.campaign.state import CampaignState
from durable_dispatch.cli import main
from durable_dispatch.core.events import check_event
from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec
from durable_dispatch.schema import Invalid
from durable_dispatch.views.joblog import read_joblog
from durable_dispatch.views.report import render_report, report_series

CAMPAIGN = Path(__file__).parent / "children" / "cost_campaign.py"
MIB = 1 << 20


def _can_reset_the_peak() -> bool:
    """Linux lets a process reset its peak resident size (``/proc/self/clear_refs``); where it
    does not, an item's peak is not measured (null), which the memory tests then check."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


PEAK = _can_reset_the_peak()


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def _campaign(state: Path, mode: str) -> Any:
    cmd = mpiexec_command(2, [sys.executable, str(CAMPAIGN), str(state), mode])
    res = run_mpiexec(cmd, timeout=150)
    line = next((x for x in res.stdout.splitlines() if x.startswith("REPORT ")), None)
    assert line is not None, res.stdout[-3000:] + res.stderr[-3000:]
    assert orjson.loads(line.removeprefix("REPORT "))["finished"], line
    return res


_LOG: dict[str, str] = {}  # the isolated campaign's job log (mpiexec's standard output)


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("costs") / "state"
    _LOG["stdout"] = _campaign(state, "isolate").stdout
    return state


def _rows(state: Path) -> dict[str, Any]:
    return {r.work_id: r for r in read_joblog(state)}


def test_each_isolated_attempt_reports_its_own_cpu_and_peak_memory(isolated: Path) -> None:
    rows = _rows(isolated)
    burn, small = rows["burn"], rows["small"]
    assert burn.cost_measured == small.cost_measured == "child"
    assert burn.cpu_seconds is not None and burn.cpu_seconds >= 0.3  # its own CPU clock's 0.3 s
    assert small.cpu_seconds is not None and small.cpu_seconds < burn.cpu_seconds
    if not PEAK:
        assert burn.max_rss is None and small.max_rss is None
        return
    assert burn.max_rss is not None and burn.max_rss >= 96 * MIB
    # the next item in the same child: its own peak, not the child's high-water mark
    assert small.max_rss is not None and small.max_rss < burn.max_rss - 64 * MIB


def test_a_child_killed_by_a_signal_still_reports_what_its_item_cost(isolated: Path) -> None:
    rows = _rows(isolated)
    segv = rows["segv"]
    assert segv.status == "deferred" and segv.signal == "SIGSEGV"  # (its column, as before)
    assert segv.cost_measured == "child-ended"  # wait4's figures for the dead child
    assert segv.cpu_seconds is not None and segv.cpu_seconds >= 0.3  # less what came before
    assert segv.cpu_seconds < 0.3 + rows["burn"].cpu_seconds  # (the burn's CPU is not in it)
    assert segv.max_rss is not None and segv.max_rss >= 160 * MIB
    spin = rows["spin"]  # killed at its own timeout: its peak read before the kill
    assert spin.last_failure_kind == "timeout" and spin.cost_measured == "child-ended"
    assert spin.cpu_seconds is not None and spin.cpu_seconds > 0
    if PEAK:
        assert spin.max_rss is not None and 64 * MIB <= spin.max_rss < 160 * MIB


def test_the_costs_survive_a_reopen_and_a_compaction_and_show_in_table_and_report(
    isolated: Path, tmp_path: Path
) -> None:
    import shutil

    state = tmp_path / "state"
    shutil.copytree(isolated, state)
    before = {w: r.as_dict() for w, r in _rows(state).items()}
    with CampaignState.open(state, ranks=(1,)):
        pass  # a reopen
    compact_state(state)
    after = {w: r.as_dict() for w, r in _rows(state).items()}
    keys = ("cpu_seconds", "max_rss", "cost_measured")
    for w in before:
        assert {k: before[w][k] for k in keys} == {k: after[w][k] for k in keys}, w
        assert after[w]["cpu_seconds"] is not None, w
    code, table, _ = cli("joblog", str(state))
    assert code == 0 and "cpu s" in table.splitlines()[0] and "peak MiB" in table.splitlines()[0]
    burn = next(x for x in table.splitlines() if x.startswith("burn "))
    assert f"{after['burn']['cpu_seconds']:.2f}" in burn
    if PEAK:
        assert f"{after['burn']['max_rss'] / MIB:.1f}" in burn
    rows = [json.loads(x) for x in cli("joblog", str(state), "--jsonl")[1].splitlines()]
    assert {r["work_id"]: r["max_rss"] for r in rows} == {w: a["max_rss"] for w, a in after.items()}
    series = report_series(isolated)  # (before compaction: every attempt's dispatch is there)
    slow = {r["work_id"]: r for r in series["slowest"]}
    assert slow["burn"]["cpu_seconds"] == before["burn"]["cpu_seconds"]
    assert slow["segv"]["max_rss"] == before["segv"]["max_rss"]
    page = render_report(series, "t")
    assert "CPU seconds" in page and "peak memory MiB" in page
    assert f"{before['segv']['max_rss'] / MIB:.1f}" in page


def test_without_isolation_the_worker_measures_itself_and_says_so(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _campaign(state, "inprocess")
    rows = _rows(state)
    assert {r.cost_measured for r in rows.values()} == {"in-process"}
    assert rows["burn"].cpu_seconds is not None and rows["burn"].cpu_seconds >= 0.3
    if PEAK:
        assert rows["burn"].max_rss is not None and rows["burn"].max_rss >= 96 * MIB
    code, table, _ = cli("joblog", str(state))
    assert code == 0
    burn = next(x for x in table.splitlines() if x.startswith("burn "))
    assert f"{rows['burn'].cpu_seconds:.2f}*" in burn
    assert table.splitlines()[-1].startswith("* measured in the worker's own process")
    page = render_report(report_series(state), "t")
    assert f"{rows['burn'].cpu_seconds:.2f}*" in page


def test_the_master_keeps_a_current_results_costs_only_and_only_well_formed_ones(
    tmp_path: Path,
) -> None:
    """The campaign's side, without MPI: a RESULT's costs go into its items' records (a commit,
    a failure), a stale dispatch's and a malformed entry are dropped, and a state written
    without costs reads with blank ones."""
    d = tmp_path / "state"
    cost = {"cpu": 1.25, "rss": 3 * MIB, "by": "child"}
    with CampaignState.open(d, ranks=(1, 2)) as st:
        st.submit([WorkItem("a", 1), WorkItem("b", 2), WorkItem("c", 3)])
        a = st.next_send(0.0)
        b = st.next_send(0.0)
        assert a is not None and b is not None
        st.sent(a.token, 0.0)
        st.sent(b.token, 0.0)
        st.note_usage(a.rank, str(a.token), {"a": cost, "zz": cost})
        st.note_usage(b.rank, str(a.token), {"a": {"cpu": 9.0, "rss": 1, "by": "x"}})  # stale
        st.note_usage(b.rank, str(b.token), {"b": {"cpu": "lots", "by": "child"}})  # malformed
        st.on_results(a.rank, str(a.token), [10], 0.0)
        st.on_ready(a.rank, str(a.token), 0.0)
        st.on_results(b.rank, str(b.token), [20], 0.0)
        st.on_ready(b.rank, str(b.token), 0.0)
        c = st.next_send(0.0)
        assert c is not None
        st.sent(c.token, 0.0)
        st.note_usage(c.rank, str(c.token), {"c": {**cost, "by": "child-ended"}})
        st.on_results(c.rank, str(c.token), None, 0.0, failure="boom")  # (malformed: requeued)
        st.on_ready(c.rank, str(c.token), 0.0)
        st.tick(0.0)
    rows = _rows(d)
    assert (rows["a"].cpu_seconds, rows["a"].max_rss, rows["a"].cost_measured) == (
        1.25,
        3 * MIB,
        "child",
    )
    assert rows["b"].cpu_seconds is None and rows["b"].cost_measured is None
    assert rows["c"].status == "pending" and rows["c"].cost_measured == "child-ended"


# ------------------------------------------------------------------------ each item's output
LOUD = (
    b"head-of-loud\n"
    + b"".join(f"{i:07d}".encode() + b"o" * 1016 + b"\n" for i in range(1024))
    + b"tail-of-loud\n"
)


def test_an_isolated_items_output_is_kept_bounded_and_printed_by_the_output_command(
    isolated: Path,
) -> None:
    from durable_dispatch.views.output import read_output

    out = read_output(isolated, "loud")
    assert len(LOUD) > 1 << 20
    assert out.stdout == LOUD[-(64 << 10) :]  # its last 64 KiB, exactly
    assert out.stdout_dropped == len(LOUD) - (64 << 10)
    assert out.stderr == b"loud's error line\n" and out.stderr_dropped == 0
    code, text, _ = cli("output", str(isolated), "loud")
    assert code == 0
    head_out = f"--- stdout of loud (65536 bytes; {len(LOUD) - 65536} earlier bytes not kept) ---"
    assert text.startswith(head_out + "\n")
    assert text.index("tail-of-loud\n--- stderr of loud (18 bytes) ---\nloud's error line\n")
    from .test_doc_samples import assert_same, sample

    assert_same(sample("docs/cli.md", "cli-output"), text)  # as docs/cli.md shows it
    code, text, _ = cli("output", str(isolated), "loud", "--json")
    assert code == 0 and json.loads(text)["stderr"] == "loud's error line\n"
    # the job's log still has all of it (the worker copies its children's output, as before)
    assert "head-of-loud" in _LOG["stdout"] and "tail-of-loud" in _LOG["stdout"]


def test_a_crashed_or_killed_items_output_is_kept_too(isolated: Path) -> None:
    from durable_dispatch.views.output import read_output

    assert read_output(isolated, "segv").stderr == b"segv is about to crash\n"
    assert read_output(isolated, "spin").stdout == b"spin starts spinning\n"


def test_the_output_command_says_why_an_item_has_no_output_and_exits_non_zero(
    isolated: Path, tmp_path: Path
) -> None:
    code, _, err = cli("output", str(isolated), "no-such-item")
    assert code == 2 and "'no-such-item' is no work item" in err
    code, _, err = cli("output", str(isolated), "burn")
    assert code == 1 and "wrote nothing" in err
    state = tmp_path / "state"
    _campaign(state, "inprocess")
    code, _, err = cli("output", str(state), "loud")
    assert code == 1 and "ran without isolation" in err and "worker's standard output" in err
    code, _, err = cli("output", str(tmp_path / "nowhere"), "loud")
    assert code == 2


def test_each_items_newest_output_survives_a_reopen_and_compaction_drops_older_attempts(
    isolated: Path, tmp_path: Path
) -> None:
    import shutil

    from durable_dispatch.campaign.statedir import OUTPUTS_JOURNAL
    from durable_dispatch.storage.journal import read_journal
    from durable_dispatch.views.output import read_output

    state = tmp_path / "state"
    shutil.copytree(isolated, state)

    def records() -> list[str]:
        return [r.payload["work_id"] for r in read_journal(state / OUTPUTS_JOURNAL)]

    assert records().count("twice") == 2  # both attempts printed
    assert read_output(state, "twice").stdout == b"second attempt of twice\n"
    with CampaignState.open(state, ranks=(1,)):
        pass  # a reopen
    assert read_output(state, "twice").stdout == b"second attempt of twice\n"
    loud = read_output(state, "loud")
    compact_state(state)
    assert sorted(records()) == ["loud", "segv", "spin", "twice"]  # the newest of each
    assert read_output(state, "twice").stdout == b"second attempt of twice\n"
    assert read_output(state, "loud") == loud


def test_an_outputs_record_that_breaks_its_schema_is_a_corruption_not_a_crash(
    tmp_path: Path,
) -> None:
    from durable_dispatch.campaign.statedir import OUTPUTS_JOURNAL
    from durable_dispatch.errors import JournalCorruptError
    from durable_dispatch.storage import Journal
    from durable_dispatch.views.output import read_output

    d = tmp_path / "state"
    with CampaignState.open(d, ranks=(1,)) as st:
        st.submit([WorkItem("a", 1)])
    with Journal.open(d / OUTPUTS_JOURNAL, sync="always") as j:
        j.append({"work_id": "a", "token": "e1-1", "ts": 1.0, "stdout": 5})
    with pytest.raises(JournalCorruptError, match="stdout"):
        read_output(d, "a")
    code, _, err = cli("output", str(d), "a")
    assert code == 1 and "stdout" in err


def test_a_multi_item_dispatch_keeps_each_items_cost_in_its_one_record(tmp_path: Path) -> None:
    from durable_dispatch.campaign.statedir import STATE_JOURNAL
    from durable_dispatch.storage.journal import read_journal

    d = tmp_path / "state"
    with CampaignState.open(d, ranks=(1,)) as st:
        s = _dispatch_of(st)
        costs = {
            "a": {"cpu": 0.5, "rss": 7 * MIB, "by": "child"},
            "c": {"cpu": 0.25, "rss": None, "by": "child"},
        }
        st.note_usage(s.rank, str(s.token), costs)
        st.on_results(s.rank, str(s.token), [1, 2, 3], 0.0)
        st.on_ready(s.rank, str(s.token), 0.0)
        st.tick(0.0)
    recs = [r.payload for r in read_journal(d / STATE_JOURNAL)]
    committed = next(p for p in recs if p.get("event") == "committed")
    assert committed["costs"] == [costs["a"], None, costs["c"]]
    rows = _rows(d)
    assert (rows["a"].cpu_seconds, rows["a"].max_rss) == (0.5, 7 * MIB)
    assert rows["b"].cpu_seconds is None
    assert (rows["c"].cpu_seconds, rows["c"].max_rss) == (0.25, None)
    slow = report_series(d)["slowest"]
    assert slow[0]["cpu_seconds"] == 0.75 and slow[0]["max_rss"] == 7 * MIB


def _dispatch_of(st: CampaignState, ids: str = "abc") -> Any:
    """Submit one item per letter of ``ids`` and send them all in one dispatch."""
    st.submit([WorkItem(w, i) for i, w in enumerate(ids)])
    s = st.next_send(0.0, len(ids))
    assert s is not None and len(s.items) == len(ids)
    st.sent(s.token, 0.0)
    return s


def _committed_records(d: Path) -> list[dict[str, Any]]:
    from durable_dispatch.campaign.statedir import STATE_JOURNAL
    from durable_dispatch.storage.journal import read_journal

    recs = [r.payload for r in read_journal(d / STATE_JOURNAL)]
    return [p for p in recs if p.get("event") == "committed"]


def test_a_dispatch_measured_alike_keeps_its_costs_as_the_table_the_worker_sent(
    tmp_path: Path,
) -> None:
    """Several items measured the same way come as a table (one column each, in the order of
    ``ids``); a record of exactly those items keeps the columns as they came (no dict an
    item), and every reader sees each item's cost, after a reopen and a compaction too."""
    d = tmp_path / "state"
    table = {"ids": ["a", "b", "c"], "cpu": [0.5, 0.0, 1.25], "rss": [7 * MIB, None, 9 * MIB]}
    with CampaignState.open(d, ranks=(1,)) as st:
        s = _dispatch_of(st)
        st.note_usage(s.rank, str(s.token), {**table, "by": "in-process"})
        st.on_results(s.rank, str(s.token), [1, 2, 3], 0.0)
        st.on_ready(s.rank, str(s.token), 0.0)
        st.tick(0.0)
    (committed,) = _committed_records(d)
    assert "costs" not in committed
    columns = {"cpu": table["cpu"], "rss": table["rss"], "by": "in-process"}
    assert committed["cost_table"] == columns
    check_event(committed)  # what every read of the journal checks: the table passes ...
    for bad in ({**columns, "cpu": [0.5, "x", 1.0]}, {**columns, "rss": [1]}, {"cpu": []}):
        with pytest.raises(Invalid, match="cost_table"):  # ... a malformed one does not
            check_event({**committed, "cost_table": bad})
    compact_state(d)
    rows = _rows(d)
    assert [(rows[w].cpu_seconds, rows[w].max_rss) for w in "abc"] == [
        (0.5, 7 * MIB),
        (0.0, None),
        (1.25, 9 * MIB),
    ]
    assert {rows[w].cost_measured for w in "abc"} == {"in-process"}
    assert report_series(d)["slowest"][0]["cpu_seconds"] == 1.75


def test_a_table_whose_items_do_not_all_commit_together_is_kept_item_by_item(
    tmp_path: Path,
) -> None:
    """One item of a tabled dispatch fails: its requeue carries its own cost, the commit of
    the others carries theirs item by item (the columns are not the record's items)."""
    d = tmp_path / "state"
    with CampaignState.open(d, ranks=(1,)) as st:
        s = _dispatch_of(st)
        costs = {"ids": ["a", "b", "c"], "cpu": [0.5, 2.0, 0.25], "rss": [1, 2, 3], "by": "x"}
        st.note_usage(s.rank, str(s.token), costs)
        st.on_results(s.rank, str(s.token), [1, None, 3], 0.0, errors={1: "boom"})
        st.on_ready(s.rank, str(s.token), 0.0)
        st.tick(0.0)
    (committed,) = _committed_records(d)
    assert "cost_table" not in committed
    assert committed["costs"] == [
        {"cpu": 0.5, "rss": 1, "by": "x"},
        {"cpu": 0.25, "rss": 3, "by": "x"},
    ]
    rows = _rows(d)
    assert rows["b"].status == "pending" and rows["b"].cpu_seconds == 2.0
    assert (rows["a"].cpu_seconds, rows["c"].cpu_seconds) == (0.5, 0.25)


def test_a_tabled_record_too_large_for_one_record_is_split_with_each_items_cost(
    tmp_path: Path,
) -> None:
    """The commit of a dispatch whose costs came as a table does not fit one record: each half
    is written with its items' costs, none lost, none on the wrong item."""
    d = tmp_path / "state"
    big = "r" * 700
    with CampaignState.open(d, ranks=(1,), journal_options={"max_record_bytes": 2048}) as st:
        s = _dispatch_of(st, "abcd")
        table = {"ids": list("abcd"), "cpu": [0.5, 1.5, 2.5, 3.5], "rss": [1, 2, 3, 4], "by": "x"}
        st.note_usage(s.rank, str(s.token), table)
        st.on_results(s.rank, str(s.token), [big] * 4, 0.0)
        st.on_ready(s.rank, str(s.token), 0.0)
        st.tick(0.0)
    records = _committed_records(d)
    assert len(records) > 1 and all("cost_table" not in r for r in records)
    kept = {w: c for r in records for w, c in zip(r["work_ids"], r["costs"], strict=True)}
    assert kept == {
        w: {"cpu": c, "rss": r, "by": "x"}
        for w, c, r in zip("abcd", [0.5, 1.5, 2.5, 3.5], [1, 2, 3, 4], strict=True)
    }
    rows = _rows(d)
    assert [rows[w].cpu_seconds for w in "abcd"] == [0.5, 1.5, 2.5, 3.5]


def test_a_part_sent_ahead_and_its_result_each_keep_their_items_costs(tmp_path: Path) -> None:
    """A part sent ahead and the dispatch's RESULT, read in one turn: both tables are noted
    before either is applied, and each item's record carries its own cost."""
    d = tmp_path / "state"
    with CampaignState.open(d, ranks=(1,)) as st:
        s = _dispatch_of(st, "abcd")
        wire = str(s.token)
        st.note_usage(
            s.rank, wire, {"ids": ["a", "b"], "cpu": [1.0, 2.0], "rss": [1, 2], "by": "x"}
        )
        st.note_usage(
            s.rank, wire, {"ids": ["c", "d"], "cpu": [3.0, 4.0], "rss": [3, 4], "by": "x"}
        )
        st.on_part(s.rank, wire, ["a", "b"], [0, 1], 0.0, errors=None)
        st.on_results(s.rank, wire, [2, 3], 0.0)
        st.on_ready(s.rank, wire, 0.0)
        st.tick(0.0)
    rows = _rows(d)
    assert [rows[w].cpu_seconds for w in "abcd"] == [1.0, 2.0, 3.0, 4.0]
    assert [rows[w].status for w in "abcd"] == ["committed"] * 4


@pytest.mark.parametrize(
    "bad",
    [
        {"ids": ["a", "b", "c"], "cpu": [0.5, 1.0], "rss": [1, 2, 3], "by": "x"},  # short
        {"ids": ["a", "b", "c"], "cpu": [0.5, True, 1.0], "rss": [1, 2, 3], "by": "x"},
        {"ids": ["a", "b", "c"], "cpu": [0.5, "1", 1.0], "rss": [1, 2, 3], "by": "x"},
        {"ids": ["a", "b", "c"], "cpu": [0.5, 0.5, 1.0], "rss": [1, 2.5, 3], "by": "x"},
        {"ids": ["a", 2, "c"], "cpu": [0.5, 0.5, 1.0], "rss": [1, 2, 3], "by": "x"},
        {"ids": ["a", "a", "c"], "cpu": [0.5, 0.5, 1.0], "rss": [1, 2, 3], "by": "x"},
        {"ids": ["a", "b", "c"], "cpu": [0.5, 0.5, 1.0], "rss": [1, 2, 3], "by": "x" * 33},
        {"ids": ["a", "b", "c"], "cpu": [0.5, 0.5, 1.0], "rss": [1, 2, 3], "by": None},
        {"ids": ["a", "b", "c"], "cpu": [0.5, 0.5, 1.0], "rss": [1, 2, 3], "by": "x", "y": 1},
    ],
)
def test_a_malformed_table_of_costs_is_dropped_whole(tmp_path: Path, bad: dict[str, Any]) -> None:
    d = tmp_path / "state"
    with CampaignState.open(d, ranks=(1,)) as st:
        s = _dispatch_of(st)
        st.note_usage(s.rank, str(s.token), bad)
        st.on_results(s.rank, str(s.token), [1, 2, 3], 0.0)
        st.on_ready(s.rank, str(s.token), 0.0)
        st.tick(0.0)
    (committed,) = _committed_records(d)
    assert "cost_table" not in committed and "costs" not in committed
    assert all(r.cpu_seconds is None for r in _rows(d).values())
