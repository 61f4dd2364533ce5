"""``durable-dispatch report``: one self-contained HTML page about a campaign's life.

Read-only, safe beside a running master. The page has no script, no style sheet or font from the
network and no image file: charts are inline SVG, so it opens from a login node's file browser or
is mailed as one file. :func:`report_series` computes what is plotted (a test checks it against
the journal); :func:`render_report` draws it.

What it reads: the state journal ``events.jsonl`` and the results journal ``results.jsonl``
(compaction moves committed records there, with their time). Events carry their wall-clock time
(``ts``) since this version; an event without one (an older journal) takes the time of the
nearest earlier event that has one. After a compaction only the commits remain of the folded
part of the journal (dispatches, requeues and deferrals are folded into the snapshot), so the
in-flight line and the per-rank figures cover the journal since the last compaction. Parked ranks
are not durable facts (the journal has no record of them): each timeout parks its rank, so the
timeouts line shows when ranks were parked.
"""

from __future__ import annotations

import html
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["report_series", "render_report", "write_report"]

_BUCKETS = 60


def _records(d: str) -> list[tuple[int, dict[str, Any], str]]:
    """``(seq, payload, source)`` of every state-journal record and of every moved result the
    state journal no longer holds, in sequence order."""
    from .results import RESULTS_JOURNAL
    from .statedir import STATE_JOURNAL
    from .storage.journal import read_journal

    out: dict[int, tuple[int, dict[str, Any], str]] = {}
    rpath = os.path.join(d, RESULTS_JOURNAL)
    if os.path.exists(rpath):
        for r in read_journal(rpath):
            p = r.payload
            if isinstance(p, dict) and isinstance(p.get("seq"), int):
                out[p["seq"]] = (p["seq"], {**p, "event": "committed"}, "results")
    jpath = os.path.join(d, STATE_JOURNAL)
    if os.path.exists(jpath):
        for r in read_journal(jpath):
            if isinstance(r.payload, dict):
                out[r.seq] = (r.seq, r.payload, "state")
    return [out[k] for k in sorted(out)]


def _ids(p: Mapping[str, Any]) -> list[str]:
    ids = p.get("work_ids")
    return list(ids) if isinstance(ids, list) else [p["work_id"]] if "work_id" in p else []


