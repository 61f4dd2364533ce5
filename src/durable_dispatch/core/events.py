"""The events that change a campaign's durable state: one class each, and each class is the
whole of its event: its name in the journal (``NAME``), its schema (``REQUIRED`` and
``OPTIONAL`` members, plus any rule of its own in ``check``), its ``encode`` and its ``decode``.

The live dispatcher applies an event to its :class:`~durable_dispatch.core.ledger.Ledger` when it
decides; the shell journals :func:`encode` of the same event (persist before you act); replay
applies :func:`decode` of each journal record to a ledger of its own. So the state a restart
rebuilds is the state the live master had, by construction: there is one model.

=====================  ==================================================================
event (``"event"``)    what it records
=====================  ==================================================================
``epoch``              a master started with this epoch (tokens restart from 1)
``submitted``          work items joined the back of the frontier
``dispatched``         a dispatch of one or more items was sent under a token
``committed``          the results of a dispatch's items (one record per dispatch, or a few
                       when one would exceed the record bound)
``requeued``           an item went back to the front of the frontier (charged or not)
``deferred``           an item ran out of retries and was set aside for an operator
``requeued_deferred``  an operator put a deferred item back at the end of the frontier
``delivered``          every commit journaled up to ``upto`` was handed to the callback
``host``               the worker ``rank`` of this run said it runs on ``host`` (the joblog's
                       host column; no effect on the ledger; a journal without it reads)
``cancelled``          an operator cancelled an item: it ends for good, not committed
``command``            an operator's command (``durable-dispatch cancel/retry/submit/drain``)
                       was applied, with its outcome: replay skips a command ID it holds
=====================  ==================================================================

A ``committed``, ``requeued`` or ``deferred`` record may carry what its attempt cost (``cost``;
a ``committed`` record of several items ``costs``, one per item or null; see
:mod:`durable_dispatch.mpi.usage`), for the joblog and the report: the shell adds it to the
record, the ledger ignores it, and a journal without it reads.

Every reader decodes these records here (replay, the results, the history): a result that
compaction moved with :func:`decode_moved`, a record's time with :func:`record_time`, its costs
with :func:`record_costs`.

:func:`decode` checks a record against its event's schema (:func:`check_event`) and raises
:class:`~durable_dispatch.schema.Invalid` when it does not match; an event of a later version is
``None`` (forward compatibility: the fold ignores it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..cost import Cost, is_cost, is_cost_or_none, is_cost_table
from ..schema import (
    Check,
    Invalid,
    check_members,
    is_bool,
    is_int,
    is_int_or_none,
    is_num_or_none,
    is_str,
    is_str_or_none,
    is_work_item,
    list_of,
)
from ..tokens import Token
from .decisions import UNCHARGED_SOURCES, Defer, Requeue, Send, WorkItem
from .records import fast_init

__all__ = [
    "Event",
    "EVENTS",
    "EpochStarted",
    "Submitted",
    "Dispatched",
    "Committed",
    "Requeued",
    "Deferred",
    "RequeuedDeferred",
    "Delivered",
    "WorkerHost",
    "Cancelled",
    "CommandApplied",
    "encode",
    "decode",
    "check_event",
    "of_decision",
    "MovedResult",
    "decode_moved",
    "record_time",
    "record_costs",
]

#: ``stored(first, count)``: the items of a stored submission (see :func:`decode`)
Stored = Callable[[int, int], Sequence[WorkItem]]


class _Event:
    """What every event class states (see the module docs); the base adds no field."""

    __slots__ = ()
    NAME: ClassVar[str]
    REQUIRED: ClassVar[Mapping[str, Check]] = {}
    OPTIONAL: ClassVar[Mapping[str, Check]] = {}

    @classmethod
    def check(cls, rec: Mapping[str, Any]) -> None:
        """Check a record of this event against its schema (S11).

        Raises:
            Invalid: a member is missing or of the wrong type.
        """
        check_members(rec, cls.REQUIRED, cls.OPTIONAL)


@dataclass(frozen=True, slots=True)
class EpochStarted(_Event):
    """A master started with ``epoch`` (``ts``: wall-clock seconds, informational)."""

    NAME: ClassVar[str] = "epoch"
    REQUIRED: ClassVar[Mapping[str, Check]] = {"epoch": is_int}
    OPTIONAL: ClassVar[Mapping[str, Check]] = {"ts": is_num_or_none}

    epoch: int
    ts: float | None = None

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        return {"event": "epoch", "epoch": self.epoch, "ts": self.ts}

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> EpochStarted:
        """The event of a checked record."""
        return cls(rec["epoch"], rec.get("ts"))


@dataclass(frozen=True, slots=True)
class Submitted(_Event):
    """``items`` joined the back of the frontier (an item whose work ID is known is ignored).

    ``first``: the dense index of the first item (None: the ledger's next one). ``stored``: the
    items are in the submissions store, so the journal record names only ``first`` and how many
    (``{"event": "submitted", "first": 7, "count": 512}``); otherwise it holds the items.
    """

    NAME: ClassVar[str] = "submitted"
    OPTIONAL: ClassVar[Mapping[str, Check]] = {
        "items": list_of(is_work_item),
        "first": is_int,
        "count": is_int,
    }

    items: tuple[WorkItem, ...]
    first: int | None = None
    stored: bool = False

    @classmethod
    def check(cls, rec: Mapping[str, Any]) -> None:
        """As :meth:`_Event.check`; a stored submission names ``first`` (>= 0) and ``count``
        (>= 1)."""
        check_members(rec, cls.REQUIRED, cls.OPTIONAL)
        if "items" not in rec:
            check_members(rec, {"first": is_int, "count": is_int}, {})
            if rec["first"] < 0 or rec["count"] < 1:
                raise Invalid("count", "a stored submission of no items or at a negative index")

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        if self.stored:
            return {"event": "submitted", "first": self.first, "count": len(self.items)}
        out: dict[str, Any] = {"event": "submitted", "items": [i.to_json() for i in self.items]}
        if self.first is not None:
            out["first"] = self.first
        return out

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> Submitted:
        """The event of a checked record; a stored submission's items come from ``stored``.

        Raises:
            Invalid: a stored submission, and ``stored`` is None.
        """
        first = rec.get("first")
        if "items" in rec:
            return cls(tuple(WorkItem.from_json(i) for i in rec["items"]), first)
        if stored is None:
            raise Invalid("items", "a stored submission, read without its submissions store")
        return cls(tuple(stored(first, rec["count"])), first, True)  # type: ignore[arg-type]


def _check_work_ids(rec: Mapping[str, Any]) -> None:
    """A dispatch's work IDs: ``work_id`` for one item, ``work_ids`` for several."""
    ids = rec.get("work_ids")
    if ids is not None:
        if type(ids) is not list or not ids or not all(map(is_str, ids)):
            raise Invalid("work_ids", "not a non-empty list of strings")
    elif not is_str(rec.get("work_id")):
        raise Invalid("work_id", "missing or not a string (nor is work_ids given)")


def _put_ids(wids: tuple[str, ...], out: dict[str, Any]) -> None:
    if len(wids) == 1:
        out["work_id"] = wids[0]
    else:
        out["work_ids"] = list(wids)


def _work_ids(rec: Mapping[str, Any]) -> tuple[str, ...]:
    ids = rec.get("work_ids")
    return tuple(ids) if ids is not None else (rec["work_id"],)


@fast_init
@dataclass(frozen=True, slots=True)
class Dispatched(_Event):
    """The items ``work_ids`` left the frontier in one dispatch under ``token`` to ``rank``."""

    NAME: ClassVar[str] = "dispatched"
    REQUIRED: ClassVar[Mapping[str, Check]] = {"token": is_str, "rank": is_int}

    token: Token
    rank: int
    work_ids: tuple[str, ...]

    @classmethod
    def check(cls, rec: Mapping[str, Any]) -> None:
        """As :meth:`_Event.check`, and ``work_id`` or ``work_ids``."""
        check_members(rec, cls.REQUIRED, cls.OPTIONAL)
        _check_work_ids(rec)

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        out: dict[str, Any] = {"event": "dispatched", "token": str(self.token), "rank": self.rank}
        _put_ids(self.work_ids, out)
        return out

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> Dispatched:
        """The event of a checked record (its token parsed, and so checked, here)."""
        t = Token.parse(rec["token"])
        if t is None:
            raise Invalid("token", f"not a dispatch token (e<epoch>-<n>): {rec['token']!r}")
        return cls(t, rec["rank"], _work_ids(rec))


@fast_init
@dataclass(frozen=True, slots=True)
class Committed(_Event):
    """The items ``work_ids`` of the dispatch ``token`` committed with ``results`` (one per item;
    the ledger keeps the work IDs, the results store keeps the results)."""

    NAME: ClassVar[str] = "committed"
    OPTIONAL: ClassVar[Mapping[str, Check]] = {
        "token": is_str_or_none,
        "rank": is_int,
        "cost": is_cost,
        "costs": list_of(is_cost_or_none),
        "cost_table": is_cost_table,
    }

    token: Token | None
    rank: int | None
    work_ids: tuple[str, ...]
    results: tuple[Any, ...] = ()
    ts: float | None = None

    @classmethod
    def check(cls, rec: Mapping[str, Any]) -> None:
        """As :meth:`_Event.check`, and ``work_id`` or ``work_ids``."""
        check_members(rec, cls.REQUIRED, cls.OPTIONAL)
        _check_work_ids(rec)

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        out: dict[str, Any] = {"event": "committed"}
        if self.token is not None:
            out["token"] = str(self.token)
        if self.rank is not None:
            out["rank"] = self.rank
        out["ts"] = self.ts
        if len(self.work_ids) == 1:
            out["work_id"] = self.work_ids[0]
            out["result"] = self.results[0] if self.results else None
        else:
            out["work_ids"], out["results"] = list(self.work_ids), list(self.results)
        return out

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> Committed:
        """The event of a checked record."""
        wids = _work_ids(rec)
        if "work_ids" in rec:
            results = rec.get("results")
            results = tuple(results) if type(results) is list else (None,) * len(wids)
        else:
            results = (rec.get("result"),)
        return cls(Token.parse(rec.get("token")), rec.get("rank"), wids, results, record_time(rec))


@dataclass(frozen=True, slots=True)
class Requeued(_Event):
    """``work_id`` went back to the front of the frontier.

    ``split``: it was one of a multi-item dispatch that failed as a whole (not charged; it runs
    alone from now on). ``source`` ``"master-restart"`` or ``"node-lost"``: not charged either
    (:data:`~.decisions.UNCHARGED_SOURCES`). Otherwise one failure
    of ``kind`` was charged and ``attempts`` is its new count.
    """

    NAME: ClassVar[str] = "requeued"
    REQUIRED: ClassVar[Mapping[str, Check]] = {"work_id": is_str}
    OPTIONAL: ClassVar[Mapping[str, Check]] = {
        "attempts": is_int_or_none,
        "kind": is_str_or_none,
        "error": is_str_or_none,
        "source": is_str_or_none,
        "split": is_bool,
        "traceback": is_str_or_none,
        "cost": is_cost,
    }

    work_id: str
    token: Token | None
    source: str | None
    kind: str | None
    attempts: int | None
    error: str | None = ""
    split: bool = False
    traceback: str | None = None  # the function's, when it raised (its last lines)

    @property
    def charged(self) -> bool:
        """True when this requeue charged a failure to the work ID."""
        return not self.split and self.source not in UNCHARGED_SOURCES

    @classmethod
    def check(cls, rec: Mapping[str, Any]) -> None:
        """As :meth:`_Event.check`; a charged requeue names its ``attempts`` and ``kind``."""
        check_members(rec, cls.REQUIRED, cls.OPTIONAL)
        if not rec.get("split") and rec.get("source") not in UNCHARGED_SOURCES:
            check_members(rec, {"attempts": is_int, "kind": is_str}, {})

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        out = {
            "event": "requeued",
            "token": _str(self.token),
            "work_id": self.work_id,
            "source": self.source,
            "kind": self.kind,
            "attempts": self.attempts,
            "error": self.error,
        }
        if self.split:
            out["split"] = True
        if self.traceback is not None:
            out["traceback"] = self.traceback
        return out

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> Requeued:
        """The event of a checked record."""
        return cls(
            rec["work_id"],
            Token.parse(rec.get("token")),
            rec.get("source"),
            rec.get("kind"),
            rec.get("attempts"),
            rec.get("error") or "",
            bool(rec.get("split", False)),
            rec.get("traceback"),
        )


@dataclass(frozen=True, slots=True)
class Deferred(_Event):
    """``work_id`` ran out of retries: set aside, with its failures ``kinds`` (oldest first)."""

    NAME: ClassVar[str] = "deferred"
    REQUIRED: ClassVar[Mapping[str, Check]] = {
        "work_id": is_str,
        "attempts": is_int,
        "kinds": list_of(is_str),
    }
    OPTIONAL: ClassVar[Mapping[str, Check]] = {
        "last_error": is_str_or_none,
        "traceback": is_str_or_none,
        "cost": is_cost,
    }

    work_id: str
    token: Token | None
    source: str | None
    attempts: int
    kinds: tuple[str, ...]
    last_error: str | None
    traceback: str | None = None  # the function's, when it raised (its last lines)

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        out = {
            "event": "deferred",
            "token": _str(self.token),
            "work_id": self.work_id,
            "source": self.source,
            "attempts": self.attempts,
            "kinds": list(self.kinds),
            "last_error": self.last_error,
        }
        if self.traceback is not None:
            out["traceback"] = self.traceback
        return out

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> Deferred:
        """The event of a checked record."""
        return cls(
            rec["work_id"],
            Token.parse(rec.get("token")),
            rec.get("source"),
            rec["attempts"],
            tuple(rec["kinds"]),
            rec.get("last_error") or "",
            rec.get("traceback"),
        )


@dataclass(frozen=True, slots=True)
class RequeuedDeferred(_Event):
    """An operator put the deferred (or cancelled) ``work_id`` back at the end of the frontier,
    its failure counts cleared (``durable-dispatch retry``)."""

    NAME: ClassVar[str] = "requeued_deferred"
    REQUIRED: ClassVar[Mapping[str, Check]] = {"work_id": is_str}

    work_id: str

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        return {"event": "requeued_deferred", "work_id": self.work_id}

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> RequeuedDeferred:
        """The event of a checked record."""
        return cls(rec["work_id"])


@dataclass(frozen=True, slots=True)
class Delivered(_Event):
    """Every commit journaled up to sequence number ``upto`` was handed to the callback."""

    NAME: ClassVar[str] = "delivered"
    REQUIRED: ClassVar[Mapping[str, Check]] = {"upto": is_int}

    upto: int

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        return {"event": "delivered", "upto": self.upto}

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> Delivered:
        """The event of a checked record."""
        return cls(rec["upto"])


@dataclass(frozen=True, slots=True)
class WorkerHost(_Event):
    """The worker ``rank`` of the current run said (in its first READY) that it runs on
    ``host``; ``ts``: wall-clock seconds, informational. Journaled once per rank per run, for
    the joblog's host column; it changes nothing in the ledger."""

    NAME: ClassVar[str] = "host"
    REQUIRED: ClassVar[Mapping[str, Check]] = {"rank": is_int, "host": is_str}
    OPTIONAL: ClassVar[Mapping[str, Check]] = {"ts": is_num_or_none}

    rank: int
    host: str
    ts: float | None = None

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        return {"event": "host", "rank": self.rank, "host": self.host, "ts": self.ts}

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> WorkerHost:
        """The event of a checked record."""
        return cls(rec["rank"], rec["host"], rec.get("ts"))


@dataclass(frozen=True, slots=True)
class Cancelled(_Event):
    """An operator cancelled ``work_id`` (pending, in flight or deferred): it ends for good
    without a commit, a final state beside committed and deferred. ``command``: the ID of
    the operator's command that did it."""

    NAME: ClassVar[str] = "cancelled"
    REQUIRED: ClassVar[Mapping[str, Check]] = {"work_id": is_str}
    OPTIONAL: ClassVar[Mapping[str, Check]] = {"command": is_str_or_none}

    work_id: str
    command: str | None = None

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        return {"event": "cancelled", "work_id": self.work_id, "command": self.command}

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> Cancelled:
        """The event of a checked record."""
        return cls(rec["work_id"], rec.get("command"))


def _is_dict(v: Any) -> bool:
    return type(v) is dict


@dataclass(frozen=True, slots=True)
class CommandApplied(_Event):
    """The operator's command ``id`` (``op``: ``cancel``, ``retry``, ``submit`` or ``drain``)
    was applied with ``outcome`` (JSON: what it did to each work ID). Journaled after the
    command's effects and before its acknowledgement, so a command is applied once: replay
    knows its ID, and a command file found again is acknowledged, not applied again."""

    NAME: ClassVar[str] = "command"
    REQUIRED: ClassVar[Mapping[str, Check]] = {"id": is_str, "op": is_str}
    OPTIONAL: ClassVar[Mapping[str, Check]] = {"outcome": _is_dict}

    id: str
    op: str
    outcome: Mapping[str, Any]

    def encode(self) -> dict[str, Any]:
        """The journal record (the inverse of :meth:`decode`)."""
        return {"event": "command", "id": self.id, "op": self.op, "outcome": dict(self.outcome)}

    @classmethod
    def decode(cls, rec: Mapping[str, Any], stored: Stored | None = None) -> CommandApplied:
        """The event of a checked record."""
        return cls(rec["id"], rec["op"], rec.get("outcome") or {})


Event = (
    EpochStarted
    | Submitted
    | Dispatched
    | Committed
    | Requeued
    | Deferred
    | RequeuedDeferred
    | Delivered
    | WorkerHost
    | Cancelled
    | CommandApplied
)

#: Every event class, in the order of the module docs' table.
EVENTS: tuple[type[Event], ...] = (
    EpochStarted,
    Submitted,
    Dispatched,
    Committed,
    Requeued,
    Deferred,
    RequeuedDeferred,
    Delivered,
    WorkerHost,
    Cancelled,
    CommandApplied,
)
_BY_NAME: dict[str, type[Event]] = {c.NAME: c for c in EVENTS}


def encode(ev: Event) -> dict[str, Any]:
    """The journal record of ``ev`` (a JSON-ready dict; the inverse of :func:`decode`).

    Raises:
        TypeError: ``ev`` is not a state event.
    """
    if type(ev) not in _TYPES:
        raise TypeError(f"not a state event: {ev!r}")
    return ev.encode()


_TYPES = frozenset(EVENTS)


def check_event(rec: Any) -> None:
    """Check one state-journal record (``events.jsonl``) against its event's schema; a
    record of an event kind this version does not know passes (a later version's event).

    Raises:
        Invalid: the record is not an object, names no event kind, or a member of a known
            kind is missing or of the wrong type.
    """
    if type(rec) is not dict:
        raise Invalid("(record)", "not an object")
    kind = rec.get("event")
    if type(kind) is not str:
        raise Invalid("event", "missing or not a string")
    cls = _BY_NAME.get(kind)
    if cls is not None:
        cls.check(rec)


def decode(rec: Any, stored: Stored | None = None) -> Event | None:
    """The event a journal record holds, checked against its schema; None for an event kind of
    a later version.

    ``stored(first, count)``: the items of a ``submitted`` record that names only ``first`` and
    ``count`` (their payloads are in the submissions store).

    Raises:
        Invalid: the record does not match its event's schema, or it is a stored
            submission and ``stored`` is None or does not hold its items.
    """
    check_event(rec)
    cls = _BY_NAME.get(rec["event"])
    return None if cls is None else cls.decode(rec, stored)


def record_time(rec: Mapping[str, Any]) -> float | None:
    """The wall-clock time the shell stamped on a record (``ts``), or None (none, or no number)."""
    return _num(rec.get("ts"))


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and type(v) is not bool else None


def record_costs(rec: Mapping[str, Any], work_ids: Sequence[str]) -> dict[str, Cost] | None:
    """What the attempts of a checked ``committed``, ``requeued`` or ``deferred`` record cost,
    by work ID (``work_ids``: the record's, in order), from its ``cost`` (one item),
    ``cost_table`` (columns) or ``costs`` (one per item or null); None when it has none. The
    ledger never needs them: :func:`decode` leaves them in the record, a replay pays nothing."""
    cost = rec.get("cost")
    if cost is not None and len(work_ids) == 1:
        return {work_ids[0]: cost}
    if (table := rec.get("cost_table")) is not None:
        by, cols = table["by"], zip(work_ids, table["cpu"], table["rss"], strict=False)
        return {w: {"cpu": c, "rss": r, "by": by} for w, c, r in cols}
    if (many := rec.get("costs")) is not None:
        return {w: c for w, c in zip(work_ids, many, strict=False) if c is not None}
    return None


@dataclass(frozen=True, slots=True)
class MovedResult:
    """A ``committed`` record compaction moved into the results journal (``{..., "event":
    "result", "seq", "started", "host"}``): ``seq``, its sequence number in the state journal;
    ``commit``, its event; ``started``, when its dispatch was sent; ``host``, its rank's."""

    seq: int
    commit: Committed
    started: float | None
    host: str | None


def decode_moved(rec: Any) -> MovedResult:
    """The moved result a results-journal record holds, checked as a ``committed`` record.

    Raises:
        Invalid: not an object, no integer ``seq``, or not a ``committed`` record.
    """
    if type(rec) is not dict:
        raise Invalid("(record)", "not an object")
    if type(seq := rec.get("seq")) is not int:
        raise Invalid("seq", "missing or not an integer")
    Committed.check(rec)
    host = rec.get("host")
    return MovedResult(
        seq, Committed.decode(rec), _num(rec.get("started")), host if type(host) is str else None
    )


def _str(t: Token | None) -> str | None:
    return None if t is None else str(t)


def of_decision(d: object) -> Event | None:
    """The event a decision stands for (:class:`~durable_dispatch.core.decisions.Send`:
    ``dispatched``, ``Requeue``: ``requeued``, ``Defer``: ``deferred``), or None for a decision
    that changes no durable fact. The core applies this event to its ledger when it decides; the
    shell journals the same event, so the two cannot disagree."""
    if type(d) is Send:
        if d.event is not None:
            return d.event  # type: ignore[no-any-return]
        return Dispatched(d.token, d.rank, tuple(w.work_id for w in d.items))
    if type(d) is Requeue:
        return Requeued(
            d.work_id, d.token, d.source, d.kind, d.attempts, d.error, d.split, d.traceback
        )
    if type(d) is Defer:
        return Deferred(
            d.work.work_id, d.token, d.source, d.attempts, d.kinds, d.last_error, d.traceback
        )
    return None
