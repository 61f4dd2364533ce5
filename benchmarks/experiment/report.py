"""The tables and SVG figures of the results, and ``docs/experiments.md`` between its markers."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .plan import ADAPTIVE_LABEL, Cell
from .stats import Estimate, mean_ci, spread

# ------------------------------------------------------------------ tables and figures
_MEASURES = (
    ("recovery", "recovery", 2),
    ("false_suspicions", "false suspicions", 1),
    ("duplicate_cpu", "duplicate CPU (s)", 2),
    ("hung_cpu", "hung CPU (s)", 1),
    ("good_deferred", "good items deferred", 1),
    ("parked", "parked at end", 1),
)


def summarize_group1(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One line per cell: every measure as an :class:`Estimate` over its seeds; time to target
    over the seeds that reached it (``reached`` says how many)."""
    cells: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        c = r["cell"]
        key = (c["sigma"], c["hang"], c["multiple"], c.get("adaptive", False))
        cells.setdefault(key, []).append(r)
    out = []
    for (sg, h, mult, adapt), rs in cells.items():
        line: dict[str, Any] = {
            "sigma": sg, "hang": h, "multiple": mult, "adaptive": adapt, "runs": len(rs),
        }  # fmt: skip
        for key, _label, _d in _MEASURES:
            vals = [r[key] for r in rs if r[key] is not None]
            line[key] = mean_ci(vals) if vals else None
        reached = [r["time_to_target"] for r in rs if r["time_to_target"] is not None]
        line["reached"] = len(reached)
        line["time_to_target"] = mean_ci(reached) if reached else None
        out.append(line)
    return out


def _fmt(e: Estimate | None, digits: int) -> str:
    return "n/a" if e is None else e.text(digits)