def report_series(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """What the report plots, computed from the journals (JSON-ready).

    Keys: ``start``/``end`` (wall-clock seconds), ``times`` (bucket ends), ``committed``
    (cumulative work items committed at each bucket end), ``in_flight`` (items in flight),
    ``parked`` (ranks parked, until their next dispatch),
    ``timeouts`` and ``deferred`` (cumulative), ``epochs`` (``[epoch, ts]``), ``failures_by_kind``
    (failures charged or not, by kind, from requeues and deferrals), ``ranks`` (rank ->
    ``{"dispatches", "busy_seconds", "utilisation"}``), ``slowest`` (the 10 slowest items:
    ``[work_id, seconds, rank]``, dispatch to commit), ``totals``.
    """
    d = os.fspath(directory)
    events: list[tuple[float, dict[str, Any]]] = []
    last_ts: float | None = None
    pending_no_ts: list[dict[str, Any]] = []
    for _seq, p, _src in _records(d):
        ts = p.get("ts")
        if isinstance(ts, (int, float)):
            last_ts = float(ts)
            for q in pending_no_ts:  # records before the first timed one take its time
                events.append((last_ts, q))
            pending_no_ts.clear()
            events.append((last_ts, p))
        elif last_ts is None:
            pending_no_ts.append(p)
        else:
            events.append((last_ts, p))
    if not events:
        return {
            "start": None,
            "end": None,
            "times": [],
            "committed": [],
            "in_flight": [],
            "parked": [],
            "timeouts": [],
            "deferred": [],
            "epochs": [],
            "failures_by_kind": {},
            "ranks": {},
            "slowest": [],
            "totals": {"committed": 0, "timeouts": 0, "deferred": 0, "epochs": 0},
        }
    start, end = events[0][0], max(t for t, _ in events)
    span = max(end - start, 1e-6)
    times = [start + span * (i + 1) / _BUCKETS for i in range(_BUCKETS)]
    committed_at: list[tuple[float, int]] = []
    flight: list[tuple[float, int]] = []
    timeouts: list[float] = []
    deferred: list[float] = []
    epochs: list[list[Any]] = []
    kinds: Counter[str] = Counter()
    sent: dict[str, tuple[float, int]] = {}  # work ID -> (dispatch time, rank) of its last one
    busy: dict[int, float] = {}
    dispatches: Counter[int] = Counter()
    done: set[str] = set()
    slow: list[tuple[float, str, int]] = []
    token_of: dict[str, tuple[float, int, int]] = {}  # token -> (time, rank, items open)
    parked_now: set[int] = set()
    parked: list[tuple[float, int]] = []
    for ts, p in events:
        kind = p.get("event")
        if kind == "epoch":
            epochs.append([p.get("epoch"), ts])
            parked.extend((ts, -1) for _ in parked_now)  # a new master starts every rank idle
            parked_now.clear()
        elif kind == "dispatched":
            ids = _ids(p)
            rank = int(p.get("rank", -1))
            dispatches[rank] += 1
            if rank in parked_now:  # released by its exact READY some time before this
                parked_now.discard(rank)
                parked.append((ts, -1))
            for w in ids:
                sent[w] = (ts, rank)
            flight.append((ts, len(ids)))
            token_of[str(p.get("token"))] = (ts, rank, len(ids))
        elif kind == "committed":
            ids = [w for w in _ids(p) if w not in done]
            done.update(ids)
            committed_at.append((ts, len(ids)))
            flight.append((ts, -sum(1 for w in ids if w in sent)))  # dispatched in view
            for w in ids:
                if w in sent:
                    t0, rank = sent.pop(w)
                    slow.append((ts - t0, w, rank))
            _close_token(token_of, busy, str(p.get("token")), ts, len(ids))
        elif kind in ("requeued", "deferred"):
            w = str(p.get("work_id"))
            if p.get("source") == "watchdog-timeout":
                timeouts.append(ts)
            if p.get("source") in ("watchdog-timeout", "send-failure") and w in sent:
                rank = sent[w][1]  # the rolled-back dispatch parked its rank
                if rank not in parked_now:
                    parked_now.add(rank)
                    parked.append((ts, 1))
            if kind == "deferred":
                deferred.append(ts)
                ks = p.get("kinds") or []
                kinds[str(ks[-1]) if ks else "unknown"] += 1
            elif p.get("source") != "master-restart":
                kinds[str(p.get("kind") or "unknown")] += 1
            if w in sent:
                sent.pop(w)
                flight.append((ts, -1))
                _close_token(token_of, busy, str(p.get("token")), ts, 1)
    ranks = {
        str(r): {
            "dispatches": n,
            "busy_seconds": round(busy.get(r, 0.0), 3),
            "utilisation": round(min(1.0, busy.get(r, 0.0) / span), 3),
        }
        for r, n in sorted(dispatches.items())
    }
    slow.sort(reverse=True)
    return {
        "start": start,
        "end": end,
        "times": times,
        "committed": _cumulative(times, committed_at),
        "in_flight": _cumulative(times, flight),
        "timeouts": _cumulative(times, [(t, 1) for t in timeouts]),
        "parked": _cumulative(times, parked),
        "deferred": _cumulative(times, [(t, 1) for t in deferred]),
        "epochs": epochs,
        "failures_by_kind": dict(sorted(kinds.items())),
        "ranks": ranks,
        "slowest": [[w, round(s, 3), r] for s, w, r in slow[:10]],
        "totals": {
            "committed": len(done),
            "timeouts": len(timeouts),
            "deferred": len(deferred),
            "epochs": len(epochs),
        },
    }


def _close_token(
    token_of: dict[str, tuple[float, int, int]], busy: dict[int, float], tok: str, ts: float, n: int
) -> None:
    """``n`` items of dispatch ``tok`` ended at ``ts``; when its last one did, its rank's busy
    time grows by the dispatch's duration."""
    if tok not in token_of:
        return
    t0, rank, left = token_of[tok]
    left -= n
    if left > 0:
        token_of[tok] = (t0, rank, left)
        return
    del token_of[tok]
    busy[rank] = busy.get(rank, 0.0) + max(0.0, ts - t0)


def _cumulative(times: list[float], deltas: Iterable[tuple[float, int]]) -> list[int]:
    """The running sum of ``deltas`` at each of ``times``."""
    out, total, i = [], 0, 0
    ds = sorted(deltas)
    for t in times:
        while i < len(ds) and ds[i][0] <= t + 1e-9:
            total += ds[i][1]
            i += 1
        out.append(total)
    return out


# ----------------------------------------------------------------------------------- drawing
_W, _H, _PAD = 760, 180, 40
_COLORS = {
    "committed": "#2a7ab0",
    "in_flight": "#e08a1e",
    "timeouts": "#c0392b",
    "deferred": "#7d3c98",
    "parked": "#27ae60",
}


def _line_chart(s: Mapping[str, Any], keys: list[str], title: str) -> str:
    times = s["times"]
    if not times:
        return f"<h2>{html.escape(title)}</h2><p>No events yet.</p>"
    top = float(max([1] + [max(s[k]) for k in keys if s[k]]))
    x0 = float(s["start"])
    span = max(float(s["end"]) - x0, 1e-6)

    def x(t: float) -> float:
        return _PAD + (_W - 2 * _PAD) * (t - x0) / span

    def y(v: float) -> float:
        return _H - _PAD / 2 - (_H - _PAD) * v / top

    parts = [
        f'<svg width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img">',
        f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="#fbfbfb" stroke="#ddd"/>',
    ]
    for epoch, ts in s["epochs"]:
        parts.append(
            f'<line x1="{x(ts):.1f}" y1="8" x2="{x(ts):.1f}" y2="{_H - 8}" '
            f'stroke="#999" stroke-dasharray="4 3"/>'
        )
        parts.append(
            f'<text x="{x(ts) + 3:.1f}" y="16" font-size="10" fill="#666">epoch {epoch}</text>'
        )
    for k in keys:
        pts = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in zip(times, s[k], strict=True))
        pts = f"{x(x0):.1f},{y(0):.1f} " + pts
        parts.append(
            f'<polyline fill="none" stroke="{_COLORS[k]}" stroke-width="2" points="{pts}"/>'
        )
    parts.append(f'<text x="4" y="{_PAD / 2 + 4:.0f}" font-size="10" fill="#666">{top:g}</text>')
    parts.append(f'<text x="4" y="{_H - 6}" font-size="10" fill="#666">0</text>')
    legend = "  ".join(
        f'<tspan fill="{_COLORS[k]}">&#9632; {k.replace("_", " ")} ({s[k][-1]})</tspan>'
        for k in keys
    )
    parts.append(f'<text x="{_PAD}" y="{_H - 4}" font-size="11">{legend}</text></svg>')
    return f"<h2>{html.escape(title)}</h2>" + "".join(parts)


