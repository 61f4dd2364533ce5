"""The sweep's plan: the cells of group 1 (task spread, hang rate, watchdog) and the seeded
items of a campaign (pure)."""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any


# ------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class Cell:
    """One setting of group 1."""

    sigma: float
    hang: float
    multiple: float | None  # the watchdog as a multiple of the median task time; None: off
    adaptive: bool = False  # the adaptive rule (ADAPTIVE) instead; ``multiple`` is ignored

    @property
    def label(self) -> str:
        if self.adaptive:
            return ADAPTIVE_LABEL
        return "off" if self.multiple is None else f"{self.multiple:g}x"


#: The adaptive rule as measured: the note's default (120 s) as its cap and first deadline,
#: then 3 x the measured 99th percentile of task time (``WatchdogConfig(120, quantile=0.99)``).
ADAPTIVE = {"seconds": 120.0, "quantile": 0.99, "multiple": 3.0, "min_samples": 10}
ADAPTIVE_LABEL = "p99x3"


def _unit(*parts: object) -> float:
    """A uniform number in [0, 1) from ``parts`` (stable across processes and runs)."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def make_plan(
    seed: int,
    n: int,
    *,
    median: float,
    sigma: float,
    hang: float,
    slow_rate: float,
    slow_factor: float,
    attempts: int,
) -> list[dict[str, Any]]:
    """The items of one campaign: ``{"work_id", "seconds", "hang": [attempt indices]}``.

    Task times are log-normal (``median`` · e^(σ·z)), a ``slow_rate`` fraction of items takes
    ``slow_factor`` times longer on every attempt, and each of an item's first ``attempts``
    attempts hangs with probability ``hang``, independently.
    """
    rnd = random.Random(seed)
    items = []
    for i in range(n):
        wid = f"x-{i:05d}"
        seconds = median * math.exp(sigma * rnd.gauss(0.0, 1.0))
        if _unit(seed, wid, "slow") < slow_rate:
            seconds *= slow_factor
        hung = [k for k in range(attempts) if _unit(seed, wid, "hang", k) < hang]
        items.append({"work_id": wid, "seconds": round(seconds, 6), "hang": hung})
    return items
