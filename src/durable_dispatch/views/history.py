"""A campaign's history as the journals tell it (read-only): the master runs, every dispatch
attempt (which rank ran which items, from when to when, and how it ended), the commits, and the
ranks parked. ``report`` draws it and ``joblog`` lists it.

What it reads: the state journal ``events.jsonl`` and the results journal ``results.jsonl``
(compaction moves committed records there with their time, the rank, and the time of their
dispatch). Events carry their wall-clock time (``ts``); an event without one takes the time of the
nearest earlier event that has one. Dispatches, requeues and deferrals that a compaction folded
into the snapshot are gone from the journals: their failure *counts* are kept in the snapshot
(see :mod:`~durable_dispatch.views.view`), their times are not.

A master's run ends at its last record. What it left in flight then is ``interrupted``: the next
run rolls it back and dispatches it again. A run with a master still running ends now. Parked
ranks are not durable facts (the journal has no record of them): a rank counts as parked from the
timeout or failed send that parked it until its next dispatch or the end of its run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import events
from ..cost import Cost
from ..tokens import Token

__all__ = ["Attempt", "Run", "History", "read_history", "INTERRUPTED", "IN_FLIGHT", "COMMITTED"]

#: :attr:`Attempt.outcome` of a dispatch whose items committed.
COMMITTED = "committed"
#: :attr:`Attempt.outcome` of a dispatch still running (its master runs).
IN_FLIGHT = "in flight"
#: :attr:`Attempt.outcome` of a dispatch its master left in flight when it ended.
INTERRUPTED = "interrupted"


@dataclass(slots=True)
class Attempt:
    """One dispatch: ``work_ids`` sent to ``rank`` under ``token`` at ``start``; it ended at
    ``end`` (None while in flight) with ``outcome``: :data:`COMMITTED`, a failure kind
    (``timeout``, ``crash``, ``error`` ...), ``batch split``, :data:`INTERRUPTED` or
    :data:`IN_FLIGHT`; ``error`` is the failure's text; ``host`` the host its rank named in
    that run's first READY (None: not recorded, as by a version before the joblog's host);
    ``costs`` what each item's attempt cost, by work ID, when its worker said (a
    :class:`~durable_dispatch.cost.Cost`; None: nothing said)."""

    work_ids: tuple[str, ...]
    rank: int | None
    token: str | None
    epoch: int | None
    start: float | None
    end: float | None = None
    outcome: str = IN_FLIGHT
    error: str | None = None
    open_items: int = 0
    failed: str | None = None
    host: str | None = None
    costs: dict[str, Cost] | None = None

    def seconds(self, now: float) -> float | None:
        """How long it ran (until ``now`` while in flight), or None without a start time."""
        if self.start is None:
            return None
        return max(0.0, (self.end if self.end is not None else now) - self.start)


@dataclass(slots=True)
class Run:
    """One master run: its ``epoch``, its first and last record's time, and whether it is the
    running master's (``open``: it ends now)."""

    epoch: int
    start: float
    end: float
    open: bool = False


@dataclass
class History:
    """What :func:`read_history` found (see the module docs).

    Attributes:
        runs: the master runs with a time, oldest first.
        attempts: every dispatch attempt found, in dispatch order.
        last: work ID -> its newest attempt (and, per item, that attempt's outcome in ``item``).
        item: work ID -> ``(outcome, error, end)`` of its newest attempt for that item.
        commits: ``(ts, items)`` of each commit (each work ID once).
        deferred_changes: ``(ts, +1 | -1)``: an item deferred, or requeued from deferred.
        parks: ``(rank, from, to)`` for each time a rank was parked.
        now: the time open runs and attempts end at.
        drained: the epochs of the runs an operator drained (``durable-dispatch drain``).
    """

    runs: list[Run] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    last: dict[str, Attempt] = field(default_factory=dict)
    item: dict[str, tuple[str, str | None, float | None]] = field(default_factory=dict)
    commits: list[tuple[float, int]] = field(default_factory=list)
    deferred_changes: list[tuple[float, int]] = field(default_factory=list)
    parks: list[tuple[int, float, float]] = field(default_factory=list)
    now: float = 0.0
    drained: set[int] = field(default_factory=set)

    @property
    def start(self) -> float | None:
        """The first run's start, or None when the journals hold no time."""
        return self.runs[0].start if self.runs else None

    @property
    def end(self) -> float | None:
        """The last run's end, or None."""
        return self.runs[-1].end if self.runs else None