def table_group1(lines: Sequence[Mapping[str, Any]], budget: float) -> str:
    head = ["σ", "hang", "watchdog", "time to target (s)"] + [m[1] for m in _MEASURES]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ln in lines:
        wd = Cell(ln["sigma"], ln["hang"], ln["multiple"], ln["adaptive"]).label
        ttt = _fmt(ln["time_to_target"], 1)
        if ln["reached"] < ln["runs"]:
            ttt = f"> {budget:g} in {ln['runs'] - ln['reached']}/{ln['runs']}" + (
                f"; {ttt} in the rest" if ln["reached"] else ""
            )
        cells = [f"{ln['sigma']:g}", f"{ln['hang']:g}", wd, ttt]
        cells += [_fmt(ln[k], d) for k, _label, d in _MEASURES]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table_group2(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    ul = [r for r in rows if r["ulfm"]]
    if ul:
        lat = [x for r in ul for x in r["latencies"]]
        sp = spread(lat) if lat else None
        kills = sum(r["killed"] for r in ul)
        lines += [
            "| under ULFM | value |",
            "|---|---|",
            f"| campaigns (seeds) | {len(ul)} |",
            f"| ranks killed (SIGKILL) | {kills} |",
            f"| kills the master saw | {sum(r['detected'] for r in ul)} |",
        ]
        if sp is not None:
            lines.append(
                "| kill-to-rollback latency, median / p95 / max (ms) | "
                f"{sp['median'] * 1e3:.1f} / {sp['p95'] * 1e3:.1f} / {sp['max'] * 1e3:.1f} |"
            )
        lines += [
            f"| finished on the survivors | {sum(r['finished'] for r in ul)}/{len(ul)} |",
            f"| time to finish (s) | {mean_ci(r['seconds'] for r in ul).text(2)} |",
            f"| work lost | {sum(r['lost'] for r in ul)} |",
            f"| duplicate commits | {sum(r['duplicate_commits'] for r in ul)} |",
        ]
    no = [r for r in rows if not r["ulfm"]]
    if no:
        ends = [r["kill_to_job_end"] for r in no if r["kill_to_job_end"] is not None]
        lines += [
            "",
            "| without ULFM (one kill, then the same command again) | value |",
            "|---|---|",
            f"| campaigns (seeds) | {len(no)} |",
            f"| the kill ended the job | {sum(r['job_ended'] for r in no)}/{len(no)} |",
        ]
        if ends:
            lines.append(f"| kill to the job's end (s) | {mean_ci(ends).text(2)} |")
        lines += [
            "| restart's time to finish (s) | "
            f"{mean_ci(r['restart_seconds'] for r in no).text(2)} |",
            f"| the restart finished | {sum(r['finished'] for r in no)}/{len(no)} |",
            f"| work lost (both runs) | {sum(r['lost'] for r in no)} |",
            f"| duplicate commits (both runs) | {sum(r['duplicate_commits'] for r in no)} |",
        ]
    return "\n".join(lines)


_PALETTE = ("#1b6ca8", "#d1495b", "#2e933c", "#8c5e99", "#e08e0b")


def figure(
    lines: Sequence[Mapping[str, Any]], sigma: float, key: str, ylabel: str, budget: float
) -> str:
    """An SVG: ``key`` against the watchdog multiple (log scale), one line per hang rate, with
    95% intervals; the adaptive rule and "off" sit at the right, unconnected. Censored time to
    target (some seeds did not finish) is drawn at the budget with an open marker."""
    w, h, pad = 560, 320, 52
    sel = [ln for ln in lines if ln["sigma"] == sigma]
    mults = sorted({ln["multiple"] for ln in sel if ln["multiple"] is not None})
    if not mults:
        return ""
    xs = [math.log2(m) for m in mults]
    x_adapt, x_off = xs[-1] + 1.0, xs[-1] + 2.0
    lo, hi = xs[0] - 0.3, x_off + 0.3

    def where(ln: Mapping[str, Any]) -> float:
        if ln.get("adaptive"):
            return x_adapt
        return x_off if ln["multiple"] is None else math.log2(ln["multiple"])

    def value(ln: Mapping[str, Any]) -> tuple[float, float, bool]:
        e: Estimate | None = ln[key]
        if key == "time_to_target" and ln["reached"] < ln["runs"]:
            return budget, 0.0, True
        return (e.mean, e.half or 0.0, False) if e is not None else (0.0, 0.0, False)

    top = max([value(ln)[0] + value(ln)[1] for ln in sel] + [1e-9]) * 1.1

    def px(x: float) -> float:
        return pad + (w - 1.5 * pad) * (x - lo) / (hi - lo)

    def py(v: float) -> float:
        return h - pad + (2 * pad - h) * v / top + 0.0

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad / 2}" y2="{h - pad}" stroke="#444"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#444"/>',
        f'<text x="{w / 2}" y="{h - 24}" text-anchor="middle">watchdog, multiple of the median '
        "task time (log scale)</text>",
        f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">'
        f"{ylabel}</text>",
        f'<text x="{w / 2}" y="18" text-anchor="middle" font-weight="bold">{ylabel}, '
        f"σ = {sigma:g}</text>",
    ]
    if key == "time_to_target":
        parts.append(
            f'<text x="{w / 2}" y="{h - 8}" text-anchor="middle" fill="#666" font-size="10">'
            f"open marker: some seeds did not finish within the {budget:g} s budget (drawn at "
            "the budget)</text>"
        )
    labels = [f"{m:g}x" for m in mults] + [ADAPTIVE_LABEL, "off"]
    for lab, x in zip(labels, [*xs, x_adapt, x_off], strict=True):
        parts.append(f'<text x="{px(x):.1f}" y="{h - pad + 16}" text-anchor="middle">{lab}</text>')
    for frac in (0.0, 0.5, 1.0):
        v = top / 1.1 * frac
        parts.append(
            f'<text x="{pad - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>'
            f'<line x1="{pad}" y1="{py(v):.1f}" x2="{w - pad / 2}" y2="{py(v):.1f}" '
            'stroke="#eee"/>'
        )
    hangs = sorted({ln["hang"] for ln in sel})
    legend = []
    for i, hr in enumerate(hangs):
        color = _PALETTE[i % len(_PALETTE)]
        shift = 0.09 * (i - (len(hangs) - 1) / 2)  # side by side, so equal values stay visible
        pts = []
        for ln in sel:
            if ln["hang"] != hr:
                continue
            x = where(ln) + shift
            v, half, censored = value(ln)
            pts.append((x, v, half, censored))
        pts.sort()
        line = " ".join(f"{px(x):.1f},{py(v):.1f}" for x, v, _h, _c in pts if x < x_adapt - 0.5)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"/>')
        for x, v, half, censored in pts:
            if half:
                parts.append(
                    f'<line x1="{px(x):.1f}" y1="{py(v - half):.1f}" x2="{px(x):.1f}" '
                    f'y2="{py(v + half):.1f}" stroke="{color}"/>'
                )
            fill = "white" if censored else color
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(v):.1f}" r="4" fill="{fill}" '
                f'stroke="{color}" stroke-width="2"/>'
            )
        legend.append(
            f'<tspan dx="{14 if i else 0}" fill="{color}">&#9679; hang rate {hr:g}</tspan>'
        )
    parts.append(f'<text x="{w / 2}" y="36" text-anchor="middle">{"".join(legend)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


BEGIN, END = "<!-- results: begin (benchmarks/experiments.py --docs) -->", "<!-- results: end -->"


def write_docs(raw: Mapping[str, Any], docs: str) -> list[str]:
    """Write the figures into ``docs`` and the tables into ``docs/experiments.md`` between the
    :data:`BEGIN` and :data:`END` markers (the text around them, the method and the reading,
    is kept; a new file gets only the markers); the paths written."""
    s = raw["setup"]
    lines = summarize_group1(raw["group1"])
    os.makedirs(docs, exist_ok=True)
    written = []
    figs = []
    for sg in sorted({ln["sigma"] for ln in lines}):
        for key, label in (
            ("time_to_target", "time to target (s)"),
            ("duplicate_cpu", "duplicate CPU (s)"),
        ):
            svg = figure(lines, sg, key, label, s["budget"])
            if svg:
                name = f"experiments-{key.replace('_', '-')}-sigma{sg:g}.svg"
                Path(docs, name).write_text(svg)
                written.append(os.path.join(docs, name))
                figs.append(f"![{label}, σ = {sg:g}]({name})")
    body = [
        BEGIN,
        "## Group 1: the watchdog on and off",
        "",
        f"{s['items']} items on {s['workers']} isolated workers, median task time "
        f"{s['median']:g} s, {s['slow_rate']:.0%} of items {s['slow_factor']:g}x slower, "
        f"{s['retries']} retries, a budget of {s['budget']:g} s per campaign; "
        f"{len({r['seed'] for r in raw['group1']})} seed(s) per cell.",
        "",
        table_group1(lines, s["budget"]),
        "",
        *figs,
        "",
        "## Group 2: real rank kills",
        "",
        f"{s['items']} items (σ = 0.5) on {s['kill_workers']} workers; "
        f"{s['kills']} workers SIGKILLed per ULFM campaign at seeded moments.",
        "",
        table_group2(raw["group2"]),
        END,
    ]
    path = os.path.join(docs, "experiments.md")
    old = Path(path).read_text() if os.path.exists(path) else f"# Experiments\n\n{BEGIN}\n{END}\n"
    if BEGIN not in old or END not in old:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers to write between")
    head, rest = old.split(BEGIN, 1)
    Path(path).write_text(head + "\n".join(body) + rest.split(END, 1)[1])
    written.append(path)
    return written
