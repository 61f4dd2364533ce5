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
    every number of the page's summary), ``runs`` (``{"epoch", "start", "end", "open", "ended",
    "how"}`` per master run; ``ended`` says how it ended in a word, ``how`` in words), ``gaps``
    (``[from, to]`` when no master ran), ``start``/``end``, ``times`` (bucket ends),
    ``committed`` (cumulative items committed at each), ``deferred`` (items deferred at each: the
    folded ones, whose time a compaction dropped, from the start), ``in_flight`` (items in
    flight; 0 between runs), ``parked`` (ranks parked), ``throughput`` (items committed per
    second over the last 4 buckets of the run), ``timeline`` (rank -> ``[[from, to, outcome],
    ...]``), ``failures`` (items that failed: ``{"work_id", "status", "failures", "kinds",
    "last_error", "payload"}``; ``failures``: failed attempts), ``failure_groups`` (those items
    grouped by their last failure's kind and error line, most items first: ``{"kind", "error",
    "items", "attempts", "deferred", "work_ids"`` (the first 8), ``"more"``, ``"example":
    {"work_id", "payload", "error"}}``), ``deferred_items`` (each deferred item once, as in
    ``failures``), ``slowest`` (the 10 longest attempts, in flight and failed ones included:
    ``{"work_id", "seconds", "rank", "host", "outcome", "cpu_seconds", "max_rss",
    "cost_measured"}``; ``host`` None when not recorded; the last three: what the attempt cost,
    its items' CPU seconds summed and their largest peak memory in bytes, and how that was
    measured (``child``, ``child-ended``, ``in-process``: see the joblog), None when not said).
    """
    from ..campaign.admin import view_state
    from .view import view_of_state

    t_now = time.time() if now is None else now
    sv = view_state(directory)
    view = view_of_state(sv, t_now)
    h = read_history(directory, now=t_now, running=view.master_running)
    out: dict[str, Any] = {"view": view.as_dict()}
    out.update(_failures(sv.projection, view.master_running, os.fspath(directory)))
    out.update(_over_time(h, view.deferred))
    for run in out["runs"]:
        run["ended"], run["how"] = _run_end(run, h, view, sv.live)
    out["slowest"] = _slowest(h)
    return out


#: how a run ended, in a word for the time axis and in words for the runs table
_ENDS = {
    "running": "running now",
    "finished": "closed: the campaign finished",
    "drained (operator)": "drained by the operator (durable-dispatch drain), then closed",
    "drained": "drained, then closed (SIGUSR1, SIGTERM, Ctrl-C, the warning before a time "
    "limit; or no worker left)",
    "cut short": "closed with work in flight: its drain was cut short",
    "killed": "killed or died without closing (SIGKILL, a time limit without warning, a lost node)",
    "ended": "ended with nothing in flight (drained, or stopped between two dispatches)",
    "time limit": "its allocation's time limit came (drained at the batch system's warning, "
    "or killed at the limit)",
}
#: a run that ended this close to its allocation's end ended at the time limit
_LIMIT_SECONDS = 300.0


def _run_end(
    run: Mapping[str, Any], h: History, view: Any, live: Mapping[str, Any] | None = None
) -> tuple[str, str]:
    """``(word, words)``: how a master run ended, from what the journals and the newest
    master's statistics say: its operator's drain command, the work it left in flight, and
    (the newest run only) whether it closed the state directory."""
    from .history import INTERRUPTED

    if run["open"]:
        return "running", _ENDS["running"]
    epoch = run["epoch"]
    left = any(a.outcome == INTERRUPTED and a.epoch == epoch for a in h.attempts)
    operator = epoch in h.drained
    newest = h.runs and epoch == h.runs[-1].epoch
    if newest and view.master_ended == "killed":
        word = "killed"
    elif newest and view.master_ended == "closed":
        word = (
            "finished" if view.finished and not left
            else "cut short" if left
            else "drained (operator)" if operator
            else "drained"
        )  # fmt: skip
    else:  # an earlier run: no statistics of its own are kept
        word = "killed" if left else "drained (operator)" if operator else "ended"
    alloc = (live or {}).get("allocation") if newest else None
    ends_at = alloc.get("ends_at") if isinstance(alloc, Mapping) else None
    if (
        word in ("killed", "cut short", "drained")
        and isinstance(ends_at, (int, float))
        and run["end"] >= ends_at - _LIMIT_SECONDS
    ):
        word = "time limit"  # (the master published its allocation's end: it came)
    return word, _ENDS[word]


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


def _headline(error: str | None, work_id: str) -> str:
    """The line that names an error (a traceback's last), without its work ID, so that the
    same error of many items is one group."""
    lines = [x.strip() for x in (error or "").splitlines() if x.strip()]
    text = lines[-1] if lines else "(no message)"
    text = text.removeprefix(f"{work_id}: ")
    return text.replace(work_id, "<work ID>") if len(work_id) > 3 else text


def _payload_texts(d: str, led: Any, wanted: set[str]) -> dict[str, str]:
    """Work ID -> its payload as short text, for the ``wanted`` work IDs."""
    from .joblog import _call_text, _ledger_payload, _payloads

    if not wanted:
        return {}
    stored = _payloads(d)
    out = {}
    for w in wanted:
        p = stored[w] if w in stored else _ledger_payload(led, w)
        out[w] = _call_text(p) or "-"
    return out


_GROUP_IDS = 8  # work IDs named per failure group, then "and N more"
_EXAMPLE_CHARS = 4000  # an example's error text (a traceback) is cut here


def _failures(led: Any, running: bool, d: str = "") -> dict[str, Any]:
    failed = {w for w, ks in led.kinds.items() if ks} | set(led.deferred)
    payloads = _payload_texts(d, led, failed) if d else {}
    groups: dict[tuple[str, str], list[str]] = {}
    for w, ks in led.kinds.items():
        if ks:
            key = (str(ks[-1]), _headline(led.last_error.get(w), w))
            groups.setdefault(key, []).append(w)
    failure_groups = []
    for (kind, error), ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        first = ids[0]
        failure_groups.append(
            {
                "kind": kind,
                "error": error,
                "items": len(ids),
                "attempts": sum(len(led.kinds[w]) for w in ids),
                "deferred": sum(1 for w in ids if w in led.deferred),
                "work_ids": ids[:_GROUP_IDS],
                "more": max(0, len(ids) - _GROUP_IDS),
                "example": {
                    "work_id": first,
                    "payload": payloads.get(first),
                    "error": (led.last_error.get(first) or "")[-_EXAMPLE_CHARS:] or None,
                },
            }
        )
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
                    "payload": payloads.get(w),
                }
            )
    rows.sort(key=lambda r: (-r["failures"], r["work_id"]))
    deferred = [
        {
            "work_id": w,
            "failures": len(led.kinds.get(w, ())),
            "kinds": list(led.kinds.get(w, ())),
            "last_error": led.last_error.get(w) or None,
            "payload": payloads.get(w),
        }
        for w in led.deferred
    ]
    return {"failures": rows, "failure_groups": failure_groups, "deferred_items": deferred}


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
        costs = list((a.costs or {}).values())
        cpus = [c["cpu"] for c in costs if type(c.get("cpu")) in (int, float)]
        peaks = [c["rss"] for c in costs if type(c.get("rss")) is int]
        ways = sorted({c["by"] for c in costs if isinstance(c.get("by"), str)})
        out.append(
            {
                "work_id": ids[0] + (f" (+{len(ids) - 1})" if len(ids) > 1 else ""),
                "seconds": round(s, 3),
                "rank": a.rank,
                "host": a.host,
                "outcome": a.outcome,
                "cpu_seconds": sum(cpus) if cpus else None,  # (unrounded: as the joblog shows)
                "max_rss": max(peaks) if peaks else None,
                "cost_measured": ", ".join(ways) if ways else None,
            }
        )
    return out


def _cost_cells(r: Mapping[str, Any]) -> list[str]:
    """The slowest attempts' CPU and peak memory cells; ``*``: measured in-process."""
    mark = "*" if r.get("cost_measured") == "in-process" else ""
    cpu, rss = r.get("cpu_seconds"), r.get("max_rss")
    return [
        f"{cpu:.2f}{mark}" if cpu is not None else "-",
        f"{rss / (1 << 20):.1f}{mark}" if rss is not None else "-",
    ]


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
            "progress (work items)",
            f"{v['committed']} of {v['work_items']}"
            + (" submitted so far" if v.get("open_ended") else "")
            + f" committed, {v['deferred']} deferred, "
            + (f"{v['cancelled']} cancelled, " if v.get("cancelled") else "")
            + f"{v['pending']} pending, {v['in_flight']} in flight"
            + (f", {v['waiting']} waiting for dependencies" if v.get("waiting") else ""),
        ),
        (
            "failed attempts by kind",
            f"{kinds} ({v['failed_items']} items failed at least once)",
        ),
        ("master runs", f"{v['epoch']} (epochs; {_gaps(len(s['gaps']))})"),
        ("from", f"{_when(s['start'])} to {_when(s['end'])}"),
    ]
    if v["state"] == "running":
        rate = v["rate_per_s"]
        rows.append(
            (
                "rate, ETA",
                f"{rate:,.1f} items/s, no ETA (the script may submit more)" + allocation_of(v)
                if rate is not None and v.get("open_ended")
                else f"{rate:,.1f} items/s, ETA {duration(v['eta_seconds'])}" + allocation_of(v)
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


def _kinds_text(kinds: Sequence[str]) -> str:
    """``["error", "error", "timeout"]`` -> ``"error x2, timeout"``."""
    counts: dict[str, int] = {}
    for k in kinds:
        counts[k] = counts.get(k, 0) + 1
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in counts.items())


def _failure_groups(groups: Sequence[Mapping[str, Any]], n_items: int, v: Mapping[str, Any]) -> str:
    """The failures grouped by error: each group's count of items and of failed attempts, its
    work IDs (the first few, then "and N more") and one example with its payload and error."""
    attempts = sum(v["failures_by_kind"].values())
    head = (
        f"<h2>Failures: {n_items} items failed at least once, {attempts} failed attempts; "
        f"{len(groups)} distinct error{'s' if len(groups) != 1 else ''}</h2>"
    )
    if not groups:
        return head + "<p>No failures.</p>"
    out = [head]
    for g in groups[:_TABLE_MAX]:
        ids = ", ".join(g["work_ids"]) + (f" and {g['more']} more" if g["more"] else "")
        ex = g["example"]
        deferred = f", {g['deferred']} of them deferred" if g["deferred"] else ""
        out.append(
            '<div class="group">'
            f"<h3>{g['items']} item{'s' if g['items'] != 1 else ''} "
            f"({g['attempts']} failed attempt{'s' if g['attempts'] != 1 else ''}{deferred}): "
            f"{html.escape(g['kind'])}: {html.escape(_cell(g['error']))}</h3>"
            f"<p>work IDs: {html.escape(ids)}</p>"
            f"<p>for example <code>{html.escape(ex['work_id'])}</code>, payload "
            f"<code>{html.escape(_cell(ex.get('payload')))}</code>:</p>"
            f"<pre>{html.escape(ex.get('error') or '-')}</pre></div>"
        )
    if len(groups) > _TABLE_MAX:
        out.append(f"<p>{len(groups) - _TABLE_MAX} more errors not shown.</p>")
    return "".join(out)


def _gaps(n: int) -> str:
    if not n:
        return "no gap between runs"
    return f"{n} gap{'s' if n > 1 else ''} between runs, when no master ran, drawn grey"


def render_report(series: Mapping[str, Any], title: str, where: str = "") -> str:
    """The HTML page for ``series`` (:func:`report_series`); ``where`` names the state
    directory under the title."""
    from .watch import duration

    v = series["view"]
    axis = _Axis([(r["start"], r["end"]) for r in series["runs"]])
    axis.ends = [(r["end"], r["ended"]) for r in series["runs"] if r.get("ended")]
    fails = series["failures"]
    deferred = series["deferred_items"]
    deferred_rows = [
        [
            r["work_id"],
            r.get("payload"),
            r["failures"],
            _kinds_text(r["kinds"]),
            _headline(r["last_error"], r["work_id"]),
        ]
        for r in deferred[:_TABLE_MAX]
    ]
    slow_rows = [[r["work_id"], f"{r['seconds']:.3f}", r["rank"], r["host"] or "-", r["outcome"],
                  *_cost_cells(r)] for r in series["slowest"]]  # fmt: skip
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
            "items, ranks",
            f'<span style="color:{_COLORS["in_flight"]}">&#9632;</span> items in flight '
            f'&nbsp; <span style="color:{_COLORS["parked"]}">&#9632;</span> ranks parked (from '
            "the timeout that parked a rank until its next dispatch)",
        ),
        _timeline_chart(series, axis),
        "<h2>Master runs</h2>",
        _table(
            ["run (epoch)", "from", "to", "length", "how it ended"],
            [
                [
                    r["epoch"],
                    _when(r["start"]),
                    _when(r["end"]),
                    duration(r["end"] - r["start"]),
                    r.get("how"),
                ]
                for r in series["runs"]
            ],
            len(series["runs"]),
            "No run with a time in the journals.",
        ),  # fmt: skip
        _failure_groups(series.get("failure_groups", []), len(fails), v),
        f"<h2>Deferred items ({v['deferred']} items, each once: set aside after their "
        "retries)</h2>",
        _table(
            ["work ID", "payload", "failed attempts", "failure kinds", "last error"],
            deferred_rows,
            len(deferred),
            "None deferred.",
        ),
        "<h2>The slowest attempts (each row one dispatch attempt: from its send to its end; "
        "in flight ones until now)</h2>",
        _table(
            ["work ID", "seconds", "rank", "host", "outcome", "CPU seconds", "peak memory MiB"],
            slow_rows,
            len(slow_rows),
            "None.",
        ),
        '<p class="legend">CPU seconds (user + system) and peak resident memory of the process '
        "that ran the attempt's items, as its worker measured them: in the isolated child, or "
        "(marked *) in the worker's own process, where its other threads count too and the "
        "peak is the worker's high-water mark so far.</p>",
    ]
    style = (
        "body{font-family:sans-serif;margin:24px;color:#222;max-width:1800px}"
        "h2{font-size:15px;margin:22px 0 4px}h3{font-size:13px;margin:14px 0 2px}"
        "table{border-collapse:collapse}svg{width:100%;height:auto;display:block}"
        "td,th{border:1px solid #ddd;padding:3px 8px;font-size:12px;text-align:left}"
        ".summary th{background:#f4f4f4}.legend{font-size:12px;margin:2px 0 0;color:#444}"
        "pre{font-size:11px;background:#f7f7f7;padding:6px;overflow-x:auto;max-height:260px}"
        ".group p{font-size:12px;margin:2px 0}"
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
