"""The delivery queue: what the user must hear, held until the delivery point runs it.

The library's steps (a turn of the master's loop, an open, a close, an operator's command) change
the campaign's state and *queue* what the user's code must be told: a commit for ``on_commit``
once an fsync covers its record, an item deferred or cancelled, a dispatch sent, a worker up or
gone. :class:`Deliveries` holds that queue; :meth:`CampaignState.deliver
<durable_dispatch.campaign.state.CampaignState.deliver>` runs it, on a consistent state and with
no structure of the library being walked, and nothing else runs user code. What a hook does (a
submit, children, a cancel) enters as input to the next step: it never re-enters the step that
queued it, because the queue hands each hook an entry it already took.

The delivery point (:attr:`Deliveries.delivered_seq`): every commit journaled up to that journal
sequence number was handed to the callback, which returned. It is kept in every snapshot and,
between snapshots, in ``delivered`` events at most every :data:`DELIVERY_MARK_SECONDS`. After a
crash or a failed callback the commits after it are handed to the callback again (at least once),
read back from the state directory; the durable record stays exactly once per work ID.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..core import Commits, Decision, Dispatcher, WorkItem
from ..core.events import Delivered, encode
from ..core.records import fast_init
from ..errors import NotDurableError, StorageDegradedError, UsageError
from ..storage import DeferJournal, Journal
from ..tokens import Token
from ..values import restore
from .dependencies import DependencyResults
from .results import read_results

__all__ = ["Deliveries", "OnCommit", "PendingCommit"]

log = logging.getLogger("durable_dispatch.state")

#: ``on_commit(work_id, result)``: called once a commit is journaled, at least once: once an
#: fsync covers it, or at once as a *memory-only* commit while the journal is degraded (a disk
#: fault: the campaign goes on; the commit becomes durable if the journal is restored, and is
#: lost with the process otherwise, so the item runs and is delivered again on the next run). A
#: callback with a parameter named ``durable`` is told which: ``on_commit(work_id, result,
#: durable=False)`` for a memory-only commit. It may return the work items the result spawns,
#: which are submitted before it counts as delivered.
OnCommit = Callable[..., "Iterable[WorkItem] | None"]

#: A ``delivered`` event records the delivery point between snapshots once it is this old or
#: this many records behind: after a crash at most about that much is delivered again.
DELIVERY_MARK_SECONDS = 0.25
DELIVERY_MARK_RECORDS = 256


@fast_init
@dataclass(frozen=True, slots=True)
class PendingCommit:
    """A ``committed`` record journaled and not yet closed in the core (its group commit runs)."""

    seq: int  # its journal sequence number
    token: Token  # the dispatch it belongs to
    commits: Commits  # the commits it holds, as columns


class Deliveries:
    """The commits journaled and not yet delivered, the delivery point, and the queue of the
    user's calls (see the module docs). Owned by the campaign's facade; it writes only
    ``delivered`` marks to the journal it is given."""

    def __init__(
        self,
        journal: Journal,
        core: Dispatcher,
        directory: str,
        delivered: int,
        *,
        dependencies: DependencyResults,
        defer: DeferJournal,
        persist: Callable[[list[Decision]], object],
    ) -> None:
        self._journal = journal
        self._core = core
        self._ledger = core.ledger  # (a ``delivered`` mark is applied to it as it is journaled)
        self._directory = directory
        self._dependencies = dependencies  # (holds what a memory-only commit's dependents need)
        self._defer = defer  # (a released item's deferral is resolved)
        self._persist = persist  # (what a commit's close decides)
        self._in_memory: list[int] = []  # the journal seq of each memory-only commit
        #: one entry per ``committed`` record journaled and not yet closed in the core, in
        #: journal order; the records of one dispatch are next to each other (several only
        #: when one would be too big). The one place that knows what is committed and not
        #: yet delivered.
        self.pending: list[PendingCommit] = []
        self._ready: list[tuple[PendingCommit, bool]] = []  # closed: (record, durable) to hand
        self._notices: list[tuple[Callable[[Any], None], Any]] = []
        self._redeliver_upto: int | None = None  # the journal's end when a redelivery was asked
        self._call: Callable[[str, Any], Any] | None = None
        self._spawn: Callable[[str, Any], None] | None = None
        self._delivered = delivered
        self._marked = delivered
        self._marked_at = time.monotonic()
        #: True once a callback raised: nothing more is handed to it in this run (what it did
        #: not take is delivered again on the next open)
        self.callback_failed = False
        #: While the commit callback runs: True when an fsync covers the commit being
        #: delivered, False for a memory-only commit (the journal is degraded).
        self.commit_durable = True

    # ------------------------------------------------------------------ queueing
    def set_callback(self, on_commit: OnCommit | None, spawn: Callable[[str, Any], None]) -> None:
        """Make ``on_commit`` the callback of every commit from now on; ``spawn(parent,
        returned)`` submits what it returns."""
        self._call = _caller(on_commit, self)
        self._spawn = spawn

    def add(self, seq: int, token: Token, commits: Commits) -> None:
        """A ``committed`` record was journaled at ``seq``."""
        self.pending.append(PendingCommit(seq, token, commits))

    def _take_covered(self, durable: int, degraded: bool) -> list[tuple[PendingCommit, bool]]:
        """The pending records an fsync covers (all of them while the journal is ``degraded``),
        taken off the pending list, each with whether it is the last record of its dispatch
        that is covered (the dispatch may close)."""
        pending = self.pending
        if not pending or (not degraded and pending[0].seq > durable):
            return []
        n = 0
        while n < len(pending) and (degraded or pending[n].seq <= durable):
            n += 1
        ready = pending[:n]
        last = [k + 1 == n or ready[k + 1].token != p.token for k, p in enumerate(ready)]
        if n < len(pending) and pending[n].token == ready[-1].token:
            last[-1] = False  # the dispatch's last record is not covered yet
        del pending[:n]
        return list(zip(ready, last, strict=True))

    def _settled(self, records: Iterable[PendingCommit], durable: int) -> None:
        """``records`` are closed in the core: their commits wait for the callback."""
        if self.callback_failed:
            return  # (delivered again on the next open: the delivery point stays)
        if self._call is None:
            for p in records:  # (nobody to tell: the delivery point passes them now)
                self._delivered = max(self._delivered, p.seq)
            return
        self._ready.extend((p, p.seq <= durable) for p in records)

    def settle(self, *, wait: bool = False) -> int:
        """The delivery point's library part (no user code): close in the core every journaled
        commit an fsync now covers (all of them while the journal is degraded: memory-only
        commits), persist what follows, and queue the commits for their callback. With
        ``wait``, first wait for the newest to be durable. Returns how many work items it
        closed."""
        pending = self.pending
        if not pending:
            return 0
        journal = self._journal
        if wait:
            try:
                journal.wait_durable(pending[-1].seq)
            except NotDurableError:
                pass  # (delivered as memory-only commits)
        durable = journal.durable_seq
        taken = self._take_covered(durable, degraded=not journal.healthy)
        if not taken:
            return 0  # no fsync covers the oldest yet (the usual answer during a group commit)
        items = 0
        follow: list[Decision] = []
        for p, closes in taken:
            if p.seq > durable:
                self._in_memory.extend([p.seq] * len(p.commits))
                self._dependencies.hold(p.seq, p.commits)  # a dependency's result is here
            if p.commits.part:  # sent ahead: the dispatch goes on
                self._core.part_done(p.token, p.commits.rank, list(p.commits.work_ids))
            elif closes:
                follow += self._core.commit_done(p.token)  # the dispatch's last record is in
            items += len(p.commits)
        if follow:
            self._persist(follow)
        if self._core.ledger.released:
            self._resolve_released()
        self._settled([p for p, _ in taken], durable)
        return items

    def _resolve_released(self) -> None:
        """Items deferred for a dependency that its commit released leave the defer journal
        (``resolved``, how ``"requeued"``: they are back in the queue)."""
        released, self._core.ledger.released = self._core.ledger.released, []
        for wid in released:
            if wid not in self._defer:
                continue
            try:
                self._defer.resolve(wid, "requeued")
            except StorageDegradedError:
                log.warning("defer journal: %s released, its record not resolved", wid)

    def committing(self) -> set[str]:
        """The work IDs whose commit is journaled and not yet closed in the core."""
        return {w for p in self.pending for w in p.commits.work_ids}

    @property
    def in_memory(self) -> int:
        """How many commits were delivered while the journal held them in memory only."""
        return len(self._in_memory)

    def forget_in_memory(self, durable: int) -> None:
        """The journal is durable through ``durable``: its memory-only commits up to it are not."""
        self._in_memory = [s for s in self._in_memory if s > durable]

    def notify(self, hook: Callable[[Any], None], arg: Any) -> None:
        """Queue ``hook(arg)`` for the delivery point."""
        self._notices.append((hook, arg))

    def redeliver(self, upto: int) -> None:
        """Queue, for the callback, every commit journaled after the delivery point up to
        ``upto`` (read back from the state directory at the delivery point)."""
        self._redeliver_upto = upto

    @property
    def queued(self) -> bool:
        """True when a hook waits for the delivery point (a closed commit, a notice)."""
        return bool(self._ready or self._notices or self._redeliver_upto is not None)

    @property
    def idle(self) -> bool:
        """True when nothing is journaled and undelivered, and nothing is queued."""
        return not (
            self.pending or self._ready or self._notices or self._redeliver_upto is not None
        )

    # ------------------------------------------------------------------ running
    def run(self) -> int:
        """Hand everything queued to its hook, in order: first the commits of a redelivery, then
        each closed commit to the callback (in commit order), then the notices. Returns how
        many commits were handed over. A hook that raises stops the run; what it did not take
        stays queued (a commit: delivered again on the next open)."""
        n = self._run_redelivery() if self._redeliver_upto is not None else 0
        ready = self._ready
        if ready:
            self._ready = []
            call, spawn = self._call, self._spawn
            for p, durable in ready:
                if call is not None and not self.callback_failed:
                    self.commit_durable = durable
                    try:
                        assert spawn is not None
                        for wid, result in zip(p.commits.work_ids, p.commits.results, strict=True):
                            spawn(wid, call(wid, restore(result)))
                    except BaseException:
                        # this record and every later one are delivered again on the next
                        # open; from now on nothing is handed to the callback (it failed)
                        self.callback_failed = True
                        raise
                    n += len(p.commits)
                if not self.callback_failed:
                    self._delivered = max(self._delivered, p.seq)
        if self._notices:
            notices, self._notices = self._notices, []
            for i, (hook, arg) in enumerate(notices):
                try:
                    hook(arg)
                except BaseException:
                    self._notices[:0] = notices[i + 1 :]
                    raise
        if ready:
            self.mark()
        return n

    def _run_redelivery(self) -> int:
        upto = self._redeliver_upto
        assert upto is not None
        self._redeliver_upto = None
        n = 0
        call, spawn = self._call, self._spawn
        for r in self._after_delivery_point(upto):
            if call is not None:
                self.commit_durable = r.seq <= self._journal.durable_seq
                try:
                    children = call(r.work_id, r.result)
                except Exception as e:
                    log.error(
                        "on_commit raised on the redelivery of %s's result (%s: %s): the result "
                        "is safe, committed in %s, and is delivered again at the next start; fix "
                        "the callback and run again (durable-dispatch results %s shows it)",
                        r.work_id,
                        type(e).__name__,
                        e,
                        self._directory,
                        self._directory,
                    )
                    self.callback_failed = True
                    raise
                assert spawn is not None
                spawn(r.work_id, children)
            self._delivered = max(self._delivered, r.seq)
            n += 1
        if n:
            log.warning("redelivered %d committed result(s) to the callback (at least once)", n)
        self._delivered = max(self._delivered, upto)  # nothing after it is a commit yet
        self.mark(now=True)
        return n

    def _after_delivery_point(self, upto: int) -> Iterator[Any]:
        for r in read_results(self._directory, after_seq=self._delivered):
            if r.seq > upto:
                return
            yield r

    # ------------------------------------------------------------------ the point
    @property
    def delivered_seq(self) -> int:
        """Every commit journaled up to this sequence number was handed to the callback, which
        returned."""
        return self._delivered

    def mark(self, *, now: bool = False) -> None:
        """Journal the delivery point if it moved and the last mark is old enough (or ``now``)."""
        if self._delivered <= self._marked:
            return
        t = time.monotonic()
        behind = self._delivered - self._marked
        if now or t - self._marked_at >= DELIVERY_MARK_SECONDS or behind >= DELIVERY_MARK_RECORDS:
            mark = Delivered(self._delivered)
            self._journal.append(encode(mark))
            self._ledger.apply(mark)
            self._marked, self._marked_at = self._delivered, t


def spawned(parent: str, children: Any) -> list[WorkItem]:
    """The work items a callback returned for ``parent``'s commit, checked.

    Raises:
        UsageError: the callback returned something else than None or work items.
    """
    if children is None:
        return []
    if isinstance(children, (str, bytes, dict)) or not hasattr(children, "__iter__"):
        raise UsageError(
            f"on_commit({parent!r}, ...) returned {type(children).__name__}: return None, "
            "or an iterable of WorkItem (the work this result spawns)"
        )
    items = list(children)
    bad = next((i for i in items if not isinstance(i, WorkItem)), None)
    if bad is not None:
        raise UsageError(
            f"on_commit({parent!r}, ...) returned {bad!r} among its children: each must be "
            "a WorkItem"
        )
    return items


def _caller(on_commit: OnCommit | None, d: Deliveries) -> Callable[[str, Any], Any] | None:
    """``on_commit`` as ``call(work_id, result)``: passing ``durable=d.commit_durable`` when it
    has a parameter of that name (callbacks of two parameters keep working)."""
    if on_commit is None:
        return None
    try:
        params = inspect.signature(on_commit).parameters
    except (TypeError, ValueError):  # a callable without a signature: the two arguments
        return on_commit
    p = params.get("durable")
    if p is None or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
        return on_commit
    return lambda wid, result: on_commit(wid, result, durable=d.commit_durable)
