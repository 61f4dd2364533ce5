"""The driver: runs the campaigns of both groups under ``mpiexec`` (retrying a launch whose
runtime never started), kills ranks for group 2, and resumes a stopped sweep."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .accounting import account, attempts_of
from .plan import ADAPTIVE, Cell, make_plan

#: the command that runs a campaign under mpiexec (``--role campaign``)
SCRIPT = Path(__file__).resolve().parent.parent / "experiments.py"


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
    from durable_dispatch.campaign.statedir import STATE_JOURNAL
    from durable_dispatch.storage.journal import read_journal

    path = os.path.join(state, STATE_JOURNAL)
    return [r.payload for r in read_journal(path) if isinstance(r.payload, dict)]


def _run(cfg: dict[str, Any], ulfm: bool) -> Any:
    """Run one campaign under ``mpiexec`` in its own session (killed after its budget plus a
    margin); its :class:`~durable_dispatch.mpi.launcher.MpiexecResult`."""
    from durable_dispatch.mpi.launcher import mpiexec_command, run_mpiexec

    Path(cfg["config"]).write_text(json.dumps(cfg))
    argv = [sys.executable, str(SCRIPT), "--role", "campaign", cfg["config"]]
    env = {"PYTHONPATH": str(SCRIPT.parent.parent / "src")}
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
    from durable_dispatch.cli.demo import summarize

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
