"""What ``durable-dispatch stats`` and ``watch`` show, as values and lines of text, all read from
one :class:`~durable_dispatch.views.view.CampaignView` (one view, one name per number):
:func:`stats_of` (``stats --json``),
:func:`stats_text` (``stats``, and ``stats --verbose``), :func:`watch_frame` (``watch --json``)
and :func:`watch_text` (``watch``). Pure: the command line reads the view and prints these."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..storage import fs as _fs
from .view import FINISHED, RUNNING, CampaignView

__all__ = [
    "stats_of",
    "stats_text",
    "watch_frame",
    "watch_text",
    "duration",
    "allocation_text",
    "allocation_of",
]


def duration(seconds: float | None) -> str:
    """``"42s"``, ``"5m 12s"``, ``"3h 05m"``, ``"2d 04h"`` (``"-"`` for None)."""
    if seconds is None:
        return "-"
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _kinds(view: CampaignView) -> str:
    if not view.failures_by_kind:
        return "none"
    text = ", ".join(f"{k} {n}" for k, n in view.failures_by_kind.items())
    items = "item" if view.failed_items == 1 else "items"
    return f"{text} failed attempts ({view.failed_items} {items} failed at least once)"


def _master(view: CampaignView) -> str:
    """Who the master is (or was), and how long it has run."""
    who = (
        f"{view.master_host}, pid {view.master_pid}" if view.master_host is not None else "unknown"
    )
    if view.master_running:
        beat = view.heartbeat_age_seconds
        return f"{who}, up {duration(view.master_age_seconds)}" + (
            f", statistics {beat:.0f}s old" if beat is not None else ", no statistics yet"
        )
    if view.master_host is None:
        return "none has run" if view.epoch == 0 else "no statistics published"
    how = {"killed": "ended without closing (killed?)", "closed": "closed"}.get(
        view.master_ended or "", "ended"
    )
    ago = duration(view.heartbeat_age_seconds)
    return f"{who} {how} {ago} ago after {duration(view.master_age_seconds)}"


def _state_line(view: CampaignView) -> str:
    if view.state == RUNNING:
        return "running"
    if view.state == FINISHED:
        return "finished (every item committed or deferred; no master running)"
    return "stopped, work left (no master running; run the campaign again to resume)"


def _progress(view: CampaignView) -> str:
    total = view.work_items
    pct = f" ({100.0 * view.committed / total:.1f}%)" if total else ""
    so_far = " submitted so far" if view.open_ended else ""
    line = (
        f"{view.committed} of {total}{so_far} committed{pct}, {view.deferred} deferred, "
        + (f"{view.cancelled} cancelled, " if view.cancelled else "")
        + f"{view.pending} pending, {view.in_flight} in flight"
    )
    if view.waiting:
        line += f", {view.waiting} waiting for dependencies"
    if view.interrupted:
        line += f" ({view.interrupted} of the pending were in flight when the master stopped)"
    return line


def _rate(view: CampaignView) -> str:
    if view.rate_per_s is None:
        if not view.master_running:
            return "- (no master running)"
        return "- (nothing committed yet)" + _allocation(view)
    if view.open_ended:  # (a futures script submits as it goes: the end is not known)
        return (
            f"{view.rate_per_s:,.1f} items/s over this run, no ETA (the script may submit more)"
            + _allocation(view)
        )
    eta = "done" if not view.left else duration(view.eta_seconds)
    return f"{view.rate_per_s:,.1f} items/s over this run, ETA {eta}" + _allocation(view)


def allocation_text(ends_at: float | None, left: float | None, needed: int | None) -> str:
    """``"; the allocation ends in 4m 10s (03:45:00)"``, and when the ETA is past it ``", the
    ETA is past it: needs about 2 more allocations"`` ("" when no end is known); the view's
    ``allocation_ends_at``, ``allocation_left_seconds`` and ``allocations_needed``."""
    if ends_at is None:
        return ""
    at = time.strftime("%H:%M:%S", time.localtime(ends_at))
    text = f"; the allocation ends in {duration(left)} ({at})"
    if needed:
        text += f", the ETA is past it: needs about {needed} more allocation"
        text += "s" if needed > 1 else ""
    return text


def allocation_of(view: Mapping[str, Any]) -> str:
    """:func:`allocation_text` of a view as a dict (``CampaignView.as_dict()``)."""
    keys = ("allocation_ends_at", "allocation_left_seconds", "allocations_needed")
    return allocation_text(*(view.get(k) for k in keys))


def _allocation(view: CampaignView) -> str:
    return allocation_text(
        view.allocation_ends_at, view.allocation_left_seconds, view.allocations_needed
    )


def _ranks(view: CampaignView) -> str:
    if not view.master_running:
        return "- (no master running)"
    return (
        f"{view.parked_ranks if view.parked_ranks is not None else '-'} parked, "
        f"{view.busy_ranks if view.busy_ranks is not None else '-'} busy, "
        f"{view.lost_ranks if view.lost_ranks is not None else '-'} lost"
    )


def stats_text(view: CampaignView, master_stats: Mapping[str, Any], verbose: bool) -> list[str]:
    """The lines of ``durable-dispatch stats``: a summary an operator reads at a glance; with
    ``verbose`` also every field of the view and the master's counters of its (last) run."""
    storage = view.storage or "- (no statistics published)"
    if view.commits_in_memory:
        storage += f", {view.commits_in_memory} commits in memory only"
    if view.storage_stalls:
        storage += (
            f", {view.storage_stalls} fsync(s) slower than the {_fs.STALL_SECONDS:g}s stall bound,"
            f" the slowest {view.longest_stall_seconds:.1f}s"
        )
    rows = [
        ("campaign", f"{view.directory} (epoch {view.epoch})"),
        ("state", _state_line(view)),
        ("progress", _progress(view)),
        ("rate", _rate(view)),
        ("failures", _kinds(view)),
        ("ranks", _ranks(view)),
        ("storage", storage),
        ("master", _master(view)),
    ]
    if view.duplicate_commits:
        rows.append(("duplicates", f"{view.duplicate_commits} second commits ignored"))
    lines = [f"{k:<10} {v}" for k, v in rows]
    if not verbose:
        return lines
    lines.append("")
    lines.append("view (as `stats --json` names them)")
    for k, v in stats_of(view, {}).items():
        if k != "master_statistics":
            lines.append(f"  {k:<28} {_value(v)}")
    lines.append("")
    lines.append("the master's counters of its newest run (`stats --json`: master_statistics)")
    for k, v in _flat(master_stats):
        lines.append(f"  {k:<40} {_value(v)}")
    return lines


