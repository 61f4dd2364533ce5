"""This tree against a base commit, in one invocation, alternating: every figure as new/base.

Usage: ``python benchmarks/compare.py --base REF [--rounds 3] [--tasks 20000] [--only NAME ...]``

It checks out REF in a temporary git worktree and measures both trees in turn, round after
round (base, new, base, new, ...), so a noisy moment of a shared machine hits both alike; each
figure is the median of its rounds, and the ratio new/base is printed with the spread of the
rounds. Each tree is measured with *its own* ``benchmarks/bench_mpi.py`` (so a base whose
private API differs is measured as it was), its own ``src`` first on ``PYTHONPATH``, its source
byte-compiled first (as pip installs it) and, under ``mpiexec``, its package imported before the
benchmark starts its clock (``_warm.py``: a campaign's throughput, not its imports):

  ceiling-1, ceiling-64   the master without MPI (``ceiling_without_mpi``): campaign state +
                          core with instant in-process workers, batch 1 and 64, tasks/s
  mpi-1, mpi-64           ``run_master``/``run_worker`` under ``mpiexec`` (1 master + 3 workers),
                          batch 1 and 64, tasks/s
  bare                    the plain mpi4py send/recv loop under the same mpiexec: the library
                          is not in it, so its ratio shows the machine's drift (about 1.0)
  durable, durable-isolated
                          ``durable_dispatch.futures``' executor ``map`` under its runner
                          (``python -m durable_dispatch.futures``, 1 + 3 ranks), each call
                          durable, with ``isolate=False`` and ``isolate=True``, tasks/s

Under ``mpiexec`` each rank's CPU seconds are read too: the master's CPU per task and the
workers' are printed after the figures (a loaded machine moves them much less than tasks/s,
which also depends on how the OS schedules 4 ranks on few cores). A ratio above 1.0 is faster
than the base. This is the check every performance claim in a closing note is made with
(STYLE.md: compare with the base, not with yourself). pyperf is not used: each figure is a whole
campaign's throughput, printed by the benchmark itself (several processes under mpiexec), not a
calibrated loop of one Python callable. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec  # noqa: E402

FIGURES = (
    "ceiling-1",
    "ceiling-64",
    "mpi-1",
    "mpi-64",
    "bare",
    "durable",
    "durable-isolated",
    "durable-64",
    "durable-64-isolated",
    "futures-1",
    "futures-64",
)
#: the figures that do not run the library (the anchors): the same in both trees, so their
#: ratio shows the machine's drift; each is also what a figure of ours is read against
ANCHORS = {"mpi-64": "bare", "mpi-1": "futures-1", "durable": "futures-1"}
ANCHORS |= {"durable-64": "futures-64", "durable-64-isolated": "futures-64"}
#: the calls of a chunked map (as issue figures and mpi4py's own are measured)
MAP_TASKS = 200_000


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), env.get("PYTHONPATH", "")])
    return env


def _last_json(text: str, what: str, key: str = "tasks_per_s") -> dict[str, float]:
    for line in reversed(text.splitlines()):
        if line.startswith("{") and key in line:
            return json.loads(line)  # type: ignore[no-any-return]
    raise SystemExit(f"{what}: no result\n{text[-3000:]}")


#: the master's (rank 0's) CPU microseconds per task of the last ``mpi`` figure measured
#: (``_warm.py`` prints each rank's), or None where the figure has none
LAST_CPU: list[float | None] = [None, None]


def ceiling(tree: Path, tasks: int, batch: int) -> float:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_mpi; "
        "print(json.dumps({'tasks_per_s': bench_mpi.ceiling_without_mpi(int(sys.argv[2]), 3, "
        "int(sys.argv[3]))}))"
    )
    cmd = [sys.executable, "-c", code, str(tree / "benchmarks"), str(tasks), str(batch)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(tree), timeout=900)
    return _last_json(out.stdout + out.stderr, f"ceiling {batch} in {tree}")["tasks_per_s"]


#: Launches of one figure: Open MPI's runtime sometimes fails to start at all ("The PMIx
#: server's listener thread failed to start", exit 213) before any rank ran; such a launch is
#: made again, any other failure ends the comparison.
LAUNCH_TRIES = 3


def mpi(
    tree: Path,
    tasks: int,
    role: list[str],
    runner: list[str] = [],  # noqa: B006
    script_tree: Path | None = None,
    state: bool = True,
) -> float:
    """A figure under mpiexec: ``bench_mpi.py`` of ``script_tree`` (default: ``tree``; the
    new tree's for a figure the base's script cannot run, on the base's package all the same)."""
    script = str((script_tree or tree) / "benchmarks" / "bench_mpi.py")
    for attempt in range(LAUNCH_TRIES):
        with tempfile.TemporaryDirectory(prefix="dd-compare-") as d:
            warm = [] if runner else [str(HERE / "_warm.py")]  # the imports before the clock
            args = [sys.executable, *runner, *warm, script, *role, "--tasks", str(tasks)]
            args += ["--state-dir", d + "/s"] if state else []
            res = run_mpiexec(mpiexec_command(4, args), timeout=900, env=_env(tree), quiet=True)
        out = res.stdout + res.stderr
        never_started = res.returncode == 213 or "listener thread failed to start" in out
        if not never_started or attempt == LAUNCH_TRIES - 1:
            break
        print(f"{role} in {tree}: the MPI runtime did not start; again", file=sys.stderr)
    got = _last_json(out, f"{role} in {tree}")
    ranks = [json.loads(x) for x in out.splitlines() if x.startswith('{"rank"')]
    master = [r["cpu_s"] for r in ranks if r["rank"] == 0]
    LAST_CPU[0] = master[0] * 1e6 / tasks if master else None
    workers = [r["cpu_s"] for r in ranks if r["rank"] != 0]
    LAST_CPU[1] = sum(workers) * 1e6 / tasks if workers else None
    return got["tasks_per_s"]


def measures(tasks: int) -> dict[str, Callable[[Path], float]]:
    return {
        "ceiling-1": lambda t: ceiling(t, tasks // 4, 1),
        "ceiling-64": lambda t: ceiling(t, tasks, 64),
        "mpi-1": lambda t: mpi(t, tasks // 4, ["--role", "ours", "--batch", "1"]),
        "mpi-64": lambda t: mpi(t, tasks, ["--role", "ours", "--batch", "64"]),
        "bare": lambda t: mpi(t, tasks, ["--role", "bare"]),
        "durable": lambda t: mpi(t, tasks // 4, ["--role", "durable"], FUTURES),
        "durable-isolated": lambda t: mpi(
            t, tasks // 4, ["--role", "durable", "--isolate"], FUTURES
        ),
        "durable-64": lambda t: mpi(t, MAP_TASKS, CHUNKED, FUTURES, ROOT),
        "durable-64-isolated": lambda t: mpi(t, MAP_TASKS, [*CHUNKED, "--isolate"], FUTURES, ROOT),
        "futures-1": lambda t: mpi(t, tasks // 10, MPI4PY + ["1"], MPI4PY_RUNNER, ROOT, False),
        "futures-64": lambda t: mpi(t, MAP_TASKS, MPI4PY + ["64"], MPI4PY_RUNNER, ROOT, False),
    }


#: the durable map of chunksize 64 (the new tree's script: the base's has no --chunksize)
CHUNKED = ["--role", "durable", "--chunksize", "64"]
#: mpi4py's own MPIPoolExecutor.map (the anchor), under its runner; then its chunksize
MPI4PY = ["--role", "futures", "--batch"]
MPI4PY_RUNNER = ["-m", "mpi4py.futures"]


#: the futures runner, which ``bench_mpi.py --role durable`` runs under
FUTURES = ["-m", "durable_dispatch.futures"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit to compare with (a git revision)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median kept)")
    ap.add_argument("--tasks", type=int, default=20000, help="tasks per campaign (batch 1: /4)")
    ap.add_argument("--only", nargs="*", choices=FIGURES, help="measure only these figures")
    ap.add_argument(
        "--anchors-once",
        action="store_true",
        help="measure the anchors (bare, futures-1, futures-64) under the new tree only",
    )
    a = ap.parse_args()
    base_dir = Path(tempfile.mkdtemp(prefix="dd-compare-base-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(base_dir), a.base],
        check=True,
        capture_output=True,
    )
    trees = {"base": base_dir, "new": ROOT}
    for tree in trees.values():  # as an installed package: its bytecode written once, not on
        # each launch (PYTHONDONTWRITEBYTECODE, set here, made every rank compile the package)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "src")], check=True)
    figs = {k: v for k, v in measures(a.tasks).items() if not a.only or k in a.only}
    got: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    wcpu: dict[tuple[str, str], list[float]] = {}
    anchors = set(ANCHORS.values()) | {"bare"}
    try:
        for r in range(a.rounds):
            for name, fn in figs.items():
                for which in ("base", "new") if r % 2 == 0 else ("new", "base"):
                    if a.anchors_once and name in anchors and which == "base":
                        continue
                    LAST_CPU[:] = [None, None]
                    got.setdefault((name, which), []).append(fn(trees[which]))
                    if LAST_CPU[0] is not None:
                        cpu.setdefault((name, which), []).append(LAST_CPU[0])
                    if LAST_CPU[1] is not None:
                        wcpu.setdefault((name, which), []).append(LAST_CPU[1])
            print(f"round {r + 1} of {a.rounds} done", file=sys.stderr, flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_dir)])
        shutil.rmtree(base_dir, ignore_errors=True)
    print(f"new: {ROOT} (HEAD and its working tree); base: {a.base}; {a.rounds} rounds, medians")
    print(
        f"{'figure':<12} {'base tasks/s':>14} {'new tasks/s':>14} {'new/base':>9}  rounds' ratios"
    )
    for name in figs:
        n = got[(name, "new")]
        b = got.get((name, "base"), n)  # (an anchor measured once: under the new tree)
        ratios = " ".join(f"{x / y:.2f}" for x, y in zip(n, b, strict=True))
        mb, mn = statistics.median(b), statistics.median(n)
        print(f"{name:<12} {mb:14,.0f} {mn:14,.0f} {mn / mb:9.2f}  {ratios}")
    pairs = [(f, x) for f, x in ANCHORS.items() if f in figs and x in figs]
    if pairs:
        print("against the anchors, in this run (medians; each tree's figure / the anchor's")
        print("median over both trees' runs: the anchors do not run the library)")
        print(f"{'figure':<20} {'anchor':<11} {'base':>7} {'new':>7}")
        for f, x in pairs:
            anchor = statistics.median(got[(x, "new")] + got.get((x, "base"), []))
            fb = statistics.median(got[(f, "base")]) / anchor
            fn_ = statistics.median(got[(f, "new")]) / anchor
            print(f"{f:<20} {x:<11} {fb:7.3f} {fn_:7.3f}")
    heads = {
        "the master's CPU per task (rank 0's CPU seconds over the run / tasks, median;": cpu,
        "the workers' CPU per task (every worker rank's CPU seconds over the run / tasks,": wcpu,
    }
    tails = (
        "base/new: above 1.0 the new tree spends less; a loaded machine moves it less)",
        "median: on few cores the workers' cost per item counts as much as the master's)",
    )
    for (head, table), tail in zip(heads.items(), tails, strict=True):
        if not table:
            continue
        print(head)
        print(tail)
        print(f"{'figure':<12} {'base us/task':>14} {'new us/task':>14} {'base/new':>9}")
        for name in figs:
            if (name, "base") in table and (name, "new") in table:
                cb = statistics.median(table[(name, "base")])
                cn = statistics.median(table[(name, "new")])
                print(f"{name:<12} {cb:14.1f} {cn:14.1f} {cb / cn:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
