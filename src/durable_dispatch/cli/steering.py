"""The commands that steer a campaign through its state directory: ``cancel``, ``retry``,
``drain`` and ``submit``. Each is the command line's half of an operator's command (applied
exactly once, journaled before it is acknowledged): :func:`send` writes it into the state
directory (:func:`durable_dispatch.campaign.control.write_command`), then sees it applied by the
running master, or, with none running, by opening the state directory here (its open applies
every command waiting, as the next master's start would). See
:mod:`durable_dispatch.campaign.control` for the master's half and the file formats.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..campaign.control import Command, read_ack, write_command
from ..campaign.state import CampaignState
from ..campaign.statedir import _master_running
from ..errors import LockHeldError, NoMasterError, UsageError
from ._common import (
    EXIT_FINDING,
    EXIT_OK,
    _error,
    _need_state_dir,
    _print,
)

__all__ = ["WAIT_SECONDS", "Sent", "send"]


#: How long the command line waits for the master's acknowledgement by default (seconds).
WAIT_SECONDS = 30.0


@dataclass(frozen=True)
class Sent:
    """What :func:`send` found.

    Attributes:
        command: the command written.
        outcome: its outcome (the acknowledgement's body), or None when none came.
        how: ``"master"`` (the running master applied it), ``"opened"`` (no master was
            running: this process opened the state directory and applied it, as the next
            master would have), ``"queued"`` (not waited for) or ``"timeout"`` (no
            acknowledgement within the time given: it stays queued, and is applied once).
    """

    command: Command
    outcome: dict[str, Any] | None
    how: str


def send(
    state_dir: str,
    op: str,
    args: Mapping[str, Any],
    *,
    wait: bool = True,
    timeout: float = WAIT_SECONDS,
    poll: float = 0.05,
) -> Sent:
    """Write a command and see it applied: by the running master (waiting up to ``timeout``
    seconds for its acknowledgement, unless not ``wait``), or, with no master running, by
    opening the state directory here (its open applies every command waiting).

    Raises:
        NoMasterError: ``drain`` with no master running (nothing is written).
        LockHeldError, StorageError ...: opening the state directory failed (the command
            stays queued for the next master).
    """

    def apply_here() -> Sent | None:
        """No master: open the state directory (its open applies the command); None when a
        master started meanwhile (it applies it)."""
        try:
            with CampaignState.open(state_dir):
                pass
        except LockHeldError:
            return None
        return Sent(cmd, read_ack(state_dir, cmd.id), "opened")

    running = _master_running(state_dir)
    if op == "drain" and not running:
        raise NoMasterError(
            f"no master is running on {state_dir}: nothing to drain", path=state_dir
        )
    cmd = write_command(state_dir, op, args)
    if not running and (here := apply_here()) is not None:
        return here
    if not wait:
        return Sent(cmd, None, "queued")
    end = time.monotonic() + timeout
    check = time.monotonic() + 1.0
    while True:
        got = read_ack(state_dir, cmd.id)
        if got is not None:
            return Sent(cmd, got, "master")
        if time.monotonic() >= check:  # the master ended before it looked: apply it here
            check = time.monotonic() + 1.0
            if op != "drain" and not _master_running(state_dir):
                got = read_ack(state_dir, cmd.id)  # (it may have, just before it ended)
                if got is not None:
                    return Sent(cmd, got, "master")
                if (here := apply_here()) is not None:
                    return here
        if time.monotonic() >= end:
            return Sent(cmd, None, "timeout")
        time.sleep(poll)


def _steer(args: argparse.Namespace, op: str, cmd_args: dict[str, Any]) -> int:
    """Send an operator command (:func:`send`) and print what was done: exit 0 when
    it was applied as asked, 1 when something was left alone (an unknown work ID, a payload
    that conflicts, no master to drain) or no acknowledgement came in time."""
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
