"""The torture harness is tested too (issue 35): each planted bug is caught within a few
scenarios, a clean scenario passes, and a scenario replays from its file. The harness itself is
``benchmarks/torture.py``; CI also runs it for a few minutes on a fixed seed list and a fresh
seed (``.ci/run``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import torture  # noqa: E402

# Every test here runs scenarios under mpiexec inside the harness, where the tier classifier
# (tests/conftest.py) does not look: so the tier is stated.
pytestmark = [pytest.mark.mpi, pytest.mark.loop]


#: How long a run of a planted bug's scenario may take. A run of the restart profile's
#: scenarios ends in about 4 s on the real code (the control below, two runs, took 8.5 s under a
#: full suite, and runs them to the harness's own bound, 57 s); with the planted bug a hang never
#: ends, so any bound finds it, and waiting out 57 s bought nothing.
PLANTED_BOUND = 15.0


def _first_violation(plant: str, profile: str, tmp: Path, tries: int = 3) -> list[str]:
    for seed in range(tries):
        s = torture.generate(seed, profile)
        out = torture.run_scenario(s, tmp / f"s{seed}", plant, bound=PLANTED_BOUND)
        if out.violations:
            return out.violations
    return []


@pytest.mark.parametrize(
    ("plant", "profile", "finding"),
    [
        ("double-commit", "commit", "committed more than once"),
        ("drop-child", "spawn", "neither committed nor deferred"),
        ("deadline-after-restart", "restart", "did not end by itself"),
    ],
)
def test_each_planted_bug_is_caught_within_a_few_scenarios(
    tmp_path: Path, plant: str, profile: str, finding: str
) -> None:
    """A commit journaled twice, a child the callback returned but the state dropped, and an
    item's own timeout ignored once the master restarted: the checker names each."""
    violations = _first_violation(plant, profile, tmp_path)
    assert any(finding in v for v in violations), violations


@pytest.mark.parametrize("profile", ["commit", "spawn", "restart"])
def test_the_same_scenarios_without_the_bugs_pass(tmp_path: Path, profile: str) -> None:
    """The control: the scenarios that catch the planted bugs pass on the real code (so the
    findings above come from the bugs, not from the scenarios)."""
    out = torture.run_scenario(torture.generate(0, profile), tmp_path / "s")
    assert out.violations == [] and out.runs >= (2 if profile == "restart" else 1)


def test_a_scenario_is_the_same_for_a_seed_and_replays_from_its_file(tmp_path: Path) -> None:
    a, b = torture.generate(12345), torture.generate(12345)
    assert a == b and a != torture.generate(12346)
    modes = set()
    for s in (torture.generate(seed) for seed in range(50)):
        modes.add(s.get("mode", "campaign"))
        iso = {k for k, (_, _, needs) in torture.KINDS.items() if needs}
        if not s["isolate"]:  # a hang or a segfault without isolation is not a scenario
            assert not {i["kind"] for i in s["items"]} & iso
        if s.get("mode") != "futures":  # there every call has the executor's task_timeout
            assert all(i["timeout"] for i in s["items"] if i["kind"] == "hang")
    assert modes == {"campaign", "futures"}
    small = torture.generate(7, "commit")
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(small))
    assert torture.main(["--scenario", str(path), "--out", str(tmp_path / "f")]) == 0


def test_cis_fixed_seeds_cross_every_pair_of_features() -> None:
    """Issue 58: the features the harness names meet pairwise in CI's fixed seeds (.ci/run),
    every pair that can occur, the futures face's included (its calls taking other calls'
    futures as arguments, and an operator's cancel, retry and drain of them); and a seed's
    features are what its scenario holds."""
    import re

    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    line = next(x for x in ci.splitlines() if "benchmarks/torture.py" in x and "--seed" in x)
    seeds = [int(x) for x in re.findall(r"--seed (\d+)", line)]
    scenarios = [torture.generate(seed) for seed in seeds]
    assert torture.pairs_covered(scenarios) == torture.all_pairs()
    table = torture.pair_table(scenarios)
    n = len(torture.all_pairs())
    assert table.startswith(f"pairs of features covered: {n} of {n}\n")
    assert "not covered" not in table
    one = scenarios[0]
    assert {"after-child", "after-submitted", "feed", "children", "op-submit"} <= (
        torture.features(one)
    )
    assert any("." in d for i in one["items"] for d in i.get("after", ()))  # waits for a child
    futures = [s for s in scenarios if s.get("mode") == "futures"]
    for s in futures:  # futures as arguments, and the operator's commands on the calls
        assert {"after-static", "op-cancel", "op-retry", "op-drain"} <= torture.features(s)
        assert all(j < n for n, it in enumerate(s["items"]) for j in it.get("after", ()))
        cancels = [a for a in s["nemesis"] if a["do"] == "op-cancel"]
        assert cancels and all(a["calls"] for a in cancels)
    assert {s["isolate"] for s in futures} == {True, False}
    # between runs too (no master running: the command opens the directory)
    assert any(a.get("between") for s in futures for a in s["nemesis"])


REGRESSIONS = [
    # a scenario found under ULFM runs only where there is one (the ulfm tier: conftest.py)
    pytest.param(
        p, id=p.stem, marks=[pytest.mark.ulfm] if json.loads(p.read_text()).get("ulfm") else []
    )
    for p in sorted((Path(__file__).parent / "testdata" / "torture").glob("*.json"))
]


@pytest.mark.parametrize("path", REGRESSIONS)
def test_each_scenario_the_harness_found_failing_passes_now(tmp_path: Path, path: Path) -> None:
    """The scenarios the harness found, shrunk and kept: ``orphan-then-worker-killed``, items
    that leave a process running and a worker SIGKILLed after them: the orphans kept the
    dead rank's output pipes open and mpiexec never ended (fixed in the isolated worker);
    ``operator-commands-on-a-full-disk`` (CI's seed 607701747): a ``cancel`` and a ``submit``
    the full tmpfs refused exited 2 without saying that nothing was sent (now they say so, and
    the checker holds that they had no effect), and a ``cancel`` after the disk frees works."""
    out = torture.run_scenario(json.loads(path.read_text()), tmp_path / "s")
    assert out.violations == []
