"""The ``durable-dispatch`` command (also ``python -m durable_dispatch``).

Command bodies stay thin: they call the library and print its results, a table for people or
``--json`` for machines (valid JSON even when empty). Library errors become ``Error: ...`` here and
only here. Exit codes: 0 ok, 1 a finding (damage, lost records) or a library error, 2 usage or I/O
error. Reading commands never modify anything; a progress line goes to standard error while a large
file is read or compacted, only when standard error is a terminal.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import orjson

from ..errors import DurableDispatchError, UsageError
from ..views.examine import examine, kind_of
from ..views.watch import stats_of, stats_text, watch_frame, watch_text

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # the demo was stopped by a second Ctrl-C (128 + SIGINT)
EXIT_TERMINATED = 143  # the demo was stopped by SIGTERM (128 + SIGTERM)
_PROGRESS_MIN = 8 << 20


class _IOFailure(Exception):
    pass


class _Stopped(Exception):
    """The demo was stopped by a signal (``--json`` reports it as an error of type Stopped)."""


def _file_meter(name: str, size: int) -> _Meter:
    """The progress line of reading one file (``examine``'s ``progress``)."""
    return _Meter(f"reading {name}", size)


class _Meter:
    """A progress line on standard error: only on a terminal and for large files. The size is
    given here, or by the first call (``meter(done, total)``, as the library's callbacks do)."""

    def __init__(self, label: str, size: int | None = None) -> None:
        self._label = label
        self._size = size
        self._show = False
        self._next = 0.0
        if size is not None:
            self._sized(size)

    def _sized(self, size: int) -> None:
        self._size = max(size, 1)
        self._show = sys.stderr.isatty() and size >= _PROGRESS_MIN

    def __call__(self, done: int, total: int | None = None) -> None:
        if self._size is None:
            self._sized(total or 0)
        if self._show and time.monotonic() >= self._next:
            assert self._size is not None
            sys.stderr.write(f"\r{self._label}: {100.0 * done / self._size:5.1f}%")
            sys.stderr.flush()
            self._next = time.monotonic() + 0.2

    def done(self) -> None:
        if self._show:
            sys.stderr.write("\r" + " " * (len(self._label) + 9) + "\r")
            sys.stderr.flush()


def _print(obj: Any, as_json: bool) -> None:
    if as_json:
        opt = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
        sys.stdout.write(orjson.dumps(obj, option=opt).decode() + "\n")
        return
    if isinstance(obj, list):
        for row in obj:
            _print(row, False)
            print()
        if not obj:
            print("(none)")
        return
    for k, v in obj.items():
        if k == "damage":
            for d in v:
                where = f"{d['path']} " if "path" in d else ""
                print(
                    f"{'damage':<30} {where}offset {d['offset']}, {d['length']} bytes: "
                    f"{d['reason']}"
                )
        elif k == "kinds" and isinstance(v, dict):
            for kind, n in sorted(v.items()):
                print(f"{'kind ' + kind:<30} {n}")
        elif k == "files":
            for f in v:
                print(
                    f"{'file':<30} {f['path']} ({f['kind']}, "
                    f"{'intact' if f['intact'] else 'DAMAGED'})"
                )
        elif isinstance(v, dict) and v and k not in ("stale", "unowned", "malformed", "duplicate"):
            _print({f"{k}.{kk}": vv for kk, vv in v.items()}, False)
        else:
            print(f"{k:<30} {_text(v)}")


def _text(v: Any) -> str:
    """A value for people: no Python reprs (lists joined, mappings as k=v, None as -)."""
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return ", ".join(_text(x) for x in v) if v else "(none)"
    if isinstance(v, dict):
        return ", ".join(f"{kk}={_text(vv)}" for kk, vv in v.items()) if v else "(none)"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


# ---------------------------------------------------------------------------------- commands
def cmd_verify(args: argparse.Namespace) -> int:
    """Full checksum and structure check; never modifies anything."""
    res = examine(args.path, count_kinds=False, progress=_file_meter)
    if res["kind"] == "state-directory" and res["intact"]:
        from ..campaign.admin import view_state
        from ..errors import CorruptionError

        try:  # S11: checksums passed; every event and the snapshot must match their schemas
            view_state(args.path)
        except CorruptionError as e:
            res["intact"] = False
            res["damage"] = [{"path": e.path, "offset": e.offset, "reason": e.reason or str(e)}]
    first = res["damage"][0] if res["damage"] else None
    records = res.get("records")
    if records is None and "files" in res:  # a state directory: the records of its journals
        records = sum(f.get("records") or 0 for f in res["files"])
    summary = {
        "path": res["path"],
        "kind": res["kind"],
        "intact": res["intact"],
        "records": records,
        "first_bad_offset": first["offset"] if first else None,
        "first_bad_file": first.get("path", res["path"]) if first else None,
        "problem": first["reason"] if first else None,
    }
    _print(summary, args.json)
    return EXIT_OK if res["intact"] else EXIT_FINDING


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe a journal, a snapshot or a state directory."""
    res = examine(args.path, count_kinds=True, progress=_file_meter)
    if res["kind"] == "state-directory":  # the campaign's one view, as stats shows it (V1)
        from ..views.view import read_view

        res["state"] = read_view(args.path).as_dict()
    _print(res, args.json)
    return EXIT_OK


def _need_state_dir(path: str) -> None:
    if not os.path.exists(path):
        raise _IOFailure(f"{path}: no such directory")
    if not os.path.isdir(path):
        raise _IOFailure(f"{path}: not a directory")
    if kind_of(path) != "state-directory":
        from ..campaign.statedir import is_state_dir

        try:
            inner = sorted(n for n in os.listdir(path) if is_state_dir(os.path.join(path, n)))
        except OSError:
            inner = []
        if inner:  # a futures runner's --state-dir holds one state directory per executor
            more = f" and {len(inner) - 8} more" if len(inner) > 8 else ""
            raise _IOFailure(
                f"{path} is not a durable-dispatch state directory, but it holds "
                f"{len(inner)} ({', '.join(inner[:8])}{more}): a futures runner's --state-dir "
                "keeps one per executor; pass one of them, e.g. "
                f"{os.path.join(path, inner[0])}"
            )
        raise _IOFailure(f"{path} is not a durable-dispatch state directory")


def cmd_stats(args: argparse.Namespace) -> int:
    """The campaign at a glance (state, progress, rate and ETA, failures, ranks, storage,
    master); every number with ``--verbose`` and ``--json`` (one view, V1)."""
    from ..campaign.admin import view_state
    from ..views.view import view_of_state

    _need_state_dir(args.state_dir)
    v = view_state(args.state_dir)
    view = view_of_state(v)
    master_stats = dict(v.live.get("stats") or {})
    if args.json:
        _print(stats_of(view, master_stats), True)
    else:
        sys.stdout.write("\n".join(stats_text(view, master_stats, args.verbose)) + "\n")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """Write the campaign's report page (read-only on the state directory)."""
    from ..views.report import write_report

    _need_state_dir(args.state_dir)
    series = write_report(args.state_dir, args.output)
    if args.json:
        _print({"output": args.output, **series["view"]}, True)
    else:
        v = series["view"]
        print(
            f"wrote {args.output}: {v['state']}, {v['committed']} of {v['work_items']} "
            f"committed, {v['deferred']} deferred"
        )
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    """A live view of a campaign, read-only and safe beside the master (see docs/cli.md)."""
    from ..views.view import read_view

    _need_state_dir(args.state_dir)
    if args.interval <= 0:
        raise UsageError(f"--interval must be > 0, got {args.interval}")
    tty = sys.stdout.isatty() and not args.json
    try:
        while True:
            view = read_view(args.state_dir)
            if args.json:
                sys.stdout.write(orjson.dumps(watch_frame(view)).decode() + "\n")
            else:
                lines = watch_text(view)
                sys.stdout.write(("\x1b[H\x1b[J" if tty else "") + "\n".join(lines) + "\n")
            sys.stdout.flush()
            if args.once or not view.master_running:
                return EXIT_OK
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_results(args: argparse.Namespace) -> int:
    """Every committed result, in commit order (U6); read-only, safe beside a running master.
    A sealed pickle of the futures executor is shown opaque (``results.shown``)."""
    from ..campaign.results import read_results, shown

    _need_state_dir(args.state_dir)
    rows = read_results(args.state_dir, args.work_ids or None)
    if args.jsonl:
        out = sys.stdout
        for r in rows:
            out.write(orjson.dumps({**r.as_dict(), "result": shown(r.result)}).decode() + "\n")
        return EXIT_OK
    if args.json:
        _print([{**r.as_dict(), "result": shown(r.result)} for r in rows], True)
        return EXIT_OK
    n = 0
    for r in rows:
        value = orjson.dumps(shown(r.result)).decode()
        if len(value) > 100:
            value = value[:97] + "..."
        print(f"{r.work_id:<30} {value}")
        n += 1
    if not n:
        print("(none)")
    return EXIT_OK


def cmd_joblog(args: argparse.Namespace) -> int:
    """One line per work item: status, tries, last failure, start, duration, rank, host and
    what it runs (GNU parallel's --joblog); read-only, safe beside a running master."""
    import datetime

    from ..campaign.results import read_joblog

    _need_state_dir(args.state_dir)
    rows = read_joblog(args.state_dir)
    if args.status:
        rows = (r for r in rows if r.status in args.status)
    if args.jsonl:
        for r in rows:
            sys.stdout.write(orjson.dumps(r.as_dict()).decode() + "\n")
        return EXIT_OK
    if args.json:
        _print([r.as_dict() for r in rows], True)
        return EXIT_OK

    def when(ts: float | None) -> str:
        if ts is None:
            return "-"
        return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%H:%M:%S")

    head = (
        f"{'work ID':<24} {'status':<9} {'tries':>5} {'started':>8} {'seconds':>8} {'rank':>4} "
        f"{'host':<16}"
    )
    print(f"{head}  last failure / call")
    n = 0
    for r in rows:
        secs = f"{r.seconds:.2f}" if r.seconds is not None else "-"
        fail = f"{r.last_failure_kind}: {r.last_failure}" if r.last_failure_kind else ""
        tail = fail or (r.call or "")
        tail = tail if len(tail) <= 70 else tail[:67] + "..."
        rank = "-" if r.rank is None else str(r.rank)
        host = "-" if r.host is None else r.host if len(r.host) <= 16 else r.host[:15] + "~"
        print(
            f"{r.work_id:<24} {r.status:<9} {r.tries:>5} {when(r.started):>8} {secs:>8} "
            f"{rank:>4} {host:<16}  {tail}"
        )
        n += 1
    if not n:
        print("(none)")
    return EXIT_OK


def cmd_compact(args: argparse.Namespace) -> int:
    """Fold a state directory's journal into a snapshot, or drop resolved deferred entries."""
    from ..storage.defer import compact_file

    path = args.path
    if not os.path.exists(path):
        raise _IOFailure(f"{path}: no such file or directory")
    meter = _Meter("compacting")
    try:
        if os.path.isdir(path):
            from ..campaign.admin import compact_state

            _need_state_dir(path)
            rep = compact_state(path, dry_run=args.dry_run, progress=meter).as_dict()
        else:
            size = os.path.getsize(path)
            before, after = compact_file(path, dry_run=args.dry_run, progress=meter)
            rep = {
                "path": path,
                "records_before": before,
                "records_after": after,
                "bytes_before": size,
                "bytes_after": os.path.getsize(path) if not args.dry_run else None,
                "dry_run": args.dry_run,
            }
    finally:
        meter.done()
    _print(rep, args.json)
    return EXIT_OK


def _steer(args: argparse.Namespace, op: str, cmd_args: dict[str, Any]) -> int:
    """Send an operator command (O1; ``steer.send``) and print what was done: exit 0 when
    it was applied as asked, 1 when something was left alone (an unknown work ID, a payload
    that conflicts, no master to drain) or no acknowledgement came in time."""
    from .steer import send

    _need_state_dir(args.state_dir)
    sent = send(args.state_dir, op, cmd_args, wait=not args.no_wait, timeout=args.timeout)
    out = dict(sent.outcome or {"id": sent.command.id, "op": op})
    out["applied_by"] = sent.how
    if sent.how == "queued":
        out["message"] = "queued: the running master applies it within about a second"
    elif sent.how == "timeout":
        out["ok"] = False
        out["message"] = (
            f"no acknowledgement within {args.timeout:g}s: the command stays queued and is "
            "applied once, by the running master or else by the next one at its start"
        )
    elif sent.how == "opened":
        out["message"] = (
            f"no master was running; applied now, as a master's start would: {out.get('message')}"
        )
    if args.json:
        _print(out, True)
    else:
        print(out.get("message", ""))
        if sent.how == "timeout":
            return EXIT_FINDING
    return EXIT_OK if out.get("ok", True) else EXIT_FINDING


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel work items (O1): pending ones are removed, in-flight ones stopped; they end
    cancelled, never retried."""
    return _steer(args, "cancel", {"work_ids": args.ids})


def cmd_retry(args: argparse.Namespace) -> int:
    """Put deferred or cancelled work items back to pending with fresh retry budgets."""
    if args.all == bool(args.ids):
        raise UsageError("retry needs work IDs or --all (not both)")
    return _steer(args, "retry", {"work_ids": args.ids, "all": args.all})


def cmd_drain(args: argparse.Namespace) -> int:
    """Drain the running master as SIGUSR1 does (it stops resumably)."""
    from ..campaign.statedir import _master_running
    from ..errors import NoMasterError

    _need_state_dir(args.state_dir)
    try:
        if not _master_running(args.state_dir):
            raise NoMasterError(f"no master is running on {args.state_dir}: nothing to drain")
        return _steer(args, "drain", {})
    except NoMasterError as e:  # a finding, not a usage error: exit 1 (also when the master
        # ended between the check above and the command's own)
        return _error(args, LookupError(e.message), EXIT_FINDING)


def cmd_submit(args: argparse.Namespace) -> int:
    """Add work items from a JSON Lines file (or standard input) to the campaign."""
    from ..campaign.control import parse_submit_lines
    from ..errors import ChangedPayloadError

    _need_state_dir(args.state_dir)
    try:
        if args.file == "-":
            items = parse_submit_lines(sys.stdin.buffer)
        else:
            with open(args.file, "rb") as f:
                items = parse_submit_lines(f)
    except ChangedPayloadError as e:
        return _error(args, e, EXIT_FINDING)
    return _steer(args, "submit", {"items": items})


def cmd_deferred(args: argparse.Namespace) -> int:
    """List, show, requeue or drop deferred work items of a state directory."""
    from ..campaign.admin import drop_deferred, view_state
    from ..storage.defer import DEFAULT_DEFER_NAME
    from ..storage.journal import read_journal

    _need_state_dir(args.state_dir)
    if args.action in ("requeue", "drop"):
        if not args.ids:
            raise UsageError(f"deferred {args.action} needs at least one work ID")
        if args.action == "requeue":  # an alias of ``retry`` (issue 52), for deferred items
            led = view_state(args.state_dir).projection
            for w in args.ids:
                if w not in led.deferred:
                    raise UsageError(f"{w!r} is not deferred")
            return _steer(args, "retry", {"work_ids": list(args.ids)})
        done = drop_deferred(args.state_dir, args.ids)
        _print({"action": args.action, "work_ids": done}, args.json)
        return EXIT_OK
    live: dict[str, dict[str, Any]] = {}
    path = os.path.join(args.state_dir, DEFAULT_DEFER_NAME)
    if os.path.exists(path):
        for rec in read_journal(path):
            p = rec.payload
            if not isinstance(p, dict) or not isinstance(p.get("work_id"), str):
                continue
            if p.get("event") == "deferred":
                live[p["work_id"]] = {
                    "work_id": p["work_id"],
                    "attempts": p.get("attempts"),
                    "kinds": p.get("kinds"),
                    "last_error": p.get("last_error"),
                    "self_contained": p.get("self_contained"),
                    "inputs": p.get("inputs"),
                    "item": p.get("item"),
                    "seq": rec.seq,
                }
            elif p.get("event") == "resolved":
                live.pop(p["work_id"], None)
    if live:  # as stats counts them: a record whose item the state journal brought back (a
        led = view_state(args.state_dir).projection  # dependency's commit released it, and
        live = {w: r for w, r in live.items() if w in led.deferred}  # the master ended before
        # it resolved the record) is not deferred
    if args.action == "list":
        rows = [{k: v for k, v in r.items() if k != "item"} for r in live.values()]
        _print(rows, args.json)
        return EXIT_OK
    if len(args.ids) != 1:
        raise UsageError("deferred show takes exactly one work ID")
    item = live.get(args.ids[0])
    if item is None:  # a finding about the state, not a wrong call
        return _error(args, LookupError(f"{args.ids[0]!r} is not deferred"), EXIT_FINDING)
    _print(item, args.json)
    return EXIT_OK


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
        _print(shown, False)
    ok = summary["lost"] == 0 and summary["duplicate_commits"] == 0 and summary.get("finished")
    return EXIT_OK if ok else EXIT_FINDING


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``durable-dispatch`` command."""
    p = _Parser(
        prog="durable-dispatch",
        description="Inspect, verify and compact durable-dispatch state; run the demo campaign.",
        epilog="Exit codes: 0 ok, 1 damage found or library error, 2 usage or I/O error.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Any, helptext: str, example: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(
            name,
            help=helptext,
            description=helptext,
            epilog=f"Example: {example}",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=fn)
        return sp

    sp = add(
        "verify",
        cmd_verify,
        "check every checksum and the structure; exit 1 on damage",
        "durable-dispatch verify state/events.jsonl --json",
    )
    sp.add_argument("path", help="a journal (.jsonl), a snapshot (.snap) or a state directory")
    sp = add(
        "inspect",
        cmd_inspect,
        "describe a journal, a snapshot or a state directory",
        "durable-dispatch inspect state/",
    )
    sp.add_argument("path", help="a journal (.jsonl), a snapshot (.snap) or a state directory")
    sp = add(
        "compact",
        cmd_compact,
        "fold a state directory's journal into a snapshot, or drop resolved entries of a "
        "defer journal; crash-safe; refuses while a master runs",
        "durable-dispatch compact state/ --dry-run",
    )
    sp.add_argument("path", help="a state directory or a defer journal file")
    sp.add_argument("--dry-run", action="store_true", help="report what would change")
    sp = add(
        "results",
        cmd_results,
        "every committed result, in commit order (read-only; safe beside a running master)",
        "durable-dispatch results state/ --jsonl",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("work_ids", nargs="*", metavar="ID", help="only these work IDs")
    sp.add_argument("--jsonl", action="store_true", help="one JSON object per line")
    sp = add(
        "joblog",
        cmd_joblog,
        "one line per work item: status (committed, deferred, cancelled, pending, waiting, in "
        "flight), tries, last failure, start time (UTC), seconds, rank, host, and what it runs "
        "(a futures call as "
        "function(arguments)); read-only",
        "durable-dispatch joblog state/ --status deferred --jsonl | jq .last_failure",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("--jsonl", action="store_true", help="one JSON object per line")
    sp.add_argument(
        "--status",
        action="append",
        choices=["committed", "deferred", "cancelled", "pending", "waiting", "in flight"],
        help="only items with this status (repeat for several)",
    )
    sp = add(
        "stats",
        cmd_stats,
        "the campaign at a glance: state, progress, rate and ETA, failures by kind, ranks, "
        "storage, master; every number with --verbose or --json",
        "durable-dispatch stats state/ --verbose",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("-v", "--verbose", action="store_true", help="every number, not a summary")
    sp = add(
        "report",
        cmd_report,
        "write one self-contained HTML page about the campaign's life (inline SVG, no network)",
        "durable-dispatch report state/ -o report.html",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("-o", "--output", default="report.html", help="the page to write")
    sp = add(
        "watch",
        cmd_watch,
        "a live view of a campaign (read-only, safe beside the master); ends with the master",
        "durable-dispatch watch state/ --interval 5",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("--once", action="store_true", help="show one frame and exit")
    sp.add_argument("--interval", type=float, default=2.0, help="seconds between frames")
    sp = add(
        "deferred",
        cmd_deferred,
        "list, show, requeue or drop deferred work items",
        "durable-dispatch deferred requeue state/ w-17 w-18",
    )
    sp.add_argument(
        "action",
        choices=["list", "show", "requeue", "drop"],
        help="list them, show one, put them back in the frontier, or give them up",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("ids", nargs="*", help="work IDs (show, requeue, drop)")
    _steering(sp)
    sp = add(
        "cancel",
        cmd_cancel,
        "cancel work items, running master or not: pending ones are removed, in-flight ones "
        "stopped (an isolated child is killed); they end cancelled, never retried; a committed "
        "one is left alone",
        "durable-dispatch cancel state/ w-17 w-18",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("ids", nargs="+", metavar="ID", help="work IDs")
    _steering(sp)
    sp = add(
        "retry",
        cmd_retry,
        "put deferred or cancelled work items back to pending with fresh retry budgets, "
        "running master or not",
        "durable-dispatch retry state/ --all",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("ids", nargs="*", metavar="ID", help="work IDs")
    sp.add_argument("--all", action="store_true", help="every deferred and cancelled item")
    _steering(sp)
    sp = add(
        "drain",
        cmd_drain,
        "drain the running master as SIGUSR1 does: no new dispatch, in-flight work finishes "
        "and commits, then it stops resumably",
        "durable-dispatch drain state/",
    )
    sp.add_argument("state_dir", help="a state directory")
    _steering(sp)
    sp = add(
        "submit",
        cmd_submit,
        'add work items from JSON Lines {"work_id", "payload", "priority"?, "after"?}, running '
        "master or not; a known ID with the same payload is skipped, with another payload the "
        "whole file is refused (exit 1); a malformed line refuses the whole file (exit 2)",
        "durable-dispatch submit state/ new-items.jsonl",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("file", help="a JSON Lines file, or - for standard input")
    _steering(sp)
    dp = sub.add_parser(
        "demo",
        help="run the bundled campaign under mpiexec, with injected faults",
        description="Run the bundled example campaign on real MPI ranks, the work functions "
        "isolated in child processes. Unless --no-faults, some work functions hang or segfault "
        "(and their ranks come back), some answer late, some workers lie or (with --ulfm) die; "
        "the summary checks that no work was lost and none was committed twice. Ctrl-C drains "
        "(a second Ctrl-C stops at once). Running it again resumes.",
        epilog="Example: durable-dispatch demo --ranks 4 --json",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    dp.add_argument("--state-dir", default="dd-demo-state", help="state directory")
    dp.add_argument("-n", "--ranks", type=int, default=4, help="MPI ranks (1 master + workers)")
    dp.add_argument("--items", type=int, default=80, help="work items in the campaign")
    dp.add_argument("--no-faults", action="store_true", help="inject no faults")
    dp.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_false",
        help="run the work function inside the worker ranks (no segfault fault then: it would "
        "end the job)",
    )
    dp.add_argument("--ulfm", action="store_true", help="run with --with-ft ulfm (adds a crash)")
    dp.add_argument("--seed", type=int, default=7, help="fault plan seed")
    dp.add_argument("--watchdog", type=float, default=2.0, help="watchdog seconds")
    dp.add_argument("--batch", type=int, default=1, help="work items per dispatch")
    dp.add_argument("--ms", type=float, default=40.0, help="milliseconds each work item takes")
    dp.add_argument("--timeout", type=float, default=600.0, help="give up after this long")
    dp.add_argument("--json", action="store_true", help="machine-readable output")
    dp.set_defaults(func=cmd_demo)
    rp = sub.add_parser(
        "run",
        help="run a program on N MPI ranks with the flags this machine's MPI needs",
        description="Run PROGRAM on N ranks under the mpiexec found (next to this Python, else "
        "on PATH), in the dialect of that MPI: Open MPI gets --oversubscribe --bind-to none "
        "(more ranks than cores) and, as root, OMPI_ALLOW_RUN_AS_ROOT=1 and "
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; Intel MPI gets I_MPI_PIN=0; MPICH needs nothing. "
        "PROGRAM 'python' is this Python. The first Ctrl-C drains the campaign (SIGUSR1 to "
        "mpiexec), a second stops it at once; SIGTERM, SIGUSR1 and SIGUSR2 are passed on to "
        "mpiexec. The exit code is mpiexec's. --print shows the command instead.",
        epilog="Example: durable-dispatch run -n 4 python campaign.py",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    rp.add_argument("-n", "--ranks", type=int, default=4, help="MPI ranks (1 master + workers)")
    rp.add_argument("--ulfm", action="store_true", help="add Open MPI's --with-ft ulfm")
    rp.add_argument("--print", action="store_true", help="print the command line; run nothing")
    rp.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    rp.set_defaults(func=cmd_run)
    from .launch import add_parser as add_launch  # issue 45: its body lives in launch.py

    add_launch(sub)
    return p


def _steering(sp: argparse.ArgumentParser) -> None:
    """The options of the commands that steer a campaign (O1)."""
    sp.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds to wait for the running master's acknowledgement",
    )
    sp.add_argument(
        "--no-wait",
        action="store_true",
        help="do not wait for the running master's acknowledgement",
    )


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are raised (so that ``--json`` gets them as JSON)."""

    def error(self, message: str) -> NoReturn:
        raise _ArgumentError(f"{self.prog}: {message}")


class _ArgumentError(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code.

    Writing to a pipe whose reader has gone (``durable-dispatch results STATE --jsonl | head``)
    ends the command quietly with exit 0, as ``head`` asked for no more."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # the library's warnings
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(words)
    except _ArgumentError as e:  # a wrong call: usage on stderr, or one JSON object
        if "--json" in words:
            return _error(argparse.Namespace(json=True), UsageError(str(e)), EXIT_USAGE)
        parser.print_usage(sys.stderr)
        print(f"Error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return int(e.code or 0)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        return _reader_gone()
    except (_IOFailure, UsageError) as e:  # a wrong call of the command is a usage error
        return _error(args, e, EXIT_USAGE)
    except DurableDispatchError as e:
        return _error(args, e, EXIT_FINDING)
    except OSError as e:
        return _error(args, e, EXIT_USAGE)


def _reader_gone() -> int:
    """The reader of standard output closed it (``| head``): stop quietly, exit 0. Standard
    output is pointed at /dev/null so that the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return EXIT_OK


def _error(args: argparse.Namespace, e: BaseException, code: int) -> int:
    """Report an error: ``Error: ...`` on stderr, or with ``--json`` one object on stdout of a
    stable shape, ``{"error": {"type", "message", "exit_code"}}``; returns ``code``."""
    if getattr(args, "json", False):
        names: dict[type[BaseException], str] = {
            _IOFailure: "UsageError",
            LookupError: "NotFound",
            _Stopped: "Stopped",
        }
        kind = names.get(type(e), type(e).__name__)
        body = {"error": {"type": kind, "message": str(e), "exit_code": code}}
        sys.stdout.write(orjson.dumps(body).decode() + "\n")
    else:
        print(f"Error: {e}", file=sys.stderr)
    return code
