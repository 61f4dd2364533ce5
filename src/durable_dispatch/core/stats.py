"""The dispatch core's statistics: the live counters it increments (:class:`Counters`) and the
immutable snapshot it hands out (:class:`DispatchStats`: the counters plus the gauges read at
that moment).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .decisions import Classification

__all__ = ["Counters", "DispatchStats"]


# -------------------------------------------------------------------------------- counters
@dataclass(slots=True)
class Counters:
    """The core's counters; each field is the :class:`DispatchStats` field of the same name (a
    mistyped name is an AttributeError, not a counter that silently stays zero)."""

    dispatches: int = 0
    dispatched_items: int = 0
    commits: int = 0
    dispatch_watchdog_timeouts: int = 0
    watchdog_worker_recoveries: int = 0
    protocol_requeued_dispatches: int = 0
    protocol_deferred_dispatches: int = 0
    deferred_in_memory: int = 0
    invalid_result_rollbacks: int = 0
    batch_splits: int = 0
    send_failures: int = 0
    ranks_lost: int = 0
    master_restart_rollbacks: int = 0
    duplicate_commits_ignored: int = 0
    heartbeats: int = 0
    parked_ready_missing: int = 0
    parked_ready_malformed: int = 0
    parked_ready_other_token: int = 0
    # by message kind ("RESULT", "READY", "HEARTBEAT"), one per Classification not CURRENT
    stale: Counter[str] = field(default_factory=Counter)
    unowned: Counter[str] = field(default_factory=Counter)
    malformed: Counter[str] = field(default_factory=Counter)
    duplicate: Counter[str] = field(default_factory=Counter)

    def by_class(self, cls: Classification) -> Counter[str]:
        """The by-message-kind counter of a classification."""
        return {
            Classification.STALE: self.stale,
            Classification.UNOWNED: self.unowned,
            Classification.MALFORMED: self.malformed,
            Classification.DUPLICATE: self.duplicate,
        }[cls]

    def values(self) -> dict[str, Any]:
        """Every counter by name (by-kind counters as plain dicts)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = dict(v) if isinstance(v, Counter) else v
        return out


@dataclass(frozen=True)
class DispatchStats:
    """An immutable snapshot of the core's counters (all zero in a campaign with no faults,
    except the work counters ``dispatches`` and ``commits`` and the gauges).

    Counters by message kind (``stale``, ``unowned``, ``malformed``, ``duplicate``) are dicts
    keyed ``"RESULT"``, ``"READY"``, ``"HEARTBEAT"``. ``dispatches`` counts WORK messages
    (tokens), ``dispatched_items`` the work items they carried, ``commits`` committed work items,
    and ``batch_splits`` items requeued uncharged because their multi-item dispatch failed as a
    whole. The ``*_now`` fields are gauges: ``in_flight_now`` counts work *items* in flight
    (a multi-item dispatch's items, and items whose commit is still being made durable while
    their rank already took new work), ``busy_ranks_now`` the ranks running a dispatch, and
    ``watchdog_deadline_now`` the deadline an item without its own timeout gets now (the
    watchdog's seconds, or the adaptive rule's fitted deadline; 0 when the watchdog is off).
    ``starting_ranks_now`` counts ranks that have not said their first READY yet.
    ``master_pauses`` counts the gaps in the master's own turns that were not counted against
    the workers (U7: it was stopped or blocked), ``master_paused_seconds`` their total length.
    """

    dispatches: int = 0
    dispatched_items: int = 0
    commits: int = 0
    dispatch_watchdog_timeouts: int = 0
    watchdog_worker_recoveries: int = 0
    protocol_requeued_dispatches: int = 0
    protocol_deferred_dispatches: int = 0
    deferred_in_memory: int = 0
    invalid_result_rollbacks: int = 0
    batch_splits: int = 0
    send_failures: int = 0
    ranks_lost: int = 0
    master_restart_rollbacks: int = 0
    duplicate_commits_ignored: int = 0
    heartbeats: int = 0
    stale: Mapping[str, int] = field(default_factory=dict)
    unowned: Mapping[str, int] = field(default_factory=dict)
    malformed: Mapping[str, int] = field(default_factory=dict)
    duplicate: Mapping[str, int] = field(default_factory=dict)
    parked_ready_missing: int = 0
    parked_ready_malformed: int = 0
    parked_ready_other_token: int = 0
    parked_ranks_now: int = 0
    starting_ranks_now: int = 0
    idle_ranks_now: int = 0
    busy_ranks_now: int = 0
    in_flight_now: int = 0
    pending_now: int = 0
    deferred_now: int = 0
    auto_batch_now: int = 1
    watchdog_enabled: bool = True
    watchdog_seconds: float = 0.0
    watchdog_deadline_now: float = 0.0
    config_corrections: int = 0
    master_pauses: int = 0
    master_paused_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in vars(self).items()}
