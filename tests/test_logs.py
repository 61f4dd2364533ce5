"""Tests of durable_dispatch.logs: structured records with source=... for recoveries."""

from __future__ import annotations

import logging

import pytest

from durable_dispatch.core import Dispatcher, Send, WatchdogConfig, WorkItem
from durable_dispatch.logs import LOGGER_NAME, log_decisions


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
