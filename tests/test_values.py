"""The user's values come back exactly as given, or are refused at the first try (U15).

Payloads and results go through the journal, compaction, ``ctx.dependencies``,
``read_results`` and the command line's JSON; every value comes back equal (NaN by
``math.isnan``, the infinities with their sign, a numpy scalar as the equal Python number) or is
refused: a payload when it is submitted (naming the work ID and the path, nothing added), a
result as a ``malformed-result`` on its first attempt, not retried.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_dispatch import RetryPolicy, WorkItem, read_results
from durable_dispatch.campaign.admin import view_state
from durable_dispatch.cli import main as cli_main
from durable_dispatch.errors import RecordEncodeError
from durable_dispatch.mpi import run_master
from durable_dispatch.storage.journal import read_journal
from durable_dispatch.testing import LocalWorkers

np = pytest.importorskip("numpy", reason="numpy is in the test extra (issue: numpy results)")


# ------------------------------------------------------------------ an independent model
class _Refuse(Exception):
    pass


def model(v: Any) -> Any:
    """What a value must come back as, or ``_Refuse``: written apart from the library."""
    if v is None or type(v) in (bool, str):
        if type(v) is str:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise _Refuse from None
        return v
    if type(v) is int:
        if -(2**63) <= v < 2**64:
            return v
        raise _Refuse
    if type(v) is float:
        return v
    if isinstance(v, np.generic) and isinstance(v, (np.floating, np.integer, np.bool_)):
        return v.item()
    if type(v) is list:
        return [model(x) for x in v]
    if type(v) is dict:
        if not all(type(k) is str for k in v):
            raise _Refuse
        return {k: model(x) for k, x in v.items()}
    raise _Refuse  # tuple, set, bytes, datetime, ndarray, complex ...


def same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and the sign of infinities and zeros checked."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0]),
    st.text(max_size=5),
)
_odd = st.one_of(
    st.tuples(st.integers(0, 3)),
    st.frozensets(st.integers(0, 3), max_size=2),
    st.binary(max_size=3),
    st.just(datetime.datetime(2026, 1, 2, 3, 4, 5)),
    st.integers(2**64, 2**70),
    st.just("\ud800"),
    st.builds(np.float64, st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(np.int32, st.integers(-(2**31), 2**31 - 1)),
    st.just(np.arange(2)),
    st.just({1: "a"}),
    st.just({"~nonfinite": [None, [[[], "nan"]]]}),  # looks like the stored form: kept as is
)


def _values(odd: bool) -> st.SearchStrategy[Any]:
    leaf = st.one_of(_leaf, _odd) if odd else _leaf
    return st.recursive(
        leaf,
        lambda kids: (
            st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3)
        ),
        max_leaves=8,
    )


def deferred(state: Path) -> dict[str, dict[str, Any]]:
    """work ID -> its (last) deferral record in the defer journal."""
    out: dict[str, dict[str, Any]] = {}
    for rec in read_journal(state / ".dispatch_protocol_deferred.jsonl"):
        if rec.payload.get("event") == "deferred":
            out[rec.payload["work_id"]] = rec.payload
    return out


def _cli(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(list(argv)) == 0
    return out.getvalue()


def _jsonl(out: str) -> list[str]:
    """The lines of JSON Lines output: split at "\\n" only (``str.splitlines`` also splits at
    U+0085 and U+2028, which a JSON string may hold as they are)."""
    return [x for x in out.split("\n") if x]


def _roundtrips(state: Path, wid: str, want: Any) -> None:
    """``wid``'s result is ``want`` through read_results, the CLI's JSON, and after a
    compaction through both again."""
    for _ in range(2):
        got = {r.work_id: r.result for r in read_results(state)}
        assert same(got[wid], want), (got[wid], want)
        rows = [json.loads(x) for x in _jsonl(_cli("results", str(state), "--jsonl"))]
        assert same(next(r["result"] for r in rows if r["work_id"] == wid), want)
        listed = json.loads(_cli("results", str(state), "--json"))
        assert same(next(r["result"] for r in listed if r["work_id"] == wid), want)
        _cli("compact", str(state))


_n = iter(range(10**9))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values(odd=True))
def test_a_result_comes_back_equal_or_is_refused_at_its_first_attempt(
    tmp_path_factory: pytest.TempPathFactory, value: Any
) -> None:
    state = tmp_path_factory.mktemp("r") / f"s{next(_n)}"
    try:
        want = model(value)
    except _Refuse:
        want = _Refuse
    report = run_master(
        [WorkItem("r", 0)], state, comm=LocalWorkers(lambda p: value, 1), retry=RetryPolicy(3)
    )
    assert report.finished
    if want is _Refuse:
        assert report.stats["core"]["dispatches"] == 1  # not retried: it would fail again
        d = deferred(state)["r"]
        assert (d["attempts"], d["kinds"]) == (1, ["malformed-result"])
        assert "cannot be stored as given" in d["last_error"]
        assert list(read_results(state)) == []
    else:
        _roundtrips(state, "r", want)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_values(odd=True))
def test_a_payload_reaches_the_worker_equal_or_is_refused_when_submitted(
    tmp_path_factory: pytest.TempPathFactory, value: Any
) -> None:
    state = tmp_path_factory.mktemp("p") / f"s{next(_n)}"
    try:
        want = model(value)
    except _Refuse:
        want = _Refuse
    seen: list[Any] = []
    items = [WorkItem("ok", 1), WorkItem("p", value)]

    def fn(p: Any) -> Any:
        seen.append(p)
        return p

    if want is _Refuse:
        with pytest.raises(RecordEncodeError, match="work item 'p': its payload at ") as e:
            run_master(items, state, comm=LocalWorkers(fn, 1))
        assert "cannot be stored as given" in str(e.value)
        assert seen == []
        led = view_state(state).projection  # nothing of that call was added
        assert not led.known("ok") and not led.known("p")
        return
    assert run_master(items, state, comm=LocalWorkers(fn, 1)).finished
    assert same(seen[-1], want)
    _roundtrips(state, "p", want)
    # the same payload again is the same payload (U11), NaN included: skipped, not refused
    assert run_master(items, state, comm=LocalWorkers(fn, 1)).finished


def test_non_finite_floats_reach_the_dependents_and_the_callback_exactly(tmp_path: Path) -> None:
    deps: dict[str, Any] = {}
    delivered: dict[str, Any] = {}

    def fn(p: Any, ctx: Any) -> Any:
        deps[ctx.work_id] = dict(ctx.dependencies)
        return {"e": p["x"], "list": [float("-inf"), 1.5]}

    items = [
        WorkItem("a", {"x": float("nan")}),
        WorkItem("b", {"x": float("inf")}, after=("a",)),
    ]
    run_master(items, tmp_path / "s", delivered.__setitem__, comm=LocalWorkers(fn, 1, context=True))
    assert math.isnan(delivered["a"]["e"]) and delivered["b"]["e"] == math.inf
    assert delivered["a"]["list"][0] == -math.inf
    assert math.isnan(deps["b"]["a"]["e"]) and deps["b"]["a"]["list"] == [-math.inf, 1.5]
    # a later run that submits b's dependent reads a's result from the journal, exactly
    more = [*items, WorkItem("c", {"x": 0.0}, after=("a", "b"))]
    run_master(more, tmp_path / "s", comm=LocalWorkers(fn, 1, context=True))
    assert math.isnan(deps["c"]["a"]["e"]) and deps["c"]["b"]["e"] == math.inf


def test_numpy_results_under_local_workers(tmp_path: Path) -> None:
    def fn(p: str) -> Any:
        if p == "scalars":
            return {"f": np.float64(0.1), "i": np.int64(-7), "b": np.bool_(True)}
        return {"nested": [1, {"a": np.arange(3.0)}]}

    items = [WorkItem("scalars", "scalars"), WorkItem("array", "array")]
    report = run_master(items, tmp_path / "s", comm=LocalWorkers(fn, 1), retry=RetryPolicy(2))
    assert report.stats["core"]["dispatches"] == 2  # the array is not tried again
    (r,) = read_results(tmp_path / "s")
    assert r.result == {"f": 0.1, "i": -7, "b": True}
    assert [type(v) for v in r.result.values()] == [float, int, bool]
    d = deferred(tmp_path / "s")["array"]
    assert (d["attempts"], d["kinds"]) == (1, ["malformed-result"])
    assert ".nested[1].a" in d["last_error"] and "numpy.ndarray" in d["last_error"]
    assert ".tolist()" in d["last_error"]


def test_a_refused_payload_names_the_work_id_the_path_and_the_value(tmp_path: Path) -> None:
    when = datetime.datetime(2026, 12, 5)
    items = [WorkItem("fine", 1), WorkItem("w-7", {"runs": [{"at": when}]})]
    with pytest.raises(RecordEncodeError) as e:
        run_master(items, tmp_path / "s", comm=LocalWorkers(lambda p: p, 1))
    text = str(e.value)
    assert "'w-7'" in text and ".runs[0].at" in text and "datetime.datetime(2026, 12, 5" in text
    assert ".isoformat()" in text
    led = view_state(tmp_path / "s").projection
    assert not led.known("fine") and not led.known("w-7")


def test_a_refused_child_payload_ends_the_run_naming_the_child(tmp_path: Path) -> None:
    def on_commit(wid: str, result: Any) -> Any:
        return [WorkItem("child", {"s": {1, 2}})] if wid == "parent" else None

    with pytest.raises(RecordEncodeError, match="'child'.*at .s"):
        run_master([WorkItem("parent", 1)], tmp_path / "s", on_commit, comm=LocalWorkers(abs, 1))
    assert "child" not in {r.work_id for r in read_results(tmp_path / "s")}


@pytest.mark.parametrize("mode", ["plain", "isolate"])
def test_numpy_and_non_finite_values_under_mpiexec(tmp_path: Path, mode: str) -> None:
    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    script = Path(__file__).parent / "children" / "values_campaign.py"
    cmd = mpiexec_command(3, [sys.executable, str(script), str(tmp_path / "s"), mode])
    res = run_mpiexec(cmd, timeout=150)
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("REPORT "))
    report = json.loads(line.removeprefix("REPORT "))
    assert report["finished"]
    assert report["dispatches"] == 5  # "raise" twice (RetryPolicy(1)); the array once
    got = {r.work_id: r.result for r in read_results(tmp_path / "s")}
    f = got["np-scalars"]
    assert (f["f"], f["i"], f["b"]) == (0.1, -7, True) and math.isnan(f["n"])
    assert math.isnan(got["non-finite"]["echo"][0]) and got["non-finite"]["echo"][1] == -math.inf
    assert got["non-finite"]["inf"] == math.inf
    d = deferred(tmp_path / "s")["np-array"]
    assert (d["attempts"], d["kinds"]) == (1, ["malformed-result"])
    assert ".tolist()" in d["last_error"]


# ----------------------------------------------------------- results with their payloads
def test_results_carry_their_payloads_from_every_source_and_after_compaction(
    tmp_path: Path,
) -> None:
    from durable_dispatch.mpi import Feed

    state = tmp_path / "s"

    def on_commit(wid: str, result: Any) -> Any:
        if wid == "list-1":
            return [WorkItem("child", {"from": "on_commit", "x": float("nan")})]
        return None

    class Once(Feed):
        def refill(self) -> None:
            if not self.state.core.ledger.known("fed"):
                self.state.submit([WorkItem("fed", {"from": "feed"})])
            self.exhausted = True

    items = [WorkItem("list-1", {"from": "list", "x": 1}), WorkItem("list-2", [1, -0.0])]
    run_master(items, state, on_commit, comm=LocalWorkers(lambda p: "done", 1))
    run_master(Once(), state, comm=LocalWorkers(lambda p: "done", 1))
    new = tmp_path / "new.jsonl"
    new.write_text('{"work_id": "cli", "payload": {"from": "durable-dispatch submit"}}\n')
    _cli("submit", str(state), str(new), "--no-wait")
    run_master([], state, comm=LocalWorkers(lambda p: "done", 1))
    want = {
        "list-1": {"from": "list", "x": 1},
        "list-2": [1, -0.0],
        "child": {"from": "on_commit", "x": float("nan")},
        "fed": {"from": "feed"},
        "cli": {"from": "durable-dispatch submit"},
    }
    for _ in range(2):  # before a compaction and after
        rows = {r.work_id: r for r in read_results(state, with_payload=True)}
        assert rows.keys() == want.keys()
        for wid, payload in want.items():
            assert same(rows[wid].payload, payload), (wid, rows[wid].payload)
            assert rows[wid].result == "done"
        lines = _jsonl(_cli("results", str(state), "--with-payload", "--jsonl"))
        shown = {r["work_id"]: r for r in map(json.loads, lines)}
        assert all(same(shown[w]["payload"], p) for w, p in want.items())
        assert list(shown["cli"])[:3] == ["work_id", "result", "payload"]
        _cli("compact", str(state))
    assert all(r.payload is None for r in read_results(state))  # only when asked


# ------------------------------------------------------------- the exactly-once export
def _committed_count(state: Path) -> int:
    try:
        return sum(1 for _ in read_results(state))
    except Exception:  # noqa: BLE001 - not a state directory yet
        return 0


def test_the_csv_export_after_several_master_sigkills_has_each_committed_id_once(
    tmp_path: Path,
) -> None:
    import csv
    import os
    import signal
    import subprocess
    import time

    script = Path(__file__).parent / "children" / "export_campaign.py"
    state, n = tmp_path / "s", 300
    kills = 0
    for _ in range(4):  # kill the master while it commits, four times
        before = _committed_count(state)
        proc = subprocess.Popen([sys.executable, str(script), str(state), str(n)])
        try:
            while _committed_count(state) < min(before + 20, n) and proc.poll() is None:
                time.sleep(0.05)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                kills += 1
            proc.wait(timeout=60)
    assert kills >= 2  # (the campaign may finish before the last kill on a fast machine)
    done = subprocess.run(
        [sys.executable, str(script), str(state), str(n)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "FINISHED" in done.stdout, done.stderr[-2000:]
    out = tmp_path / "results.csv"
    _cli("results", str(state), "--csv", str(out), "--with-payload")
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["work_id"] for r in rows] == sorted({r["work_id"] for r in rows})  # once each
    assert len(rows) == n
    assert list(rows[0]) == ["work_id", "payload", "result.x", "result.square", "result.ratio"]
    for r in rows:
        x = int(r["payload"])
        assert int(r["result.x"]) == x and int(r["result.square"]) == x * x
        assert r["result.ratio"] == ("nan" if x % 7 == 0 else repr(x / 8))
    first = out.read_bytes()
    _cli("results", str(state), "--csv", str(out), "--with-payload")
    assert out.read_bytes() == first  # deterministic: twice gives the same file
    _cli("compact", str(state))
    _cli("results", str(state), "--csv", str(out), "--with-payload")
    assert out.read_bytes() == first  # and after a compaction


def test_the_csv_export_flattens_one_level_and_keeps_values_exact(tmp_path: Path) -> None:
    import csv

    def fn(p: int) -> Any:
        if p == 0:
            return {"e": float("-inf"), "nested": {"a": [1, 2]}, "s": "x,y"}
        if p == 1:
            return {"e": 1.5, "extra": True}
        return [p, None]

    items = [WorkItem("a", 0), WorkItem("b", 1), WorkItem("c", {"k": 2, "deep": [2]})]
    run_master(
        items, tmp_path / "s", comm=LocalWorkers(lambda p: fn(p if type(p) is int else 2), 1)
    )
    out = tmp_path / "r.csv"
    _cli("results", str(tmp_path / "s"), "--csv", str(out))
    with open(out, newline="") as f:
        rows = {r["work_id"]: r for r in csv.DictReader(f)}
    assert list(rows["a"]) == ["work_id", "result.e", "result.nested", "result.s",
                               "result.extra", "result"]  # fmt: skip
    assert rows["a"]["result.e"] == "-inf" and rows["a"]["result.s"] == "x,y"
    assert json.loads(rows["a"]["result.nested"]) == {"a": [1, 2]}
    assert rows["b"]["result.extra"] == "True" and rows["b"]["result.nested"] == ""
    assert json.loads(rows["c"]["result"]) == [2, None]
    _cli("results", str(tmp_path / "s"), "--csv", str(out), "--with-payload")
    with open(out, newline="") as f:
        rows = {r["work_id"]: r for r in csv.DictReader(f)}
    assert rows["c"]["payload.k"] == "2" and json.loads(rows["c"]["payload.deep"]) == [2]
    assert rows["a"]["payload"] == "0"


def test_the_parquet_export(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow: the 'parquet' extra")
    items = [WorkItem(f"w{i}", i) for i in range(5)]
    fn = lambda p: {"x": p, "r": float("nan") if p == 3 else p / 2, "mixed": p if p else "zero"}  # noqa: E731
    run_master(items, tmp_path / "s", comm=LocalWorkers(fn, 1))
    out = tmp_path / "r.parquet"
    _cli("results", str(tmp_path / "s"), "--parquet", str(out), "--with-payload")
    t = pq.read_table(out).to_pylist()
    assert [r["work_id"] for r in t] == [f"w{i}" for i in range(5)]
    assert [r["result.x"] for r in t] == [0, 1, 2, 3, 4] == [r["payload"] for r in t]
    assert math.isnan(t[3]["result.r"]) and t[4]["result.r"] == 2.0
    assert [r["result.mixed"] for r in t] == ['"zero"', "1", "2", "3", "4"]  # JSON text


def test_the_parquet_export_without_pyarrow_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_dispatch.views.export import export_results

    run_master([WorkItem("a", 1)], tmp_path / "s", comm=LocalWorkers(abs, 1))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(Exception, match=r"durable-dispatch\[parquet\]"):
        export_results(tmp_path / "s", tmp_path / "r.parquet", format="parquet")
    assert not (tmp_path / "r.parquet").exists()


# ---------------------------------------------------------------------------- tracebacks
def _diverge(x: float) -> float:
    raise ValueError("diverged")


def _simulate(p: Any) -> Any:
    if p == "bad":
        return _diverge(1.0)
    return p


def _check_traceback(state: Path, wid: str, where: str) -> None:
    """The last failure's traceback of ``wid`` is in the journals and every face shows it."""
    tb = deferred(state)[wid]["traceback"]
    assert "Traceback (most recent call last)" in tb and tb.endswith("ValueError: diverged")
    assert "in _diverge" in tb and where in tb
    assert "call_work_function" not in tb  # the library's own frame is left out
    requeued = [
        r.payload
        for r in read_journal(state / "events.jsonl")
        if r.payload.get("event") in ("requeued", "deferred") and r.payload["work_id"] == wid
    ]
    assert requeued and all("ValueError: diverged" in r["traceback"] for r in requeued)
    shown = _cli("deferred", "show", str(state), wid)
    assert "traceback (its last failure)" in shown and "    ValueError: diverged" in shown
    assert json.loads(_cli("deferred", "show", str(state), wid, "--json"))["traceback"] == tb
    rows = {r["work_id"]: r for r in map(json.loads, _jsonl(_cli("joblog", str(state), "--jsonl")))}
    assert rows[wid]["traceback"] == tb
    assert all(r["traceback"] is None for w, r in rows.items() if w != wid)
    _cli("compact", str(state))  # compaction keeps it (the defer journal holds it)
    rows = {r["work_id"]: r for r in map(json.loads, _jsonl(_cli("joblog", str(state), "--jsonl")))}
    assert rows[wid]["traceback"] == tb


