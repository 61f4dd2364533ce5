"""The torture harness's check of ranks parked at a campaign's end (``torture.parked_at_end``),
on the files a run leaves (its report, ``ops.jsonl``, ``faults.jsonl``), with no run: with
isolation a parked rank at the end is a violation, unless the run was drained (a drain does not
wait for a parked rank's READY) or the nemesis held that rank's worker or child stopped into the
master's linger."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import torture  # noqa: E402

END = 1796685177.814  # when the master of seed 2144568252 wrote its report


def _run(
    tmp: Path,
    *,
    parked: int = 1,
    run: int | None = 0,
    ops: list[dict[str, Any]] = (),  # type: ignore[assignment]
    faults: list[dict[str, Any]] = (),  # type: ignore[assignment]
    isolate: bool = True,
) -> list[str]:
    """What the check says of a run that ended at END with ``parked`` ranks parked."""
    report: dict[str, Any] = {"finished": True, "reason": None}
    report["stats"] = {"core": {"parked_ranks_now": parked, "in_flight_now": 0}}
    if run is not None:
        report |= {"run": run, "t": END}
    (tmp / "report-31586.json").write_text(json.dumps(report))
    (tmp / "ops.jsonl").write_text("".join(json.dumps(o) + "\n" for o in ops))
    (tmp / "faults.jsonl").write_text("".join(json.dumps(f) + "\n" for f in faults))
    return torture.parked_at_end({"isolate": isolate}, tmp)


def _drain(ran_in: int | None = 0, by: str | None = "master") -> dict[str, Any]:
    """An operator's ``drain`` as ``ops.jsonl`` logs it (the answer of seed 2144568252's)."""
    answer = {"op": "drain", "ok": True, "message": "the master is draining"}
    if by is not None:
        answer["applied_by"] = by
    return {"run": 0, "do": "op-drain", "ran_in": ran_in, "rc": 0, "answer": answer}


def _cancel() -> dict[str, Any]:
    answer = {"op": "cancel", "ok": True, "work_ids": {"i008": "cancelled in flight"}}
    return {"run": 0, "do": "op-cancel", "ids": ["i008"], "ran_in": 0, "rc": 0, "answer": answer}


def _stop(rank: int | None, at: float, until: float | None, do: str = "stop-child") -> list[Any]:
    """A stop of a pid of ``rank`` at ``at``, continued at ``until`` (None: never in the run)."""
    pid = 40000 + (rank or 0)
    out = [{"run": 0, "do": do, "pid": pid, "rank": rank, "t": at}]
    if until is not None:
        out.append({"run": 0, "do": "cont", "pid": pid, "t": until})
    return out


def test_a_rank_parked_at_the_end_of_a_run_not_drained_nor_stopped_is_a_violation(
    tmp_path: Path,
) -> None:
    assert _run(tmp_path, ops=[_cancel()]) == [
        "1 rank(s) parked at the end with isolation on (run 0 was not drained; ranks stopped "
        "into the linger: none)"
    ]


def test_without_isolation_a_parked_rank_is_not_checked(tmp_path: Path) -> None:
    """(a hung in-process function parks its rank until the job ends, by design)"""
    assert _run(tmp_path, isolate=False) == []


def test_a_run_drained_by_an_operator_may_end_with_a_rank_parked(tmp_path: Path) -> None:
    """Seed 2144568252: a cancel in flight parked rank 3 until its worker, which restarts its
    killed child before it says READY, answered; that child was SIGSTOPped while it started;
    the operator's drain ended the run once nothing was in flight, with no linger."""
    faults = _stop(3, END - 1.02, END + 0.25)
    assert _run(tmp_path, ops=[_cancel(), _drain()], faults=faults) == []


def test_a_run_drained_by_sigusr1_may_end_with_a_rank_parked(tmp_path: Path) -> None:
    drain = {"run": 0, "do": "drain", "pid": 123, "rank": None, "t": END - 0.5}
    assert _run(tmp_path, parked=2, faults=[drain]) == []


@pytest.mark.parametrize(
    "drain",
    [_drain(ran_in=1), _drain(ran_in=None), _drain(by=None)],
    ids=["in-another-run", "between-runs", "not-applied-by-a-master"],
)
def test_only_a_drain_the_master_applied_in_that_run_excuses_a_parked_rank(
    tmp_path: Path, drain: dict[str, Any]
) -> None:
    assert len(_run(tmp_path, ops=[drain])) == 1


def test_a_report_without_its_run_is_checked_as_before(tmp_path: Path) -> None:
    """(a report written before the report said its run: nothing excuses a parked rank)"""
    assert len(_run(tmp_path, run=None, ops=[_drain()])) == 1


@pytest.mark.parametrize("do", ["stop-child", "stop-worker"])
def test_a_rank_stopped_into_the_linger_may_end_parked(tmp_path: Path, do: str) -> None:
    linger_began = END - torture.LINGER
    assert _run(tmp_path, faults=_stop(2, END - 3.0, linger_began + 0.1, do)) == []
    assert _run(tmp_path, faults=_stop(2, END - 1.0, None, do)) == []  # continued after the end


def test_a_rank_continued_before_the_linger_had_time_to_answer(tmp_path: Path) -> None:
    assert len(_run(tmp_path, faults=_stop(2, END - 4.0, END - torture.LINGER - 0.1))) == 1


def test_each_parked_rank_needs_a_stop_of_its_own(tmp_path: Path) -> None:
    late = END - 0.5
    one = _stop(2, END - 1.0, late)
    assert len(_run(tmp_path, parked=2, faults=one + _stop(2, END - 0.9, late))) == 1
    assert _run(tmp_path, parked=2, faults=one + _stop(3, END - 0.9, late)) == []
    assert len(_run(tmp_path, parked=2, faults=one + _stop(None, END - 0.9, late))) == 1
