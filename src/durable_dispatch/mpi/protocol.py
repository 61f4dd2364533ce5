"""Wire protocol between master and workers: tags and JSON message bodies (no pickle).

Every message is one MPI message of raw bytes (``MPI.BYTE``) holding one JSON object encoded by
orjson. The master receives with ``ANY_SOURCE``/``ANY_TAG``, so MPI's non-overtaking rule delivers
each worker's messages in the order it sent them (RESULT before its READY).

| tag | direction | body |
| --- | --- | --- |
| WORK | master -> worker | ``{"token", "ids": [...], "payloads": [...], "seconds", "lease"}`` |
| RESULT | worker -> master | ``{"token", "results": [...], "errors": {"<i>": {...}}}`` |
| READY | worker -> master | ``{"token"}`` (``null`` when the worker starts; then also ``"host"``) |
| HEARTBEAT | worker -> master | ``{"token"}`` |
| STOP | master -> worker | ``{}`` |
| GONE | worker -> master | ``{"error"}``: the worker failed (at start, or in its loop) and ends |
| CANCEL | master -> worker | ``{"token"}``: an operator cancelled the dispatch |

This module holds both ends of WORK and RESULT: the master encodes WORK
(:func:`work_message`) and the worker reads it (:func:`read_work`); the worker encodes RESULT
(:func:`result_message`, a part: :func:`part_message`) and the master reads it
(:func:`read_result`, :func:`sort`).

A WORK message carries one item, or several when the master runs with ``batch > 1``, as
columns: ``ids`` (the work IDs) and ``payloads``, one entry per item in order; ``attempts``
(each item's failed attempts so far) only when one is not 0; and two sparse members by work ID,
only for the items that have them: ``timeouts`` (in a dispatch of several, an item's own
timeout in seconds, which an isolating worker applies to that item alone) and
``dependencies`` (the committed results of an item's ``after`` IDs, its
``ctx.dependencies``). A WORK is never persisted and both ends are this package: no other form
is read, and a WORK that does not read (:func:`read_work`) is ignored. Its RESULT
has one entry in ``results`` per item, in order. ``seconds`` is the dispatch's deadline as the
master counts it (null when the watchdog is off) and ``lease`` how far a HEARTBEAT pushes it: an
isolating worker kills the work at the same deadline. ``errors`` (optional) names the items the
worker could not do, each with its failure kind (``error``, ``crash``, ``result-too-large``,
``malformed-result``; a bare string is kind ``error``; ``"final": true`` marks a deterministic
failure, deferred without a retry; ``"traceback"`` the function's, when it raised): their
``results`` entries are null. A
RESULT ``{"token", "error", "kind"}`` reports that the whole dispatch failed (``kind`` is
``timeout`` when an isolating worker killed it at its deadline; without ``kind`` it counts as a
malformed RESULT).

A RESULT (a part of one too, and a whole dispatch's failure) may carry ``costs``: by work ID,
what the item's attempt cost, ``{"cpu", "rss", "by"}`` (see :mod:`.usage`), or, for several
items all measured the same way, a table ``{"ids", "cpu", "rss", "by"}`` with one column entry
per item in the order of ``ids`` (see :mod:`durable_dispatch.campaign.costs`); the master
keeps it with the attempt when the RESULT is current; and, from an isolating worker,
``outputs``: by work ID, the tails of what the item wrote (see
:func:`.capture.output_entry`), which the master appends to the outputs journal. A RESULT
without them (a worker of an earlier version) is as good; a master of an earlier version
that keeps costs reads them by work ID only, and keeps none of a table's (its items' costs
read blank).

A worker's first READY (``token`` null) names its host (``"host"``: ``socket.gethostname()``);
the master journals it once per rank per run, for the joblog. A READY without it (a worker of an
earlier version) is as good: its rank's host is unknown.

On CANCEL an isolating worker kills the dispatch's child (and its process tree) and sends
READY with the token; a worker without isolation finishes the dispatch (its RESULT is stale).

A WORK message with ``"ahead": true`` (the master sends it under ``batch="auto"``) lets the
worker send the outcomes of some of its items ahead of its RESULT, when they would otherwise
wait behind a slow item: a RESULT with ``ids`` (the work IDs of those items, in order) is such a
part; its ``results`` and ``errors`` follow ``ids``. The items it names leave the dispatch, and
the dispatch's RESULT has entries only for the items left. A dispatch of a fixed ``batch`` size
answers with one RESULT, as the user chose.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import orjson

from ..core.decisions import ItemFailure, Send
from ..cost import wire_table
from ..values import TAG
from .capture import output_entry
from .context import Batch, ItemOutcome, Outcomes

__all__ = [
    "WORK",
    "RESULT",
    "READY",
    "HEARTBEAT",
    "STOP",
    "GONE",
    "CANCEL",
    "TAG_NAMES",
    "encode",
    "decode",
    "read_result",
    "Inbox",
    "sort",
    "work_message",
    "Work",
    "read_work",
    "result_message",
    "part_message",
    "BAD",
]

log = logging.getLogger("durable_dispatch.mpi")

WORK, RESULT, READY, HEARTBEAT, STOP, GONE = 11, 12, 13, 14, 15, 16
CANCEL = 17  # issue 52
TAG_NAMES = {
    WORK: "WORK",
    RESULT: "RESULT",
    READY: "READY",
    HEARTBEAT: "HEARTBEAT",
    STOP: "STOP",
    GONE: "GONE",
    CANCEL: "CANCEL",
}
MAX_MESSAGE = 16 << 20
#: characters of a failure's reason a worker sends (a RESULT's error, a GONE)
REASON_MAX = 2000
#: characters of a function's traceback a RESULT carries (its last lines)
TRACEBACK_MAX = 16000
#: bytes of a RESULT kept for its envelope and error entries
ROOM = 64 << 10
#: bytes of a RESULT its items' outputs may take, at most
OUTPUT_ROOM = 4 << 20


def encode(obj: Any) -> bytes:
    """JSON bytes of one message body."""
    return orjson.dumps(obj)


def decode(data: bytes | bytearray | memoryview) -> tuple[dict[str, Any] | None, str | None]:
    """``(body, None)`` for a valid JSON object, ``(None, reason)`` otherwise (never raises)."""
    if len(data) > MAX_MESSAGE:
        return None, f"message of {len(data)} bytes is over the bound"
    try:
        obj = orjson.loads(data)  # (bytes, bytearray or memoryview: no copy)
    except orjson.JSONDecodeError as e:
        return None, f"not JSON: {e}"
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    return obj, None


def read_result(
    body: dict[str, Any] | None, reason: str | None
) -> tuple[list[Any] | None, dict[int, str | ItemFailure] | None, str | ItemFailure | None]:
    """Split a decoded RESULT body into ``(results, errors, None)``, or ``(None, None, reason)``
    when it cannot be read (the arguments of ``Dispatcher.on_results``; never raises).

    Args:
        body: the body :func:`decode` gave, or None.
        reason: the reason :func:`decode` gave when ``body`` is None.
    """
    if body is None:
        return None, None, reason or "malformed RESULT"
    if "error" in body:
        kind = body.get("kind")
        if isinstance(kind, str):
            return None, None, ItemFailure(kind, str(body["error"]))
        return None, None, str(body["error"])
    results = body.get("results")
    if not isinstance(results, list):
        return None, None, "RESULT without a results list"
    raw = body.get("errors")
    if raw is None:
        return results, None, None
    if not isinstance(raw, dict):
        return None, None, "RESULT errors is not an object"
    errors: dict[int, str | ItemFailure] = {}
    for k, v in raw.items():
        if not (k.isascii() and k.isdigit()):
            return None, None, f"RESULT error index {k!r} is not a number"
        if isinstance(v, dict) and isinstance(v.get("kind"), str):
            tb = v.get("traceback")
            errors[int(k)] = ItemFailure(
                v["kind"],
                str(v.get("reason", "")),
                v.get("final") is True,
                tb if type(tb) is str else None,
            )
        else:
            errors[int(k)] = str(v)
    return results, errors, None


#: the token of a message whose body did not decode (the core classes it malformed)
BAD: Any = object()


@dataclass
class Inbox:
    """The messages of one receive, decoded and sorted by kind, each in arrival order: what the
    master loop hands to the campaign state (``CampaignState.on_ready`` and so on).

    Attributes:
        readies: ``(rank, token)`` of each READY (``token`` None at a worker's start, ``BAD``
            when the body did not decode).
        beats: ``(rank, token)`` of each HEARTBEAT.
        results: ``(rank, token, results, errors, failure)`` of each RESULT: the arguments of
            ``on_results`` (see :func:`read_result`).
        gone: ``(rank, error)`` of each worker that said it failed and ends (GONE).
        parts: ``(rank, token, work_ids, results, errors)`` of each RESULT sent ahead for some
            items of a dispatch (the arguments of ``on_part``); a rank's parts come before its
            RESULT for the same dispatch, so the loop hands them over first.
        hosts: ``(rank, host)`` of each READY that named its host (a worker's first).
        usage: ``(rank, token, costs, outputs)`` of each RESULT (or part) that carried
            ``costs`` or ``outputs`` (the arguments of ``note_usage``; before its RESULT).
    """

    readies: list[tuple[int, Any]] = field(default_factory=list)
    beats: list[tuple[int, Any]] = field(default_factory=list)
    results: list[tuple[int, Any, Any, Any, Any]] = field(default_factory=list)
    gone: list[tuple[int, str]] = field(default_factory=list)
    parts: list[tuple[int, Any, Any, Any, Any]] = field(default_factory=list)
    hosts: list[tuple[int, str]] = field(default_factory=list)
    usage: list[tuple[int, Any, Any, Any]] = field(default_factory=list)


def sort(messages: Iterable[tuple[int, int, bytes | bytearray]]) -> Inbox:
    """Decode ``(source, tag, body bytes)`` messages into an :class:`Inbox` (never raises;
    messages of unknown tags are dropped)."""
    inbox = Inbox()
    for src, tag, buf in messages:
        body, why = decode(buf)
        token = body.get("token") if body is not None else BAD
        if tag == READY:
            inbox.readies.append((src, token))
            if body is not None and type(host := body.get("host")) is str and host:
                inbox.hosts.append((src, host[:255]))
        elif tag == HEARTBEAT:
            inbox.beats.append((src, token))
        elif tag == RESULT:
            if body is not None and ("costs" in body or "outputs" in body):
                inbox.usage.append((src, token, body.get("costs"), body.get("outputs")))
            if body is not None and "ids" in body:  # some items' outcomes, sent ahead
                values, errors, failure = read_result(body, why)
                ids = body["ids"] if failure is None else None
                inbox.parts.append((src, token, ids, values, errors))
                continue
            values, errors, failure = read_result(body, why)
            inbox.results.append((src, token, values, errors, failure))
        elif tag == GONE:
            error = body.get("error") if body is not None else why
            inbox.gone.append((src, str(error or "no reason given")))
    return inbox


def work_message(
    send: Send,
    *,
    ahead: bool = False,
    dependencies: Mapping[str, Mapping[str, Any]] | None = None,
) -> bytes:
    """The WORK message of a dispatch, as columns: its token, its items' work IDs and payloads
    (``ids``, ``payloads``), their failed attempts so far (``attempts``, left out when all are
    0), and its deadline and lease, so an isolating worker kills the work at the master's
    deadline. Sparse members: ``timeouts``, by work ID, the own timeout of each item of
    several that has one (the isolating worker applies it to that item alone; a dispatch of
    one item never carries it: its deadline is its own); ``dependencies``, by work ID, the
    committed results of an item's ``after`` IDs (``ctx.dependencies``). ``ahead``: the worker
    may send finished items ahead of its RESULT (see the module docs)."""
    items = send.items
    attempts = send.attempts
    if len(items) == 1:  # (batch=1: no comprehension)
        w = items[0]
        body: dict[str, Any] = {"token": str(send.token), "ids": [w.work_id]}
        body["payloads"] = [w.payload]
        timeouts = None
    else:
        body = {"token": str(send.token), "ids": [w.work_id for w in items]}
        body["payloads"] = [w.payload for w in items]
        timeouts = {w.work_id: w.timeout for w in items if w.timeout is not None}
    if any(attempts):
        body["attempts"] = list(attempts)
    if timeouts:
        body["timeouts"] = timeouts
    if dependencies:
        body["dependencies"] = dependencies
    body["seconds"], body["lease"] = send.seconds, send.lease
    if ahead and len(items) > 1:
        body["ahead"] = True
    return orjson.dumps(body)


class Work(NamedTuple):
    """A WORK message as the worker reads it (:func:`read_work`).

    Attributes:
        token: the dispatch's token, as it came (the worker's answers echo it).
        items: the items, as columns (work IDs, payloads, attempts, own timeouts,
            dependencies), in order.
        seconds: the dispatch's deadline in seconds from now, or None (no watchdog).
        lease: how far a HEARTBEAT pushes the deadline (0: it is fixed, every item has its own
            timeout).
        ahead: the worker may send finished items ahead of its RESULT (several items only).
    """

    token: Any
    items: Batch
    seconds: float | None
    lease: float
    ahead: bool


_NUMBERS = (int, float)


def read_work(body: dict[str, Any] | None, raw: bytes | bytearray | None = None) -> Work | None:
    """The WORK a decoded body holds (:func:`decode`), or None when it holds none (no body,
    columns that are not lists of one length, attempts that are not integers, a sparse member
    that is not an object, an own timeout that is not a positive number: the worker waits for
    the next message). A deadline that is not a positive number is none; a lease that is not a
    number of seconds (0 or more) is the deadline's. ``raw``: the bytes the body was decoded
    from; when they hold no stored form's tag (see :mod:`durable_dispatch.values`), the
    payloads are the user's values as they are, and nothing is restored item by item."""
    if body is None:
        return None
    ids, payloads = body.get("ids"), body.get("payloads")
    if type(ids) is not list or type(payloads) is not list or len(ids) != len(payloads):
        return None
    attempts = body.get("attempts")
    if attempts is not None and (
        type(attempts) is not list
        or len(attempts) != len(ids)
        or not set(map(type, attempts)) <= {int}
    ):
        return None
    timeouts, deps = body.get("timeouts"), body.get("dependencies")
    if timeouts is not None and (
        type(timeouts) is not dict
        or not all(type(t) in _NUMBERS and t > 0 for t in timeouts.values())
    ):
        return None
    if deps is not None and type(deps) is not dict:
        return None
    seconds = body.get("seconds")
    seconds = float(seconds) if isinstance(seconds, _NUMBERS) and seconds > 0 else None
    lease = body.get("lease")
    lease = float(lease) if isinstance(lease, _NUMBERS) and lease >= 0 else seconds or 0.0
    ahead = len(ids) > 1 and bool(body.get("ahead"))
    tagged = raw is None or _TAG_BYTES in raw
    batch = Batch(ids, payloads, attempts, timeouts or None, deps or None, tagged)
    return Work(body.get("token"), batch, seconds, lease, ahead)