def test_the_traceback_of_an_in_process_worker_is_kept(tmp_path: Path) -> None:
    items = [WorkItem("good", "good"), WorkItem("bad", "bad")]
    run_master(items, tmp_path / "s", comm=LocalWorkers(_simulate, 1), retry=RetryPolicy(1))
    _check_traceback(tmp_path / "s", "bad", "in _simulate")


def test_a_long_traceback_keeps_its_last_50_lines(tmp_path: Path) -> None:
    def deep(n: int) -> Any:  # (two functions in turn: Python folds a frame repeated)
        return deeper(n - 1) if n else _diverge(0.0)

    def deeper(n: int) -> Any:
        return deep(n - 1)

    run_master(
        [WorkItem("deep", 60)], tmp_path / "s", comm=LocalWorkers(deep, 1), retry=RetryPolicy(0)
    )
    tb = deferred(tmp_path / "s")["deep"]["traceback"]
    lines = tb.splitlines()
    assert len(lines) == 50 and lines[0].endswith("earlier lines cut)")
    assert lines[-1] == "ValueError: diverged"


@pytest.mark.parametrize("mode", ["plain", "isolate"])
def test_the_traceback_of_an_mpi_worker_is_kept(tmp_path: Path, mode: str) -> None:
    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    script = Path(__file__).parent / "children" / "values_campaign.py"
    cmd = mpiexec_command(3, [sys.executable, str(script), str(tmp_path / "s"), mode])
    res = run_mpiexec(cmd, timeout=150)
    assert res.returncode == 0, res.stdout + res.stderr
    _check_traceback(tmp_path / "s", "raise", "values_campaign.py")


