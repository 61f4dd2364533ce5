"""The commands that maintain a state directory while no master runs: ``compact`` and
``deferred`` (list, show, requeue, drop)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..errors import UsageError
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
