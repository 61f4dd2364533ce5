"""durable-dispatch report (issue 18): the plotted series equal what the journal says, and the
page renders in headless Chromium to a picture that is not blank."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import CampaignState, RetryPolicy, WatchdogConfig, WorkItem
from durable_dispatch.campaign.admin import compact_state
from durable_dispatch.storage.journal import read_journal
from durable_dispatch.views.report import report_series, write_report

from .helpers import fake_campaign

ROOT = Path(__file__).resolve().parent.parent


def _campaign(d: Path) -> None:
    """Two master runs with silent and malformed workers, a compaction between them."""
    n = {"k": 0}

    def behave(send: Any) -> str:
        n["k"] += 1
        return ["ok", "silent", "ok", "malformed", "ok", "ok"][n["k"] % 6]

    items = [WorkItem(f"w{i:02d}", i) for i in range(40)]
    for part in (items[:20], items):
        with CampaignState.open(
            d, ranks=(1, 2, 3), watchdog=WatchdogConfig(5), retry=RetryPolicy(1)
        ) as s:
            s.submit(part)
            fake_campaign(s, behave=behave)
        if part is not items:
            compact_state(d)


def _journal_facts(d: Path) -> dict[str, Any]:
    """What the journals say, counted independently of the report's code."""
    committed: set[str] = set()
    timeouts = deferred = epochs = 0
    kinds: Counter[str] = Counter()
    for name in ("results.jsonl", "events.jsonl"):
        for r in read_journal(d / name):
            p = r.payload
            ev = "committed" if name == "results.jsonl" else p.get("event")
            if ev == "committed":
                committed.update(p.get("work_ids") or [p["work_id"]])
            elif ev == "epoch":
                epochs += 1
            elif ev in ("requeued", "deferred"):
                timeouts += p.get("source") == "watchdog-timeout"
                if ev == "deferred":
                    deferred += 1
                    kinds[p["kinds"][-1]] += 1
                elif p.get("source") != "master-restart":
                    kinds[p["kind"]] += 1
    return {
        "committed": len(committed),
        "timeouts": timeouts,
        "deferred": deferred,
        "epochs": epochs,
        "kinds": dict(kinds),
    }


def test_the_plotted_series_equal_what_the_journal_says(tmp_path: Path) -> None:
    d = tmp_path / "state"
    _campaign(d)
    s = report_series(d)
    facts = _journal_facts(d)
    assert facts["timeouts"] > 0 and facts["kinds"].get("missing-result", 0) + facts["kinds"].get(
        "malformed-result", 0
    )
    from durable_dispatch.campaign.admin import view_state

    view = view_state(d).projection  # deferrals before the compaction are in the snapshot only
    v = s["view"]  # the numbers of the page are the campaign's one view (stats shows them too)
    assert v["committed"] == facts["committed"] == len(view.committed) == s["committed"][-1]
    assert v["deferred"] == len(view.deferred) == s["deferred"][-1]
    assert len(view.committed) + len(view.deferred) == 40
    assert v["epoch"] == 2 and len(s["runs"]) == 2  # two master runs
    failures: Counter[str] = Counter()
    for ks in view.kinds.values():
        failures.update(ks)
    assert v["failures_by_kind"] == dict(sorted(failures.items()))  # kept by the compaction
    assert v["failures_by_kind"].get("timeout", 0) >= facts["timeouts"]  # the journal: since
    assert s["in_flight"][-1] == 0  # all ended
    assert all(a <= b for a, b in zip(s["committed"], s["committed"][1:], strict=False))
    assert min(s["in_flight"]) >= 0 and min(s["parked"]) >= 0
    assert max(s["parked"]) >= 1 and max(s["parked"]) <= 3  # silent workers parked their ranks
    assert set(s["timeline"]) == {"1", "2", "3"}
    assert any(seg[2] == "parked" for segs in s["timeline"].values() for seg in segs)
    assert {r["outcome"] for r in s["slowest"]} & {"timeout", "committed"}
    assert len(s["throughput"]) == len(s["times"]) and min(s["throughput"]) >= 0