_TAG_BYTES = b'"' + TAG.encode() + b'"'


def result_message(
    token: Any,
    outcomes: Outcomes | list[ItemOutcome],
    whole: ItemOutcome | None,
    ids: list[Any] | None = None,
) -> bytes:
    """The RESULT for a dispatch: one entry per item (its result JSON spliced in as it came) and
    an ``errors`` entry with kind and reason for each item that failed; or, for a dispatch that
    failed as a whole, ``{"token", "error", "kind"}``. Results that would take the message over
    its bound become ``result-too-large`` errors. ``outcomes``: the items' outcomes as columns
    (:class:`~.context.Outcomes`; a list of :class:`~.context.ItemOutcome` is taken too).
    ``ids``: the items' work IDs, in order: each item's cost goes in ``costs`` and what it
    wrote (with isolation) in ``outputs``, by work ID (see the module docs); outputs past
    :data:`OUTPUT_ROOM` bytes are left out, logged."""
    if whole is not None:
        reason = (whole.reason or "")[:REASON_MAX]
        body: dict[str, Any] = {"token": token, "error": reason, "kind": whole.kind}
        if type(whole.about) is str:
            if whole.cost is not None:
                body["costs"] = {whole.about: whole.cost}
            if whole.output is not None and (said := output_entry(whole.output)):
                body["outputs"] = {whole.about: said}
        return orjson.dumps(body)
    if not isinstance(outcomes, Outcomes):
        outcomes = Outcomes.of(outcomes)
    raws, failed = outcomes.raw, outcomes.errors
    room = MAX_MESSAGE - ROOM
    errors: dict[str, dict[str, Any]] = {}
    if not failed and None not in raws:  # (each one in C: no Python work per item)
        parts = cast(list[bytes], raws)
        size = sum(map(len, parts))
    if not failed and None not in raws and size <= room:
        room -= size
    else:
        parts = []
        for i, r in enumerate(raws):
            o = failed.get(i)
            if r is not None and len(r) > room:
                o = ItemOutcome(
                    None,
                    "result-too-large",
                    f"{len(r)} bytes would overfill the "
                    f"RESULT message ({MAX_MESSAGE} bytes for the whole dispatch)",
                )
            if r is None or o is not None:
                parts.append(b"null")
                o = o or ItemOutcome(None, "error", "no outcome")
                entry: dict[str, Any] = {
                    "kind": o.kind or "error",
                    "reason": (o.reason or "")[:REASON_MAX],
                }
                if o.final:
                    entry["final"] = True
                if o.traceback:
                    entry["traceback"] = o.traceback[-TRACEBACK_MAX:]
                errors[str(i)] = entry
            else:
                parts.append(r)
                room -= len(r)
    raw = b'{"token":' + orjson.dumps(token) + b',"results":[' + b",".join(parts) + b"]"
    if errors:
        raw += b',"errors":' + orjson.dumps(errors)
    # What the items cost and wrote: diagnostics, in the room the results left (never in
    # place of a result, never over the message's bound).
    costs = _costs(ids, outcomes) if ids is not None else b""
    if costs and len(costs) + 16 > room:
        log.warning("worker: the items' costs are not kept: the RESULT has no room left")
    elif costs:
        raw += b',"costs":' + costs
        room -= len(costs) + 16
    outputs = _outputs(ids, outcomes, room) if ids is not None and outcomes.outputs else b""
    if outputs:
        raw += b',"outputs":' + outputs
    return raw + b"}"