# ----------------------------------------------------------------------- campaign identity
def test_a_state_directory_belongs_to_one_campaign(tmp_path: Path) -> None:
    from durable_dispatch.errors import CampaignMismatchError

    state = tmp_path / "s"
    run_master([WorkItem("a1", 1)], state, comm=LocalWorkers(abs, 1), campaign="sweep")
    assert json.loads((state / "campaign-name.json").read_text())["campaign"] == "sweep"
    assert json.loads(_cli("stats", str(state), "--json"))["campaign"] == "sweep"
    assert "name       sweep" in _cli("stats", str(state))
    before = {p.name: p.read_bytes() for p in state.iterdir() if p.is_file()}
    with pytest.raises(CampaignMismatchError) as e:
        run_master([WorkItem("b1", 1)], state, comm=LocalWorkers(abs, 1), campaign="other")
    assert "'sweep'" in str(e.value) and "'other'" in str(e.value)
    assert (e.value.recorded, e.value.given, e.value.path) == ("sweep", "other", str(state))
    after = {p.name: p.read_bytes() for p in state.iterdir() if p.is_file()}
    assert after == before  # nothing was added, nothing opened
    # the same name goes on
    run_master([WorkItem("a2", 2)], state, comm=LocalWorkers(abs, 1), campaign="sweep")
    assert {r.work_id for r in read_results(state)} == {"a1", "a2"}


