"""``durable-dispatch joblog``: one row per work item, as GNU parallel's ``--joblog`` keeps one
per job. Read-only, safe beside a running master: status, tries and failures come from the
campaign's one view of its state (kept by compaction); start, duration, rank and host from the
journals' history (:mod:`~durable_dispatch.views.history`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..campaign.admin import view_state
from ..campaign.statedir import (
    RESULT_RECORD_BYTES,
    STATE_JOURNAL,
    SUBMISSION_RECORD_BYTES,
    SUBMISSIONS,
)
from ..storage.defer import DEFAULT_DEFER_NAME
from ..storage.journal import read_journal
from ..values import dumps_exact, restore
from .history import read_history

__all__ = ["JobRow", "read_joblog"]


@dataclass(frozen=True)
class JobRow:
    """One work item as ``durable-dispatch joblog`` shows it (GNU parallel's ``--joblog``).

    Attributes:
        work_id: the item's stable work ID.
        status: ``committed``, ``deferred``, ``cancelled``, ``pending``, ``waiting`` (for a
            dependency, ``WorkItem.after``) or ``in flight`` (only while a master runs: what a
            stopped master left in flight is pending).
        tries: its tries that counted: the failures charged to it, plus the try that committed
            or is running (a rollback at a master's restart, a batch split or a deferral for a
            dependency is not a try).
        last_failure_kind: the kind of its last failure (``timeout``, ``error`` ...), or None.
        last_failure: the text of its last failure, or None.
        started: when its newest dispatch was sent (wall-clock seconds), or None when no record
            of it is left (a state written before this version, or compacted by one).
        seconds: how long its newest dispatch ran (until now while in flight), or None.
        rank: the rank that ran its newest dispatch, or None.
        host: the host of that rank (what its worker named in that run's first READY), or
            None when not recorded (a state written before this version, or a worker of one).
        call: what it runs, as text: a futures call's ``function(arguments)`` (a preview stored
            at submit; never unpickled), else its payload as JSON, cut at 100 characters.
        signal: when its last failure was a crash, the signal that ended the process
            (``SIGSEGV``, ``SIGKILL`` ...), else None.
        traceback: the traceback of its last failure when its function raised (the last
            lines, as the worker kept them), or None: from the defer journal, else from the
            state journal's records not yet compacted.
        cpu_seconds: the CPU seconds (user + system) its newest attempt took, or None when not
            measured (a worker of an earlier version, or no record of the attempt left).
        max_rss: the peak resident memory of its newest attempt in bytes, or None.
        cost_measured: how those two were measured: ``child`` (in the isolated child, around
            the item), ``child-ended`` (the child died or was killed in the item: ``wait4``'s
            figures), ``in-process`` (in the worker's own process, ``isolate=False``: other
            threads count too, and the peak is the worker's high-water mark so far), or None
            (see :mod:`durable_dispatch.mpi.usage`).
    """

    work_id: str
    status: str
    tries: int
    last_failure_kind: str | None
    last_failure: str | None
    started: float | None
    seconds: float | None
    rank: int | None
    host: str | None
    call: str | None
    signal: str | None = None
    traceback: str | None = None
    cpu_seconds: float | None = None
    max_rss: int | None = None
    cost_measured: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, in the order above."""
        return dict(vars(self))


def _call_text(payload: Any) -> str | None:
    if isinstance(payload, dict) and isinstance(payload.get("fn"), str) and "tag" in payload:
        args = payload.get("args")
        return f"{payload['fn']}({args if isinstance(args, str) else '...'})"
    try:
        text = dumps_exact(restore(payload))  # (NaN as NaN: never null)
    except (TypeError, ValueError):
        return None
    return text if len(text) <= 100 else text[:97] + "..."


def _payloads(d: str) -> dict[str, Any]:
    """Work ID -> payload of every item in the submissions store (committed ones included)."""
    out: dict[str, Any] = {}
    path = os.path.join(d, SUBMISSIONS)
    if os.path.exists(path):
        for rec in read_journal(path, max_record_bytes=SUBMISSION_RECORD_BYTES):
            for it in rec.payload.get("items") or ():  # [work_id, payload] or an item's JSON
                if type(it) is list and len(it) in (2, 3) and isinstance(it[0], str):
                    out[it[0]] = it[1]
                elif isinstance(it, dict) and isinstance(it.get("work_id"), str):
                    out[it["work_id"]] = it.get("payload")
    return out


def _tracebacks(d: str, costs: dict[str, Any] | None = None) -> dict[str, str | None]:
    """Work ID -> the traceback of its last failure (None when that failure had none): the
    defer journal's live deferrals (which compaction keeps), then the state journal's
    ``requeued`` and ``deferred`` records, newer, where compaction has not folded them.
    ``costs`` receives, by work ID, what a live deferral's last attempt cost."""
    out: dict[str, str | None] = {}

    def note(p: Any) -> None:
        tb = p.get("traceback")
        out[p["work_id"]] = tb if isinstance(tb, str) else None
        if costs is not None and isinstance(p.get("cost"), dict):
            costs[p["work_id"]] = p["cost"]

    path = os.path.join(d, DEFAULT_DEFER_NAME)
    if os.path.exists(path):
        for rec in read_journal(path):
            p = rec.payload
            if isinstance(p, dict) and isinstance(p.get("work_id"), str):
                if p.get("event") == "deferred":
                    note(p)
                elif p.get("event") == "resolved":
                    out.pop(p["work_id"], None)
    path = os.path.join(d, STATE_JOURNAL)
    if os.path.exists(path):
        for rec in read_journal(path, max_record_bytes=RESULT_RECORD_BYTES):
            p = rec.payload
            if not isinstance(p, dict) or not isinstance(p.get("work_id"), str):
                continue
            event = p.get("event")
            if event == "deferred" or (
                event == "requeued" and not p.get("split") and p.get("source") != "master-restart"
            ):
                note(p)
            elif event == "requeued_deferred":
                out.pop(p["work_id"], None)
    return out


def _ledger_payload(led: Any, wid: str) -> Any:
    """The payload the ledger holds (items not committed, of states older than the store)."""
    try:
        return led.items[wid].payload
    except KeyError:
        return None


def read_joblog(state_dir: str | os.PathLike[str], *, now: float | None = None) -> Iterator[JobRow]:
    """One :class:`JobRow` per work item, in submission order; read-only, safe beside a
    running master. Status, tries and failures come from the campaign's one view of its state
    (kept by compaction); start, duration, rank and host from the journals' history.

    Raises:
        UsageError: not a state directory.
        JournalCorruptError, SnapshotCorruptError: damage found.
    """
    d = os.fspath(state_dir)
    t = time.time() if now is None else now
    sv = view_state(d)
    led, running = sv.projection, sv.master_running
    h = read_history(d, now=t, running=running)
    stored = _payloads(d)
    deferred_costs: dict[str, Any] = {}
    tracebacks = _tracebacks(d, deferred_costs)
    for wid in led.ids.ids:
        if wid is None:
            continue
        if wid in led.committed:
            status = "committed"
        elif wid in led.deferred:
            status = "deferred"
        elif wid in led.cancelled:  # O1: an operator's cancel (final)
            status = "cancelled"
        elif wid in led.in_flight and running:
            status = "in flight"
        elif wid in led.waiting:
            status = "waiting"
        else:
            status = "pending"
        kinds = led.kinds.get(wid) or []
        # (a deferral for a dependency is no try: the item never ran)
        tries = len(kinds) - kinds.count("dependency")
        tries += 1 if status in ("committed", "in flight") else 0
        att = h.last.get(wid)
        payload = stored[wid] if wid in stored else _ledger_payload(led, wid)
        cost = att.costs.get(wid) if att is not None and att.costs else None
        if cost is None and status == "deferred":  # (its attempt compacted: the defer record)
            cost = deferred_costs.get(wid)
        cost = cost or {}
        yield JobRow(
            wid,
            status,
            tries,
            kinds[-1] if kinds else None,
            (led.last_error.get(wid) or None) if kinds else None,
            att.start if att is not None else None,
            round(s, 3) if att is not None and (s := att.seconds(t)) is not None else None,
            att.rank if att is not None else None,
            att.host if att is not None else None,
            _call_text(payload),
            _signal(kinds[-1] if kinds else None, led.last_error.get(wid)),
            tracebacks.get(wid) if kinds else None,
            _num(cost.get("cpu")),
            rss if type(rss := cost.get("rss")) is int else None,
            by if isinstance(by := cost.get("by"), str) else None,
        )


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) else None


_SIGNAL = re.compile(r"\b(SIG[A-Z]{2,}[0-9]*)\b")


def _signal(kind: str | None, error: str | None) -> str | None:
    """The signal a crash's text names (the worker says "killed by SIGSEGV"), or None."""
    if kind != "crash" or not error:
        return None
    found = _SIGNAL.findall(error)
    return found[-1] if found else None
