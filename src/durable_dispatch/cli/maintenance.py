"""The commands that maintain a state directory while no master runs: ``compact`` and
``deferred`` (list, show, requeue, drop)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..errors import UsageError
from ..values import dumps_exact, restore
from ._common import (
    EXIT_FINDING,
    EXIT_OK,
    _error,
    _IOFailure,
    _Meter,
    _need_state_dir,
    _print,
)
from .steering import _steer


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
                    "item": _as_given(p.get("item")),
                    "seq": rec.seq,
                    "traceback": p.get("traceback"),
                }
            elif p.get("event") == "resolved":
                live.pop(p["work_id"], None)
    if live:  # as stats counts them: a record whose item the state journal brought back (a
        led = view_state(args.state_dir).projection  # dependency's commit released it, and
        live = {w: r for w, r in live.items() if w in led.deferred}  # the master ended before
        # it resolved the record) is not deferred
    if args.action == "list":
        rows = [
            {k: v for k, v in r.items() if k not in ("item", "traceback")} for r in live.values()
        ]
        if args.json or getattr(args, "long", False):
            _print(rows, args.json)
        else:
            for line in deferred_lines(rows):
                print(line)
        return EXIT_OK
    if len(args.ids) != 1:
        raise UsageError("deferred show takes exactly one work ID")
    item = live.get(args.ids[0])
    if item is None:  # a finding about the state, not a wrong call
        return _error(args, LookupError(f"{args.ids[0]!r} is not deferred"), EXIT_FINDING)
    if args.json:  # (NaN and the infinities as Python's json writes them: never null)
        sys.stdout.write(dumps_exact(item, indent=True) + "\n")
        return EXIT_OK
    tb = item.pop("traceback", None)
    _print(item, False)
    if tb:  # the last failure's, when the work function raised: as Python printed it
        print("traceback (its last failure)")
        for line in tb.splitlines():
            print(f"    {line}")
    return EXIT_OK


def _as_given(item: Any) -> Any:
    """A deferred record's item with its payload as the user gave it (the journal keeps NaN
    and the infinities in a stored form)."""
    if isinstance(item, dict) and "payload" in item:
        return {**item, "payload": restore(item["payload"])}
    return item


def deferred_lines(rows: list[dict[str, Any]], width: int = 100) -> list[str]:
    """``deferred list`` for people: one line per item (its work ID, attempts, the kinds of its
    failures and the first line of its last error, shortened); ``--long`` shows every field."""
    if not rows:
        return ["(none)"]

    def short(text: str, n: int) -> str:
        return text if len(text) <= n else text[: n - 3] + "..."

    wid = min(max(len("work ID"), *(len(r["work_id"]) for r in rows)), 32)
    kinds = [",".join(r.get("kinds") or ()) for r in rows]
    kw = min(max(len("failures"), *(len(k) for k in kinds)), 24)
    out = [f"{'work ID':<{wid}}  {'tries':>5}  {'failures':<{kw}}  last error"]
    for r, k in zip(rows, kinds, strict=True):
        err = str(r.get("last_error") or "").strip().splitlines()
        last = err[-1] if err else "-"  # (a traceback's last line names the error)
        head = (
            f"{short(r['work_id'], wid):<{wid}}  {r.get('attempts') or 0:>5}  "
            f"{short(k, kw):<{kw}}  "
        )
        out.append(head + short(last, max(20, width - len(head))))
    return out
