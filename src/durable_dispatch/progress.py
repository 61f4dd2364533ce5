"""A one-line progress display for a terminal (``run_master(progress=True)``).

It redraws one line in place (carriage return, then the line cleared to its end) with the
campaign's figures, and ends it with a newline when closed, so the shell prompt or the next log
line starts clean. It draws only on a terminal: :func:`terminal_progress` returns None when the
stream is not one (a batch job's log file gets no control characters).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = ["ProgressLine", "terminal_progress", "progress_text"]


def progress_text(stats: Mapping[str, Any], rate: float | None) -> str:
    """The line for the statistics ``stats`` (``CampaignStats.as_dict()``)."""
    core = stats.get("core", {})
    done = int(core.get("commits", 0))
    left = int(core.get("pending_now", 0)) + int(core.get("in_flight_now", 0))
    parts = [
        f"committed {done}",
        f"left {left}",
        f"in flight {core.get('in_flight_now', 0)} items on {core.get('busy_ranks_now', 0)} ranks",
        f"deferred {core.get('deferred_now', 0)}",
        f"parked {core.get('parked_ranks_now', 0)}",
    ]
    if rate is not None and rate > 0:
        parts.append(f"{rate:,.0f}/s")
        if left:
            parts.append(f"eta {left / rate:,.0f}s")
    health = stats.get("journal_health", {})
    if health.get("state", "OK") != "OK":
        parts.append(f"storage {health.get('state')}")
    return "  ".join(parts)


class ProgressLine:
    """Draws :func:`progress_text` on ``stream`` in place; call it with the stats dict, and
    :meth:`close` at the end."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.drawn = False
        self._first: tuple[float, int] | None = None

    def __call__(self, stats: Mapping[str, Any]) -> None:
        now = time.monotonic()
        done = int(stats.get("core", {}).get("commits", 0))
        if self._first is None:
            self._first = (now, done)
        t0, d0 = self._first
        rate = (done - d0) / (now - t0) if now > t0 else None
        try:
            self.stream.write("\r" + progress_text(stats, rate)[:200] + "\x1b[K")
            self.stream.flush()
            self.drawn = True
        except (OSError, ValueError):
            pass  # a closed terminal must not stop the campaign

    def close(self) -> None:
        """End the line (once), so that what follows starts on a clean line."""
        if self.drawn:
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self.drawn = False


def terminal_progress(stream: TextIO) -> ProgressLine | None:
    """A :class:`ProgressLine` on ``stream`` if it is a terminal, else None."""
    try:
        return ProgressLine(stream) if stream.isatty() else None
    except (AttributeError, ValueError):
        return None
