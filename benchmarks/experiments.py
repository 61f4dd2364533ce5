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
import hashlib
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()

# ------------------------------------------------------------------ statistics (pure)
#: Two-sided 95% critical values of Student's t by degrees of freedom (any table; e.g. NIST's
#: Engineering Statistics Handbook, 1.3.6.7.2). Beyond 30 the normal value is within 2%.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_critical(df: int) -> float:
    """The two-sided 95% critical value of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    return statistics.NormalDist().inv_cdf(0.975)


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` runs and the half-width of its 95% confidence interval (None for one
    run: a single run has no spread to estimate)."""

    mean: float
    half: float | None
    n: int

    def text(self, digits: int = 2) -> str:
        """``mean ± half`` (or the mean alone for a single run)."""
        if self.half is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half:.{digits}f}"


def mean_ci(values: Iterable[float]) -> Estimate:
    """The mean of ``values`` with a 95% confidence interval: mean ± t(0.975, n-1)·s/√n, with
    ``s`` the sample standard deviation. Runs are independent (one seed each).

    Raises:
        ValueError: no values.
    """
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("no values")
    m = statistics.fmean(xs)
    if len(xs) == 1:
        return Estimate(m, None, 1)
    return Estimate(m, t_critical(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs)), len(xs))


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, 95th percentile (the inclusive method: it stays within the data) and max."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    p95 = statistics.quantiles(xs, n=20, method="inclusive")[18] if len(xs) > 1 else xs[0]
    return {"median": statistics.median(xs), "p95": p95, "max": xs[-1]}


@dataclass
class Attempt:
    """One dispatch of one item, as the journal tells it."""

    work_id: str
    index: int  # 0 for the item's first dispatch
    start: float
    end: float | None = None
    outcome: str = "open"  # committed | requeued | deferred | open (in flight at the end)
    kind: str | None = None  # the failure kind of a requeue or deferral


def attempts_of(records: Iterable[Mapping[str, Any]]) -> dict[str, list[Attempt]]:
    """Each work ID's attempts, in order, from a state journal's records (one item per dispatch;
    the experiments run with ``batch=1``).

    Raises:
        ValueError: a multi-item dispatch, or an outcome for a token never dispatched.
    """
    by_token: dict[str, Attempt] = {}
    out: dict[str, list[Attempt]] = {}
    for r in records:
        ev = r.get("event")
        if ev not in ("dispatched", "committed", "requeued", "deferred"):
            continue
        if "work_ids" in r:
            raise ValueError("the experiments' accounting counts one item per dispatch")
        wid, tok = r["work_id"], r.get("token")
        if ev == "dispatched":
            a = Attempt(wid, len(out.get(wid, [])), float(r["ts"]))
            out.setdefault(wid, []).append(a)
            by_token[tok] = a
            continue
        a = by_token.pop(tok, None) if tok is not None else None
        if a is None:
            if ev == "deferred" and tok is None:
                continue  # an operator's or a restart's deferral: no attempt ends here
            raise ValueError(f"{ev} for token {tok!r}, which was never dispatched")
        a.end, a.outcome = float(r["ts"]), ev
        if ev == "requeued":
            a.kind = r.get("kind")
        elif ev == "deferred":
            kinds = r.get("kinds") or [None]
            a.kind = kinds[-1]
    return out


