"""What the dispatch core tells its shell to do, and how it classifies what the shell tells it.

Every value here is a plain immutable record. The shell executes decisions in the order they
are returned; the one ordering rule that matters is *persist before you act*: a
:class:`PersistSnapshot` must be done before the next :class:`Send`, a :class:`Commit` must be
journaled before its work ID is acknowledged or leased to anyone, and a :class:`Defer` must be
appended to the defer journal (and its outcome reported back with ``defer_recorded``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from ..tokens import Token
from .records import fast_init

__all__ = [
    "WorkItem",
    "ItemFailure",
    "Classification",
    "Decision",
    "Send",
    "Commit",
    "Commits",
    "Requeue",
    "Defer",
    "Park",
    "Release",
    "PersistSnapshot",
    "Quarantine",
    "SOURCE_INVALID_RESULT",
    "SOURCE_ITEM_FAILED",
    "SOURCE_WATCHDOG",
    "SOURCE_SEND_FAILURE",
    "SOURCE_RANK_LOST",
    "SOURCE_MASTER_RESTART",
    "SOURCE_NODE_LOST",
    "UNCHARGED_SOURCES",
    "SOURCE_DEPENDENCY",
    "SOURCE_OPERATOR",
]

#: A RESULT that cannot commit for what it is: malformed, missing (READY without it), too large.
SOURCE_INVALID_RESULT = "invalid-result"
#: The worker reported the item failed: the user's function raised (``error``), its isolated
#: child crashed (``crash``) or ran past the item's deadline (``timeout``).
SOURCE_ITEM_FAILED = "item-failed"
SOURCE_WATCHDOG = "watchdog-timeout"
SOURCE_SEND_FAILURE = "send-failure"
SOURCE_RANK_LOST = "rank-lost"
SOURCE_MASTER_RESTART = "master-restart"
#: The source of a requeue of an item whose node failed under it (its host lost several ranks
#: at once): its rank did not die of it, so nothing is charged (kind ``lost-rank``).
SOURCE_NODE_LOST = "node-lost"
#: The sources whose requeues charge the item nothing.
UNCHARGED_SOURCES = frozenset({SOURCE_MASTER_RESTART, SOURCE_NODE_LOST})
#: The source of a :class:`Defer` of an item that never ran: a dependency ended for good without
#: a commit, was never submitted, or is part of a cycle; its kind is ``"dependency"``.
SOURCE_DEPENDENCY = "dependency"
SOURCE_OPERATOR = "operator"  # O1: an operator's ``durable-dispatch cancel`` (issue 52)
#: The failure kinds the worker reports about the item itself (not about its RESULT message).
ITEM_FAILURE_KINDS = frozenset({"error", "crash", "timeout"})


def failure_source(kind: str) -> str:
    """The source a rollback of a failed item is logged and journaled under: ``item-failed``
    when the worker said the item failed, ``invalid-result`` when the RESULT was at fault."""
    return SOURCE_ITEM_FAILED if kind in ITEM_FAILURE_KINDS else SOURCE_INVALID_RESULT


@dataclass(frozen=True)
class ItemFailure:
    """Why a worker could not do one item (an entry of a RESULT's ``errors``).

    Attributes:
        kind: one of :data:`~durable_dispatch.core.config.WORKER_FAILURE_KINDS`; the core treats
            any other kind as ``malformed-result`` (a worker cannot invent a budget).
        reason: a human-readable reason (``"ValueError: bad input"``, ``"killed by SIGSEGV"``).
        final: the failure is deterministic (a result that cannot be stored as given): the
            item is deferred at once, not retried.
        traceback: the traceback of a function that raised (its last lines), or None.
    """

    kind: str
    reason: str
    final: bool = False
    traceback: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


#: The leases of an item that holds none: one shared, read-only empty mapping (an item costs no
#: dict of its own; a campaign may hold millions).
NO_LEASES: Mapping[str, str] = MappingProxyType({})


def _no_leases() -> Mapping[str, str]:
    return NO_LEASES


@fast_init
@dataclass(frozen=True, slots=True)
class WorkItem:
    """One unit of work, identified by a stable semantic ID.

    Attributes:
        work_id: the stable semantic ID (retries and commits are counted under it).
        payload: JSON-compatible data the worker needs.
        timeout: this item's deadline in seconds, overriding the watchdog's default.
        leases: side-table entries this item holds exclusively while in flight (for example
            ``{"target": "libpng"}``); an item waits in the frontier while one is taken.
        inputs: paths the item needs to be replayed after a deferral.
        self_contained: the item carries everything it needs (no ``inputs`` required).
        priority: the frontier serves higher priorities first, first in first out within one;
            0 by default. Any integer: a fuzzer's favoured inputs get a higher one, a
            depth-first search gives a child its parent's priority + 1.
        after: work IDs that must be committed, durably, before this item is dispatched;
            until then it *waits* (neither pending nor deferred). A dependency deferred for
            good defers this item (kind ``"dependency"``); so does a dependency that is never
            submitted, or a cycle, once nothing else can run. With ``run_worker(fn,
            context=True)`` the function gets their results as ``ctx.dependencies``. Not to be
            confused with ``inputs`` (paths needed to replay a deferred item).
    """

    work_id: str
    payload: Any = None
    timeout: float | None = None
    leases: Mapping[str, str] = field(default_factory=_no_leases)
    inputs: tuple[str, ...] = ()
    self_contained: bool = False
    priority: int = 0
    after: tuple[str, ...] = ()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # pickle: the shared empty mapping cannot be pickled, a dict copy of the leases can
        return _work_item, (
            self.work_id,
            self.payload,
            self.timeout,
            dict(self.leases),
            self.inputs,
            self.self_contained,
            self.priority,
            self.after,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the inverse of :meth:`from_json`); ``priority`` only when it is
        not 0 and ``after`` only when not empty (the form of earlier versions stays byte for
        byte)."""
        out = {
            "work_id": self.work_id,
            "payload": self.payload,
            "timeout": self.timeout,
            "leases": dict(self.leases),
            "inputs": list(self.inputs),
            "self_contained": self.self_contained,
        }
        if self.priority:
            out["priority"] = self.priority
        if self.after:
            out["after"] = list(self.after)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WorkItem:
        """Rebuild from :meth:`to_json` output."""
        leases = d.get("leases")
        return cls(
            work_id=str(d["work_id"]),
            payload=d.get("payload"),
            timeout=d.get("timeout"),
            leases=dict(leases) if leases else NO_LEASES,
            inputs=tuple(d.get("inputs") or ()),
            self_contained=bool(d.get("self_contained", False)),
            priority=int(d.get("priority") or 0),
            after=tuple(d.get("after") or ()),
        )


def _work_item(
    work_id: str,
    payload: Any,
    timeout: float | None,
    leases: dict[str, str],
    inputs: tuple[str, ...],
    self_contained: bool,
    priority: int,
    after: tuple[str, ...] = (),
) -> WorkItem:
    """A pickled :class:`WorkItem` again (an item without leases shares :data:`NO_LEASES`)."""
    return WorkItem(
        work_id, payload, timeout, leases or NO_LEASES, inputs, self_contained, priority, after
    )


class Classification(str, Enum):
    """How an incoming RESULT, READY or HEARTBEAT was classified."""

    CURRENT = "CURRENT"
    STALE = "STALE"
    UNOWNED = "UNOWNED"
    MALFORMED = "MALFORMED"
    DUPLICATE = "DUPLICATE"

    def __repr__(self) -> str:
        return self.value


class Decision:
    """Base class of everything the core asks its shell to do."""

    __slots__ = ()


@fast_init
@dataclass(frozen=True, slots=True)
class Send(Decision):
    """Send WORK to ``rank`` with ``token``; then report ``mark_dispatched`` or ``send_failed``.

    ``items`` holds one work item, or several when the shell asked :meth:`Dispatcher.reserve`
    for a multi-item dispatch: one token, one WORK message and one RESULT for all of them.
    The rest is what the shell sends with them, so it never asks the core: ``seconds``, the
    dispatch's deadline in seconds from the send (None with the watchdog off; an isolating
    worker kills the work then); ``lease``, how far a HEARTBEAT pushes it (0: the deadline is
    fixed, every item has its own timeout); ``attempts``, each item's failed attempts so far.
    ``event`` is the ``dispatched`` event the core applied to its ledger for it, which the shell
    journals (None for a Send made by hand: the shell then derives it, ``events.of_decision``).
    """

    rank: int
    token: Token
    items: tuple[WorkItem, ...]
    seconds: float | None = None
    lease: float = 0.0
    attempts: tuple[int, ...] = ()
    event: Any = field(default=None, compare=False, repr=False)

    @property
    def work(self) -> WorkItem:
        """The work item of a one-item dispatch.

        Raises:
            UsageError: a multi-item dispatch (use :attr:`items`: returning the first item
                would silently drop the others).
        """
        if len(self.items) != 1:
            from ..errors import UsageError

            raise UsageError(f"{self.token} carries {len(self.items)} items: use Send.items")
        return self.items[0]


@fast_init
@dataclass(frozen=True, slots=True)
class Commit(Decision):
    """Journal this result durably, then report ``commit_done(token)`` (exactly-once record).

    A multi-item dispatch yields one Commit per item that succeeded, all with the same token,
    next to each other: journal them together and report ``commit_done(token)`` once.

    ``part`` is True for an item whose outcome the worker sent ahead of its dispatch's RESULT
    (:meth:`~durable_dispatch.core.dispatcher.Dispatcher.on_part`): once it is journaled, report
    ``part_done(token, rank, work_ids)`` instead; the dispatch goes on.
    """

    rank: int
    token: Token
    work_id: str
    result: Any
    part: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class Commits(Decision):
    """What a :class:`Commit` each says for several items of one dispatch, as columns (no
    object per item): journal them as one record, then report ``commit_done(token)`` (or
    ``part_done(token, rank, work_ids)`` when ``part``). ``results[i]`` is the result of
    ``work_ids[i]``. A RESULT of several items that all succeeded yields one.
    """

    rank: int
    token: Token
    work_ids: tuple[str, ...]
    results: Sequence[Any]
    part: bool = False

    @classmethod
    def of(cls, commits: Sequence[Commit]) -> Commits:
        """The columns of ``commits`` (one or more, of one dispatch, in order)."""
        first = commits[0]
        if len(commits) == 1:
            return cls(first.rank, first.token, (first.work_id,), (first.result,), first.part)
        wids, results = tuple(map(_work_id, commits)), tuple(map(_result, commits))
        return cls(first.rank, first.token, wids, results, first.part)

    def __len__(self) -> int:
        return len(self.work_ids)

    def __getitem__(self, k: slice) -> Commits:
        """The commits of the slice ``k`` of the columns (a record split in two)."""
        return Commits(self.rank, self.token, self.work_ids[k], self.results[k], self.part)


_work_id, _result = attrgetter("work_id"), attrgetter("result")


@dataclass(frozen=True)
class Requeue(Decision):
    """The work went back to the front of the frontier (informational: the core did it).

    ``split`` is True when the item was one of several in a dispatch that failed as a whole: it
    is not charged a retry (``attempts`` is unchanged) and is dispatched alone from now on, so
    one bad item cannot use up the retries of the items it shared a dispatch with.
    """

    work_id: str
    token: Token
    source: str
    kind: str
    attempts: int
    error: str = ""
    split: bool = False
    traceback: str | None = None


@dataclass(frozen=True)
class Defer(Decision):
    """Append this item to the defer journal, then report ``defer_recorded(work_id, persisted)``.

    ``token`` is None for an item deferred without a dispatch (``source`` ``"dependency"``)."""

    work: WorkItem
    token: Token | None
    source: str
    attempts: int
    kinds: tuple[str, ...]
    last_error: str | None
    traceback: str | None = None


@dataclass(frozen=True)
class Park(Decision):
    """``rank`` left the idle set: only a READY with ``token`` can release it (a READY without
    it may come from the dispatch ``token`` rolled back, still running)."""

    rank: int
    token: Token
    source: str


@dataclass(frozen=True)
class Release(Decision):
    """A parked ``rank`` proved with its exact retired ``token`` that the old generation ended."""

    rank: int
    token: Token


@dataclass(frozen=True)
class PersistSnapshot(Decision):
    """Write an atomic snapshot of the state now, then report ``snapshot_persisted()``: no
    :class:`Send` comes before (a rollback is durable before anything is dispatched again)."""

    reason: str


@dataclass(frozen=True)
class Quarantine(Decision):
    """A message was not current: counted and ignored (never a crash of the master)."""

    rank: int
    message: str
    classification: Classification
    reason: str
