"""One view of a campaign: the numbers every face shows, computed once.

``durable-dispatch stats`` (text and ``--json``), ``watch`` (text and ``--json``), ``report``,
``joblog``, :class:`~durable_dispatch.mpi.master.MasterReport` and the demo's summary read a
:class:`CampaignView`, so the same number has the same name and value everywhere.

Where each number comes from:

* the durable counts (committed, deferred, pending, in flight) and the failure history
  (failures by kind, items that failed) from the campaign's ledger, replayed from the snapshot
  and the journal. The snapshot keeps the failure history, so compaction changes none of them;
* what only a running master knows (parked and lost ranks, storage health, the rate of this
  run, its allocation's end) from the statistics the master publishes every 2 s
  (``master-stats.*.snap``).

A master that is not running has nothing in flight: what its journal left in flight (a master
killed, or a drain cut short) runs again at the next start (a ``master-restart`` rollback), so it
counts as pending, and :attr:`CampaignView.interrupted` says how many of the pending those are.

:func:`campaign_view` is pure (it takes ``now``); :func:`read_view` reads a state directory
(read-only, safe beside a running master).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..core.drain import allocations_needed

__all__ = ["CampaignView", "campaign_view", "read_view", "RUNNING", "FINISHED", "STOPPED"]

#: :attr:`CampaignView.state` while a master holds the state directory.
RUNNING = "running"
#: no master runs, and nothing is pending or in flight (every item committed or deferred).
FINISHED = "finished"
#: no master runs and work is left: the next run resumes it.
STOPPED = "stopped"


@dataclass(frozen=True)
class CampaignView:
    """The campaign's numbers at one moment, one name per number.

    Attributes:
        directory: the state directory.
        state: :data:`RUNNING`, :data:`FINISHED` or :data:`STOPPED`.
        master_running: a master holds the state directory now.
        epoch: the newest master run's epoch (1 for the first run; 0 before any).
        work_items: every work item submitted (committed + deferred + cancelled + pending +
        waiting +
            in_flight).
        committed: items committed (each has its result, ``durable-dispatch results``).
        deferred: items set aside after their retries (``durable-dispatch deferred list``).
        pending: items waiting for a dispatch (including :attr:`interrupted`).
        in_flight: items dispatched and not yet answered (0 when no master runs).
        interrupted: of :attr:`pending`, the items a master that is not running left in flight
            (killed, or its drain cut short); they run again at the next start.
        waiting: items waiting for a dependency's commit (``WorkItem.after``): not
            pending yet, not failed.
        cancelled: items an operator cancelled (``durable-dispatch cancel``): final, never
            retried unless ``durable-dispatch retry`` puts them back.
        failures_by_kind: failures charged to items, by kind (``timeout``, ``error``,
            ``crash`` ...), over the campaign's life (kept by compaction).
        failed_items: items that failed at least once (committed later or not).
        duplicate_commits: second commits of a work ID found in the journal (ignored; 0).
        rate_per_s: items committed per second over the running master's run (None when no
            master runs or it has committed nothing yet).
        eta_seconds: pending and in-flight items over :attr:`rate_per_s` (None without a rate).
        allocation_ends_at: when the running master's allocation ends (a UNIX time, as it read
            it from the batch system or was given: ``run_master(ends_at=)``; None when no master
            runs or it knows no end).
        allocation_left_seconds: the time left until then (None likewise).
        allocations_needed: how many more allocations of this one's length the ETA needs
            beyond the time left (0 when it ends within this one; None without an ETA or end).
        parked_ranks: ranks parked now, waiting for their exact READY (None: no master runs).
        busy_ranks: ranks running a dispatch now (None: no master runs).
        lost_ranks: ranks lost in this run (None: no master runs).
        watchdog_expiries: dispatches the master's watchdog rolled back in this run (their items'
            failures are counted in :attr:`failures_by_kind` as ``timeout``; None: no master).
        deadline_seconds: the deadline an item without its own timeout gets now (None: no master).
        storage: ``"OK"``, or ``"DEGRADED"`` with the journals that hold records in memory only
            (as the master last published; None when it never did).
        commits_in_memory: commits accepted while the journal was degraded (not durable yet).
        storage_stalls: fsyncs of the newest master's run that took longer than the stall bound
            (``storage_stalls.bound_seconds`` in ``master_statistics``, 5 s), ongoing ones included.
        longest_stall_seconds: the longest of those so far (0.0 when there was none).
        master_host: the host of the newest master (running or not; None if it never published).
        master_pid: its process ID.
        master_started: when it started (wall-clock seconds), or None.
        master_age_seconds: how long it has run (running), or ran until its last statistics.
        heartbeat_age_seconds: how old its newest published statistics are.
        master_ended: how the newest master ended when none runs: ``"closed"`` (it closed the
            state: finished or drained) or ``"killed"`` (it never closed: SIGKILL, node lost);
            None while one runs or when none ever published.
        snapshot_generation: the snapshot the replay started from (None: none yet).
        journal_seq: the last journal sequence number read.
        as_of: when this view was computed (wall-clock seconds).
        open_ended: the campaign's items are what was submitted so far and its script may
            submit more (a futures executor's state directory): :attr:`work_items` is no final
            total, and there is no ETA.
    """

    directory: str
    state: str
    master_running: bool
    epoch: int
    work_items: int
    committed: int
    deferred: int
    pending: int
    in_flight: int
    interrupted: int
    waiting: int = 0
    cancelled: int = 0
    failures_by_kind: Mapping[str, int] = field(default_factory=dict)
    failed_items: int = 0
    duplicate_commits: int = 0
    rate_per_s: float | None = None
    eta_seconds: float | None = None
    allocation_ends_at: float | None = None
    allocation_left_seconds: float | None = None
    allocations_needed: int | None = None
    parked_ranks: int | None = None
    busy_ranks: int | None = None
    lost_ranks: int | None = None
    watchdog_expiries: int | None = None
    deadline_seconds: float | None = None
    storage: str | None = None
    commits_in_memory: int = 0
    storage_stalls: int = 0
    longest_stall_seconds: float = 0.0
    master_host: str | None = None
    master_pid: int | None = None
    master_started: float | None = None
    master_age_seconds: float | None = None
    heartbeat_age_seconds: float | None = None
    master_ended: str | None = None
    snapshot_generation: int | None = None
    journal_seq: int = -1
    as_of: float = 0.0
    open_ended: bool = False

    @property
    def finished(self) -> bool:
        """True when no master runs and every item is committed or deferred."""
        return self.state == FINISHED

    @property
    def left(self) -> int:
        """Items not done yet: pending, waiting and in flight."""
        return self.pending + self.waiting + self.in_flight

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field, in the order above, plus ``finished``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["failures_by_kind"] = dict(self.failures_by_kind)
        out["finished"] = self.finished
        return out


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _storage(stats: Mapping[str, Any]) -> str | None:
    """``"OK"``, or ``"DEGRADED: journal (3 records in memory), ..."`` from published health."""
    healths: dict[str, Mapping[str, Any]] = {}
    for name in ("journal", "submissions", "defer", "snapshot"):
        h = stats.get(f"{name}_health")
        if isinstance(h, Mapping):
            healths[name] = h
    if not healths:
        return None
    bad = []
    for name, h in healths.items():
        if h.get("state", "OK") != "OK":
            pending = h.get("pending") or 0
            bad.append(f"{name} ({pending} records in memory)" if pending else name)
    return "OK" if not bad else "DEGRADED: " + ", ".join(bad)


def _stalls(stats: Mapping[str, Any]) -> dict[str, Any]:
    """``storage_stalls`` and ``longest_stall_seconds`` from the published statistics."""
    s = stats.get("storage_stalls")
    if not isinstance(s, Mapping):
        return {}
    count = int(s["count"]) if type(s.get("count")) is int else 0
    ongoing = _num(s.get("ongoing_seconds")) or 0.0
    if ongoing <= (_num(s.get("bound_seconds")) or 0.0):
        ongoing = 0.0  # an fsync in progress, not (yet) a stall
    longest = max(_num(s.get("longest_seconds")) or 0.0, ongoing)
    return {"storage_stalls": count + (1 if ongoing else 0), "longest_stall_seconds": longest}


def campaign_view(
    ledger: Any,
    live: Mapping[str, Any] | None = None,
    *,
    running: bool,
    directory: str = "",
    now: float,
    snapshot_generation: int | None = None,
    journal_seq: int = -1,
    open_ended: bool = False,
) -> CampaignView:
    """The view of a campaign (pure: every input is an argument).

    Args:
        ledger: the campaign's :class:`~durable_dispatch.core.ledger.Ledger` (replayed, or the
            live core's).
        live: what the master publishes (``ts``, ``running``, ``pid``, ``host``, ``started``,
            ``stats``: ``CampaignStats.as_dict()``), or {} when it never did.
        running: a master holds the state directory now.
        directory: the state directory (shown).
        now: the wall-clock time the ages are measured at.
        snapshot_generation, journal_seq: where the replay started and ended (shown).
        open_ended: the script may submit more items (a futures executor's): no ETA.
    """
    live = live or {}
    stats: Mapping[str, Any] = live.get("stats") or {}
    core: Mapping[str, Any] = stats.get("core") or {}
    committed = len(ledger.committed)
    deferred = len(ledger.deferred)
    cancelled = len(getattr(ledger, "cancelled", ()))  # (a ledger of an earlier shape: none)
    flying = len(ledger.in_flight)
    pending = len(ledger.frontier)
    waiting = len(getattr(ledger, "waiting", ()))
    interrupted = 0
    if not running:  # nothing is in flight without a master: it runs again at the next start
        interrupted, pending, flying = flying, pending + flying, 0
    kinds: Counter[str] = Counter()
    failed = 0
    for ks in ledger.kinds.values():
        if ks:
            failed += 1
            kinds.update(k or "unknown" for k in ks)
    ts, started = _num(live.get("ts")), _num(live.get("started"))
    rate = eta = None
    age = None
    if started is not None:
        age = round(max(0.0, (now if running else (ts or now)) - started), 1)
    if running and started is not None and ts is not None and ts > started:
        commits = int(core.get("commits") or 0)
        if commits:
            rate = round(commits / (ts - started), 3)
            left = pending + waiting + flying
            eta = None if open_ended else round(left / rate, 1) if left else 0.0
    left = pending + waiting + flying
    ends_at = needed = time_left = None
    alloc = live.get("allocation")
    if running and isinstance(alloc, Mapping) and _num(alloc.get("ends_at")) is not None:
        ends_at = _num(alloc.get("ends_at"))
        assert ends_at is not None
        time_left = round(max(0.0, ends_at - now), 1)
        begun = _num(alloc.get("started")) or started
        if eta is not None and begun is not None:
            needed = allocations_needed(eta, time_left, ends_at - begun)
    if running:
        state = RUNNING
    else:
        state = FINISHED if left == 0 else STOPPED
    ended = None
    if not running and live:
        ended = "killed" if live.get("running") else "closed"

    def gauge(name: str) -> Any:
        return core.get(name) if running else None

    return CampaignView(
        directory=directory,
        state=state,
        master_running=running,
        epoch=int(ledger.epoch),
        work_items=committed + deferred + cancelled + pending + waiting + flying,
        committed=committed,
        deferred=deferred,
        pending=pending,
        in_flight=flying,
        interrupted=interrupted,
        waiting=waiting,
        cancelled=cancelled,
        failures_by_kind=dict(sorted(kinds.items())),
        failed_items=failed,
        duplicate_commits=int(ledger.duplicate_commits),
        rate_per_s=rate,
        eta_seconds=eta,
        allocation_ends_at=ends_at,
        allocation_left_seconds=time_left,
        allocations_needed=needed,
        parked_ranks=gauge("parked_ranks_now"),
        busy_ranks=gauge("busy_ranks_now"),
        lost_ranks=gauge("ranks_lost"),
        watchdog_expiries=gauge("dispatch_watchdog_timeouts"),
        deadline_seconds=gauge("watchdog_deadline_now"),
        storage=_storage(stats),
        commits_in_memory=int(stats.get("commits_in_memory") or 0),
        **_stalls(stats),
        master_host=live.get("host") if isinstance(live.get("host"), str) else None,
        master_pid=live.get("pid") if type(live.get("pid")) is int else None,
        master_started=started,
        master_age_seconds=age,
        heartbeat_age_seconds=round(max(0.0, now - ts), 1) if ts is not None else None,
        master_ended=ended,
        snapshot_generation=snapshot_generation,
        journal_seq=journal_seq,
        as_of=now,
        open_ended=open_ended,
    )


def view_of_state(v: Any, now: float | None = None) -> CampaignView:
    """The view of a :class:`~durable_dispatch.campaign.admin.StateView` (``view_state``'s
    result)."""
    return campaign_view(
        v.projection,
        v.live,
        running=v.master_running,
        directory=v.directory,
        now=time.time() if now is None else now,
        snapshot_generation=v.snapshot_generation,
        journal_seq=v.journal_seq,
        # a futures executor's directory (its secret, futures._seal.KEY_FILE): the script
        # submits as it goes, so the items so far are no final total
        open_ended=os.path.exists(os.path.join(v.directory, "futures.key")),
    )


def read_view(state_dir: str | os.PathLike[str], now: float | None = None) -> CampaignView:
    """The view of a state directory, read-only (no lock, nothing created; safe beside a
    running master).

    Raises:
        UsageError: not a state directory.
        JournalCorruptError, SnapshotCorruptError: damage found.
    """
    from ..campaign.admin import view_state

    return view_of_state(view_state(state_dir), now)
