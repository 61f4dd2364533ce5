"""Means with 95% confidence intervals (Student's t), and spreads: the statistics every
figure of the experiments is reported with (pure)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# ------------------------------------------------------------------ statistics (pure)
#: Two-sided 95% critical values of Student's t by degrees of freedom (any table; e.g. NIST's
#: Engineering Statistics Handbook, 1.3.6.7.2). Beyond 30 the normal value is within 2%.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t_critical(df: int) -> float:
    """The two-sided 95% critical value of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    return statistics.NormalDist().inv_cdf(0.975)


@dataclass(frozen=True)
class Estimate:
    """A mean over ``n`` runs and the half-width of its 95% confidence interval (None for one
    run: a single run has no spread to estimate)."""

    mean: float
    half: float | None
    n: int

    def text(self, digits: int = 2) -> str:
        """``mean ± half`` (or the mean alone for a single run)."""
        if self.half is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half:.{digits}f}"


def mean_ci(values: Iterable[float]) -> Estimate:
    """The mean of ``values`` with a 95% confidence interval: mean ± t(0.975, n-1)·s/√n, with
    ``s`` the sample standard deviation. Runs are independent (one seed each).

    Raises:
        ValueError: no values.
    """
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("no values")
    m = statistics.fmean(xs)
    if len(xs) == 1:
        return Estimate(m, None, 1)
    return Estimate(m, t_critical(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs)), len(xs))


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, 95th percentile (the inclusive method: it stays within the data) and max."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    p95 = statistics.quantiles(xs, n=20, method="inclusive")[18] if len(xs) > 1 else xs[0]
    return {"median": statistics.median(xs), "p95": p95, "max": xs[-1]}