def test_a_state_directory_of_before_names_adopts_the_first_name(tmp_path: Path) -> None:
    from durable_dispatch.errors import CampaignMismatchError

    state = tmp_path / "s"
    run_master([WorkItem("a1", 1)], state, comm=LocalWorkers(abs, 1), campaign="old")
    (state / "campaign-name.json").unlink()  # as a state directory of an earlier version
    assert "(none recorded yet)" in _cli("stats", str(state))
    run_master([WorkItem("a2", 1)], state, comm=LocalWorkers(abs, 1), campaign="adopted")
    assert json.loads(_cli("stats", str(state), "--json"))["campaign"] == "adopted"
    with pytest.raises(CampaignMismatchError):
        run_master([WorkItem("a3", 1)], state, comm=LocalWorkers(abs, 1), campaign="old")


def test_the_default_name_is_the_main_scripts_file_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from durable_dispatch.campaign.identity import default_name

    for argv0, name in [
        ("/home/u/sweep.py", "sweep.py"),
        ("/x/pkg/__main__.py", "pkg"),
        ("-c", None),
        ("", None),
    ]:
        monkeypatch.setattr(sys, "argv", [argv0, "--flag"])
        assert default_name() == name
    body = (
        "import sys\n"
        "from durable_dispatch import WorkItem\n"
        "from durable_dispatch.mpi import run_master\n"
        "from durable_dispatch.testing import LocalWorkers\n"
        "run_master([WorkItem(sys.argv[2], 1)], sys.argv[1], comm=LocalWorkers(abs, 1))\n"
    )
    (tmp_path / "first.py").write_text(body)
    (tmp_path / "second.py").write_text(body)
    state = tmp_path / "s"

    def run(script: str, wid: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(tmp_path / script), str(state), wid]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    assert run("first.py", "f1").returncode == 0
    assert run("first.py", "f2").returncode == 0  # the same script, again
    refused = run("second.py", "s1")
    assert refused.returncode != 0
    assert "CampaignMismatchError" in refused.stderr
    assert "'first.py'" in refused.stderr and "'second.py'" in refused.stderr
    assert {r.work_id for r in read_results(state)} == {"f1", "f2"}


