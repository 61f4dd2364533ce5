"""The bundled example campaign, run under ``mpiexec`` (``durable-dispatch demo`` launches it).

Rank 0 runs :func:`run_master`, every other rank :func:`run_worker` with ``isolate=True`` (unless
``--no-isolate``). Each work item hashes a seed a number of times (a stand-in for a fuzzing or
parameter-sweep task). A seeded plan (``--faults``) makes chosen work IDs misbehave on their first
attempt. In the work function (it reads the fault from its payload, so it acts in the isolated
child): hang forever, segfault, answer too late, raise, return a value JSON cannot hold. In the
worker's messages (:func:`~durable_dispatch.testing.run_lying_worker`): a malformed RESULT, READY
without RESULT, a RESULT for an old token, and (under ULFM only) death by SIGKILL. At the end rank 0
checks the durable record against the full set of work IDs and writes a summary: committed,
deferred, ``lost`` (must be 0) and ``duplicate_commits`` (must be 0).

Usage (under mpiexec): ``python -m durable_dispatch.cli.demo STATE_DIR [options]``. :func:`launch`
runs it under ``mpiexec`` and supervises the job (``durable-dispatch demo`` calls it).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..campaign.replay import event_work_ids
from ..campaign.statedir import STATE_JOURNAL
from ..core import RetryPolicy, WatchdogConfig, WorkItem
from ..errors import UsageError
from ..mpi.context import WorkContext
from ..storage import Journal
from ..storage import fs as _fs

__all__ = ["work_items", "fault_plan", "demo_task", "summarize", "main", "FAULT_KINDS"]

#: Faults the work function commits (from its payload, so they act in an isolated child).
FUNCTION_FAULTS = ("hang", "segfault", "slow", "raise", "unencodable")
#: Faults of the worker's messages (a lying worker; ``crash`` kills the rank itself).
MESSAGE_FAULTS = ("malformed", "missing", "old-token", "crash")
FAULT_KINDS = FUNCTION_FAULTS + MESSAGE_FAULTS


def work_items(
    n: int, ms: float = 5.0, plan: dict[str, str] | None = None, slow: float = 0.0
) -> list[WorkItem]:
    """The bundled campaign: ``n`` items ``demo-0000`` ... with small hashing tasks; an item the
    plan gives a function fault carries it in its payload (``fault``, and ``slow`` seconds)."""
    out = []
    for i in range(n):
        wid = f"demo-{i:04d}"
        payload: dict[str, Any] = {"seed": f"seed-{i}", "rounds": 2000 + 37 * i, "ms": ms}
        fault = (plan or {}).get(wid)
        if fault in FUNCTION_FAULTS:
            payload["fault"] = fault
            if fault == "slow":
                payload["slow"] = slow
        out.append(WorkItem(wid, payload))
    return out


def fault_plan(n: int, seed: int, kinds: tuple[str, ...], per_kind: int = 1) -> dict[str, str]:
    """A deterministic map work ID -> fault (first attempt only), ``per_kind`` IDs per kind."""
    rnd = random.Random(seed)
    ids = rnd.sample(range(n), min(n, per_kind * len(kinds)))
    plan = {}
    for k, i in enumerate(ids):
        plan[f"demo-{i:04d}"] = kinds[k // per_kind]
    return plan


def demo_task(payload: Any, ctx: WorkContext | None = None) -> dict[str, Any]:
    """Hash the seed ``rounds`` times and sleep ``ms`` milliseconds; on the first attempt
    (``ctx.attempt == 0``), commit the payload's ``fault`` first."""
    fault = payload.get("fault") if ctx is None or ctx.attempt == 0 else None
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "segfault":
        import signal

        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "slow":
        time.sleep(float(payload.get("slow", 0)))
    if fault == "raise":
        raise RuntimeError("injected failure in the work function")
    if fault == "unencodable":
        return {"not JSON": {1, 2}}  # a set: this result cannot be sent
    h = str(payload["seed"]).encode()
    for _ in range(int(payload["rounds"])):
        h = hashlib.sha256(h).digest()
    time.sleep(float(payload.get("ms", 0)) / 1000)
    return {"digest": h.hex()[:16]}


