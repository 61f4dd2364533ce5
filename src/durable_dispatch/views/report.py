"""``durable-dispatch report``: one self-contained HTML page about a campaign's life.

Read-only, safe beside a running master. The page has no script, no style sheet or font from the
network and no image file: charts are inline SVG, so it opens from a login node's file browser or
is mailed as one file. :func:`report_series` computes what is drawn (a test checks it against the
journal and against ``stats``); :func:`render_report` draws it.

Its numbers (committed, deferred, pending, in flight, failures by kind, master runs, rate, ETA)
are the campaign's one :class:`~durable_dispatch.views.view.CampaignView`, the numbers ``stats`` and
``watch`` show. Its charts come from the journals' history (:mod:`~durable_dispatch.views.history`):
progress, throughput, items in flight and parked ranks over time, and a timeline per rank. The
time axis runs over the master runs; the time between two runs, when no master ran, is drawn as
a grey band (narrowed when it is long) in which nothing is in flight.
"""

from __future__ import annotations

import datetime
import html
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .charts import _COLORS, _Axis, _line_chart, _throughput_chart, _timeline_chart
from .history import COMMITTED, History, read_history

__all__ = ["report_series", "render_report", "write_report"]

_SMOOTH = 4  # throughput: commits per second over this many buckets
_TABLE_MAX = 30


# ------------------------------------------------------------------------------- the series
def _cumulative(times: Iterable[float], deltas: Iterable[tuple[float, int]]) -> list[int]:
    """The running sum of ``deltas`` at each of ``times``."""
    out, total, i = [], 0, 0
    ds = sorted(deltas)
    for t in times:
        while i < len(ds) and ds[i][0] <= t + 1e-9:
            total += ds[i][1]
            i += 1
        out.append(total)
    return out


def report_series(directory: str | os.PathLike[str], *, now: float | None = None) -> dict[str, Any]:
    """What the report shows, JSON-ready.

    Keys: ``view`` (the campaign's :class:`~durable_dispatch.views.view.CampaignView` as a dict:
    every number of the page's summary), ``runs`` (``{"epoch", "start", "end", "open"}`` per master
    run), ``gaps`` (``[from, to]`` when no master ran), ``start``/``end``, ``times`` (bucket ends),
    ``committed`` (cumulative items committed at each), ``deferred`` (items deferred at each: the
    folded ones, whose time a compaction dropped, from the start), ``in_flight`` (items in flight; 0
    between runs), ``parked`` (ranks parked), ``throughput`` (items committed per second over the
    last 4 buckets of the run), ``timeline`` (rank -> ``[[from, to, outcome], ...]``), ``failures``
    (items that failed: ``{"work_id", "status", "failures", "kinds", "last_error"}``),
    ``deferred_items`` (the same for deferred items), ``slowest`` (the 10 longest attempts, in
    flight and failed ones included: ``{"work_id", "seconds", "rank", "host", "outcome"}``; ``host``
    None when not recorded).
    """
    from ..campaign.admin import view_state
    from .view import view_of_state

    t_now = time.time() if now is None else now
    sv = view_state(directory)
    view = view_of_state(sv, t_now)
    h = read_history(directory, now=t_now, running=view.master_running)
    out: dict[str, Any] = {"view": view.as_dict()}
    out.update(_failures(sv.projection, view.master_running))
    out.update(_over_time(h, view.deferred))
    out["slowest"] = _slowest(h)
    return out


def _status(led: Any, w: str, running: bool) -> str:
    if w in led.committed:
        return "committed"
    if w in led.deferred:
        return "deferred"
    if w in led.cancelled:
        return "cancelled"
    if w in led.in_flight:
        return "in flight" if running else "pending"
    if w in led.waiting:
        return "waiting"
    return "pending"


def _failures(led: Any, running: bool) -> dict[str, Any]:
    rows = []
    for w, ks in led.kinds.items():
        if ks:
            rows.append(
                {
                    "work_id": w,
                    "status": _status(led, w, running),
                    "failures": len(ks),
                    "kinds": list(ks),
                    "last_error": led.last_error.get(w) or None,
                }
            )
    rows.sort(key=lambda r: (-r["failures"], r["work_id"]))
    deferred = [
        {
            "work_id": w,
            "failures": len(led.kinds.get(w, ())),
            "kinds": list(led.kinds.get(w, ())),
            "last_error": led.last_error.get(w) or None,
        }
        for w in led.deferred
    ]
    return {"failures": rows, "deferred_items": deferred}


