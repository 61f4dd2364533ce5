"""Watchdog and retry configuration, parsed by pure functions that report every correction.

The watchdog's seconds follow the rules of DESIGN.md section 3: the default is
``max(120, 4 x task timeout)``; the valid range is 0 to 86400; 0 disables the watchdog; NaN,
infinity and unparsable text fall back to the default; negatives clamp to 0; values over the range
clamp to 86400. Each such correction is returned as a :class:`Correction`, never applied silently.

Nothing here reads the environment: :meth:`WatchdogConfig.from_env` takes the mapping as an
argument, so the caller decides whether it is ``os.environ`` or a test's dict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigurationError

__all__ = [
    "WatchdogConfig",
    "RetryPolicy",
    "Correction",
    "parse_watchdog_seconds",
    "WATCHDOG_MAX",
    "ADAPTIVE_WINDOW",
    "DEFAULT_ENV_NAMES",
    "FAILURE_KINDS",
    "WORKER_FAILURE_KINDS",
]

WATCHDOG_MAX = 86400.0
#: The adaptive rule measures the last this many dispatches (``WatchdogConfig.quantile``).
ADAPTIVE_WINDOW = 1000
#: Default environment variable names read by :meth:`WatchdogConfig.from_env`.
DEFAULT_ENV_NAMES = {
    "watchdog": "DURABLE_DISPATCH_WATCHDOG_SEC",
    "task_timeout": "DURABLE_DISPATCH_TASK_TIMEOUT",
    "heartbeat_lease": "DURABLE_DISPATCH_HEARTBEAT_LEASE_SEC",
    "quantile": "DURABLE_DISPATCH_WATCHDOG_QUANTILE",
    "retries": "DURABLE_DISPATCH_PROTOCOL_RETRIES",
}
#: Failure kinds a worker may report for an item (each with its own budget; see docs/protocol.md,
#: "Failure kinds"): ``timeout`` (its deadline passed and the isolated child was killed), ``error``
#: (the function raised), ``crash`` (the isolated child died: a signal, or an exit),
#: ``result-too-large`` and ``malformed-result`` (its value cannot be sent or is not JSON).
WORKER_FAILURE_KINDS = ("timeout", "error", "crash", "result-too-large", "malformed-result")
#: Failure kinds the retry ledger knows, each with its own budget in :class:`RetryPolicy`: the
#: worker's, and the master's own findings (``missing-result``: READY without a RESULT;
#: ``send-failure``; ``lost-rank``: the rank failed, ULFM). A rollback after a master restart
#: (``master-restart``) is never charged, so it has no budget.
FAILURE_KINDS = (*WORKER_FAILURE_KINDS, "missing-result", "send-failure", "lost-rank")
#: Earlier names of failure kinds, still accepted in ``RetryPolicy(per_kind=...)``.
KIND_ALIASES = {"rank-lost": "lost-rank"}


@dataclass(frozen=True)
class Correction:
    """A configuration value that was not used as given.

    Attributes:
        name: the setting (an environment variable name or a field name).
        given: the value as given.
        used: the value used instead.
        reason: why (``"not a number"``, ``"negative"``, ``"over the maximum"`` ...).
    """

    name: str
    given: Any
    used: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.name}={self.given!r} is {self.reason}; using {self.used!r}"


def default_watchdog_seconds(task_timeout: float) -> float:
    """``max(120, 4 x task_timeout)``, kept within the valid range."""
    return min(WATCHDOG_MAX, max(120.0, 4.0 * task_timeout))


def parse_watchdog_seconds(
    value: object, task_timeout: float = 0.0, name: str = "watchdog"
) -> tuple[float, list[Correction]]:
    """Parse a watchdog setting by the rules in the module docs.

    Args:
        value: a number, a string, or None (not set: the default, no correction).
        task_timeout: the task timeout the default is derived from.
        name: the setting's name, for the corrections.

    Returns:
        The seconds to use (0 means disabled) and the corrections made.
    """
    default = default_watchdog_seconds(task_timeout)
    if value is None:
        return default, []
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, str):
            x = float(value.strip())
        elif isinstance(value, (int, float)):
            x = float(value)
        else:
            raise ValueError
    except ValueError:
        return default, [Correction(name, value, default, "not a number")]
    if math.isnan(x):
        return default, [Correction(name, value, default, "NaN")]
    if math.isinf(x):
        return default, [Correction(name, value, default, "infinite")]
    if x < 0:
        return 0.0, [Correction(name, value, 0.0, "negative (clamped to 0: disabled)")]
    if x > WATCHDOG_MAX:
        return WATCHDOG_MAX, [Correction(name, value, WATCHDOG_MAX, "over the maximum")]
    return x, []


def _parse_positive(value: object, default: float, name: str) -> tuple[float, list[Correction]]:
    if value is None:
        return default, []
    try:
        if isinstance(value, bool):
            raise ValueError
        x = float(value.strip()) if isinstance(value, str) else float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default, [Correction(name, value, default, "not a number")]
    if not math.isfinite(x) or x < 0:
        return default, [Correction(name, value, default, "not a finite non-negative number")]
    return x, []


@dataclass(frozen=True)
class WatchdogConfig:
    """Dispatch deadlines.

    The fixed rule (the default): an item without its own ``timeout`` gets ``seconds``. The
    adaptive rule (``quantile`` set): once ``min_samples`` dispatches have succeeded, it gets
    ``multiple`` times the ``quantile`` of the task times measured so far (the last 1,000
    successful dispatches of items without a timeout of their own, from the WORK send to its
    RESULT, divided by its items), never less than ``floor`` and never more than ``seconds``;
    until then, ``seconds``. When it first fits, a dispatch still in flight under the cap gets
    the fitted deadline too (unless a heartbeat extended it); an isolating worker was told the
    cap with that WORK, so its rank is parked until the worker kills the function there, while
    its item goes to another rank at once. Only successes are measured: an item the watchdog
    killed has no time to measure, so keep ``multiple`` well above 1.
    ``WatchdogConfig(120, quantile=0.99)`` follows task times of any scale with no tuning: once
    fitted, a hang costs 3 times the 99th percentile of task time instead of two minutes; during
    the warm-up it costs ``seconds``, so make that a true upper bound (docs/experiments.md
    measures both rules). Deadlines are never saved: a resumed master measures again,
    starting from ``seconds``.

    Attributes:
        seconds: the deadline after a WORK send returned (0: the watchdog is disabled); under the
            adaptive rule, the first deadline and the cap.
        heartbeat_lease: how far a current HEARTBEAT pushes the deadline (defaults to the
            deadline an item gets now: ``seconds``, or the adaptive deadline).
        corrections: every correction made while building this config (see :class:`Correction`).
        quantile: the adaptive rule's quantile of task time, in (0, 1) (None: the fixed rule).
        multiple: the adaptive deadline in multiples of that quantile (>= 1).
        floor: the adaptive deadline's lower bound in seconds (> 0; timer jitter, a child's start
            and a busy master must never look like a hang).
        min_samples: measured dispatches before the adaptive rule takes over (>= 1).
    """

    seconds: float = 120.0
    heartbeat_lease: float | None = None
    corrections: tuple[Correction, ...] = ()
    quantile: float | None = None
    multiple: float = 3.0
    floor: float = 1.0
    min_samples: int = 20

    def __post_init__(self) -> None:
        if not (isinstance(self.seconds, (int, float)) and 0 <= self.seconds <= WATCHDOG_MAX):
            raise ConfigurationError(
                f"watchdog seconds must be within 0..{WATCHDOG_MAX:g}, got {self.seconds!r}; use "
                "WatchdogConfig.build() to clamp and report",
                name="seconds",
            )
        lease = self.heartbeat_lease
        if lease is not None and not (
            isinstance(lease, (int, float)) and 0 < lease <= WATCHDOG_MAX
        ):
            raise ConfigurationError(
                f"heartbeat_lease must be within (0, {WATCHDOG_MAX:g}], got {lease!r}",
                name="heartbeat_lease",
            )
        q = self.quantile
        if q is not None and not (isinstance(q, (int, float)) and 0 < q < 1):
            raise ConfigurationError(f"quantile must be within (0, 1), got {q!r}", name="quantile")
        m, f = self.multiple, self.floor
        if not (isinstance(m, (int, float)) and math.isfinite(m) and m >= 1):
            raise ConfigurationError(f"multiple must be a number >= 1, got {m!r}", name="multiple")
        if not (isinstance(f, (int, float)) and math.isfinite(f) and f > 0):
            raise ConfigurationError(
                f"floor must be a number of seconds > 0, got {f!r}", name="floor"
            )
        if type(self.min_samples) is not int or not 1 <= self.min_samples <= ADAPTIVE_WINDOW:
            raise ConfigurationError(
                f"min_samples must be an integer within 1..{ADAPTIVE_WINDOW}, got "
                f"{self.min_samples!r}",
                name="min_samples",
            )

    @property
    def adaptive(self) -> bool:
        """True under the adaptive rule (``quantile`` set and the watchdog enabled)."""
        return self.quantile is not None and self.enabled

    @property
    def enabled(self) -> bool:
        """False when ``seconds`` is 0."""
        return self.seconds > 0

    @property
    def lease(self) -> float:
        """The configured heartbeat lease in seconds, else ``seconds`` (under the adaptive rule
        the core pushes by the fitted deadline instead: ``Dispatcher.lease_seconds``)."""
        return self.heartbeat_lease if self.heartbeat_lease is not None else self.seconds

    @classmethod
    def build(
        cls, seconds: object = None, *, task_timeout: float = 0.0, heartbeat_lease: object = None
    ) -> WatchdogConfig:
        """Build a config from loose values, clamping and reporting as the rules say."""
        s, corr = parse_watchdog_seconds(seconds, task_timeout, "seconds")
        lease: float | None = None
        if heartbeat_lease is not None:
            lease, c2 = _parse_positive(heartbeat_lease, s, "heartbeat_lease")
            corr += c2
            if lease == 0 or lease > WATCHDOG_MAX:
                used = s if s > 0 else None
                corr.append(Correction("heartbeat_lease", heartbeat_lease, used, "out of range"))
                lease = used
        return cls(s, lease, tuple(corr))

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], names: Mapping[str, str] | None = None
    ) -> WatchdogConfig:
        """Build from an environment mapping (the caller passes ``os.environ`` or a dict).

        Args:
            env: the variables.
            names: override :data:`DEFAULT_ENV_NAMES` keys ``watchdog``, ``task_timeout``,
                ``heartbeat_lease``, ``quantile`` (the adaptive rule; a value outside (0, 1)
                is a correction to the fixed rule).
        """
        n = {**DEFAULT_ENV_NAMES, **(names or {})}
        task, corr = _parse_positive(env.get(n["task_timeout"]), 0.0, n["task_timeout"])
        s, c2 = parse_watchdog_seconds(env.get(n["watchdog"]), task, n["watchdog"])
        corr += c2
        lease: float | None = None
        raw = env.get(n["heartbeat_lease"])
        if raw is not None:
            lease, c3 = _parse_positive(raw, s, n["heartbeat_lease"])
            corr += c3
            if lease == 0 or lease > WATCHDOG_MAX:
                used = s if s > 0 else None
                corr.append(Correction(n["heartbeat_lease"], raw, used, "out of range"))
                lease = used
        quantile: float | None = None
        raw = env.get(n["quantile"])
        if raw is not None:
            try:
                quantile = float(raw)
            except ValueError:
                quantile = None
            if quantile is None or not 0 < quantile < 1:
                corr.append(Correction(n["quantile"], raw, None, "not within (0, 1)"))
                quantile = None
        return cls(s, lease, tuple(corr), quantile=quantile)


@dataclass(frozen=True)
class RetryPolicy:
    """How many protocol retries a work ID gets before it is deferred.

    A work ID's failures are counted under its stable semantic ID (never its transport token).
    After a failure, with ``n`` failures so far, the item is requeued at the front of the frontier
    while ``n <= retries_for(kind)`` and deferred after that.

    Attributes:
        retries: the default budget (1: first failure requeued, second deferred).
        per_kind: budgets for particular failure kinds (see :data:`FAILURE_KINDS`).
    """

    retries: int = 1
    per_kind: Mapping[str, int] = field(default_factory=dict)
    #: What :meth:`from_env` had to correct (as :attr:`WatchdogConfig.corrections`).
    corrections: tuple[Correction, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ConfigurationError(f"retries must be an integer >= 0, got {self.retries!r}")
        if any(k in KIND_ALIASES for k in self.per_kind):
            renamed = {KIND_ALIASES.get(k, k): v for k, v in self.per_kind.items()}
            object.__setattr__(self, "per_kind", renamed)
        for k, v in self.per_kind.items():
            if k not in FAILURE_KINDS:
                raise ConfigurationError(f"unknown failure kind {k!r}; use one of {FAILURE_KINDS}")
            if not isinstance(v, int) or v < 0:
                raise ConfigurationError(f"retries for {k!r} must be an integer >= 0, got {v!r}")

    def retries_for(self, kind: str) -> int:
        """The retry budget for failures of ``kind``."""
        return self.per_kind.get(kind, self.retries)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], name: str = DEFAULT_ENV_NAMES["retries"]
    ) -> RetryPolicy:
        """A policy whose default budget is ``env[name]`` (an integer >= 0; else 1, reported in
        ``corrections``), like :meth:`WatchdogConfig.from_env`: pass it on as it is."""
        raw = env.get(name)
        if raw is None:
            return cls()
        try:
            n = int(raw.strip())
            if n < 0:
                raise ValueError
        except ValueError:
            return cls(corrections=(Correction(name, raw, 1, "not an integer >= 0"),))
        return cls(n)
