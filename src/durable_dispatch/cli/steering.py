"""The commands that steer a campaign through its state directory: ``cancel``, ``retry``,
``drain`` and ``submit`` (the file half is :mod:`~durable_dispatch.cli.steer`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import UsageError
from ._common import (
    EXIT_FINDING,
    EXIT_OK,
    _error,
    _need_state_dir,
    _print,
)


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
    """Cancel work items, through the state directory: pending ones are removed, in-flight
    ones stopped; they end cancelled, never retried."""
    return _steer(args, "cancel", {"work_ids": args.ids})


def cmd_retry(args: argparse.Namespace) -> int:
    """Put deferred or cancelled work items back to pending with fresh retry budgets."""
    sets = [s for s in ("deferred", "cancelled") if args.all or getattr(args, s)]
    if bool(sets) == bool(args.ids):
        raise UsageError("retry needs work IDs or --deferred, --cancelled or --all (not both)")
    if not sets:
        return _steer(args, "retry", {"work_ids": args.ids})
    return _steer(args, "retry", {"work_ids": [], "all": args.all, "sets": sets})


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
