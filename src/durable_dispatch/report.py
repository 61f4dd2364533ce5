"""``durable-dispatch report``: one self-contained HTML page about a campaign's life.

Read-only, safe beside a running master. The page has no script, no style sheet or font from the
network and no image file: charts are inline SVG, so it opens from a login node's file browser or
is mailed as one file. :func:`report_series` computes what is drawn (a test checks it against the
journal and against ``stats``); :func:`render_report` draws it.

Its numbers (committed, deferred, pending, in flight, failures by kind, master runs, rate, ETA)
are the campaign's one :class:`~durable_dispatch.view.CampaignView`, the numbers ``stats`` and
``watch`` show. Its charts come from the journals' history (:mod:`~durable_dispatch.history`):
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

from .history import COMMITTED, IN_FLIGHT, INTERRUPTED, History, read_history

__all__ = ["report_series", "render_report", "write_report"]

_BUCKETS = 60
_SMOOTH = 4  # throughput: commits per second over this many buckets
_W, _PAD_L, _PAD_R = 760, 48, 16
_PLOT = _W - _PAD_L - _PAD_R
_GAP_PX = 34.0  # a long pause between runs is drawn this wide
_ROWS_MAX = 32  # ranks drawn in the timeline
_TABLE_MAX = 30


# --------------------------------------------------------------------------------- the axis
class _Axis:
    """Time -> x over the runs: each run proportional to its length, the gaps between runs
    proportional too unless long (then :data:`_GAP_PX` wide)."""

    def __init__(self, runs: Sequence[tuple[float, float]]) -> None:
        runs = sorted(runs)
        merged: list[list[float]] = []
        for a, b in runs:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.runs = [(a, b) for a, b in merged]
        busy = sum(b - a for a, b in self.runs)
        gaps = [(self.runs[i][1], self.runs[i + 1][0]) for i in range(len(self.runs) - 1)]
        total = busy + sum(b - a for a, b in gaps)
        long_gap = max(total * 0.08, 1e-9)
        self.gaps = gaps
        self.long = [(a, b) for a, b in gaps if b - a > long_gap]
        short = sum(b - a for a, b in gaps if b - a <= long_gap)
        width = _PLOT - _GAP_PX * len(self.long)
        self.scale = width / max(busy + short, 1e-6)
        self.pieces: list[tuple[float, float, float, float]] = []  # t0, t1, x0, x1
        x = float(_PAD_L)
        for i, (a, b) in enumerate(self.runs):
            w = (b - a) * self.scale
            self.pieces.append((a, b, x, x + w))
            x += w
            if i < len(gaps):
                g0, g1 = gaps[i]
                gw = _GAP_PX if (g0, g1) in self.long else (g1 - g0) * self.scale
                self.pieces.append((g0, g1, x, x + gw))
                x += gw
        self.start = self.runs[0][0] if self.runs else 0.0
        self.end = self.runs[-1][1] if self.runs else 0.0

    def x(self, t: float) -> float:
        for t0, t1, x0, x1 in self.pieces:
            if t <= t1:
                if t <= t0 or t1 <= t0:
                    return x0
                return x0 + (x1 - x0) * (t - t0) / (t1 - t0)
        return self.pieces[-1][3] if self.pieces else float(_PAD_L)

    def buckets(self, n: int = _BUCKETS) -> list[tuple[float, float]]:
        """About ``n`` time buckets ``(from, to)`` over the runs only (none in the gaps)."""
        busy = sum(b - a for a, b in self.runs) or 1e-6
        out: list[tuple[float, float]] = []
        for a, b in self.runs:
            k = max(1, round(n * (b - a) / busy))
            out.extend((a + (b - a) * i / k, a + (b - a) * (i + 1) / k) for i in range(k))
        return out

    def ticks(self) -> list[tuple[float, str]]:
        """Labelled ticks (elapsed time since the first run started) inside the runs."""
        busy = sum(b - a for a, b in self.runs)
        span = (self.end - self.start) if len(self.long) == 0 else busy
        step = _nice_step(max(span, 1e-3) / 16)
        out: list[tuple[float, str]] = []
        for a, b in self.runs:
            k = int((a - self.start) // step) + (1 if (a - self.start) % step > 1e-9 else 0)
            while self.start + k * step <= b + 1e-9:
                t = self.start + k * step
                if not out or self.x(t) - self.x(out[-1][0]) > 44:
                    out.append((t, _elapsed(k * step, step)))
                k += 1
        return out


def _nice_step(raw: float) -> float:
    for s in (
        0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
        21600, 43200, 86400, 172800, 604800,
    ):  # fmt: skip
        if s >= raw:
            return float(s)
    return 604800.0 * max(1, round(raw / 604800))


def _elapsed(seconds: float, step: float) -> str:
    """A tick's label: ``"0 s"``, ``"1.5 s"``, ``"2 min"``, ``"1 h 30 min"``, ``"2 d"``."""
    if step < 1:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    if step < 60:
        return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    if step < 3600:
        m = s // 60
        return f"{m} min" if m < 60 else f"{m // 60} h {m % 60} min" if m % 60 else f"{m // 60} h"
    if step < 86400:
        h = s // 3600
        return f"{h} h" if h < 24 else f"{h // 24} d {h % 24} h" if h % 24 else f"{h // 24} d"
    return f"{s // 86400} d"


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

    Keys: ``view`` (the campaign's :class:`~durable_dispatch.view.CampaignView` as a dict: every
    number of the page's summary), ``runs`` (``{"epoch", "start", "end", "open"}`` per master
    run), ``gaps`` (``[from, to]`` when no master ran), ``start``/``end``, ``times`` (bucket
    ends), ``committed`` (cumulative items committed at each), ``deferred`` (items deferred at
    each: the folded ones, whose time a compaction dropped, from the start), ``in_flight``
    (items in flight; 0 between runs), ``parked`` (ranks parked), ``throughput`` (items
    committed per second over the last 4 buckets of the run), ``timeline`` (rank ->
    ``[[from, to, outcome], ...]``), ``failures`` (items that failed: ``{"work_id", "status",
    "failures", "kinds", "last_error"}``), ``deferred_items`` (the same for deferred items),
    ``slowest`` (the 10 longest attempts, in flight and failed ones included: ``{"work_id",
    "seconds", "rank", "host", "outcome"}``; ``host`` None when not recorded).
    """
    from .admin import view_state
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


# ----------------------------------------------------------------------------------- drawing
_COLORS = {
    "committed": "#2a7ab0",
    "deferred": "#7d3c98",
    "in_flight": "#e08a1e",
    "parked": "#27ae60",
    "throughput": "#2a7ab0",
}
_OUTCOME_COLORS = {
    COMMITTED: "#2a7ab0",
    IN_FLIGHT: "#e08a1e",
    INTERRUPTED: "#999999",
    "parked": "#27ae60",
}
_FAILED = "#c0392b"


def _frame(axis: _Axis, h: int, top: float, unit: str) -> list[str]:
    """The chart's box, the no-master bands, the x ticks with labels and the y scale."""
    base = h - 24
    parts = [
        f'<svg width="{_W}" height="{h}" viewBox="0 0 {_W} {h}" role="img" '
        'font-family="sans-serif">',
        f'<rect x="{_PAD_L}" y="6" width="{_PLOT}" height="{base - 6}" fill="#fbfbfb" '
        'stroke="#ddd"/>',
    ]
    for a, b in axis.gaps:
        x0, x1 = axis.x(a), axis.x(b)
        parts.append(
            f'<rect x="{x0:.1f}" y="6" width="{max(x1 - x0, 1):.1f}" height="{base - 6}" '
            'fill="#e4e4e4"/>'
        )
        if x1 - x0 >= 20:
            label = "no master " + _short(b - a)
            parts.append(
                f'<text x="{(x0 + x1) / 2:.1f}" y="{(6 + base) / 2:.1f}" font-size="9" '
                f'fill="#555" text-anchor="middle" transform="rotate(-90 {(x0 + x1) / 2:.1f} '
                f'{(6 + base) / 2:.1f})">{html.escape(label)}</text>'
            )
    for t, label in axis.ticks():
        x = axis.x(t)
        parts.append(f'<line x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 4}" stroke="#666"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{base + 15}" font-size="10" fill="#444" '
            f'text-anchor="middle">{html.escape(label)}</text>'
        )
    if top > 0:
        for frac in (0.0, 0.5, 1.0):
            v = top * frac
            y = base - (base - 10) * frac
            shown = f"{v:,.0f}" if top >= 10 or v == int(v) else f"{v:,.1f}"
            parts.append(
                f'<text x="{_PAD_L - 4}" y="{y + 3:.1f}" font-size="10" fill="#444" '
                f'text-anchor="end">{shown}</text>'
            )
            parts.append(
                f'<line x1="{_PAD_L}" y1="{y:.1f}" x2="{_W - _PAD_R}" y2="{y:.1f}" stroke="#eee"/>'
            )
    if unit:
        parts.append(
            f'<text x="{_PAD_L + 4}" y="17" font-size="9" fill="#666">{html.escape(unit)}</text>'
        )
    if len(axis.runs) > 1:
        for r0, _r1 in axis.runs:
            parts.append(
                f'<line x1="{axis.x(r0):.1f}" y1="6" x2="{axis.x(r0):.1f}" y2="{base}" '
                'stroke="#888" stroke-dasharray="3 3"/>'
            )
    return parts


