"""What ``durable-dispatch stats`` and ``watch`` show of a state directory, as values: the
live statistics and their age (:func:`stats_of`), and one frame of ``watch`` with its rate and
ETA (:func:`watch_frame`). Read-only; the command line prints what these return."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["stats_of", "watch_frame"]


def _age(ts: Any) -> float | None:
    return round(max(0.0, time.time() - ts), 1) if isinstance(ts, (int, float)) else None


def stats_of(v: Any) -> dict[str, Any]:
    """What ``durable-dispatch stats`` prints of the view ``v``
    (:func:`~durable_dispatch.admin.view_state`): the durable counts, the master's live
    statistics with their age and whether it runs, and the figures of the last snapshot."""
    live = v.live
    return {
        "state": v.summary(),
        "live": {
            "age_seconds": _age(live.get("ts")),
            "running": bool(live.get("running")) and v.master_running,
            "host": live.get("host"),
            "pid": live.get("pid"),
            "stats": live.get("stats", {}),
        },
        "master_stats_age_seconds": _age(v.snapshot_ts),
        "master_stats": v.stats,
    }


def watch_frame(v: Any, previous: tuple[float, int] | None = None) -> dict[str, Any]:
    """One frame of ``watch``: the durable counts, the master's live figures and their age,
    rate and ETA (from the previous frame's ``(time, committed)``, else since the master
    started), failures by kind, and whether the campaign has ended."""
    summary = v.summary()
    live = v.live
    core = dict(live.get("stats", {}).get("core", {}))
    now = time.time()
    committed, pending, in_flight = summary["committed"], summary["pending"], summary["in_flight"]
    rate = None
    if previous is not None and now > previous[0]:
        rate = (committed - previous[1]) / (now - previous[0])
    elif isinstance(live.get("started"), (int, float)) and live.get("ts", 0) > live["started"]:
        rate = core.get("commits", 0) / (live["ts"] - live["started"])
    kinds: dict[str, int] = {}
    for ks in v.projection.kinds.values():
        for k in ks:
            kinds[k] = kinds.get(k, 0) + 1
    left = pending + in_flight
    running = v.master_running
    return {
        "committed": committed,
        "pending": pending,
        "in_flight": in_flight,
        "deferred": summary["deferred"],
        "rate_per_s": round(rate, 2) if rate is not None else None,
        "eta_seconds": round(left / rate) if rate and left else None,
        "parked_ranks": core.get("parked_ranks_now"),
        "lost_ranks": core.get("ranks_lost"),
        "timeouts": core.get("dispatch_watchdog_timeouts"),
        "deadline_seconds": core.get("watchdog_deadline_now"),
        "failures_by_kind": dict(sorted(kinds.items())),
        "storage": (live.get("stats", {}).get("journal_health") or {}).get("state"),
        "master_running": running,
        "heartbeat_age_seconds": _age(live.get("ts")),
        "epoch": summary["epoch"],
        "ended": not running,
        "finished": not running and left == 0,
    }
