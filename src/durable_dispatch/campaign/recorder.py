"""The core's decisions persisted before the shell acts on them.

Every decision that changes the durable state is journaled before the shell acts on it: a
dispatch before its WORK is sent, a requeue, a deferral (also to the defer journal), a snapshot
the core asks for. The Commits of one dispatch are journaled as one ``committed`` record (a few
when one would exceed the record bound; a result too large for any record is refused and
retried) and handed to the delivery queue (:class:`~.delivery.Deliveries`), which the delivery
point empties once an fsync covers them. No user code runs here: what a decision must tell a
hook (``on_defer``) is queued for the delivery point.

What each attempt cost (a worker's RESULT says, :mod:`.costs`) is held here until the item's
outcome is journaled, which then carries it: informational, replay ignores it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

from ..core import Commit, Commits, Decision, Defer, Dispatcher, PersistSnapshot, Requeue, Send
from ..core.events import Committed, of_decision
from ..errors import RecordTooLargeError, StorageDegradedError
from ..storage import DeferJournal, Journal
from ..tokens import Token
from .costs import CostTable, cost_entries, record_members
from .delivery import Deliveries
from .dependencies import DependencyResults
from .logs import log_decisions
from .outputs import Outputs, output_record

__all__ = ["Recorder", "record_deferral"]

log = logging.getLogger("durable_dispatch.state")

_COMMIT = {Commit}
_token_of = attrgetter("token")
_COSTS_HELD = 4096  # dispatches whose costs wait for their items' outcomes, at most


class Recorder:
    """Persists the core's decisions (see the module docs)."""

    def __init__(
        self,
        journal: Journal,
        defer: DeferJournal,
        core: Dispatcher,
        deliveries: Deliveries,
        dependencies: DependencyResults,
        outputs: Callable[[], Outputs],
        save_snapshot: Callable[[str], bool],
        deferred: Callable[[Defer], None],
    ) -> None:
        self._journal = journal
        self._defer = defer
        self._core = core
        self._deliveries = deliveries
        self._dependencies = dependencies
        self._save_snapshot = save_snapshot
        self._deferred = deferred  # told of each deferral once it is recorded
        self._open_outputs = outputs
        self._outputs: Outputs | None = None  # the items' outputs journal, opened at the first
        #: token -> work ID -> what that attempt cost, or a table, until its outcome is journaled
        self._costs: dict[Token, dict[str, Any] | CostTable] = {}

    # ------------------------------------------------------ persist before you act
    def record_send(self, send: Send) -> None:
        """Journal a dispatch before its WORK is sent: one record for all its items."""
        self._journal_event_of(send)

    def apply(self, decisions: Iterable[Decision]) -> list[Decision]:
        """Persist each decision that changes durable state, in order; returns them all.

        * :class:`Commit` / :class:`Commits`: journal it (the commits of one dispatch, which the
          core returns next to each other or as one ``Commits``, as one record) and queue it
          for the delivery point, which closes it in the core once an fsync covers it and
          then hands it to the callback.
        * :class:`Requeue` / :class:`Defer`: journal it; a Defer is appended to the defer journal
          and its outcome (on disk or in memory) reported to the core; ``on_defer`` is queued.
        * :class:`PersistSnapshot`: write the snapshot now.
        """
        out = list(decisions)
        if not out:
            return out
        first = out[0]
        kind = type(first)
        commits = len(out) == 1 and (kind is Commit or kind is Commits)
        if commits:  # the answer to a RESULT: one Commit, or a dispatch's Commits (columns)
            one = first if kind is Commits else Commits.of(out)  # type: ignore[arg-type]
            refused = self._journal_commits(one)  # type: ignore[arg-type]
        elif (
            kind is Commit and set(map(type, out)) == _COMMIT and len(set(map(_token_of, out))) == 1
        ):  # the commits of one dispatch, one by one (C-level passes): one record
            commits = True
            refused = self._journal_commits(Commits.of(out))  # type: ignore[arg-type]
        else:
            refused = self._persist_each(out)
        log_decisions(out, quiet=commits)  # (Commits are logged at DEBUG)
        if refused:
            out += self.apply(refused)
        return out

    def _persist_each(self, out: list[Decision]) -> list[Decision]:
        """:meth:`apply`'s persist step for any mix of decisions; returns the decisions of the
        commits the journal refused (a result too large for a record)."""
        refused: list[Decision] = []
        group: list[Commit] = []
        for i, d in enumerate(out):
            if isinstance(d, Commit):
                group.append(d)
                nxt = out[i + 1] if i + 1 < len(out) else None
                if not isinstance(nxt, Commit) or nxt.token != d.token:
                    refused += self._journal_commits(Commits.of(group))
                    group = []
            elif isinstance(d, Commits):
                refused += self._journal_commits(d)
            elif isinstance(d, Requeue):
                self._journal_event_of(d, self._cost_of(d.token, d.work_id))
            elif isinstance(d, Defer):
                w = d.work
                cost = self._cost_of(d.token, w.work_id)
                self._journal_event_of(d, cost)
                try:
                    persisted = record_deferral(
                        self._defer,
                        w,
                        attempts=d.attempts,
                        kinds=d.kinds,
                        last_error=d.last_error,
                        traceback=d.traceback,
                        cost=cost,
                    )
                except StorageDegradedError:
                    persisted = False
                self._core.defer_recorded(w.work_id, persisted)
                self._deferred(d)
                # what waits for it is deferred too, after it (persisted next, as refused
                # commits' decisions are)
                refused += self._core.ended_without_commit(w.work_id)
            elif isinstance(d, PersistSnapshot):
                self._save_snapshot(d.reason)
        return refused

    def _journal_event_of(self, d: Decision, cost: dict[str, Any] | None = None) -> None:
        """Journal the event the core applied to its ledger for decision ``d`` (one encoding:
        replay decodes it into the same ledger change), with the wall-clock time it happened
        (``ts``: informational, for ``durable-dispatch report``; replay ignores it) and what
        the attempt cost, when its worker said (``cost``: informational too)."""
        ev = of_decision(d)  # (a Send's own event: the one the core applied)
        assert ev is not None, d
        rec = ev.encode()
        rec["ts"] = time.time()
        if cost is not None:
            rec["cost"] = cost
        self._journal.append(rec)

    # ------------------------------------------------------------------ costs
    def note_usage(self, token: Token, costs: Any, outputs: Any) -> None:
        """What the items of the current dispatch ``token`` cost and wrote (a RESULT's ``costs``
        and ``outputs``, a worker's word: each entry checked before it is kept): the costs held
        until each item's outcome is journaled; the outputs appended to the outputs journal now
        (:mod:`.outputs`: written in the background, never waited for)."""
        if type(outputs) is dict:
            ts = time.time()
            for w, entry in outputs.items():
                if type(w) is str and (rec := output_record(w, str(token), entry, ts)):
                    if self._outputs is None:
                        self._outputs = self._open_outputs()
                    self._outputs.append(rec)
        if type(costs) is dict and (clean := cost_entries(costs)):
            self._hold_costs(token, clean)

    def close(self) -> None:
        """Close the outputs journal (never raises: the outputs are diagnostics)."""
        if self._outputs is not None:
            self._outputs.close()
            self._outputs = None

    def _hold_costs(self, token: Token, clean: dict[str, Any] | CostTable) -> None:
        """Hold what the items of dispatch ``token`` cost (checked entries, :mod:`.costs`) until
        each item's outcome is journaled."""
        held = self._costs
        got = held.get(token)
        if got is not None:  # (parts of one dispatch: one by work ID)
            merged = dict(got.items())
            merged.update(clean.items())
            held[token] = merged
            return
        if len(held) > _COSTS_HELD:  # (a token whose items never ended: dropped, oldest)
            del held[next(iter(held))]
        held[token] = clean

    def _cost_of(self, token: Token | None, work_id: str) -> dict[str, Any] | None:
        """What the attempt of ``work_id`` under ``token`` cost, taken."""
        if not self._costs or token is None:
            return None
        costs = self._costs.get(token)
        if costs is None:
            return None
        c: dict[str, Any] | None = costs.pop(work_id, None)
        if not costs:
            del self._costs[token]
        return c

    # ------------------------------------------------------------ the commits
    def _journal_commits(self, commits: Commits) -> list[Decision]:
        """One ``committed`` record for the commits of one dispatch (its columns), or several
        when one would exceed the journal's record bound. A single result too large for any
        record is refused: the core retries that item (returns its decisions)."""
        wids = commits.work_ids
        ev = Committed(commits.token, commits.rank, wids, tuple(commits.results), time.time())
        rec = ev.encode()
        costs = self._costs.get(commits.token) if self._costs and commits.token else None
        table = None
        if costs:  # what each attempt cost: informational, replay ignores it
            rec.update(record_members(costs, wids))
            table = rec.get("cost_table")
        try:
            try:
                r = self._journal.append(rec)
            except RecordTooLargeError:
                if len(wids) > 1 or rec.pop("cost", None) is None:
                    raise  # (several: split below, each half with its costs)
                # what it cost is the library's word, the result the user's: a record that
                # holds the result without it keeps the result (its cost reads blank)
                log.warning("commit of %s recorded without its cost (too large)", wids[0])
                r = self._journal.append(rec)
        except RecordTooLargeError as e:
            if len(wids) > 1:
                half = len(wids) // 2
                return self._journal_commits(commits[:half]) + self._journal_commits(commits[half:])
            log.error("result of %s cannot be journaled: %s", wids[0], e)
            why = f"result too large: {e}"
            if commits.part:  # sent ahead of its dispatch: the item takes the retry path
                return self._core.part_refused(commits.token, wids[0], why)
            return self._core.commit_refused(commits.token, wids[0], why)
        if costs:
            if table is None:
                for w in wids:
                    costs.pop(w, None)
            if table is not None or not costs:
                del self._costs[commits.token]
        self._dependencies.note_commits(commits)  # (keeps what a dependent needs)
        self._deliveries.add(r.seq, commits.token, commits)
        return []


def record_deferral(
    defer: DeferJournal,
    work: Any,
    *,
    attempts: int,
    kinds: Iterable[str],
    last_error: str | None,
    traceback: str | None = None,
    cost: dict[str, Any] | None = None,
) -> bool:
    """Append the deferral of ``work`` (a :class:`~durable_dispatch.core.WorkItem`) to the defer
    journal: the one builder of a defer record. Returns True when it is on disk, False when the
    journal holds it in memory (a disk fault).

    Raises:
        StorageDegradedError: the defer journal refused it and could not hold it either.
    """
    rec = defer.defer(
        work.work_id,
        work.to_json(),
        attempts=attempts,
        kinds=tuple(kinds),
        last_error=last_error,
        inputs=work.inputs,
        self_contained=work.self_contained,
        traceback=traceback,
        cost=cost,
    )
    return bool(rec.persisted)