def _bars(rows: list[tuple[str, float, str]], title: str) -> str:
    if not rows:
        return f"<h2>{html.escape(title)}</h2><p>None.</p>"
    top = max(v for _, v, _ in rows) or 1
    h = 22 * len(rows) + 10
    parts = [f'<svg width="{_W}" height="{h}" viewBox="0 0 {_W} {h}" role="img">']
    for i, (label, v, shown) in enumerate(rows):
        w = (_W - 360) * v / top
        yy = 8 + 22 * i
        parts.append(f'<text x="4" y="{yy + 13}" font-size="12">{html.escape(label)}</text>')
        parts.append(f'<rect x="160" y="{yy}" width="{max(w, 1):.1f}" height="16" fill="#2a7ab0"/>')
        parts.append(
            f'<text x="{166 + w:.1f}" y="{yy + 13}" font-size="12">{html.escape(shown)}</text>'
        )
    parts.append("</svg>")
    return f"<h2>{html.escape(title)}</h2>" + "".join(parts)


def render_report(series: Mapping[str, Any], title: str, where: str = "") -> str:
    """The HTML page for ``series`` (:func:`report_series`); ``where`` names the state
    directory under the title."""
    import datetime

    def when(ts: float | None) -> str:
        if ts is None:
            return "-"
        return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        )

    t = series["totals"]
    failures = [(k, float(n), str(n)) for k, n in series["failures_by_kind"].items()]
    ranks = [
        (
            f"rank {r}",
            v["utilisation"],
            f"{100 * v['utilisation']:.0f}% ({v['dispatches']} dispatches)",
        )
        for r, v in series["ranks"].items()
    ]
    slowest = (
        "".join(
            f"<tr><td>{html.escape(str(w))}</td><td>{s:.3f}</td><td>{r}</td></tr>"
            for w, s, r in series["slowest"]
        )
        or '<tr><td colspan="3">None.</td></tr>'
    )
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p><code>{html.escape(where)}</code></p>" if where else "",
        f"<p>From {when(series['start'])} to {when(series['end'])}: {t['committed']} work items "
        f"committed, {t['timeouts']} timeouts, {t['deferred']} deferred, {t['epochs']} master "
        "runs (epochs, the dashed lines).</p>",
        _line_chart(series, ["committed", "deferred"], "Committed and deferred over time"),
        _line_chart(
            series,
            ["in_flight", "timeouts", "parked"],
            "In flight, timeouts and parked ranks (until their next dispatch)",
        ),
        _bars(failures, "Failures by kind"),
        _bars(ranks, "Per-rank utilisation (busy time over the campaign's span)"),
        "<h2>The slowest items (dispatch to commit)</h2><table><tr><th>work ID</th>"
        f"<th>seconds</th><th>rank</th></tr>{slowest}</table>",
    ]
    style = (
        "body{font-family:sans-serif;margin:24px;color:#222;max-width:820px}"
        "h2{font-size:15px;margin-top:24px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ddd;padding:3px 8px;font-size:12px;text-align:left}"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{style}</style></head><body>"
        + "".join(body)
        + "</body></html>\n"
    )


def write_report(directory: str | os.PathLike[str], out: str | os.PathLike[str]) -> dict[str, Any]:
    """Write the report page of the state directory ``directory`` to ``out``; returns its
    series. Only ``out`` is written (through a temporary file and a rename)."""
    d = os.fspath(directory)
    series = report_series(d)
    page = render_report(series, "durable-dispatch campaign", os.path.abspath(d))
    from .storage import fs

    tmp = os.fspath(out) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    fs.replace(tmp, os.fspath(out))  # every rename goes through the fs seam
    return series
