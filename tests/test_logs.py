"""Tests of durable_dispatch.campaign.logs: structured records with source=... for recoveries."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from durable_dispatch.campaign.logs import LOGGER_NAME, log_decisions
from durable_dispatch.core import Dispatcher, Send, WatchdogConfig, WorkItem


def test_recoveries_are_logged_with_their_source(caplog: pytest.LogCaptureFixture) -> None:
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(10), ranks=(1, 2))
    d.submit([WorkItem("a"), WorkItem("b")])
    s1 = d.reserve(0)
    s2 = d.reserve(0)
    assert isinstance(s1, Send) and isinstance(s2, Send)
    d.mark_dispatched(s1.token, 0)
    d.mark_dispatched(s2.token, 0)
    d.on_ready(s2.rank, str(s2.token), 1)
    with caplog.at_level(logging.DEBUG, logger=LOGGER_NAME):
        log_decisions(d.join_invalid(1))
        log_decisions(d.sweep(10))
    requeues = [r for r in caplog.records if getattr(r, "event", None) == "requeue"]
    assert [r.source for r in requeues] == ["invalid-result", "watchdog-timeout"]  # type: ignore[attr-defined]
    assert "source=watchdog-timeout" in requeues[1].getMessage()
    assert "source=invalid-result" in requeues[0].getMessage()
    parks = [r for r in caplog.records if getattr(r, "event", None) == "park"]
    assert len(parks) == 1 and parks[0].rank == s1.rank  # type: ignore[attr-defined]


def test_each_decision_is_logged_exactly_when_its_level_is_on() -> None:
    """log_decisions skips a decision by its type's level before building its fields: at every
    logger level it must emit exactly the decisions whose own level is enabled."""
    from durable_dispatch.campaign.logs import decision_fields
    from durable_dispatch.core import decisions as D
    from durable_dispatch.tokens import Token

    t = Token(1, 2)
    w = D.WorkItem("w", {})
    samples = [
        D.Requeue("w", t, "watchdog", "timeout", 1, "late"),
        D.Defer(w, t, "watchdog", 2, ("timeout",), "late"),
        D.Park(1, t, "watchdog"),
        D.Release(1, t),
        D.Quarantine(1, "RESULT", D.Classification.STALE, "old"),
        D.Commit(1, t, "w", {}),
        D.Send(1, t, (w,)),
        D.PersistSnapshot("rollback"),
    ]

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.DEBUG)
            self.events: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.events.append(record.event)  # type: ignore[attr-defined]

    lg = logging.getLogger("durable_dispatch.test-levels")
    lg.propagate = False
    for threshold in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
        keep = Keep()
        lg.handlers = [keep]
        lg.setLevel(threshold)
        log_decisions(samples, lg)
        fields = [decision_fields(d) for d in samples]
        assert keep.events == [ev for ev, level, _f in fields if level >= threshold], threshold


def test_the_library_prints_nothing_unless_the_program_configures_logging(tmp_path: Path) -> None:
    """Issue 18: park and requeue warnings printed through Python's last-resort handler in any
    program that used the library. The library's logger has a NullHandler now (the logging
    HOWTO's rule); a program that configures logging still gets every record."""
    import subprocess
    import sys

    campaign = f"""
import logging, sys
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
from durable_dispatch import CampaignState, WatchdogConfig, WorkItem
with CampaignState.open({str(tmp_path)!r} + "/" + sys.argv[1], ranks=[1],
                        watchdog=WatchdogConfig(1)) as s:
    s.submit([WorkItem("w1")])
    x = s.next_send(0.0)
    s.sent(x.token, 0.0)
    s.tick(5.0)  # the deadline passed: park and requeue, logged as warnings
print("done")
"""
    quiet = subprocess.run(
        [sys.executable, "-c", campaign, "plain"], capture_output=True, text=True, check=True
    )
    assert quiet.stdout == "done\n" and quiet.stderr == "", quiet.stderr
    loud = subprocess.run(
        [sys.executable, "-c", campaign, "configured"], capture_output=True, text=True, check=True
    )
    assert "durable_dispatch.dispatch park" in loud.stderr, loud.stderr
    assert "durable_dispatch.dispatch requeue" in loud.stderr, loud.stderr
