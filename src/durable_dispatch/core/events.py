"""The events that change a campaign's durable state: one class each, one encode/decode pair.

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
``delivered``          every commit journaled up to ``upto`` was handed to the callback (U6)
=====================  ==================================================================

:func:`decode` checks a record against its schema (S11) and raises
:class:`~durable_dispatch.schema.Invalid` when it does not match; an event of a later version is
``None`` (forward compatibility: the fold ignores it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..schema import Invalid, check_event
from ..tokens import Token
from .decisions import SOURCE_MASTER_RESTART, Defer, Requeue, Send, WorkItem
from .records import fast_init

__all__ = [
    "Event",
    "EpochStarted",
    "Submitted",
    "Dispatched",
    "Committed",
    "Requeued",
    "Deferred",
    "RequeuedDeferred",
    "Delivered",
    "encode",
    "decode",
    "of_decision",
]


@dataclass(frozen=True, slots=True)
class EpochStarted:
    """A master started with ``epoch`` (``ts``: wall-clock seconds, informational)."""

    epoch: int
    ts: float | None = None


@dataclass(frozen=True, slots=True)
class Submitted:
    """``items`` joined the back of the frontier (an item whose work ID is known is ignored).

    ``first``: the dense index of the first item (None: the ledger's next one). ``stored``: the
    items are in the submissions store, so the journal record names only ``first`` and how many
    (``{"event": "submitted", "first": 7, "count": 512}``); otherwise it holds the items.
    """

    items: tuple[WorkItem, ...]
    first: int | None = None
    stored: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class Dispatched:
    """The items ``work_ids`` left the frontier in one dispatch under ``token`` to ``rank``."""

    token: Token
    rank: int
    work_ids: tuple[str, ...]


@fast_init
@dataclass(frozen=True, slots=True)
class Committed:
    """The items ``work_ids`` of the dispatch ``token`` committed with ``results`` (one per item;
    the ledger keeps the work IDs, the results store keeps the results)."""

    token: Token | None
    rank: int | None
    work_ids: tuple[str, ...]
    results: tuple[Any, ...] = ()
    ts: float | None = None


@dataclass(frozen=True, slots=True)
class Requeued:
    """``work_id`` went back to the front of the frontier.

    ``split``: it was one of a multi-item dispatch that failed as a whole (not charged; it runs
    alone from now on). ``source == "master-restart"``: not charged either. Otherwise one failure
    of ``kind`` was charged and ``attempts`` is its new count.
    """

    work_id: str
    token: Token | None
    source: str | None
    kind: str | None
    attempts: int | None
    error: str | None = ""
    split: bool = False

    @property
    def charged(self) -> bool:
        """True when this requeue charged a failure to the work ID."""
        return not self.split and self.source != SOURCE_MASTER_RESTART


@dataclass(frozen=True, slots=True)
class Deferred:
    """``work_id`` ran out of retries: set aside, with its failures ``kinds`` (oldest first)."""

    work_id: str
    token: Token | None
    source: str | None
    attempts: int
    kinds: tuple[str, ...]
    last_error: str | None


@dataclass(frozen=True, slots=True)
class RequeuedDeferred:
    """An operator put the deferred ``work_id`` back at the end of the frontier, its failure
    counts cleared."""

    work_id: str


@dataclass(frozen=True, slots=True)
class Delivered:
    """Every commit journaled up to sequence number ``upto`` was handed to the callback (U6)."""

    upto: int


Event = (
    EpochStarted
    | Submitted
    | Dispatched
    | Committed
    | Requeued
    | Deferred
    | RequeuedDeferred
    | Delivered
)


def _ids(wids: tuple[str, ...], ev: dict[str, Any]) -> None:
    """A dispatch's work IDs: ``work_id`` for one item, ``work_ids`` for several."""
    if len(wids) == 1:
        ev["work_id"] = wids[0]
    else:
        ev["work_ids"] = list(wids)


def encode(ev: Event) -> dict[str, Any]:
    """The journal record of ``ev`` (a JSON-ready dict; the inverse of :func:`decode`)."""
    if type(ev) is Dispatched:
        out: dict[str, Any] = {"event": "dispatched", "token": str(ev.token), "rank": ev.rank}
        _ids(ev.work_ids, out)
        return out
    if type(ev) is Committed:
        out = {"event": "committed"}
        if ev.token is not None:
            out["token"] = str(ev.token)
        if ev.rank is not None:
            out["rank"] = ev.rank
        out["ts"] = ev.ts
        if len(ev.work_ids) == 1:
            out["work_id"], out["result"] = ev.work_ids[0], ev.results[0] if ev.results else None
        else:
            out["work_ids"], out["results"] = list(ev.work_ids), list(ev.results)
        return out
    if type(ev) is Requeued:
        out = {
            "event": "requeued",
            "token": _str(ev.token),
            "work_id": ev.work_id,
            "source": ev.source,
            "kind": ev.kind,
            "attempts": ev.attempts,
            "error": ev.error,
        }
        if ev.split:
            out["split"] = True
        return out
    if type(ev) is Deferred:
        return {
            "event": "deferred",
            "token": _str(ev.token),
            "work_id": ev.work_id,
            "source": ev.source,
            "attempts": ev.attempts,
            "kinds": list(ev.kinds),
            "last_error": ev.last_error,
        }
    if type(ev) is Submitted:
        if ev.stored:
            return {"event": "submitted", "first": ev.first, "count": len(ev.items)}
        out = {"event": "submitted", "items": [i.to_json() for i in ev.items]}
        if ev.first is not None:
            out["first"] = ev.first
        return out
    if type(ev) is EpochStarted:
        return {"event": "epoch", "epoch": ev.epoch, "ts": ev.ts}
    if type(ev) is RequeuedDeferred:
        return {"event": "requeued_deferred", "work_id": ev.work_id}
    if type(ev) is Delivered:
        return {"event": "delivered", "upto": ev.upto}
    raise TypeError(f"not a state event: {ev!r}")


def decode(
    rec: Any, stored: Callable[[int, int], Sequence[WorkItem]] | None = None
) -> Event | None:
    """The event a journal record holds, checked against its schema; None for an event kind of
    a later version.

    ``stored(first, count)``: the items of a ``submitted`` record that names only ``first`` and
    ``count`` (their payloads are in the submissions store).

    Raises:
        Invalid: the record does not match its event's schema (S11), or it is a stored
            submission and ``stored`` is None or does not hold its items.
    """
    check_event(rec)
    kind = rec["event"]
    if kind == "dispatched":
        return Dispatched(_token(rec["token"]), rec["rank"], _work_ids(rec))
    if kind == "committed":
        wids = _work_ids(rec)
        if "work_ids" in rec:
            results = rec.get("results")
            results = tuple(results) if type(results) is list else (None,) * len(wids)
        else:
            results = (rec.get("result"),)
        return Committed(
            Token.parse(rec.get("token")), rec.get("rank"), wids, results, rec.get("ts")
        )
    if kind == "requeued":
        return Requeued(
            rec["work_id"],
            Token.parse(rec.get("token")),
            rec.get("source"),
            rec.get("kind"),
            rec.get("attempts"),
            rec.get("error") or "",
            bool(rec.get("split", False)),
        )
    if kind == "deferred":
        return Deferred(
            rec["work_id"],
            Token.parse(rec.get("token")),
            rec.get("source"),
            rec["attempts"],
            tuple(rec["kinds"]),
            rec.get("last_error") or "",
        )
    if kind == "submitted":
        first = rec.get("first")
        if "items" in rec:
            return Submitted(tuple(WorkItem.from_json(i) for i in rec["items"]), first)
        if stored is None:
            raise Invalid("items", "a stored submission, read without its submissions store")
        return Submitted(tuple(stored(first, rec["count"])), first, True)
    if kind == "epoch":
        return EpochStarted(rec["epoch"], rec.get("ts"))
    if kind == "requeued_deferred":
        return RequeuedDeferred(rec["work_id"])
    if kind == "delivered":
        return Delivered(rec["upto"])
    return None


def _work_ids(rec: Mapping[str, Any]) -> tuple[str, ...]:
    ids = rec.get("work_ids")
    return tuple(ids) if ids is not None else (rec["work_id"],)


def _token(value: Any) -> Token:
    t = Token.parse(value)
    if t is None:
        raise Invalid("token", f"not a dispatch token (e<epoch>-<n>): {value!r}")
    return t


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
        return Requeued(d.work_id, d.token, d.source, d.kind, d.attempts, d.error, d.split)
    if type(d) is Defer:
        return Deferred(d.work.work_id, d.token, d.source, d.attempts, d.kinds, d.last_error)
    return None