def _short(seconds: float) -> str:
    from .watch import duration

    return duration(seconds)


def _line_chart(
    s: Mapping[str, Any], axis: _Axis, keys: list[str], title: str, unit: str, legend: str
) -> str:
    times = s["times"]
    if not times:
        return f"<h2>{html.escape(title)}</h2><p>No events with a time yet.</p>"
    h = 170
    base = h - 24
    top = float(max([1] + [max(s[k]) for k in keys if s[k]]))
    parts = _frame(axis, h, top, unit)

    def y(v: float) -> float:
        return base - (base - 10) * v / top

    for k in keys:
        for run in s["runs"]:  # one line per run: nothing is drawn across a gap
            pts = [(run["start"], None)] + [
                (t, v)
                for t, v in zip(times, s[k], strict=True)
                if run["start"] - 1e-9 <= t <= run["end"] + 1e-9
            ]
            first = _value_before(times, s[k], run["start"])
            pts[0] = (run["start"], first)
            line = " ".join(f"{axis.x(t):.1f},{y(v):.1f}" for t, v in pts if v is not None)
            parts.append(
                f'<polyline fill="none" stroke="{_COLORS[k]}" stroke-width="2" points="{line}"/>'
            )
    parts.append("</svg>")
    return f"<h2>{html.escape(title)}</h2>" + "".join(parts) + f'<p class="legend">{legend}</p>'