def _over_time(h: History, deferred_now: int) -> dict[str, Any]:
    empty: dict[str, Any] = {
        "runs": [],
        "gaps": [],
        "start": None,
        "end": None,
        "times": [],
        "committed": [],
        "deferred": [],
        "in_flight": [],
        "parked": [],
        "throughput": [],
        "timeline": {},
    }
    if not h.runs:
        return empty
    axis = _Axis([(r.start, r.end) for r in h.runs])
    buckets = axis.buckets()
    times = [b for _, b in buckets]
    flight: list[tuple[float, int]] = []
    for a in h.attempts:
        if a.start is None or (a.outcome == COMMITTED and a.end is not None and a.token is None):
            continue
        n = len(a.work_ids)
        flight.append((a.start, n))
        if a.end is not None:
            flight.append((a.end, -n))
    parked = [(t0, 1) for _r, t0, _t1 in h.parks] + [(t1, -1) for _r, _t0, t1 in h.parks]
    seen = sum(d for _, d in h.deferred_changes)
    folded = max(0, deferred_now - seen)  # deferrals a compaction folded: no time left
    deferred = [folded + v for v in _cumulative(times, h.deferred_changes)]
    committed = _cumulative(times, h.commits)
    starts = _cumulative([a for a, _ in buckets], h.commits)
    throughput = []  # over the last few buckets of the same run (one bucket is noisy)
    first = 0
    for i, (b0, b1) in enumerate(buckets):
        if i and b0 != buckets[i - 1][1]:
            first = i  # a new run
        j = max(first, i - _SMOOTH + 1)
        t0 = buckets[j][0]
        throughput.append(round((committed[i] - starts[j]) / max(b1 - t0, 1e-6), 3))
    return {
        "runs": [
            {"epoch": r.epoch, "start": r.start, "end": r.end, "open": r.open} for r in h.runs
        ],
        "gaps": [[a, b] for a, b in axis.gaps],
        "start": axis.start,
        "end": axis.end,
        "times": times,
        "committed": committed,
        "deferred": deferred,
        "in_flight": _cumulative(times, flight),
        "parked": _cumulative(times, parked),
        "throughput": throughput,
        "timeline": _timeline(h),
    }


def _timeline(h: History) -> dict[str, list[list[Any]]]:
    rows: dict[str, list[list[Any]]] = {}
    for a in h.attempts:
        if a.rank is None or a.start is None:
            continue
        end = a.end if a.end is not None else h.now
        rows.setdefault(str(a.rank), []).append([a.start, end, a.outcome])
    for rank, t0, t1 in h.parks:
        rows.setdefault(str(rank), []).append([t0, t1, "parked"])
    return {k: sorted(v) for k, v in sorted(rows.items(), key=lambda kv: int(kv[0]))}


def _slowest(h: History, n: int = 10) -> list[dict[str, Any]]:
    rows = []
    for a in h.attempts:
        s = a.seconds(h.now)
        if s is None:
            continue
        rows.append((s, a))
    rows.sort(key=lambda x: -x[0])
    out = []
    for s, a in rows[:n]:
        ids = a.work_ids
        out.append(
            {
                "work_id": ids[0] + (f" (+{len(ids) - 1})" if len(ids) > 1 else ""),
                "seconds": round(s, 3),
                "rank": a.rank,
                "host": a.host,
                "outcome": a.outcome,
            }
        )
    return out


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], total: int, empty: str) -> str:
    if not rows:
        return f"<p>{html.escape(empty)}</p>"
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in r) + "</tr>" for r in rows
    )
    more = f"<p>{total - len(rows)} more not shown.</p>" if total > len(rows) else ""
    return f"<table><tr>{th}</tr>{body}</table>{more}"


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    text = str(v)
    return text if len(text) <= 120 else text[:117] + "..."


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


def _summary(v: Mapping[str, Any], s: Mapping[str, Any]) -> str:
    from .watch import allocation_of, duration

    kinds = ", ".join(f"{k} {n}" for k, n in v["failures_by_kind"].items()) or "none"
    state = {
        "running": "running",
        "finished": "finished (every item committed or deferred)",
        "stopped": "stopped with work left (run the campaign again to resume)",
    }.get(v["state"], v["state"])
    rows = [
        ("state", state),
        (
            "progress",
            f"{v['committed']} of {v['work_items']} committed, {v['deferred']} deferred, "
            + (f"{v['cancelled']} cancelled, " if v.get("cancelled") else "")
            + f"{v['pending']} pending, {v['in_flight']} in flight"
            + (f", {v['waiting']} waiting for dependencies" if v.get("waiting") else ""),
        ),
        ("failures by kind", f"{kinds} ({v['failed_items']} items failed at least once)"),
        ("master runs", f"{v['epoch']} (epochs; {_gaps(len(s['gaps']))})"),
        ("from", f"{_when(s['start'])} to {_when(s['end'])}"),
    ]
    if v["state"] == "running":
        rate = v["rate_per_s"]
        rows.append(
            (
                "rate, ETA",
                f"{rate:,.1f} items/s, ETA {duration(v['eta_seconds'])}" + allocation_of(v)
                if rate is not None
                else "- (nothing committed in this run yet)",
            )
        )
        rows.append(
            ("ranks", f"{v['parked_ranks']} parked, {v['busy_ranks']} busy, {v['lost_ranks']} lost")
        )
    if v["interrupted"]:
        rows.append(
            ("interrupted", f"{v['interrupted']} of the pending were in flight when it stopped")
        )
    rows.append(("storage", v["storage"] or "-"))
    return (
        '<table class="summary">'
        + "".join(
            f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(x))}</td></tr>" for k, x in rows
        )
        + "</table>"
    )


