"""The command line's half of an operator's command (each applied exactly once, journaled
before it is acknowledged): write it into the state
directory (:func:`durable_dispatch.campaign.control.write_command`), then see it applied by the
running master, or, with none running, by opening the state directory here (its open applies every
command waiting, as the next master's start would). See :mod:`durable_dispatch.campaign.control` for
the master's half and the file formats.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..campaign.control import Command, read_ack, write_command
from ..campaign.state import CampaignState
from ..campaign.statedir import _master_running
from ..errors import LockHeldError, NoMasterError

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
