"""The commands that start processes: ``demo`` (the bundled campaign under ``mpiexec``) and
``run`` (``mpiexec`` with the flags a laptop needs). ``launch`` lives in
:mod:`~durable_dispatch.cli.launch`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from ..errors import UsageError
from ._common import (
    EXIT_FINDING,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    _error,
    _IOFailure,
    _print,
    _Stopped,
    _text,
)


def cmd_demo(args: argparse.Namespace) -> int:
    """Launch the bundled campaign under mpiexec, show progress, print the summary."""
    from .demo import DemoFailed, DemoStopped, launch

    tty = sys.stdout.isatty() and not args.json
    try:
        run = launch(
            args.state_dir,
            ranks=args.ranks,
            items=args.items,
            batch=args.batch,
            watchdog=args.watchdog,
            timeout=args.timeout,
            ms=args.ms,
            seed=args.seed,
            isolate=args.isolate,
            ulfm=args.ulfm,
            faults=not args.no_faults,
            show=_show_progress if tty else None,
        )
    except DemoStopped as e:
        code = EXIT_TERMINATED if e.signum == signal.SIGTERM else EXIT_INTERRUPTED
        if args.json:
            why = f"stopped by signal {e.signum}; the state directory {e.state} resumes"
            return _error(args, _Stopped(why), code)
        print(f"stopped; the state directory {e.state} resumes", file=sys.stderr)
        return code
    except DemoFailed as e:
        raise _IOFailure(str(e)) from None
    if tty:
        print()
    summary = run.summary
    shown = {k: v for k, v in summary.items() if k not in ("lost_ids",)}
    if args.json:
        _print(summary, True)
    else:
        print(f"state directory  {run.state} (run again to resume)")
        print(f"mpiexec log      {run.log_path}")
        for line in demo_lines(shown):
            print(line)
    ok = summary["lost"] == 0 and summary["duplicate_commits"] == 0 and summary.get("finished")
    return EXIT_OK if ok else EXIT_FINDING


#: the demo summary's numbers in a user's words, in the order shown (``--json`` keeps the keys)
_DEMO_WORDS = {
    "state": "state",
    "work_items": "work items",
    "committed": "committed",
    "deferred": "deferred (failed past their retries)",
    "left": "left for the next run",
    "lost": "lost (must be 0)",
    "duplicate_commits": "committed twice (must be 0)",
    "failures_by_kind": "failed attempts by kind",
    "finished": "finished",
    "seconds": "seconds",
    "epoch": "run of this state directory",
    "dispatches": "dispatches (messages)",
    "dispatched_items": "items sent",
    "batch_splits": "items requeued from a failed batch",
    "item_failures": "items whose function failed",
    "invalid_result_rollbacks": "results refused (malformed, missing, too large)",
    "dispatch_watchdog_timeouts": "dispatches past their deadline",
    "watchdog_worker_recoveries": "stuck workers that came back",
    "parked_ranks_now": "workers still stuck (parked)",
    "protocol_requeued_dispatches": "retries queued",
    "protocol_deferred_dispatches": "items deferred this run",
    "deferred_in_memory": "deferrals not yet on disk",
    "ranks_lost": "ranks lost",
    "master_restart_rollbacks": "dispatches a restart took back",
}
#: the messages the master ignored, by kind: what each means
_IGNORED = {
    "stale": "late answers from a dispatch already taken back, ignored",
    "unowned": "answers for work the rank was not given, ignored",
    "malformed": "malformed messages refused",
    "duplicate": "second answers for one dispatch, ignored",
}


def demo_lines(summary: dict[str, Any]) -> list[str]:
    """The demo's summary for people: each number under a name a user knows (the JSON keys are
    for machines), the messages the master ignored said in words, and the MPI mode."""
    rows: list[tuple[str, str]] = []
    for key, label in _DEMO_WORDS.items():
        if key in summary:
            v = summary[key]
            text = _text(v)
            if isinstance(v, dict):
                text = ", ".join(f"{k} {n}" for k, n in sorted(v.items())) if v else "none"
            rows.append((label, text))
    if "mode" in summary:
        ulfm = summary["mode"] == "ulfm"
        rows.append(
            ("MPI fault tolerance (ULFM)", "on" if ulfm else "off: a lost rank ends the job")
        )
    for key, label in _IGNORED.items():
        for message, n in sorted((summary.get(key) or {}).items()):
            rows.append((label, f"{n} ({message} messages)"))
    if summary.get("lost_rank_times"):
        rows.append(("ranks lost (rank=when)", _text(summary["lost_rank_times"])))
    known = {*_DEMO_WORDS, *_IGNORED, "mode", "lost_rank_times", "lost_ids"}
    rows += [(k.replace("_", " "), _text(v)) for k, v in summary.items() if k not in known]
    width = max(len(label) for label, _ in rows) + 2
    return [f"{label:<{width}}{text}" for label, text in rows]


def cmd_run(args: argparse.Namespace) -> int:
    """Run a program on ``-n`` ranks under the ``mpiexec`` found (the one next to this Python,
    else on ``PATH``), with the flags that MPI needs on a laptop: Open MPI gets
    ``--oversubscribe --bind-to none`` and, as root, its two root variables; Intel MPI
    ``I_MPI_PIN=0``; MPICH's Hydra needs nothing. ``python`` is this Python. The first Ctrl-C
    drains the campaign (SIGUSR1 to ``mpiexec``, which passes it to every rank), a second stops
    the job at once; SIGTERM, SIGUSR1 and SIGUSR2 are passed on to ``mpiexec``. The exit code
    is ``mpiexec``'s."""
    import shlex
    import subprocess

    from ..mpi.launcher import kill_session, launch_env, mpiexec_command

    if not args.program:
        raise UsageError("run needs a program, e.g. durable-dispatch run -n 4 python campaign.py")
    argv = list(args.program)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    cmd = mpiexec_command(args.ranks, argv, ulfm=args.ulfm)
    if args.print:
        env = launch_env(quiet=True)
        root = [
            f"{k}={env[k]}"
            for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
            if k in env and k not in os.environ
        ]
        print(shlex.join(root + cmd))
        return EXIT_OK
    # A session of its own, so that Ctrl-C reaches this process only and can be made a drain.
    stdin = subprocess.DEVNULL if sys.stdin is None or sys.stdin.isatty() else None
    proc = subprocess.Popen(cmd, env=launch_env(), stdin=stdin, start_new_session=True)
    forwarded = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    old = {s: signal.signal(s, lambda signum, _f: proc.send_signal(signum)) for s in forwarded}
    interrupted = False
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:
                if interrupted:
                    kill_session(proc)
                    return EXIT_INTERRUPTED
                interrupted = True
                print("\ninterrupted: draining (Ctrl-C again to stop at once)", file=sys.stderr)
                proc.send_signal(signal.SIGUSR1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 128 - rc if rc < 0 else rc


def _show_progress(st: dict[str, Any], total: int) -> None:
    """The demo's progress line (its master's statistics), on a terminal."""
    c = st.get("core", {})
    left = sum(int(c.get(k, 0)) for k in ("pending_now", "in_flight_now", "deferred_now"))
    # The campaign's committed count, as stats shows it (the master's "commits" counts its own
    # run only: a resumed demo would show 3/80 for 80 done); nothing before the first dispatch.
    done = total - left if c.get("dispatches", 0) or c.get("commits", 0) else 0
    line = (
        f"committed {max(done, 0)}/{total}  in flight {c.get('in_flight_now', 0)} items "
        f"on {c.get('busy_ranks_now', 0)} busy ranks  parked ranks {c.get('parked_ranks_now', 0)}  "
        f"deferred {c.get('deferred_now', 0)}  "
        f"timeouts {c.get('dispatch_watchdog_timeouts', 0)}"
    )
    sys.stdout.write("\r" + line.ljust(100))
    sys.stdout.flush()