def _flat(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        if isinstance(v, Mapping) and v and k not in ("stale", "unowned", "malformed", "duplicate"):
            out.extend(_flat(v, f"{prefix}{k}."))
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={_value(x)}" for k, x in v.items()) if v else "(none)"
    return str(v)


def stats_of(view: CampaignView, master_stats: Mapping[str, Any]) -> dict[str, Any]:
    """What ``durable-dispatch stats --json`` prints: every field of the view, and
    ``master_statistics``, the counters the newest master published (its run only)."""
    return {**view.as_dict(), "master_statistics": dict(master_stats)}


def watch_frame(view: CampaignView) -> dict[str, Any]:
    """One frame of ``watch --json``: every field of the view (the names ``stats --json`` uses)."""
    return view.as_dict()


def watch_text(view: CampaignView) -> list[str]:
    """One frame of ``watch`` for a terminal."""
    head = f"durable-dispatch watch {view.directory}   epoch {view.epoch}, {view.state}"
    if view.master_running and view.heartbeat_age_seconds is not None:
        head += f", statistics {view.heartbeat_age_seconds:.1f}s old"
    end = "   FINISHED" if view.finished else "" if view.master_running else "   STOPPED"
    return [
        head,
        f"progress  {_progress(view)}",
        f"rate      {_rate(view)}",
        f"failures  {_kinds(view)}",
        f"ranks     {_ranks(view)}",
        f"storage   {view.storage or '-'}{end}",
    ]
