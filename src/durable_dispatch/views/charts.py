"""The report's charts, drawn as inline SVG (no script, no file): the time axis over the master
runs (a long pause between two runs drawn as a narrow grey band), line charts, the throughput and
the timeline per rank. :mod:`~durable_dispatch.views.report` computes what is drawn and calls
these."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from .history import COMMITTED, IN_FLIGHT, INTERRUPTED

_BUCKETS = 60
_W, _PAD_L, _PAD_R = 760, 48, 16
_PLOT = _W - _PAD_L - _PAD_R
_GAP_PX = 34.0  # a long pause between runs is drawn this wide
_ROWS_MAX = 32  # ranks drawn in the timeline


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
