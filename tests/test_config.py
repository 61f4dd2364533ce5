"""Tests of durable_dispatch.core.config: the watchdog rules of DESIGN.md section 3 and retries."""

from __future__ import annotations

import math

import pytest

from durable_dispatch.core.config import (
    DEFAULT_ENV_NAMES,
    WATCHDOG_MAX,
    RetryPolicy,
    WatchdogConfig,
    parse_watchdog_seconds,
)
from durable_dispatch.errors import ConfigurationError


@pytest.mark.parametrize(
    "given,task,expect,reason",
    [
        (None, 0, 120.0, None),
        (None, 60, 240.0, None),
        (None, 10**6, WATCHDOG_MAX, None),
        ("0", 0, 0.0, None),
        (0, 0, 0.0, None),
        ("300", 0, 300.0, None),
        (" 7.5 ", 0, 7.5, None),
        (86400, 0, 86400.0, None),
        ("-5", 0, 0.0, "negative (clamped to 0: disabled)"),
        (-0.1, 0, 0.0, "negative (clamped to 0: disabled)"),
        ("nan", 30, 120.0, "NaN"),
        (math.nan, 60, 240.0, "NaN"),
        ("inf", 0, 120.0, "infinite"),
        ("-inf", 0, 120.0, "infinite"),
        (math.inf, 0, 120.0, "infinite"),
        ("ten", 0, 120.0, "not a number"),
        ("", 0, 120.0, "not a number"),
        (True, 0, 120.0, "not a number"),
        ([1], 0, 120.0, "not a number"),
        ("1e9", 0, WATCHDOG_MAX, "over the maximum"),
        (10**30, 0, WATCHDOG_MAX, "over the maximum"),
    ],
)
def test_watchdog_rules(given: object, task: float, expect: float, reason: str | None) -> None:
    value, corrections = parse_watchdog_seconds(given, task)
    assert value == expect
    if reason is None:
        assert corrections == []
    else:
        assert len(corrections) == 1
        c = corrections[0]
        assert c.reason == reason and c.used == expect and c.given is given
        assert "using" in str(c)


def test_from_env_reads_the_named_variables_and_reports() -> None:
    env = {
        DEFAULT_ENV_NAMES["task_timeout"]: "100",
        DEFAULT_ENV_NAMES["watchdog"]: "NaN",
        DEFAULT_ENV_NAMES["heartbeat_lease"]: "30",
    }
    cfg = WatchdogConfig.from_env(env)
    assert cfg.seconds == 400 and cfg.lease == 30 and cfg.enabled
    assert [c.name for c in cfg.corrections] == [DEFAULT_ENV_NAMES["watchdog"]]
    custom = WatchdogConfig.from_env({"MY_WD": "0"}, names={"watchdog": "MY_WD"})
    assert custom.seconds == 0 and not custom.enabled and custom.corrections == ()
    bad_task = WatchdogConfig.from_env({DEFAULT_ENV_NAMES["task_timeout"]: "soon"})
    assert bad_task.seconds == 120 and len(bad_task.corrections) == 1


def test_build_and_direct_construction() -> None:
    assert WatchdogConfig.build("-3").seconds == 0
    assert WatchdogConfig.build(50, heartbeat_lease="x").lease == 50
    assert WatchdogConfig.build(50, heartbeat_lease=0).corrections
    with pytest.raises(ConfigurationError):
        WatchdogConfig(-1)
    with pytest.raises(ConfigurationError):
        WatchdogConfig(10, heartbeat_lease=0)
    assert WatchdogConfig(10).lease == 10


@pytest.mark.parametrize(
    "kw,name",
    [
        ({"quantile": 0}, "quantile"),
        ({"quantile": 1}, "quantile"),
        ({"quantile": 1.5}, "quantile"),
        ({"quantile": "0.9"}, "quantile"),
        ({"multiple": 0.5}, "multiple"),
        ({"multiple": math.inf}, "multiple"),
        ({"floor": 0}, "floor"),
        ({"floor": -1.0}, "floor"),
        ({"floor": math.nan}, "floor"),
        ({"min_samples": 0}, "min_samples"),
        ({"min_samples": 2.0}, "min_samples"),
        ({"min_samples": 1001}, "min_samples"),
    ],
)
def test_the_adaptive_rule_refuses_bad_settings_by_name(kw: dict, name: str) -> None:
    with pytest.raises(ConfigurationError, match=name) as e:
        WatchdogConfig(60, quantile=kw.pop("quantile", 0.99), **kw)
    assert e.value.name == name


def test_the_adaptive_rule_from_the_environment() -> None:
    q = DEFAULT_ENV_NAMES["quantile"]
    cfg = WatchdogConfig.from_env({q: "0.99"})
    assert cfg.quantile == 0.99 and cfg.adaptive and cfg.seconds == 120 and not cfg.corrections
    for bad in ("2", "often", "0"):
        cfg = WatchdogConfig.from_env({q: bad})
        assert cfg.quantile is None and not cfg.adaptive
        assert [(c.name, c.given, c.used) for c in cfg.corrections] == [(q, bad, None)]
    off = WatchdogConfig.from_env({q: "0.9", DEFAULT_ENV_NAMES["watchdog"]: "0"})
    assert off.quantile == 0.9 and not off.adaptive  # a disabled watchdog has no deadline to fit
    assert not WatchdogConfig(60).adaptive


def test_retry_policy() -> None:
    p = RetryPolicy(2, {"timeout": 0})
    assert p.retries_for("timeout") == 0 and p.retries_for("malformed-result") == 2
    with pytest.raises(ConfigurationError):
        RetryPolicy(-1)
    with pytest.raises(ConfigurationError):
        RetryPolicy(1, {"bogus": 1})
    with pytest.raises(ConfigurationError):
        RetryPolicy(1, {"timeout": -2})
    # Issue 14/15: from_env returns a policy (it returned a tuple, which the core choked on at
    # the first retry, AttributeError deep inside run_master).
    assert RetryPolicy.from_env({}) == RetryPolicy()
    pol = RetryPolicy.from_env({DEFAULT_ENV_NAMES["retries"]: "3"})
    assert isinstance(pol, RetryPolicy) and pol.retries == 3 and pol.corrections == ()
    pol = RetryPolicy.from_env({DEFAULT_ENV_NAMES["retries"]: "-1"})
    assert pol.retries == 1 and len(pol.corrections) == 1
    assert pol.retries_for("timeout") == 1  # usable by the core as it is


def test_a_policy_of_the_wrong_type_is_refused_at_once() -> None:
    """Issue 15: retry=RetryPolicy.from_env(...) used to be a tuple, failing at the first retry
    with an AttributeError inside the core; a wrong type is now a UsageError up front."""
    from durable_dispatch.core import Dispatcher
    from durable_dispatch.errors import UsageError

    with pytest.raises(UsageError, match="retry must be a RetryPolicy"):
        Dispatcher(retry=(RetryPolicy(), []))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="watchdog must be a WatchdogConfig"):
        Dispatcher(watchdog=30)  # type: ignore[arg-type]