def account(
    attempts: Mapping[str, list[Attempt]],
    hangs: Mapping[str, Sequence[int]],
    end: float,
) -> dict[str, Any]:
    """Group 1's measures of one campaign.

    Args:
        attempts: from :func:`attempts_of`.
        hangs: work ID -> the attempt indices that hang (the plan); every other attempt would
            have finished.
        end: when the campaign ended (an attempt still open ran until then).
    """
    hung_ids, recovered = set(), 0
    false_suspicions = good_deferred = 0
    duplicate = hung = 0.0
    committed = deferred = 0
    for wid, tries in attempts.items():
        planned = set(hangs.get(wid, ()))
        ever_hung = False
        for a in tries:
            ran = (a.end if a.end is not None else end) - a.start
            if a.index in planned:
                ever_hung = True
                hung += ran
                continue
            if a.outcome != "committed":
                duplicate += ran
                if a.kind == "timeout":
                    false_suspicions += 1
        final = tries[-1].outcome
        committed += final == "committed"
        deferred += final == "deferred"
        if ever_hung:
            hung_ids.add(wid)
            recovered += final in ("committed", "deferred")
        elif final == "deferred":
            good_deferred += 1
    return {
        "hung_items": len(hung_ids),
        "recovery": recovered / len(hung_ids) if hung_ids else None,
        "false_suspicions": false_suspicions,
        "duplicate_cpu": duplicate,
        "hung_cpu": hung,
        "committed": committed,
        "deferred": deferred,
        "good_deferred": good_deferred,
    }


# ------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class Cell:
    """One setting of group 1."""

    sigma: float
    hang: float
    multiple: float | None  # the watchdog as a multiple of the median task time; None: off
    adaptive: bool = False  # the adaptive rule (ADAPTIVE) instead; ``multiple`` is ignored

    @property
    def label(self) -> str:
        if self.adaptive:
            return ADAPTIVE_LABEL
        return "off" if self.multiple is None else f"{self.multiple:g}x"


#: The adaptive rule as measured: the note's default (120 s) as its cap and first deadline,
#: then 3 x the measured 99th percentile of task time (``WatchdogConfig(120, quantile=0.99)``).
ADAPTIVE = {"seconds": 120.0, "quantile": 0.99, "multiple": 3.0, "min_samples": 10}
ADAPTIVE_LABEL = "p99x3"


def _unit(*parts: object) -> float:
    """A uniform number in [0, 1) from ``parts`` (stable across processes and runs)."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def make_plan(
    seed: int,
    n: int,
    *,
    median: float,
    sigma: float,
    hang: float,
    slow_rate: float,
    slow_factor: float,
    attempts: int,
) -> list[dict[str, Any]]:
    """The items of one campaign: ``{"work_id", "seconds", "hang": [attempt indices]}``.

    Task times are log-normal (``median`` · e^(σ·z)), a ``slow_rate`` fraction of items takes
    ``slow_factor`` times longer on every attempt, and each of an item's first ``attempts``
    attempts hangs with probability ``hang``, independently.
    """
    rnd = random.Random(seed)
    items = []
    for i in range(n):
        wid = f"x-{i:05d}"
        seconds = median * math.exp(sigma * rnd.gauss(0.0, 1.0))
        if _unit(seed, wid, "slow") < slow_rate:
            seconds *= slow_factor
        hung = [k for k in range(attempts) if _unit(seed, wid, "hang", k) < hang]
        items.append({"work_id": wid, "seconds": round(seconds, 6), "hang": hung})
    return items


# ------------------------------------------------------------------ under mpiexec
def task(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """An experiment's task (module level: an isolated child finds it by name)."""
    if ctx.attempt in payload["hang"]:
        while True:
            time.sleep(3600)
    time.sleep(float(payload["seconds"]))
    return {"slept": payload["seconds"]}


def role_campaign(config_path: str) -> None:
    """One campaign: rank 0 runs the master, every other rank a worker."""
    from mpi4py import MPI

    from durable_dispatch import RetryPolicy, WatchdogConfig, WorkItem
    from durable_dispatch.mpi import finish, run_master, run_worker

    cfg = json.loads(Path(config_path).read_text())
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if rank != 0:
        Path(cfg["pids"], f"{rank}.pid").write_text(str(os.getpid()))
        run_worker(task, context=True, isolate=cfg["isolate"])
        finish(comm)
        return
    started: list[bool] = []

    def progress(stats: dict[str, Any]) -> None:
        if not started:
            started.append(True)
            Path(cfg["pids"], "started").write_text(repr(time.time()))

    items = [WorkItem(p["work_id"], p) for p in cfg["items"]]
    report = run_master(
        items,
        cfg["state"],
        comm=comm,
        watchdog=WatchdogConfig(**wd)
        if isinstance(wd := cfg["watchdog"], dict)
        else WatchdogConfig(wd),
        retry=RetryPolicy(cfg["retries"]),
        max_seconds=cfg["budget"],
        progress=progress,
        progress_interval=0.05,
        linger=1.0,
        stop_timeout=5.0,
    )
    out = {
        "finished": report.finished,
        "reason": report.reason,
        "seconds": report.seconds,
        "end": time.time(),
        "mode": report.mode,
        "lost_ranks": {str(k): v for k, v in report.lost_ranks.items()},
        "parked": report.stats["core"]["parked_ranks_now"],
    }
    Path(cfg["out"]).write_text(json.dumps(out))
    finish(comm)