def test_the_futures_runner_names_the_campaign_after_the_script_it_runs(tmp_path: Path) -> None:
    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    script = tmp_path / "squares.py"
    script.write_text(
        "from durable_dispatch.futures import MPIPoolExecutor\n"
        "if __name__ == '__main__':\n"
        "    with MPIPoolExecutor() as ex:\n"
        "        print('sum', sum(ex.map(abs, [-1, 2, -3])))\n"
    )
    runner = [sys.executable, "-m", "durable_dispatch.futures", "--state-dir", str(tmp_path)]
    res = run_mpiexec(mpiexec_command(2, [*runner, str(script)]), timeout=120)
    assert res.returncode == 0 and "sum 6" in res.stdout, res.stderr[-3000:]
    (d,) = [p.parent for p in tmp_path.glob("*/campaign-name.json")]
    assert json.loads((d / "campaign-name.json").read_text())["campaign"] == "squares.py"


def test_a_refused_feed_payload_ends_the_run_and_adds_nothing_of_that_call(tmp_path: Path) -> None:
    from durable_dispatch.mpi import Feed

    class Bad(Feed):
        def refill(self) -> None:
            self.state.submit([WorkItem("fine", 1), WorkItem("feed-7", {"when": (2026, 12)})])
            self.exhausted = True

    with pytest.raises(RecordEncodeError, match=r"'feed-7': its payload at \.when: \(2026, 12\)"):
        run_master(Bad(), tmp_path / "s", comm=LocalWorkers(abs, 1))
    assert not view_state(tmp_path / "s").projection.known("fine")