def test_the_command_writes_one_self_contained_page(tmp_path: Path) -> None:
    d = tmp_path / "state"
    _campaign(d)
    out = tmp_path / "report.html"
    res = subprocess.run(
        [sys.executable, "-m", "durable_dispatch", "report", str(d), "-o", str(out), "--json"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    page = out.read_text()
    assert page.count("<svg") == 4 and "<script" not in page and "parked" in page
    assert "Failures: " in page and "Deferred items (" in page and " s</text>" in page
    for far in ("http://", "https://", "src=", "@import"):
        assert far not in page  # nothing from the network, no file beside it


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the rows (RGB or RGBA bytes) of an 8-bit PNG, unfiltered."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    height = depth = ctype = 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and ctype in (2, 6)
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def test_the_page_renders_in_headless_chromium_and_is_not_blank(tmp_path: Path) -> None:
    """The screenshot has charts in it: many pixels that are not the white page, in several
    colours. (docs/report.png is a real demo campaign's page, not this test's.)"""
    exe = _chromium()
    if exe is None:
        if os.environ.get("CI"):
            raise AssertionError("chromium is missing: .ci/run installs Debian's chromium")
        pytest.skip("no chromium here (Debian's chromium package; CI installs it)")
    d = tmp_path / "state"
    _campaign(d)
    page = tmp_path / "report.html"
    write_report(d, page)
    shot = tmp_path / "shot.png"
    res = subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=860,1300",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, HOME=str(tmp_path)),
    )
    assert shot.exists(), res.stderr[-2000:]
    width, height, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (860, 1300)
    step = 3 if len(rows[0]) == width * 3 else 4
    colours: Counter[bytes] = Counter()
    for row in rows[::4]:
        for i in range(0, len(row), step * 4):
            colours[row[i : i + 3]] += 1
    total = sum(colours.values())
    white = colours.get(b"\xff\xff\xff", 0)
    assert total - white > total * 0.05, "the screenshot is (almost) blank"
    assert len(colours) >= 8, colours.most_common(5)
    assert colours.get(b"\x2a\x7a\xb0", 0) > 0  # the committed line's blue is drawn


# ------------------------------------------------------------- what a new user looks for
_DIVERGED = (
    'Traceback (most recent call last):\n  File "sweep.py", line 9, in f\nValueError: diverged'
)
_WILD_CHILD = """
import os, signal, sys
from durable_dispatch import CampaignState, WorkItem
with_work = CampaignState.open(sys.argv[1], ranks=(1, 2))
with_work.submit([WorkItem(f"p{i:04d}", {"x": i, "seed": 1000 + i}) for i in range(30, 40)])
for _ in range(2):
    x = with_work.next_send(0.0)
    with_work.sent(x.token, 0.0)
with_work.journal.sync_now()  # (what a real master does before it sends)
with_work.publish_statistics(force=True)
os.kill(os.getpid(), signal.SIGKILL)  # killed with two dispatches in flight
"""


def _failing_campaign(d: Path) -> None:
    """Three runs: the first fails 13 items with one error, 1 with a crash and leaves work;
    the second is SIGKILLed with work in flight; the third finishes."""
    from durable_dispatch.core.decisions import ItemFailure

    def serve(s: CampaignState, fail: Any) -> None:
        while (x := s.next_send(0.0)) is not None:
            s.sent(x.token, 0.0)
            w = x.items[0]
            why = fail(w)
            if why is None:
                s.on_results(x.rank, str(x.token), [w.payload], 0.0)
                s.deliver(wait=True)
            else:
                s.on_results(x.rank, str(x.token), None, 0.0, failure=why)
            s.on_ready(x.rank, str(x.token), 0.0)
            s.tick(0.0)

    def first(w: WorkItem) -> Any:
        if w.payload["x"] == 5:
            return ItemFailure("crash", "the work function's process killed by SIGSEGV")
        if w.payload["x"] % 2 and w.payload["x"] < 27:
            return ItemFailure("error", _DIVERGED)
        return None

    items = [WorkItem(f"p{i:04d}", {"x": i, "seed": 1000 + i}) for i in range(40)]
    with CampaignState.open(d, ranks=(1,), retry=RetryPolicy(0)) as s:
        s.submit(items[:30])
        serve(s, first)
    res = subprocess.run([sys.executable, "-c", _WILD_CHILD, str(d)], timeout=120)
    assert res.returncode == -9
    with CampaignState.open(d, ranks=(1,), retry=RetryPolicy(0)) as s:
        s.submit(items)
        serve(s, lambda w: None)


def test_the_report_groups_failures_by_error_and_says_how_each_run_ended(tmp_path: Path) -> None:
    """What a new user could not read: failures listed twice (as failures and as deferred),
    nothing saying why a run ended, "failures error 118" beside "61 items failed", charts
    770 px wide in a wide window, and no payload of a failed item. Now: failures grouped by
    error (count, the first work IDs "and N more", one example with its payload and
    traceback), each deferred item once, each run's end labelled on the time axis and in the
    runs table, every figure saying attempts or items, charts that take the page's width."""
    from durable_dispatch.views.report import render_report

    d = tmp_path / "state"
    _failing_campaign(d)
    s = report_series(d)
    groups = {(g["kind"], g["error"]): g for g in s["failure_groups"]}
    diverged = groups[("error", "ValueError: diverged")]
    odd = [f"p{i:04d}" for i in range(1, 27, 2) if i != 5]
    assert diverged["items"] == diverged["attempts"] == diverged["deferred"] == len(odd) == 12
    assert diverged["work_ids"] == odd[:8] and diverged["more"] == 4
    ex = diverged["example"]
    assert ex["work_id"] == "p0001" and ex["payload"] == '{"x":1,"seed":1001}', ex
    assert "Traceback" in ex["error"] and ex["error"].endswith("ValueError: diverged")
    crash = groups[("crash", "the work function's process killed by SIGSEGV")]
    assert crash["items"] == 1 and crash["work_ids"] == ["p0005"]
    assert [r["ended"] for r in s["runs"]] == ["ended", "killed", "finished"], s["runs"]
    assert "SIGKILL" in s["runs"][1]["how"] and "finished" in s["runs"][2]["how"]
    page = render_report(s, "t")
    deferred_table = page.split("<h2>Deferred items", 1)[1].split("<h2>", 1)[0]
    failures = page.split("<h2>Failures", 1)[1].split("<h2>", 1)[0]
    listed = page.split("<h2>The slowest", 1)[0]  # (an attempt's row there is no listing)
    for w in odd:  # each deferred item once, in the deferred table only
        assert listed.count(f"<td>{w}</td>") == 1 and f"<td>{w}</td>" in deferred_table, w
    assert "and 4 more" in failures and "&quot;seed&quot;:1001" in failures
    assert "Traceback" in failures and "13 items failed at least once, 13 failed attempts" in (
        failures.replace("&quot;", '"')
    ), failures[:400]
    assert "failed attempts by kind" in page and "(work items)" in page
    assert "dispatch attempt" in page  # the timeline and the slowest table count attempts
    assert ">killed</text>" in page and ">finished</text>" in page  # on the time axis
    assert "how it ended" in page and "SIGKILL" in page  # and in the runs table
    assert "svg{width:100%;height:auto" in page and page.count("viewBox=") == page.count("<svg")
    assert "max-width:820px" not in page


def test_the_report_uses_the_width_of_a_wide_window(tmp_path: Path) -> None:
    """The charts were 760 px wide in a 1400 px window: they scale to the page's width."""
    exe = _chromium()
    if exe is None:
        if os.environ.get("CI"):
            raise AssertionError("chromium is missing: .ci/run installs Debian's chromium")
        pytest.skip("no chromium here (Debian's chromium package; CI installs it)")
    d = tmp_path / "state"
    _failing_campaign(d)
    page = tmp_path / "report.html"
    write_report(d, page)
    shot = tmp_path / "shot.png"
    res = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
        + ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
        + [f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars"]
        + [f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, HOME=str(tmp_path)),
    )
    assert shot.exists(), res.stderr[-2000:]
    width, _height, rows = _png_pixels(shot.read_bytes())
    step = 3 if len(rows[0]) == width * 3 else 4
    blue = b"\x2a\x7a\xb0"  # the committed line and the throughput bars
    xs = [i // step for row in rows for i in range(0, len(row), step) if row[i : i + 3] == blue]
    assert xs and max(xs) > 0.9 * width, (max(xs, default=0), width)


def test_a_run_killed_at_its_allocations_end_is_labelled_time_limit(tmp_path: Path) -> None:
    """The master publishes its allocation's end: a run that died at it ended at the time
    limit, and the report says so (on the axis and in the runs table), not just "killed"."""
    d = tmp_path / "state"
    child = _WILD_CHILD.replace(
        "with_work.journal.sync_now()",
        "import time\n"
        "with_work.allocation = lambda: {'ends_at': time.time() + 1.0, "
        "'started': time.time() - 60.0, 'source': 'test'}\n"
        "with_work.journal.sync_now()",
    )
    res = subprocess.run([sys.executable, "-c", child, str(d)], timeout=120)
    assert res.returncode == -9
    s = report_series(d)
    assert [r["ended"] for r in s["runs"]] == ["time limit"], s["runs"]
    assert "time limit" in s["runs"][0]["how"]
    same = tmp_path / "same"  # the same without an allocation's end: killed
    res = subprocess.run([sys.executable, "-c", _WILD_CHILD, str(same)], timeout=120)
    assert [r["ended"] for r in report_series(same)["runs"]] == ["killed"]
