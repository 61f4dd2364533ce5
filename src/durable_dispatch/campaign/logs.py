"""Structured log records for the core's decisions (the core itself never logs: it has no I/O).

:func:`log_decisions` turns each decision into one ``logging`` record on the
``durable_dispatch.dispatch`` logger. The message reads ``key=value`` pairs
(``requeue work_id=w-3 token=e1-7 source=watchdog-timeout kind=timeout attempts=1``) and the same
pairs are attached as record attributes (``record.source``, ``record.work_id`` ...), so both a
human reading the log and a JSON log handler see ``source=invalid-result`` or
``source=watchdog-timeout``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..core.decisions import (
    Commit,
    Commits,
    Decision,
    Defer,
    Park,
    PersistSnapshot,
    Quarantine,
    Release,
    Requeue,
    Send,
)

__all__ = ["decision_fields", "log_decisions", "LOGGER_NAME"]

LOGGER_NAME = "durable_dispatch.dispatch"


def decision_fields(d: Decision) -> tuple[str, int, dict[str, Any]]:
    """``(event, level, fields)`` describing one decision."""
    if isinstance(d, Requeue):
        return (
            "requeue",
            logging.WARNING,
            {
                "work_id": d.work_id,
                "token": str(d.token),
                "source": d.source,
                "kind": d.kind,
                "attempts": d.attempts,
                "split": d.split,
            },
        )
    if isinstance(d, Defer):
        return (
            "defer",
            logging.WARNING,
            {
                "work_id": d.work.work_id,
                "token": str(d.token),
                "source": d.source,
                "attempts": d.attempts,
                "kinds": ",".join(d.kinds),
                "last_error": d.last_error,
            },
        )
    if isinstance(d, Park):
        return "park", logging.WARNING, {"rank": d.rank, "token": str(d.token), "source": d.source}
    if isinstance(d, Release):
        return "release", logging.INFO, {"rank": d.rank, "token": str(d.token)}
    if isinstance(d, Quarantine):
        return (
            "quarantine",
            logging.INFO,
            {
                "rank": d.rank,
                "tag": d.message,
                "classification": d.classification.value,
                "reason": d.reason,
            },
        )
    if isinstance(d, Commit):
        return (
            "commit",
            logging.DEBUG,
            {"rank": d.rank, "token": str(d.token), "work_id": d.work_id},
        )
    if isinstance(d, Commits):
        return (
            "commit",
            logging.DEBUG,
            {"rank": d.rank, "token": str(d.token), "work_id": ",".join(d.work_ids)},
        )
    if isinstance(d, Send):
        return (
            "send",
            logging.DEBUG,
            {
                "rank": d.rank,
                "token": str(d.token),
                "work_id": ",".join(w.work_id for w in d.items),
            },
        )
    if isinstance(d, PersistSnapshot):
        return "persist-snapshot", logging.DEBUG, {"reason": d.reason}
    return type(d).__name__.lower(), logging.DEBUG, {}


_LOG = logging.getLogger(LOGGER_NAME)

#: The level each kind of decision is logged at (as :func:`decision_fields` gives it), so that a
#: decision whose level is off costs one lookup, not the building of its fields.
_LEVELS: dict[type, int] = {
    Requeue: logging.WARNING,
    Defer: logging.WARNING,
    Park: logging.WARNING,
    Release: logging.INFO,
    Quarantine: logging.INFO,
}


def log_decisions(
    decisions: Iterable[Decision], logger: logging.Logger | None = None, *, quiet: bool = False
) -> None:
    """Emit one structured record per decision. ``quiet``: the caller knows each decision is
    of a kind logged at DEBUG (the Commits of a RESULT), so with DEBUG off nothing is looked
    at (a dispatch of 64 items is not walked for nothing)."""
    lg = logger or _LOG
    debug = lg.isEnabledFor(logging.DEBUG)  # asked once: most decisions are logged at DEBUG
    if quiet and not debug:
        return
    for d in decisions:
        level = _LEVELS.get(type(d))
        if level is None:
            if not debug:
                continue
        elif not lg.isEnabledFor(level):
            continue
        event, level, fields = decision_fields(d)
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        lg.log(level, "%s %s", event, text, extra={"event": event, **fields})
