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
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ..errors import DurableDispatchError, UsageError
from ._common import EXIT_FINDING, EXIT_OK, EXIT_USAGE, HelpFormatter, _error, _IOFailure
from .inspection import (
    cmd_inspect,
    cmd_joblog,
    cmd_output,
    cmd_report,
    cmd_results,
    cmd_stats,
    cmd_verify,
    cmd_watch,
)
from .maintenance import cmd_compact, cmd_deferred
from .running import cmd_demo, cmd_run
from .steering import _steering, cmd_cancel, cmd_drain, cmd_retry, cmd_submit

__all__ = ["build_parser", "main"]


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
            formatter_class=HelpFormatter,
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
    sp.add_argument(
        "--with-payload",
        action="store_true",
        help="show each item's payload beside its result (items submitted by callbacks, feeds "
        "and 'durable-dispatch submit' too)",
    )
    sp.add_argument(
        "--csv",
        metavar="FILE",
        help="write a table instead: one row per committed work ID, the result's fields (and "
        "with --with-payload the payload's) as columns; the same state gives the same file",
    )
    sp.add_argument(
        "--parquet",
        metavar="FILE",
        help="as --csv, as a Parquet file (needs pyarrow: the 'parquet' extra)",
    )
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
        "output",
        cmd_output,
        "what a work item wrote to its standard output and error, as an isolating worker "
        "kept it (the last 64 KiB of each, of its newest attempt that wrote anything): "
        "stdout, then stderr, each under a label; exit 1 when none is kept for the item (it "
        "says why: without isolation its prints went to the worker's standard output), 2 for "
        "an ID the campaign does not know; read-only",
        "durable-dispatch output state/ w-17",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("work_id", help="the work item's ID (as the joblog shows it, whole)")
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
    sp.add_argument(
        "--long",
        action="store_true",
        help="list: every field of each item (--json has them too), not one line per item",
    )
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
        "durable-dispatch retry state/ --deferred",
    )
    sp.add_argument("state_dir", help="a state directory")
    sp.add_argument("ids", nargs="*", metavar="ID", help="work IDs")
    sp.add_argument(
        "--deferred", action="store_true", help="every deferred item (failed past its retries)"
    )
    sp.add_argument("--cancelled", action="store_true", help="every item an operator cancelled")
    sp.add_argument(
        "--all", action="store_true", help="both: every deferred and every cancelled item"
    )
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
        formatter_class=HelpFormatter,
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
        "end the job); without it each item runs in a supervised child process",
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
        formatter_class=HelpFormatter,
    )
    rp.add_argument("-n", "--ranks", type=int, default=4, help="MPI ranks (1 master + workers)")
    rp.add_argument("--ulfm", action="store_true", help="add Open MPI's --with-ft ulfm")
    rp.add_argument("--print", action="store_true", help="print the command line; run nothing")
    rp.add_argument("program", nargs=argparse.REMAINDER, help="the program and its arguments")
    rp.set_defaults(func=cmd_run)
    from .launch import add_parser as add_launch  # issue 45: its body lives in launch.py

    add_launch(sub)
    return p


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