def summarize(state_dir: str, all_ids: set[str], report: Any = None) -> dict[str, Any]:
    """Check the durable record against the campaign's work IDs.

    The counts are the campaign's one view (``report.view``, else read from ``state_dir``: the
    numbers ``durable-dispatch stats`` shows). ``left`` counts the items not done yet (pending,
    or in flight when the master stopped: the next run does them); ``lost`` the work IDs the
    record holds nowhere (no commit, not deferred, not pending: must be 0), and
    ``duplicate_commits`` second commit records of a work ID in the journal (must be 0).
    """
    from ..campaign.admin import view_state
    from ..views.view import view_of_state

    commits: Counter[str] = Counter()
    with Journal.open(os.path.join(state_dir, STATE_JOURNAL)) as j:
        for r in j.records():
            if isinstance(r.payload, dict) and r.payload.get("event") == "committed":
                commits.update(event_work_ids(r.payload))
    from ..storage import DeferJournal

    with DeferJournal.open(state_dir) as d:
        deferred = {i.work_id for i in d.items()}
    sv = view_state(state_dir)
    led = sv.projection
    view = getattr(report, "view", None) or view_of_state(sv)
    waiting = set(led.frontier) | set(led.in_flight)
    lost = sorted(all_ids - set(commits) - deferred - waiting)
    out: dict[str, Any] = {
        "state": view.state,
        "work_items": view.work_items,  # the campaign's (a resumed run may name fewer)
        "committed": view.committed,
        "deferred": view.deferred,
        "left": view.pending + view.in_flight,
        "lost": len(lost),
        "lost_ids": lost[:20],
        "duplicate_commits": sum(c - 1 for c in commits.values() if c > 1),
        "failures_by_kind": dict(view.failures_by_kind),
    }
    if report is not None:
        core = report.stats["core"]
        out.update(
            mode=report.mode,
            finished=report.finished,
            seconds=round(report.seconds, 3),
            epoch=report.stats["epoch"],
            dispatches=core["dispatches"],
            dispatched_items=core["dispatched_items"],
            batch_splits=core["batch_splits"],
            dispatch_watchdog_timeouts=core["dispatch_watchdog_timeouts"],
            watchdog_worker_recoveries=core["watchdog_worker_recoveries"],
            protocol_requeued_dispatches=core["protocol_requeued_dispatches"],
            protocol_deferred_dispatches=core["protocol_deferred_dispatches"],
            deferred_in_memory=core["deferred_in_memory"],
            invalid_result_rollbacks=core["invalid_result_rollbacks"],
            ranks_lost=core["ranks_lost"],
            parked_ranks_now=core["parked_ranks_now"],
            stale=core["stale"],
            unowned=core["unowned"],
            malformed=core["malformed"],
            master_restart_rollbacks=core["master_restart_rollbacks"],
            lost_rank_times=report.lost_ranks,
        )
    return out