def _costs(ids: list[Any], outcomes: Outcomes) -> bytes:
    """The ``costs`` member of a RESULT (empty when no item's cost was measured): a table of
    columns when there are several items, all measured and alike (:func:`~durable_dispatch.
    cost.wire_table`; the master keeps it as it comes), else by work ID."""
    cpu, rss, by = outcomes.cpu, outcomes.rss, outcomes.by
    table = wire_table(ids, cpu, rss, by)
    if table is not None:
        return orjson.dumps(table)
    if len(by) != len(ids):
        return b""
    c = {
        w: {"cpu": cpu[i], "rss": rss[i], "by": how}
        for i, (w, how) in enumerate(zip(ids, by, strict=True))
        if how is not None and type(w) is str
    }
    return orjson.dumps(c) if c else b""


def _outputs(ids: list[Any], outcomes: Outcomes, room: int) -> bytes:
    """The ``outputs`` member of a RESULT (empty when no item wrote anything), in at most
    :data:`OUTPUT_ROOM` bytes and ``room``, what the results left."""
    said: dict[Any, bytes] = {}
    left = min(OUTPUT_ROOM, room - 64)  # (64: the member's name and its braces)
    dropped: list[str] = []
    for i, output in sorted(outcomes.outputs.items()):
        w = ids[i] if i < len(ids) else None
        if type(w) is not str or (entry := output_entry(output)) is None:
            continue
        raw = orjson.dumps(entry)
        if len(raw) + len(w) + 4 > left:
            dropped.append(w)
            continue
        said[w] = raw
        left -= len(raw) + len(w) + 4  # (the ID, its quotes, the colon and the comma)
    if dropped:  # one line a RESULT, not one an item
        log.warning(
            "worker: the output of %d items (%s%s) is not kept: the RESULT has no room left",
            len(dropped),
            ", ".join(dropped[:3]),
            ", ..." if len(dropped) > 3 else "",
        )
    if not said:
        return b""
    return b"{" + b",".join(orjson.dumps(w) + b":" + r for w, r in said.items()) + b"}"


def part_message(token: Any, outcomes: Outcomes, ids: list[Any]) -> bytes:
    """A RESULT sent ahead for some items of a dispatch (see the module docs): the RESULT of
    those ``outcomes`` (:func:`result_message`) with their work IDs ``ids`` first."""
    raw = result_message(token, outcomes, None, ids)
    return b'{"ids":' + orjson.dumps(ids) + b"," + raw[1:]