def _gaps(n: int) -> str:
    if not n:
        return "no gap between runs"
    return f"{n} gap{'s' if n > 1 else ''} between runs, when no master ran, drawn grey"


def render_report(series: Mapping[str, Any], title: str, where: str = "") -> str:
    """The HTML page for ``series`` (:func:`report_series`); ``where`` names the state
    directory under the title."""
    v = series["view"]
    axis = _Axis([(r["start"], r["end"]) for r in series["runs"]])
    fails = series["failures"]
    failure_rows = [
        [r["work_id"], r["status"], r["failures"], r["kinds"], r["last_error"]]
        for r in fails[:_TABLE_MAX]
    ]
    deferred = series["deferred_items"]
    deferred_rows = [
        [r["work_id"], r["failures"], r["kinds"], r["last_error"]] for r in deferred[:_TABLE_MAX]
    ]
    slow_rows = [[r["work_id"], f"{r['seconds']:.3f}", r["rank"], r["host"] or "-", r["outcome"]]
                 for r in series["slowest"]]  # fmt: skip
    axis_note = (
        '<p class="legend">Time axis: elapsed time since the first run started '
        f"({html.escape(_when(series['start']))}); grey bands: no master running.</p>"
    )
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p><code>{html.escape(where)}</code></p>" if where else "",
        _summary(v, series),
        _line_chart(
            series,
            axis,
            ["committed", "deferred"],
            "Progress (work items)",
            "items",
            f'<span style="color:{_COLORS["committed"]}">&#9632;</span> committed '
            f'({v["committed"]}) &nbsp; <span style="color:{_COLORS["deferred"]}">&#9632;'
            f"</span> deferred ({v['deferred']})",
        ),
        axis_note,
        _throughput_chart(series, axis),
        _line_chart(
            series,
            axis,
            ["in_flight", "parked"],
            "In flight (work items) and parked ranks",
            "count",
            f'<span style="color:{_COLORS["in_flight"]}">&#9632;</span> items in flight '
            f'&nbsp; <span style="color:{_COLORS["parked"]}">&#9632;</span> ranks parked (from '
            "the timeout that parked a rank until its next dispatch)",
        ),
        _timeline_chart(series, axis),
        f"<h2>Failures ({len(fails)} items failed at least once; by kind: "
        + html.escape(", ".join(f"{k} {n}" for k, n in v["failures_by_kind"].items()) or "none")
        + ")</h2>",
        _table(
            ["work ID", "status", "failures", "failure kinds", "last error"],
            failure_rows,
            len(fails),
            "No failures.",
        ),
        f"<h2>Deferred items ({v['deferred']})</h2>",
        _table(
            ["work ID", "failures", "failure kinds", "last error"],
            deferred_rows,
            len(deferred),
            "None deferred.",
        ),
        "<h2>The slowest attempts (dispatch to end; in flight ones until now)</h2>",
        _table(
            ["work ID", "seconds", "rank", "host", "outcome"], slow_rows, len(slow_rows), "None."
        ),
    ]
    style = (
        "body{font-family:sans-serif;margin:24px;color:#222;max-width:820px}"
        "h2{font-size:15px;margin:22px 0 4px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ddd;padding:3px 8px;font-size:12px;text-align:left}"
        ".summary th{background:#f4f4f4}.legend{font-size:12px;margin:2px 0 0;color:#444}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{style}</style></head><body>"
        + "".join(body)
        + "</body></html>\n"
    )


def write_report(directory: str | os.PathLike[str], out: str | os.PathLike[str]) -> dict[str, Any]:
    """Write the report page of the state directory ``directory`` to ``out``; returns its
    series. Only ``out`` is written (through a temporary file and a rename).

    Raises:
        UsageError: ``out``'s directory does not exist or is not a directory.
        OSError: ``out`` cannot be written (the message names ``out``, not the temporary file).
    """
    from ..errors import UsageError

    d = os.fspath(directory)
    target = os.fspath(out)
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        what = "does not exist" if not os.path.exists(parent) else "is not a directory"
        raise UsageError(f"cannot write {target}: the directory {parent} {what}")
    series = report_series(d)
    page = render_report(series, "durable-dispatch campaign", os.path.abspath(d))
    from ..storage import fs

    tmp = target + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        fs.replace(tmp, target)  # every rename goes through the fs seam
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OSError(e.errno, f"cannot write {target}: {e.strerror or e}") from e
    return series