def _write_json(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    _fs.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Entry point under mpiexec."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # for people
    ap = argparse.ArgumentParser(prog="durable_dispatch.cli.demo")
    ap.add_argument("state_dir")
    ap.add_argument("--items", type=int, default=80)
    ap.add_argument("--ms", type=float, default=40.0, help="sleep per task, milliseconds")
    ap.add_argument(
        "--faults",
        default="hang,segfault,slow,malformed,missing,old-token",
        help=f"comma-separated fault kinds ({', '.join(FAULT_KINDS)}), or 'none'",
    )
    ap.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_false",
        help="run the work function in the worker process (a hang parks the rank for good, a "
        "segfault ends the job)",
    )
    ap.add_argument("--per-kind", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--watchdog", type=float, default=2.0)
    ap.add_argument("--slow", type=float, default=None, help="seconds a slow worker sleeps")
    ap.add_argument("--retries", type=int, default=1)
    ap.add_argument("--sync", default="batch")
    ap.add_argument("--batch", type=int, default=1, help="work items per dispatch")
    ap.add_argument("--summary", default=None, help="summary JSON path (default in STATE_DIR)")
    ap.add_argument("--progress-file", default=None)
    ap.add_argument("--max-seconds", type=float, default=None)
    ap.add_argument(
        "--linger",
        type=float,
        default=0.0,
        help="after the work is done, wait this long for parked ranks' READY",
    )
    ap.add_argument(
        "--crash-after",
        type=float,
        default=None,
        help="test hook: the master SIGKILLs itself this many seconds after its campaign started",
    )
    a = ap.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    kinds = () if a.faults in ("none", "") else tuple(a.faults.split(","))
    for k in kinds:
        if k not in FAULT_KINDS:
            ap.error(f"unknown fault kind {k!r}; use {FAULT_KINDS}")
    plan = fault_plan(a.items, a.seed, kinds, a.per_kind)
    slow = a.slow if a.slow is not None else a.watchdog + 0.5
    if comm.Get_rank() != 0:
        from ..mpi.master import finish
        from ..mpi.worker import run_worker

        def lies(work_id: str, attempt: int) -> str | None:
            fault = plan.get(work_id) if attempt == 0 else None
            if fault == "crash":  # leave the moment of death for the latency measurement
                Path(a.state_dir, f"crash-{comm.Get_rank()}.time").write_text(repr(time.time()))
            return fault if fault in MESSAGE_FAULTS else None

        if any(f in MESSAGE_FAULTS for f in plan.values()):
            from ..testing import run_lying_worker

            run_lying_worker(demo_task, lies, context=True, isolate=a.isolate)
        else:
            run_worker(demo_task, context=True, isolate=a.isolate)
        finish(comm)
        return 0
    from ..mpi.master import finish, run_master

    items = work_items(a.items, a.ms, plan, slow)
    progress_file = a.progress_file

    crash_timer: list[Any] = []

    def progress(stats: dict[str, Any]) -> None:
        if a.crash_after is not None and not crash_timer:
            # Counted from the first progress call: the state is open and the epoch journaled,
            # however long a loaded machine took to start the job.
            import signal
            import threading

            crash_timer.append(
                threading.Timer(a.crash_after, lambda: os.kill(os.getpid(), signal.SIGKILL))
            )
            crash_timer[0].start()
        if progress_file:
            _write_json(progress_file, stats)

    report = run_master(
        items,
        a.state_dir,
        comm=comm,
        watchdog=WatchdogConfig.build(a.watchdog),
        retry=RetryPolicy(a.retries),
        sync=a.sync,
        progress=progress,
        progress_interval=0.25,
        max_seconds=a.max_seconds,
        linger=a.linger,
        batch=a.batch,
    )
    summary = summarize(a.state_dir, {i.work_id for i in items}, report)
    latency = {}
    for rank, seen in report.lost_ranks.items():
        f = Path(a.state_dir, f"crash-{rank}.time")
        if f.exists():
            latency[str(rank)] = round(seen - float(f.read_text()), 6)
    summary["kill_to_rollback_seconds"] = latency
    summary["fault_plan"] = plan
    _write_json(a.summary or os.path.join(a.state_dir, "summary.json"), summary)
    print(orjson.dumps(summary, option=orjson.OPT_NON_STR_KEYS).decode(), flush=True)
    finish(comm)
    return 0


# ------------------------------------------------------------------ launching it (the command)
class DemoFailed(Exception):
    """The demo job did not end with a summary (it ran past its time, or mpiexec failed)."""


class DemoStopped(Exception):
    """SIGTERM, or a second Ctrl-C, stopped the demo; its state directory resumes."""

    def __init__(self, signum: int, state: str) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum
        self.state = state


@dataclass(frozen=True)
class DemoRun:
    """A finished demo job: its summary (see :func:`summarize`), state directory and log."""

    summary: dict[str, Any]
    state: str
    log_path: str


def launch(
    state_dir: str,
    *,
    ranks: int = 4,
    items: int = 80,
    batch: int = 1,
    watchdog: float = 2.0,
    timeout: float = 600.0,
    ms: float = 40.0,
    seed: int = 7,
    isolate: bool = True,
    ulfm: bool = False,
    faults: bool = True,
    show: Callable[[dict[str, Any], int], None] | None = None,
) -> DemoRun:
    """Run the demo campaign under ``mpiexec`` in a session of its own, wait for it and return
    its summary (``durable-dispatch demo``). ``show(statistics, items)`` is called about every
    200 ms with the master's latest statistics. Ctrl-C drains the job (SIGUSR1 to ``mpiexec``,
    as a batch system's warning does); a second one, or SIGTERM, stops it at once.

    Raises:
        UsageError: a bad number.
        DemoFailed: no ``mpiexec``, or the job ran past ``timeout`` seconds, or it ended
            without a summary (the error names the log and its last error lines).
        DemoStopped: stopped by SIGTERM or a second Ctrl-C.
    """
    from ..mpi.launcher import kill_session, launch_env, mpiexec_command

    for name, value, low in (("--ranks", ranks, 2), ("--items", items, 1), ("--batch", batch, 1)):
        if value < low:
            raise UsageError(f"{name} must be at least {low}, got {value}")
    for name, seconds in (("--watchdog", watchdog), ("--timeout", timeout), ("--ms", ms)):
        if not seconds > 0 or seconds != seconds or seconds == float("inf"):
            raise UsageError(f"{name} must be a positive number of seconds, got {seconds}")
    state = os.path.abspath(state_dir)
    os.makedirs(state, mode=0o700, exist_ok=True)
    progress_file = os.path.join(state, "progress.json")
    summary_file = os.path.join(state, "summary.json")
    for stale in (progress_file, summary_file):
        if os.path.exists(stale):
            os.unlink(stale)
    # Without isolation a segfault ends the whole job, so that fault is left out then.
    kinds = "hang,segfault,slow,malformed,missing,old-token"
    if not isolate:
        kinds = kinds.replace("segfault,", "")
    if ulfm:
        kinds += ",crash"
    if not faults:
        kinds = "none"
    argv = [sys.executable, "-m", "durable_dispatch.cli.demo", state, "--items", str(items)]
    argv += ["--faults", kinds, "--seed", str(seed), "--watchdog", str(watchdog)]
    argv += ["--ms", str(ms), "--batch", str(batch), "--progress-file", progress_file]
    argv += ["--summary", summary_file] + ([] if isolate else ["--no-isolate"])
    try:
        cmd = mpiexec_command(ranks, argv, ulfm=ulfm)
    except FileNotFoundError as e:
        raise DemoFailed(str(e)) from None
    log_path = os.path.join(state, "demo-mpiexec.log")
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, env=launch_env(), start_new_session=True
        )
        deadline = time.monotonic() + timeout
        interrupted = False

        def terminated(signum: int, _frame: Any) -> None:
            raise DemoStopped(signum, state)

        previous = signal.signal(signal.SIGTERM, terminated)
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    kill_session(proc)  # and waits for it
                    raise DemoFailed(f"demo did not finish within {timeout}s; see {log_path}")
                _show(show, progress_file, items)
                try:
                    time.sleep(0.2)
                except KeyboardInterrupt:
                    if interrupted:
                        raise
                    # Ctrl-C drains, as a batch system's warning does: mpiexec forwards SIGUSR1
                    # to every rank; the master commits what is in flight and stops.
                    interrupted = True
                    print("\ninterrupted: draining (Ctrl-C again to stop at once)", file=sys.stderr)
                    proc.send_signal(signal.SIGUSR1)
                    deadline = min(deadline, time.monotonic() + 90)
        except KeyboardInterrupt:
            kill_session(proc)  # and waits for it
            raise DemoStopped(signal.SIGINT, state) from None
        except BaseException:
            kill_session(proc)
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
    _show(show, progress_file, items)
    if not os.path.exists(summary_file):
        raise DemoFailed(
            f"mpiexec exited with {proc.returncode} and no summary; see {log_path}"
            + "".join(f"\n  {line}" for line in _last_error(log_path))
        )
    with open(summary_file, "rb") as fh:
        return DemoRun(orjson.loads(fh.read()), state, log_path)


def _show(show: Callable[[dict[str, Any], int], None] | None, path: str, items: int) -> None:
    if show is None:
        return
    try:
        with open(path, "rb") as f:
            st = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return
    show(st, items)


def _last_error(log_path: str, keep: int = 8) -> list[str]:
    """What went wrong, from an mpiexec log: the master's own error line (``master: Type: ...``)
    when it logged one, else the last lines from the last traceback or error on, at most
    ``keep``."""
    try:
        with open(log_path, errors="replace") as f:
            lines = f.read().replace("\0", "").splitlines()[-400:]
    except OSError:
        return []
    own = [x for x in lines if x.startswith("master: ")]
    if own:  # Open MPI's abort notice comes after it and says nothing of the cause
        return own[-1:]
    marks = [i for i, x in enumerate(lines) if x.startswith("Traceback") or "Error" in x]
    start = marks[-1] if marks else len(lines) - keep
    return [x for x in lines[max(0, start) :][-keep:] if x.strip()]


if __name__ == "__main__":
    sys.exit(main())