def test_a_refused_result_in_a_batch_is_deferred_at_once_and_the_rest_commit(
    tmp_path: Path,
) -> None:
    items = [WorkItem(f"w{i}", i) for i in range(8)]
    fn = lambda p: {"v": {p}} if p == 5 else {"v": p}  # noqa: E731 - a set at w5
    report = run_master(
        items, tmp_path / "s", comm=LocalWorkers(fn, 1), batch=4, retry=RetryPolicy(3)
    )
    assert report.finished
    assert {r.work_id for r in read_results(tmp_path / "s")} == {f"w{i}" for i in range(8)} - {"w5"}
    d = deferred(tmp_path / "s")["w5"]
    assert (d["attempts"], d["kinds"]) == (1, ["malformed-result"]) and ".v" in d["last_error"]


def _fails(p: Any) -> Any:
    raise ValueError("diverged")


def test_deferred_show_gives_a_non_finite_payload_back_as_given(tmp_path: Path) -> None:
    """``deferred show`` of an item whose payload holds NaN and infinities shows the user's
    values (``NaN``, ``Infinity``, ``-Infinity`` as Python's json writes them, which it reads
    back), never the journal's stored form and never ``null``."""
    state = tmp_path / "s"
    payload = {"x": math.nan, "y": [math.inf, -math.inf], "z": 1.5}
    run_master([WorkItem("p", payload)], state, comm=LocalWorkers(_fails, 1), retry=RetryPolicy(0))
    as_json = json.loads(_cli("deferred", "show", str(state), "p", "--json"))
    assert same(as_json["item"]["payload"], payload), as_json["item"]
    shown = _cli("deferred", "show", str(state), "p")
    assert "item.payload.x" in shown and "nan" in shown and "inf, -inf" in shown, shown
    assert "~nonfinite" not in shown and "null" not in shown, shown