# ------------------------------------------------------------------ the driver
@dataclass
class Setup:
    """What every campaign of a sweep shares."""

    items: int = 60
    workers: int = 4
    median: float = 0.1
    slow_rate: float = 0.05
    slow_factor: float = 8.0
    retries: int = 2
    budget: float = 15.0
    seeds: int = 5
    sigmas: tuple[float, ...] = (0.5, 1.0)
    hangs: tuple[float, ...] = (0.0, 0.03, 0.1)
    multiples: tuple[float | None, ...] = (None, 2.0, 4.0, 8.0, 16.0, 32.0)
    kills: int = 2
    kill_workers: int = 6
    kill_seeds: int = 5


def _journal_records(state: str) -> list[dict[str, Any]]:
    from durable_dispatch.statedir import STATE_JOURNAL
    from durable_dispatch.storage.journal import read_journal

    path = os.path.join(state, STATE_JOURNAL)
    return [r.payload for r in read_journal(path) if isinstance(r.payload, dict)]


def _run(cfg: dict[str, Any], ulfm: bool) -> Any:
    """Run one campaign under ``mpiexec`` in its own session (killed after its budget plus a
    margin); its :class:`~durable_dispatch.mpi.launcher.MpiexecResult`."""
    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    Path(cfg["config"]).write_text(json.dumps(cfg))
    argv = [sys.executable, str(HERE), "--role", "campaign", cfg["config"]]
    env = {"PYTHONPATH": str(HERE.parent.parent / "src")}
    return run_mpiexec(
        mpiexec_command(cfg["ranks"], argv, ulfm=ulfm), timeout=cfg["budget"] + 90, env=env
    )


