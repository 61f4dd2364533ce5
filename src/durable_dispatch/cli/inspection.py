"""The commands that read a campaign: ``verify``, ``inspect``, ``stats``, ``report``, ``watch``,
``results`` and ``joblog``. Read-only: they take no lock and create nothing."""

from __future__ import annotations

import argparse
import sys
import time

import orjson

from ..errors import UsageError
from ..views.examine import examine
from ..views.watch import stats_of, stats_text, watch_frame, watch_text
from ._common import (
    EXIT_FINDING,
    EXIT_OK,
    _file_meter,
    _need_state_dir,
    _print,
)


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


def cmd_stats(args: argparse.Namespace) -> int:
    """The campaign at a glance (state, progress, rate and ETA, failures, ranks, storage,
    master); every number with ``--verbose`` and ``--json`` (the one view every face reads)."""
    from ..campaign.admin import view_state
    from ..campaign.identity import recorded_name
    from ..views.view import view_of_state

    _need_state_dir(args.state_dir)
    v = view_state(args.state_dir)
    view = view_of_state(v)
    master_stats = dict(v.live.get("stats") or {})
    name = recorded_name(args.state_dir)  # U16 (None: recorded by no run yet)
    if args.json:
        _print({"campaign": name, **stats_of(view, master_stats)}, True)
    else:
        lines = stats_text(view, master_stats, args.verbose)
        lines.insert(1, f"{'name':<11}{name or '(none recorded yet)'}")  # after the path
        sys.stdout.write("\n".join(lines))
        sys.stdout.write("\n")
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
    """Every committed result, in commit order, kept for the campaign's life; read-only, safe
    beside a running master.
    A sealed pickle of the futures executor is shown opaque (``results.shown``)."""
    from ..campaign.results import read_results, shown
    from ..values import dumps_exact

    _need_state_dir(args.state_dir)
    both = args.with_payload
    if args.csv or args.parquet:
        from ..views.export import export_results

        for fmt, path in (("csv", args.csv), ("parquet", args.parquet)):
            if path:
                n = export_results(args.state_dir, path, format=fmt, with_payload=both)
                print(f"wrote {n} row(s) to {path}", file=sys.stderr)
        return EXIT_OK
    rows = read_results(args.state_dir, args.work_ids or None, with_payload=both)
    if args.jsonl:  # (NaN and the infinities as Python's json writes them: never null)
        out = sys.stdout
        for r in rows:
            out.write(dumps_exact({**r.as_dict(both), "result": shown(r.result)}) + "\n")
        return EXIT_OK
    if args.json:
        listed = [{**r.as_dict(both), "result": shown(r.result)} for r in rows]
        sys.stdout.write(dumps_exact(listed, indent=True) + "\n")
        return EXIT_OK
    n = 0
    for r in rows:
        value = dumps_exact(shown(r.result))
        if both:
            value = f"{dumps_exact(r.payload)} -> {value}"
        if len(value) > 100:
            value = value[:97] + "..."
        print(f"{r.work_id:<30} {value}")
        n += 1
    if not n:
        print("(none)")
    return EXIT_OK


def cmd_output(args: argparse.Namespace) -> int:
    """What an item wrote (with isolation): its standard output, then its standard error, each
    under a label; exit 1 when none is kept (the error says why), 2 for an unknown ID."""
    import base64

    from ..views.output import read_output

    _need_state_dir(args.state_dir)
    out = read_output(args.state_dir, args.work_id)
    if args.json:
        _print(
            {
                "work_id": out.work_id,
                "token": out.token,
                "ts": out.ts,
                "stdout": out.stdout.decode("utf-8", "replace"),
                "stderr": out.stderr.decode("utf-8", "replace"),
                "stdout_b64": base64.b64encode(out.stdout).decode("ascii"),
                "stderr_b64": base64.b64encode(out.stderr).decode("ascii"),
                "stdout_dropped": out.stdout_dropped,
                "stderr_dropped": out.stderr_dropped,
            },
            True,
        )
        return EXIT_OK
    raw = getattr(sys.stdout, "buffer", None)  # (the bytes as written, where there are any)

    def write(b: bytes) -> None:
        if raw is not None:
            raw.write(b)
        else:
            sys.stdout.write(b.decode("utf-8", "replace"))

    sys.stdout.flush()
    for name, data, dropped in (
        ("stdout", out.stdout, out.stdout_dropped),
        ("stderr", out.stderr, out.stderr_dropped),
    ):
        cut = f"; {dropped} earlier bytes not kept" if dropped else ""
        write(f"--- {name} of {out.work_id} ({len(data)} bytes{cut}) ---\n".encode())
        write(data)
        if data and not data.endswith(b"\n"):
            write(b"\n")
    if raw is not None:
        raw.flush()
    return EXIT_OK


def cmd_joblog(args: argparse.Namespace) -> int:
    """One line per work item: status, tries, last failure, start, duration, rank, host and
    what it runs (GNU parallel's --joblog); read-only, safe beside a running master."""
    import datetime

    from ..views.joblog import read_joblog

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
        f"{'host':<16} {'signal':<7} {'cpu s':>8} {'peak MiB':>8}"
    )
    print(f"{head}  last failure / call")  # (long work IDs shortened here; --json has them)
    n = 0
    in_process = False
    for r in rows:
        mark = "*" if r.cost_measured == "in-process" else ""
        in_process = in_process or bool(mark)
        cpu = f"{r.cpu_seconds:.2f}{mark}" if r.cpu_seconds is not None else "-"
        peak = f"{r.max_rss / (1 << 20):.1f}{mark}" if r.max_rss is not None else "-"
        secs = f"{r.seconds:.2f}" if r.seconds is not None else "-"
        fail = f"{r.last_failure_kind}: {r.last_failure}" if r.last_failure_kind else ""
        tail = fail or (r.call or "")
        tail = tail if len(tail) <= 70 else tail[:67] + "..."
        rank = "-" if r.rank is None else str(r.rank)
        host = "-" if r.host is None else r.host if len(r.host) <= 16 else r.host[:15] + "~"
        wid = r.work_id if len(r.work_id) <= 24 else r.work_id[:11] + "~" + r.work_id[-12:]
        print(
            f"{wid:<24} {r.status:<9} {r.tries:>5} {when(r.started):>8} {secs:>8} "
            f"{rank:>4} {host:<16} {r.signal or '-':<7} {cpu:>8} {peak:>8}  {tail}"
        )
        n += 1
    if not n:
        print("(none)")
    if in_process:
        print(
            "* measured in the worker's own process (isolate=False): other threads of the "
            "worker count too, and the peak is the worker's high-water mark so far"
        )
    return EXIT_OK