#: what :func:`_records` yields: the record's time, its event (None for an event kind of a
#: later version), the moved result it is (None for a state-journal record), and the record
Decoded = tuple[float | None, "events.Event | None", "events.MovedResult | None", Mapping[str, Any]]


def _records(d: str) -> Iterator[Decoded]:
    """Every state-journal record and every moved result the state journal no longer holds,
    in sequence order, each decoded by :mod:`durable_dispatch.core.events`.

    Raises:
        JournalCorruptError: a record does not match its event's schema.
    """
    from ..campaign.statedir import RESULT_RECORD_BYTES, RESULTS_JOURNAL, STATE_JOURNAL
    from ..errors import JournalCorruptError
    from ..schema import Invalid
    from ..storage.journal import read_journal

    def bad(path: str, seq: int, e: Invalid) -> JournalCorruptError:
        return JournalCorruptError(
            f"{path}: invalid record (seq {seq}): {e}", path=path, reason=str(e)
        )

    out: dict[int, Decoded] = {}
    rpath = os.path.join(d, RESULTS_JOURNAL)
    if os.path.exists(rpath):
        for r in read_journal(rpath, max_record_bytes=RESULT_RECORD_BYTES):
            try:
                m = events.decode_moved(r.payload)
            except Invalid as e:
                raise bad(rpath, r.seq, e) from None
            out[m.seq] = (events.record_time(r.payload), m.commit, m, r.payload)
    jpath = os.path.join(d, STATE_JOURNAL)
    if os.path.exists(jpath):
        for r in read_journal(jpath):
            p = r.payload
            try:
                # (a submission's items are not needed here: a stored one is read without them)
                ev = None if type(p) is dict and p.get("event") == "submitted" else events.decode(p)
            except Invalid as e:
                raise bad(jpath, r.seq, e) from None
            out[r.seq] = (events.record_time(p), ev, None, p)
    for k in sorted(out):
        yield out[k]


def _note_costs(att: Attempt, rec: Mapping[str, Any], ids: tuple[str, ...]) -> None:
    """Keep the costs a ``committed``, ``requeued`` or ``deferred`` record carries in ``att``."""
    found = events.record_costs(rec, ids)
    if found is None:
        return
    if att.costs is None:
        att.costs = {}
    att.costs.update(found)