def _value_before(times: list[float], values: list[int], t: float) -> int:
    """The series' value just before ``t`` (0 before the first bucket)."""
    v = 0
    for tt, vv in zip(times, values, strict=True):
        if tt >= t - 1e-9:
            break
        v = vv
    return v


def _throughput_chart(s: Mapping[str, Any], axis: _Axis) -> str:
    title = "Throughput (work items committed per second)"
    if not s["times"]:
        return f"<h2>{title}</h2><p>No events with a time yet.</p>"
    h = 150
    base = h - 24
    top = max([0.0] + list(s["throughput"])) or 1.0
    parts = _frame(axis, h, top, "items/s")
    prev = None
    for run in s["runs"]:
        prev = run["start"]
        for t, v in zip(s["times"], s["throughput"], strict=True):
            if not (run["start"] - 1e-9 <= t <= run["end"] + 1e-9):
                continue
            x0, x1 = axis.x(prev), axis.x(t)
            hh = (base - 10) * v / top
            parts.append(
                f'<rect x="{x0:.1f}" y="{base - hh:.1f}" width="{max(x1 - x0 - 0.5, 0.5):.1f}" '
                f'height="{hh:.1f}" fill="{_COLORS["throughput"]}"/>'
            )
            prev = t
    parts.append("</svg>")
    return f"<h2>{title}</h2>" + "".join(parts)


def _timeline_chart(s: Mapping[str, Any], axis: _Axis) -> str:
    title = "Per-rank timeline (which rank ran what, when; where it was parked)"
    rows = s["timeline"]
    if not rows:
        return f"<h2>{title}</h2><p>No dispatches in the journal (a compaction folds them).</p>"
    ranks = list(rows)[:_ROWS_MAX]
    row_h = 14 if len(ranks) <= 16 else 9
    h = 6 + row_h * len(ranks) + 30
    parts = _frame(axis, h, 0.0, "")
    for i, rank in enumerate(ranks):
        y = 8 + row_h * i
        parts.append(
            f'<text x="{_PAD_L - 4}" y="{y + row_h - 3}" font-size="{min(10, row_h)}" '
            f'fill="#444" text-anchor="end">rank {html.escape(rank)}</text>'
        )
        # one mark per pixel column at most: failures over parked over busy (bounded output)
        cols: dict[int, tuple[int, str]] = {}
        rank_of = {"parked": 1, INTERRUPTED: 2, COMMITTED: 3, IN_FLIGHT: 4}
        for t0, t1, outcome in rows[rank]:
            p = rank_of.get(outcome, 5)
            for c in range(int(axis.x(t0)), int(axis.x(t1)) + 1):
                if cols.get(c, (0, ""))[0] < p:
                    cols[c] = (p, outcome)
        run: list[Any] = []
        for c in [*sorted(cols), -1]:
            if run and (c < 0 or c != run[1] + 1 or cols[c][1] != run[2]):
                color = _OUTCOME_COLORS.get(run[2], _FAILED)
                inset = 3 if run[2] == "parked" else 1
                parts.append(
                    f'<rect x="{run[0]}" y="{y + inset}" width="{run[1] - run[0] + 1}" '
                    f'height="{row_h - 2 * inset}" fill="{color}"/>'
                )
                run = []
            if c < 0:
                break
            if not run:
                run = [c, c, cols[c][1]]
            else:
                run[1] = c
    parts.append("</svg>")
    more = len(rows) - len(ranks)
    note = f" {more} more ranks are not drawn." if more > 0 else ""
    key = "".join(
        f'<span style="color:{c}">&#9632;</span> {html.escape(k)} &nbsp;'
        for k, c in (
            ("committed", _OUTCOME_COLORS[COMMITTED]),
            ("failed (timeout, crash, error ...)", _FAILED),
            ("in flight", _OUTCOME_COLORS[IN_FLIGHT]),
            ("interrupted (its master ended)", _OUTCOME_COLORS[INTERRUPTED]),
            ("parked (thin bar)", _OUTCOME_COLORS["parked"]),
        )
    )
    return f"<h2>{title}</h2>" + "".join(parts) + f'<p class="legend">{key}{note}</p>'


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
    from .errors import UsageError

    d = os.fspath(directory)
    target = os.fspath(out)
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        what = "does not exist" if not os.path.exists(parent) else "is not a directory"
        raise UsageError(f"cannot write {target}: the directory {parent} {what}")
    series = report_series(d)
    page = render_report(series, "durable-dispatch campaign", os.path.abspath(d))
    from .storage import fs

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
