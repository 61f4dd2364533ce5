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
    assert "Failures (" in page and "Deferred items (" in page and " s</text>" in page
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
