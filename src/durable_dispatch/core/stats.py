"""The dispatch core's statistics: the immutable snapshot it hands out (:class:`DispatchStats`:
its counters plus the gauges read at that moment) and the live counters it increments
(:data:`Counters`), made from the same field list.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import Any

from .decisions import Classification

__all__ = ["Counters", "DispatchStats"]

_GAUGE = {"gauge": True}


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
    ``item_failures`` counts items the worker reported failed (the function raised, its
    isolated child crashed or timed out), ``invalid_result_rollbacks`` the RESULTs that could
    not commit for what they were (malformed, missing, too large).
    ``starting_ranks_now`` counts ranks that have not said their first READY yet.
    ``node_lost_requeues`` counts items requeued uncharged because their node failed under
    them (their host lost several ranks at once), ``suspect_ranks_now`` the ranks of such a
    host that get no new work until they answer.
    ``master_pauses`` counts the gaps in the master's own turns that were not counted against
    the workers (it was stopped or blocked), ``master_paused_seconds`` their total length.
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
    item_failures: int = 0
    batch_splits: int = 0
    send_failures: int = 0
    ranks_lost: int = 0
    master_restart_rollbacks: int = 0
    node_lost_requeues: int = 0
    duplicate_commits_ignored: int = 0
    heartbeats: int = 0
    stale: Mapping[str, int] = field(default_factory=dict)
    unowned: Mapping[str, int] = field(default_factory=dict)
    malformed: Mapping[str, int] = field(default_factory=dict)
    duplicate: Mapping[str, int] = field(default_factory=dict)
    parked_ready_missing: int = 0
    parked_ready_malformed: int = 0
    parked_ready_other_token: int = 0
    operator_cancels: int = 0  # O1: items an operator cancelled while this master ran
    operator_cancelled_in_flight: int = 0  # of those, dispatches stopped in flight
    # the gauges, read when the snapshot is taken (not counters of the core)
    parked_ranks_now: int = field(default=0, metadata=_GAUGE)
    starting_ranks_now: int = field(default=0, metadata=_GAUGE)
    idle_ranks_now: int = field(default=0, metadata=_GAUGE)
    busy_ranks_now: int = field(default=0, metadata=_GAUGE)
    suspect_ranks_now: int = field(default=0, metadata=_GAUGE)
    in_flight_now: int = field(default=0, metadata=_GAUGE)
    pending_now: int = field(default=0, metadata=_GAUGE)
    deferred_now: int = field(default=0, metadata=_GAUGE)
    waiting_now: int = field(default=0, metadata=_GAUGE)
    cancelled_now: int = field(default=0, metadata=_GAUGE)
    auto_batch_now: int = field(default=1, metadata=_GAUGE)
    watchdog_enabled: bool = field(default=True, metadata=_GAUGE)
    watchdog_seconds: float = field(default=0.0, metadata=_GAUGE)
    watchdog_deadline_now: float = field(default=0.0, metadata=_GAUGE)
    config_corrections: int = field(default=0, metadata=_GAUGE)
    master_pauses: int = field(default=0, metadata=_GAUGE)
    master_paused_seconds: float = field(default=0.0, metadata=_GAUGE)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in vars(self).items()}


# ------------------------------------------------------------------------------- counters
def _by_class(self: Any, cls: Classification) -> Counter[str]:
    """The by-message-kind counter of a classification."""
    by: Counter[str] = getattr(self, _BY_CLASS[cls])
    return by


def _values(self: Any) -> dict[str, Any]:
    """Every counter by name (by-kind counters as plain dicts)."""
    out: dict[str, Any] = {}
    for f in fields(self):
        v = getattr(self, f.name)
        out[f.name] = dict(v) if isinstance(v, Counter) else v
    return out


_BY_CLASS = {
    Classification.STALE: "stale",
    Classification.UNOWNED: "unowned",
    Classification.MALFORMED: "malformed",
    Classification.DUPLICATE: "duplicate",
}

#: The core's live counters: a mutable dataclass made from the fields of
#: :class:`DispatchStats` that are not gauges (one field list), by-kind counters as ``Counter``.
#: A mistyped name is an AttributeError (slots), not a counter that silently stays zero.
Counters: type = make_dataclass(
    "Counters",
    [
        (f.name, "Counter[str]", field(default_factory=Counter))
        if f.default_factory is not MISSING
        else (f.name, f.type, field(default=f.default))
        for f in fields(DispatchStats)
        if not f.metadata.get("gauge")
    ],
    slots=True,
    namespace={"by_class": _by_class, "values": _values},
)
Counters.__module__ = __name__
Counters.__doc__ = "The core's live counters (see :data:`Counters`)."