class _Builder:
    def __init__(self, now: float, running: bool) -> None:
        self.h = History(now=now)
        self.running = running
        self.runs: dict[int, Run] = {}
        self.epoch = 0
        self.open: dict[str, Attempt] = {}
        self.parked: dict[int, float] = {}
        self.done: set[str] = set()
        self.hosts: dict[int, str] = {}  # rank -> host, in the current run

    def _touch(self, epoch: int, ts: float) -> None:
        run = self.runs.get(epoch)
        if run is None:
            self.runs[epoch] = Run(epoch, ts, ts)
        else:
            run.start, run.end = min(run.start, ts), max(run.end, ts)

    def _end_run(self, epoch: int) -> None:
        """Run ``epoch`` is over: what it left in flight was interrupted, its parks end."""
        run = self.runs.get(epoch)
        end = run.end if run is not None else None
        for tok, att in list(self.open.items()):
            if att.epoch == epoch or att.epoch is None:
                att.end, att.outcome = end if end is not None else att.start, INTERRUPTED
                for w in att.work_ids:
                    if self.h.last.get(w) is att and w not in self.done:
                        self.h.item[w] = (INTERRUPTED, None, att.end)
                del self.open[tok]
        for rank, t0 in list(self.parked.items()):
            self.h.parks.append((rank, t0, end if end is not None else t0))
            del self.parked[rank]

    def event(
        self,
        ts: float,
        ev: events.Event | None,
        moved: events.MovedResult | None,
        rec: Mapping[str, Any],
    ) -> None:
        if type(ev) is events.EpochStarted:
            self._end_run(self.epoch)
            self.epoch = ev.epoch
            self._touch(self.epoch, ts)
            self.hosts.clear()
            return
        token: Token | None = getattr(ev, "token", None)
        epoch = token.epoch if token is not None else None
        # A record belongs to the run that wrote it: the current one. Only a result moved by a
        # compaction whose run's records were folded takes its run from its token.
        later = moved is not None and epoch is not None and epoch > self.epoch
        self._touch(epoch if later and epoch is not None else self.epoch, ts)
        if type(ev) is events.Dispatched:
            ids, rank = ev.work_ids, ev.rank
            att = Attempt(ids, rank, str(token), epoch, ts, open_items=len(ids))
            att.host = self.hosts.get(rank)
            self.h.attempts.append(att)
            self.open[str(token)] = att
            for w in ids:
                self.h.last[w] = att
                self.h.item[w] = (IN_FLIGHT, None, None)
            if rank in self.parked:
                self.h.parks.append((rank, self.parked.pop(rank), ts))
        elif type(ev) is events.Committed:
            every = ev.work_ids
            ids = tuple(w for w in every if w not in self.done)
            self.done.update(ids)
            if ids:
                self.h.commits.append((ts, len(ids)))
            found = self.open.get(str(token))
            if found is not None:
                att = found
            else:  # a result moved by compaction: its dispatch is folded
                started = moved.started if moved is not None else None
                name = str(token) if token is not None else None
                att = Attempt(ids, ev.rank, name, epoch, started, ts)
                att.outcome = COMMITTED
                att.host = moved.host if moved is not None else None
                self.h.attempts.append(att)
                for w in ids:
                    self.h.last[w] = att
            for w in ids:
                self.h.item[w] = (COMMITTED, None, ts)
            _note_costs(att, rec, every)
            self._close(att, len(ids), ts, COMMITTED, None)
        elif type(ev) is events.Requeued or type(ev) is events.Deferred:
            w = ev.work_id
            if type(ev) is events.Deferred:
                self.h.deferred_changes.append((ts, 1))
            if ev.source == "master-restart":
                return  # its attempt ended with its run (interrupted)
            if isinstance(ev, events.Requeued):
                why = "batch split" if ev.split else ev.kind or "unknown"
                error = ev.error or None  # (the event reads a missing error as "")
            else:
                why = ev.kinds[-1] if ev.kinds else "unknown"
                error = ev.last_error or None
            failed = self.open.get(str(token))
            if failed is not None and w in failed.work_ids:
                att = failed
                _note_costs(att, rec, (w,))
                if self.h.last.get(w) is att:
                    self.h.item[w] = (why, error, ts)
                if ev.source in ("watchdog-timeout", "send-failure") and att.rank is not None:
                    self.parked.setdefault(att.rank, ts)
                self._close(att, 1, ts, why, error)
        elif type(ev) is events.RequeuedDeferred:
            self.h.deferred_changes.append((ts, -1))
        elif type(ev) is events.CommandApplied and ev.op == "drain":
            self.h.drained.add(self.epoch)
        elif type(ev) is events.WorkerHost:
            self.hosts[ev.rank] = ev.host

    def _close(self, att: Attempt, n: int, ts: float, outcome: str, error: str | None) -> None:
        """``n`` items of ``att`` ended at ``ts`` with ``outcome``; a failed item marks the
        whole dispatch with its failure; the dispatch ends with its last item."""
        if att.end is not None:
            return
        if outcome != COMMITTED and att.failed is None:
            att.failed, att.error = outcome, error
        att.open_items -= n
        if att.open_items <= 0:
            att.end = ts
            att.outcome = att.failed or COMMITTED
            if att.token is not None:
                self.open.pop(att.token, None)

    def finish(self) -> History:
        if self.running and self.epoch in self.runs:
            run = self.runs[self.epoch]
            run.end, run.open = max(run.end, self.h.now), True
            for rank, t0 in self.parked.items():
                self.h.parks.append((rank, t0, run.end))
            for att in self.open.values():
                att.outcome = IN_FLIGHT
        else:
            self._end_run(self.epoch)
        self.h.runs = sorted(self.runs.values(), key=lambda r: (r.start, r.epoch))
        return self.h


def read_history(state_dir: str | os.PathLike[str], *, now: float, running: bool) -> History:
    """The history of a state directory (read-only; see the module docs). ``now``: when the
    running master's run and its open dispatches end; ``running``: a master runs now.

    Raises:
        JournalCorruptError: damage in one of the journals (before their torn tails).
    """
    b = _Builder(now, running)
    last_ts: float | None = None
    waiting: list[Decoded] = []
    for ts, ev, moved, rec in _records(os.fspath(state_dir)):
        if ts is not None:
            last_ts = ts
            for q in waiting:  # records before the first timed one take its time
                b.event(ts, q[1], q[2], q[3])
            waiting.clear()
            b.event(ts, ev, moved, rec)
        elif last_ts is None:
            waiting.append((ts, ev, moved, rec))
        else:
            b.event(last_ts, ev, moved, rec)
    return b.finish()
