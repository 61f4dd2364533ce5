"""The design note's experiments (§6), on real ``mpiexec`` campaigns (issue 19).

Usage::

    python benchmarks/experiments.py --quick          # a few minutes: a small sweep, 2 seeds
    python benchmarks/experiments.py                  # the full sweep (about half an hour)
    python benchmarks/experiments.py --cell           # one campaign of each group (the CI smoke)
    python benchmarks/experiments.py --docs docs      # also write docs/experiments.md + figures

Group 1, the watchdog on and off. Each campaign runs ``Setup.items`` items on ``Setup.workers``
isolated workers (``run_worker(isolate=True)``). An item's task time is drawn from a log-normal
distribution (median ``Setup.median`` seconds, spread ``sigma``); a fraction of items is merely
slow (``Setup.slow_factor`` times longer, on every attempt), and each attempt hangs with
probability ``hang``. The watchdog is off, a multiple of the median task time, or the adaptive rule
(``WatchdogConfig(120, quantile=0.99)``, see :data:`ADAPTIVE`). Every campaign has the same
workers (fixed CPU) and the same time budget (fixed campaign time). Per campaign it measures, from
the durable journal:

  recovery          hung items that ended committed or deferred, over hung items
  false suspicions  timeouts of attempts that were not hangs (they would have finished)
  duplicate CPU     rank-seconds of attempts that were not hangs and did not commit
  hung CPU          rank-seconds spent in hung attempts until they were killed
  time to target    seconds until every item was committed or deferred (censored at the budget)
  good deferred     items that never hung but were deferred (timed out on every attempt)
  parked            ranks parked at the end

Group 2, real rank kills. ``Setup.kills`` worker ranks of a campaign get SIGKILL from this driver at
seeded random moments. Under ULFM it measures kill-to-rollback latency (the master's rollback
time minus the kill time, both ``time.time()`` on this machine), completion on the survivors, work
lost and duplicate commits (both must be 0). Without ULFM, for contrast, the same kill ends the
job; the same command run again resumes from the state directory and must finish with nothing
lost and nothing committed twice.

Every number is a mean over seeds with a 95% confidence interval (Student's t; see
:func:`mean_ci`). Task times are sleeps, so a rank-second here is what a real task would burn.
Raw results go to ``--json``; ``--docs DIR`` writes ``experiments.md`` and SVG figures there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))  # the experiment package beside this script

# The parts, by job (benchmarks/experiment/); their names are re-exported here for the tests.
from experiment import *  # noqa: E402, F403
from experiment import (  # noqa: E402
    Setup,
    role_campaign,
    summarize_group1,
    sweep,
    table_group1,
    table_group2,
    write_docs,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--role", choices=["campaign"])
    ap.add_argument("config", nargs="?")
    ap.add_argument("--quick", action="store_true", help="a small sweep of a few minutes")
    ap.add_argument("--cell", action="store_true", help="one campaign of each group (CI)")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument(
        "--json",
        default=None,
        help="write the raw results here (and each campaign as it ends to JSON.partial.jsonl, "
        "from which a stopped sweep resumes)",
    )
    ap.add_argument("--from-json", default=None, help="render docs from saved raw results")
    ap.add_argument("--docs", default=None, help="write experiments-results.md and figures here")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent.parent / "src"))  # this checkout's library, not another
    if a.role == "campaign":
        role_campaign(a.config)
        return 0
    s = Setup()
    if a.quick:
        s = Setup(
            items=40, seeds=2, sigmas=(1.0,), hangs=(0.0, 0.1), multiples=(None, 4.0, 16.0),
            kill_seeds=2, budget=12.0,
        )  # fmt: skip
    if a.cell:
        s = Setup(items=24, budget=30.0, kill_workers=4, kills=1)
    if a.seeds is not None:
        s.seeds = s.kill_seeds = a.seeds
    if a.from_json:
        raw = json.loads(Path(a.from_json).read_text())
    else:
        partial = f"{a.json}.partial.jsonl" if a.json else None
        raw = sweep(s, a.cell, lambda m: print(m, flush=True), partial)
    if a.json:
        Path(a.json).write_text(json.dumps(raw, indent=1))
    lines = summarize_group1(raw["group1"])
    print(table_group1(lines, raw["setup"]["budget"]))
    print()
    print(table_group2(raw["group2"]))
    if a.docs:
        for p in write_docs(raw, a.docs):
            print("wrote", p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