def _campaign_cfg(tmp: str, name: str, items: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    d = os.path.join(tmp, name)
    os.makedirs(os.path.join(d, "pids"), exist_ok=True)
    cfg = {
        "state": os.path.join(d, "state"),
        "pids": os.path.join(d, "pids"),
        "out": os.path.join(d, "out.json"),
        "config": os.path.join(d, "config.json"),
        "items": items,
        "isolate": True,
    }
    cfg.update(kw)
    return cfg


#: ``mpiexec`` launches per campaign: Open MPI's runtime sometimes fails to start at all ("The
#: PMIx server's listener thread failed to start", exit 213), before any rank ran. Such a launch
#: is retried (in a fresh directory, or on a state directory nothing touched) and counted
#: (``launch_retries``); any other failure ends the run.
LAUNCH_TRIES = 3


def _launch_failed(name: str, cfg: Mapping[str, Any], code: int | None, out: str, n: int) -> None:
    """A campaign did not end as it should: retry only if its master never started."""
    started = Path(cfg["pids"], "started").exists()
    if started or n + 1 >= LAUNCH_TRIES:
        raise SystemExit(f"campaign {name} failed (exit {code}):\n{out[-3000:]}")
    print(f"campaign {name}: the MPI runtime did not start (exit {code}); again", flush=True)


def _tries(
    name: str,
    cfg_for: Callable[[int], dict[str, Any]],
    run: Callable[[dict[str, Any]], Any],
    ok: Callable[[dict[str, Any], Any], bool],
) -> tuple[dict[str, Any], Any, int]:
    """Run ``run(cfg_for(attempt))`` until ``ok`` (see :data:`LAUNCH_TRIES`); the config, the
    result and how many launches were retried."""
    for attempt in range(LAUNCH_TRIES):
        cfg = cfg_for(attempt)
        res = run(cfg)
        if ok(cfg, res):
            return cfg, res, attempt
        _launch_failed(name, cfg, res.returncode, res.stdout + res.stderr, attempt)
    raise AssertionError("unreachable: the last failed launch raised")


def _ended_well(cfg: Mapping[str, Any], res: Any) -> bool:
    return bool(res.returncode == 0 and os.path.exists(cfg["out"]))


def _started(cfg: Mapping[str, Any], res: Any) -> bool:
    return Path(cfg["pids"], "started").exists()


def run_group1(s: Setup, cell: Cell, seed: int, tmp: str) -> dict[str, Any]:
    """One campaign of group 1; its measures."""
    items = make_plan(
        seed,
        s.items,
        median=s.median,
        sigma=cell.sigma,
        hang=cell.hang,
        slow_rate=s.slow_rate,
        slow_factor=s.slow_factor,
        attempts=s.retries + 1,
    )
    wd: Any = 0.0 if cell.multiple is None else cell.multiple * s.median
    if cell.adaptive:
        wd = ADAPTIVE
    name = f"g1-s{cell.sigma}-h{cell.hang}-{cell.label}-{seed}"

    def cfg_for(attempt: int) -> dict[str, Any]:
        return _campaign_cfg(
            tmp,
            f"{name}-try{attempt}",
            items,
            ranks=s.workers + 1,
            watchdog=wd,
            retries=s.retries,
            budget=s.budget,
        )

    cfg, _res, retried = _tries(name, cfg_for, lambda c: _run(c, ulfm=False), _ended_well)
    rep = json.loads(Path(cfg["out"]).read_text())
    m = account(
        attempts_of(_journal_records(cfg["state"])),
        {p["work_id"]: p["hang"] for p in items},
        rep["end"],
    )
    m.update(
        finished=rep["finished"],
        time_to_target=rep["seconds"] if rep["finished"] else None,
        seconds=rep["seconds"],
        parked=rep["parked"],
        seed=seed,
        launch_retries=retried,
    )
    return m


def _with_kills(
    cfg: dict[str, Any],
    ulfm: bool,
    victims: Sequence[int],
    moments: Sequence[float],
    killed: dict[int, float],
) -> Any:
    """Run a campaign and SIGKILL ``victims`` at ``moments`` after its master started (none if
    it never starts); ``killed``: rank -> ``time.time()`` just before its kill."""
    killed.clear()
    done = threading.Event()

    def killer() -> None:
        started = Path(cfg["pids"], "started")
        while not started.exists():
            if done.wait(0.01):
                return  # the job ended before its master started: nothing to kill
        t0 = time.time()
        for rank, at in zip(victims, moments, strict=True):
            if done.wait(max(0.0, t0 + at - time.time())):
                return
            pid = int(Path(cfg["pids"], f"{rank}.pid").read_text())
            killed[rank] = time.time()
            os.kill(pid, signal.SIGKILL)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    try:
        return _run(cfg, ulfm)
    finally:
        done.set()
        th.join(5)


def run_group2(s: Setup, seed: int, tmp: str, ulfm: bool) -> dict[str, Any]:
    """One campaign of group 2: kill ``s.kills`` workers (one without ULFM: the first ends the
    job) at seeded moments; without ULFM, run it again to resume."""
    from durable_dispatch.demo import summarize

    rnd = random.Random(seed)
    items = make_plan(
        seed,
        s.items,
        median=s.median,
        sigma=0.5,
        hang=0.0,
        slow_rate=0.0,
        slow_factor=1.0,
        attempts=1,
    )
    ideal = sum(p["seconds"] for p in items) / s.kill_workers
    victims = rnd.sample(range(1, s.kill_workers + 1), s.kills if ulfm else 1)
    moments = sorted(rnd.uniform(0.2, 0.7) * ideal for _ in victims)
    name = f"g2-{'ulfm' if ulfm else 'noulfm'}-{seed}"
    killed: dict[int, float] = {}

    def cfg_for(attempt: int) -> dict[str, Any]:
        return _campaign_cfg(
            tmp,
            f"{name}-try{attempt}",
            items,
            ranks=s.kill_workers + 1,
            watchdog=60.0,
            retries=s.retries,
            budget=s.budget * 3,
            isolate=False,
        )

    def killing(cfg: dict[str, Any]) -> Any:
        return _with_kills(cfg, ulfm, victims, moments, killed)

    cfg, res, retried = _tries(name, cfg_for, killing, _started)
    job_end = time.time()
    code = res.returncode
    result: dict[str, Any] = {
        "seed": seed,
        "ulfm": ulfm,
        "killed": len(killed),
        "exit": code,
        "launch_retries": retried,
    }
    if ulfm:
        if not _ended_well(cfg, res):
            raise SystemExit(f"campaign {name} failed (exit {code}):\n{res.stderr[-3000:]}")
        rep = json.loads(Path(cfg["out"]).read_text())
        lost = {int(k): v for k, v in rep["lost_ranks"].items()}
        result["latencies"] = [lost[r] - t for r, t in killed.items() if r in lost]
        result["detected"] = sum(r in lost for r in killed)
        result["finished"] = rep["finished"]
        result["seconds"] = rep["seconds"]
    else:
        result["job_ended"] = code != 0
        result["kill_to_job_end"] = job_end - min(killed.values()) if killed else None
        t = time.monotonic()

        def again(attempt: int) -> dict[str, Any]:  # the same command, on the same directory
            Path(cfg["pids"], "started").unlink(missing_ok=True)
            return cfg

        _tries(f"restart of {name}", again, lambda c: _run(c, ulfm=False), _ended_well)
        rep = json.loads(Path(cfg["out"]).read_text())
        result["restart_seconds"] = time.monotonic() - t
        result["finished"] = rep["finished"]
    summary = summarize(cfg["state"], {p["work_id"] for p in items})
    result["lost"] = summary["lost"]
    result["duplicate_commits"] = summary["duplicate_commits"]
    return result


def sweep(s: Setup, cell_only: bool, log: Any, progress_path: str | None = None) -> dict[str, Any]:
    """Run both groups; the raw results. With ``progress_path`` each campaign's row is appended
    there as it ends (JSON lines), and the rows already there are kept, not run again: a sweep
    that stopped resumes."""
    if cell_only:
        cells = [Cell(1.0, 0.1, 8.0), Cell(1.0, 0.1, None, adaptive=True)]
        seeds, kill_seeds = [0], [0]
    else:
        cells = [Cell(sg, h, m) for sg in s.sigmas for h in s.hangs for m in s.multiples]
        cells += [Cell(sg, h, None, adaptive=True) for sg in s.sigmas for h in s.hangs]
        seeds, kill_seeds = list(range(s.seeds)), list(range(s.kill_seeds))
    done: dict[str, dict[str, Any]] = {}
    if progress_path and os.path.exists(progress_path):
        for line in Path(progress_path).read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done[row["key"]] = row["row"]
        log(f"resuming: {len(done)} campaigns already in {progress_path}")

    def run_once(key: str, fn: Any) -> dict[str, Any]:
        if key in done:
            return done[key]
        row: dict[str, Any] = fn()
        if progress_path:
            with open(progress_path, "a") as f:
                f.write(json.dumps({"key": key, "row": row}) + "\n")
        return row

    out: dict[str, Any] = {"setup": asdict(s), "group1": [], "group2": []}
    with tempfile.TemporaryDirectory(prefix="dd-exp-") as tmp:
        for c in cells:
            for seed in seeds:
                t = time.monotonic()
                key = json.dumps(["g1", asdict(c), seed], sort_keys=True)
                m = run_once(key, lambda c=c, seed=seed: run_group1(s, c, seed, tmp))
                out["group1"].append({"cell": asdict(c), **m})
                log(
                    f"group 1 sigma={c.sigma} hang={c.hang} watchdog={c.label} seed={seed}: "
                    f"{m['seconds']:.1f}s finished={m['finished']} recovery={m['recovery']} "
                    f"false={m['false_suspicions']} dup={m['duplicate_cpu']:.2f}s "
                    f"({time.monotonic() - t:.1f}s wall)"
                )
        for ulfm in (True, False):
            for seed in kill_seeds:
                key = json.dumps(["g2", ulfm, seed])
                r = run_once(key, lambda ulfm=ulfm, seed=seed: run_group2(s, seed, tmp, ulfm))
                out["group2"].append(r)
                log(f"group 2 ulfm={ulfm} seed={seed}: {r}")
    return out


# ------------------------------------------------------------------ tables and figures
_MEASURES = (
    ("recovery", "recovery", 2),
    ("false_suspicions", "false suspicions", 1),
    ("duplicate_cpu", "duplicate CPU (s)", 2),
    ("hung_cpu", "hung CPU (s)", 1),
    ("good_deferred", "good items deferred", 1),
    ("parked", "parked at end", 1),
)


def summarize_group1(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One line per cell: every measure as an :class:`Estimate` over its seeds; time to target
    over the seeds that reached it (``reached`` says how many)."""
    cells: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        c = r["cell"]
        key = (c["sigma"], c["hang"], c["multiple"], c.get("adaptive", False))
        cells.setdefault(key, []).append(r)
    out = []
    for (sg, h, mult, adapt), rs in cells.items():
        line: dict[str, Any] = {
            "sigma": sg, "hang": h, "multiple": mult, "adaptive": adapt, "runs": len(rs),
        }  # fmt: skip
        for key, _label, _d in _MEASURES:
            vals = [r[key] for r in rs if r[key] is not None]
            line[key] = mean_ci(vals) if vals else None
        reached = [r["time_to_target"] for r in rs if r["time_to_target"] is not None]
        line["reached"] = len(reached)
        line["time_to_target"] = mean_ci(reached) if reached else None
        out.append(line)
    return out


def _fmt(e: Estimate | None, digits: int) -> str:
    return "n/a" if e is None else e.text(digits)


def table_group1(lines: Sequence[Mapping[str, Any]], budget: float) -> str:
    head = ["σ", "hang", "watchdog", "time to target (s)"] + [m[1] for m in _MEASURES]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ln in lines:
        wd = Cell(ln["sigma"], ln["hang"], ln["multiple"], ln["adaptive"]).label
        ttt = _fmt(ln["time_to_target"], 1)
        if ln["reached"] < ln["runs"]:
            ttt = f"> {budget:g} in {ln['runs'] - ln['reached']}/{ln['runs']}" + (
                f"; {ttt} in the rest" if ln["reached"] else ""
            )
        cells = [f"{ln['sigma']:g}", f"{ln['hang']:g}", wd, ttt]
        cells += [_fmt(ln[k], d) for k, _label, d in _MEASURES]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table_group2(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    ul = [r for r in rows if r["ulfm"]]
    if ul:
        lat = [x for r in ul for x in r["latencies"]]
        sp = spread(lat) if lat else None
        kills = sum(r["killed"] for r in ul)
        lines += [
            "| under ULFM | value |",
            "|---|---|",
            f"| campaigns (seeds) | {len(ul)} |",
            f"| ranks killed (SIGKILL) | {kills} |",
            f"| kills the master saw | {sum(r['detected'] for r in ul)} |",
        ]
        if sp is not None:
            lines.append(
                "| kill-to-rollback latency, median / p95 / max (ms) | "
                f"{sp['median'] * 1e3:.1f} / {sp['p95'] * 1e3:.1f} / {sp['max'] * 1e3:.1f} |"
            )
        lines += [
            f"| finished on the survivors | {sum(r['finished'] for r in ul)}/{len(ul)} |",
            f"| time to finish (s) | {mean_ci(r['seconds'] for r in ul).text(2)} |",
            f"| work lost | {sum(r['lost'] for r in ul)} |",
            f"| duplicate commits | {sum(r['duplicate_commits'] for r in ul)} |",
        ]
    no = [r for r in rows if not r["ulfm"]]
    if no:
        ends = [r["kill_to_job_end"] for r in no if r["kill_to_job_end"] is not None]
        lines += [
            "",
            "| without ULFM (one kill, then the same command again) | value |",
            "|---|---|",
            f"| campaigns (seeds) | {len(no)} |",
            f"| the kill ended the job | {sum(r['job_ended'] for r in no)}/{len(no)} |",
        ]
        if ends:
            lines.append(f"| kill to the job's end (s) | {mean_ci(ends).text(2)} |")
        lines += [
            "| restart's time to finish (s) | "
            f"{mean_ci(r['restart_seconds'] for r in no).text(2)} |",
            f"| the restart finished | {sum(r['finished'] for r in no)}/{len(no)} |",
            f"| work lost (both runs) | {sum(r['lost'] for r in no)} |",
            f"| duplicate commits (both runs) | {sum(r['duplicate_commits'] for r in no)} |",
        ]
    return "\n".join(lines)


_PALETTE = ("#1b6ca8", "#d1495b", "#2e933c", "#8c5e99", "#e08e0b")


def figure(
    lines: Sequence[Mapping[str, Any]], sigma: float, key: str, ylabel: str, budget: float
) -> str:
    """An SVG: ``key`` against the watchdog multiple (log scale), one line per hang rate, with
    95% intervals; the adaptive rule and "off" sit at the right, unconnected. Censored time to
    target (some seeds did not finish) is drawn at the budget with an open marker."""
    w, h, pad = 560, 320, 52
    sel = [ln for ln in lines if ln["sigma"] == sigma]
    mults = sorted({ln["multiple"] for ln in sel if ln["multiple"] is not None})
    if not mults:
        return ""
    xs = [math.log2(m) for m in mults]
    x_adapt, x_off = xs[-1] + 1.0, xs[-1] + 2.0
    lo, hi = xs[0] - 0.3, x_off + 0.3

    def where(ln: Mapping[str, Any]) -> float:
        if ln.get("adaptive"):
            return x_adapt
        return x_off if ln["multiple"] is None else math.log2(ln["multiple"])

    def value(ln: Mapping[str, Any]) -> tuple[float, float, bool]:
        e: Estimate | None = ln[key]
        if key == "time_to_target" and ln["reached"] < ln["runs"]:
            return budget, 0.0, True
        return (e.mean, e.half or 0.0, False) if e is not None else (0.0, 0.0, False)

    top = max([value(ln)[0] + value(ln)[1] for ln in sel] + [1e-9]) * 1.1

    def px(x: float) -> float:
        return pad + (w - 1.5 * pad) * (x - lo) / (hi - lo)

    def py(v: float) -> float:
        return h - pad + (2 * pad - h) * v / top + 0.0

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad / 2}" y2="{h - pad}" stroke="#444"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#444"/>',
        f'<text x="{w / 2}" y="{h - 24}" text-anchor="middle">watchdog, multiple of the median '
        "task time (log scale)</text>",
        f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">'
        f"{ylabel}</text>",
        f'<text x="{w / 2}" y="18" text-anchor="middle" font-weight="bold">{ylabel}, '
        f"σ = {sigma:g}</text>",
    ]
    if key == "time_to_target":
        parts.append(
            f'<text x="{w / 2}" y="{h - 8}" text-anchor="middle" fill="#666" font-size="10">'
            f"open marker: some seeds did not finish within the {budget:g} s budget (drawn at "
            "the budget)</text>"
        )
    labels = [f"{m:g}x" for m in mults] + [ADAPTIVE_LABEL, "off"]
    for lab, x in zip(labels, [*xs, x_adapt, x_off], strict=True):
        parts.append(f'<text x="{px(x):.1f}" y="{h - pad + 16}" text-anchor="middle">{lab}</text>')
    for frac in (0.0, 0.5, 1.0):
        v = top / 1.1 * frac
        parts.append(
            f'<text x="{pad - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>'
            f'<line x1="{pad}" y1="{py(v):.1f}" x2="{w - pad / 2}" y2="{py(v):.1f}" '
            'stroke="#eee"/>'
        )
    hangs = sorted({ln["hang"] for ln in sel})
    legend = []
    for i, hr in enumerate(hangs):
        color = _PALETTE[i % len(_PALETTE)]
        shift = 0.09 * (i - (len(hangs) - 1) / 2)  # side by side, so equal values stay visible
        pts = []
        for ln in sel:
            if ln["hang"] != hr:
                continue
            x = where(ln) + shift
            v, half, censored = value(ln)
            pts.append((x, v, half, censored))
        pts.sort()
        line = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v, _h, _c in pts if x < x_adapt - 0.5)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"/>')
        for x, v, half, censored in pts:
            if half:
                parts.append(
                    f'<line x1="{px(x):.1f}" y1="{py(v - half):.1f}" x2="{px(x):.1f}" '
                    f'y2="{py(v + half):.1f}" stroke="{color}"/>'
                )
            fill = "white" if censored else color
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(v):.1f}" r="4" fill="{fill}" '
                f'stroke="{color}" stroke-width="2"/>'
            )
        legend.append(
            f'<tspan dx="{14 if i else 0}" fill="{color}">&#9679; hang rate {hr:g}</tspan>'
        )
    parts.append(f'<text x="{w / 2}" y="36" text-anchor="middle">{"".join(legend)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


BEGIN, END = "<!-- results: begin (benchmarks/experiments.py --docs) -->", "<!-- results: end -->"


def write_docs(raw: Mapping[str, Any], docs: str) -> list[str]:
    """Write the figures into ``docs`` and the tables into ``docs/experiments.md`` between the
    :data:`BEGIN` and :data:`END` markers (the text around them, the method and the reading,
    is kept; a new file gets only the markers); the paths written."""
    s = raw["setup"]
    lines = summarize_group1(raw["group1"])
    os.makedirs(docs, exist_ok=True)
    written = []
    figs = []
    for sg in sorted({ln["sigma"] for ln in lines}):
        for key, label in (
            ("time_to_target", "time to target (s)"),
            ("duplicate_cpu", "duplicate CPU (s)"),
        ):
            svg = figure(lines, sg, key, label, s["budget"])
            if svg:
                name = f"experiments-{key.replace('_', '-')}-sigma{sg:g}.svg"
                Path(docs, name).write_text(svg)
                written.append(os.path.join(docs, name))
                figs.append(f"![{label}, σ = {sg:g}]({name})")
    body = [
        BEGIN,
        "## Group 1: the watchdog on and off",
        "",
        f"{s['items']} items on {s['workers']} isolated workers, median task time "
        f"{s['median']:g} s, {s['slow_rate']:.0%} of items {s['slow_factor']:g}x slower, "
        f"{s['retries']} retries, a budget of {s['budget']:g} s per campaign; "
        f"{len({r['seed'] for r in raw['group1']})} seed(s) per cell.",
        "",
        table_group1(lines, s["budget"]),
        "",
        *figs,
        "",
        "## Group 2: real rank kills",
        "",
        f"{s['items']} items (σ = 0.5) on {s['kill_workers']} workers; "
        f"{s['kills']} workers SIGKILLed per ULFM campaign at seeded moments.",
        "",
        table_group2(raw["group2"]),
        END,
    ]
    path = os.path.join(docs, "experiments.md")
    old = Path(path).read_text() if os.path.exists(path) else f"# Experiments\n\n{BEGIN}\n{END}\n"
    if BEGIN not in old or END not in old:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers to write between")
    head, rest = old.split(BEGIN, 1)
    Path(path).write_text(head + "\n".join(body) + rest.split(END, 1)[1])
    written.append(path)
    return written


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
