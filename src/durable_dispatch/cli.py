"""The ``durable-dispatch`` command (also ``python -m durable_dispatch``).

Command bodies stay thin: they call the library and print its results. Library errors become
``Error: ...`` with exit code 1 here and only here. Exit codes: 0 ok, 1 a finding (damage, lost
records) or a library error, 2 usage or I/O error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from .errors import DurableDispatchError
from .storage.format import scan
from .storage.snapshot import decode_snapshot

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2


class _IOFailure(Exception):
    pass


def _kind(path: str) -> str:
    if os.path.isdir(path):
        return "directory"
    if path.endswith(".snap"):
        return "snapshot"
    return "journal"


def _examine(path: str, count_kinds: bool) -> dict[str, Any]:
    """Read-only examination of one journal or snapshot file."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if _kind(path) == "snapshot":
                data = f.read()
                r = decode_snapshot(data)
                if isinstance(r, str):
                    return {
                        "path": path,
                        "kind": "snapshot",
                        "size": size,
                        "intact": False,
                        "damage": [{"offset": 0, "length": size, "reason": r}],
                    }
                return {
                    "path": path,
                    "kind": "snapshot",
                    "size": size,
                    "intact": True,
                    "format_version": 1,
                    "generation": r[0],
                    "damage": [],
                }
            try:
                res = scan(f, size, 1 << 30, count_kinds=count_kinds)
            except ValueError as e:
                return {
                    "path": path,
                    "kind": "journal",
                    "size": size,
                    "intact": False,
                    "damage": [
                        {
                            "offset": 0,
                            "length": size,
                            "reason": f"unsupported format version {e.args[1]!r}",
                        }
                    ],
                }
    except OSError as e:
        raise _IOFailure(f"{path}: {e.strerror or e}") from e
    torn = bool(res.damage) and res.tail_only
    out: dict[str, Any] = {
        "path": path,
        "kind": "journal",
        "format_version": 1 if res.header else None,
        "size": size,
        "records": res.records,
        "first_seq": res.first_seq,
        "last_seq": res.last_seq,
        "intact": not res.damage and size > 0,
        "torn_tail": torn,
        "torn_tail_bytes": size - res.damage[0].offset if torn else 0,
        "damage": [
            {"offset": d.offset, "length": d.length, "reason": d.reason} for d in res.damage
        ],
    }
    if size == 0:
        out["damage"] = [{"offset": 0, "length": 0, "reason": "empty file (no header)"}]
    if count_kinds:
        out["kinds"] = res.kinds
    return out


def _print(obj: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    for k, v in obj.items():
        if k == "damage":
            for d in v:
                print(f"{'damage':<30} offset {d['offset']}, {d['length']} bytes: {d['reason']}")
        elif k == "kinds":
            for kind, n in sorted(v.items()):
                print(f"{'kind ' + kind:<30} {n}")
        else:
            print(f"{k:<30} {v}")


def cmd_verify(args: argparse.Namespace) -> int:
    """Full checksum and structure check; never modifies anything."""
    res = _examine(args.path, count_kinds=False)
    first = res["damage"][0] if res["damage"] else None
    summary = {
        "path": res["path"],
        "kind": res["kind"],
        "intact": res["intact"],
        "records": res.get("records"),
        "first_bad_offset": first["offset"] if first else None,
        "problem": first["reason"] if first else None,
    }
    _print(summary, args.json)
    return EXIT_OK if res["intact"] else EXIT_FINDING


def cmd_inspect(args: argparse.Namespace) -> int:
    """Describe a journal or snapshot file."""
    _print(_examine(args.path, count_kinds=True), args.json)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """Launch the bundled campaign under mpiexec, show progress, print the summary."""
    import subprocess
    import time

    from .mpi.launcher import kill_session, launch_env, mpiexec_command

    state = os.path.abspath(args.state_dir)
    os.makedirs(state, mode=0o700, exist_ok=True)
    progress_file = os.path.join(state, "progress.json")
    summary_file = os.path.join(state, "summary.json")
    for stale in (progress_file, summary_file):
        if os.path.exists(stale):
            os.unlink(stale)
    kinds = "none" if args.no_faults else "hang,slow,malformed,missing,old-token"
    if args.ulfm and not args.no_faults:
        kinds += ",crash"
    argv = [
        sys.executable,
        "-m",
        "durable_dispatch.mpi.demo",
        state,
        "--items",
        str(args.items),
        "--faults",
        kinds,
        "--seed",
        str(args.seed),
        "--watchdog",
        str(args.watchdog),
        "--progress-file",
        progress_file,
        "--summary",
        summary_file,
    ]
    try:
        cmd = mpiexec_command(args.ranks, argv, ulfm=args.ulfm)
    except FileNotFoundError as e:
        raise _IOFailure(str(e)) from None
    log_path = os.path.join(state, "demo-mpiexec.log")
    tty = sys.stdout.isatty() and not args.json
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, env=launch_env(), start_new_session=True
        )
        deadline = time.monotonic() + args.timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                kill_session(proc)  # type: ignore[arg-type]
                proc.wait()
                raise _IOFailure(f"demo did not finish within {args.timeout}s; see {log_path}")
            if tty:
                _show_progress(progress_file, args.items)
            time.sleep(0.2)
    if tty:
        _show_progress(progress_file, args.items)
        print()
    if not os.path.exists(summary_file):
        raise _IOFailure(f"mpiexec exited with {proc.returncode} and no summary; see {log_path}")
    with open(summary_file, "rb") as fh:
        summary = orjson.loads(fh.read())
    shown = {k: v for k, v in summary.items() if k not in ("lost_ids",)}
    if args.json:
        _print(summary, True)
    else:
        print(f"state directory  {state} (run again to resume)")
        print(f"mpiexec log      {log_path}")
        _print(shown, False)
    ok = summary["lost"] == 0 and summary["duplicate_commits"] == 0 and summary.get("finished")
    return EXIT_OK if ok else EXIT_FINDING


def _show_progress(path: str, total: int) -> None:
    try:
        with open(path, "rb") as f:
            st = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return
    c = st.get("core", {})
    line = (
        f"committed {c.get('commits', 0)}/{total}  in flight {c.get('in_flight_now', 0)}  "
        f"parked ranks {c.get('parked_ranks_now', 0)}  deferred {c.get('deferred_now', 0)}  "
        f"timeouts {c.get('dispatch_watchdog_timeouts', 0)}"
    )
    sys.stdout.write("\r" + line.ljust(100))
    sys.stdout.flush()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``durable-dispatch`` command."""
    p = argparse.ArgumentParser(
        prog="durable-dispatch",
        description="Inspect and verify durable-dispatch files; run the demo campaign.",
        epilog="Exit codes: 0 ok, 1 damage found or library error, 2 usage or I/O error.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn, helptext, example in (
        (
            "verify",
            cmd_verify,
            "check every checksum and the structure; exit 1 on damage",
            "durable-dispatch verify state/events.jsonl --json",
        ),
        (
            "inspect",
            cmd_inspect,
            "describe a journal or snapshot file",
            "durable-dispatch inspect state/events.jsonl",
        ),
    ):
        sp = sub.add_parser(name, help=helptext, description=helptext, epilog=f"Example: {example}")
        sp.add_argument("path", help="a journal (.jsonl) or snapshot (.snap) file")
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=fn)
    dp = sub.add_parser(
        "demo",
        help="run the bundled campaign under mpiexec, with injected faults",
        description="Run the bundled example campaign on real MPI ranks. Unless --no-faults, "
        "some workers hang, answer late, lie or (with --ulfm) die; the summary checks that no "
        "work was lost and none was committed twice. Running it again resumes.",
        epilog="Example: durable-dispatch demo --ranks 4 --json",
    )
    dp.add_argument("--state-dir", default="dd-demo-state", help="state directory")
    dp.add_argument("-n", "--ranks", type=int, default=4, help="MPI ranks (1 master + workers)")
    dp.add_argument("--items", type=int, default=80, help="work items in the campaign")
    dp.add_argument("--no-faults", action="store_true", help="inject no faults")
    dp.add_argument("--ulfm", action="store_true", help="run with --with-ft ulfm (adds a crash)")
    dp.add_argument("--seed", type=int, default=7, help="fault plan seed")
    dp.add_argument("--watchdog", type=float, default=2.0, help="watchdog seconds")
    dp.add_argument("--timeout", type=float, default=600.0, help="give up after this long")
    dp.add_argument("--json", action="store_true", help="machine-readable output")
    dp.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        return int(args.func(args))
    except _IOFailure as e:
        print(f"Error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except DurableDispatchError as e:
        print(f"Error: {e}", file=sys.stderr)
        return EXIT_FINDING
