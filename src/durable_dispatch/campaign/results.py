"""Results are user data (U6): every committed result stays readable for the campaign's life.

Where a result lives: its ``committed`` record in the state journal (``events.jsonl``) holds it.
Compaction (``durable-dispatch compact``) moves every committed result into the results journal
(``results.jsonl``, the same checksummed format) before it empties the state journal, each with
the sequence number of the record it came from; nothing is dropped, and a compaction interrupted
half way moves nothing twice (it resumes after the last sequence number moved).

:func:`read_results` reads both, in commit order, one entry per work ID. It is read-only: it
takes no lock and creates nothing, so it is safe beside a running master (a record the master is
writing at that moment is not read yet).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .statedir import RESULT_RECORD_BYTES, RESULTS_JOURNAL, STATE_JOURNAL, is_state_dir

__all__ = [
    "CommittedResult",
    "JobRow",
    "read_joblog",
    "read_results",
    "RESULTS_JOURNAL",
    "results_of_event",
    "shown",
]


@dataclass(frozen=True)
class CommittedResult:
    """One committed work item and its result.

    Attributes:
        work_id: the item's stable work ID.
        result: the value the work function returned (JSON).
        seq: the sequence number of the state journal record that committed it (commit order).
        token: the dispatch's token (``e<epoch>-<n>``), or None in records that lack it.
        epoch: the master epoch it was committed in (from the token), or None.
        rank: the worker rank that ran it, or None in records that lack it.
        ts: when it was committed (seconds since the epoch), or None in records that lack it.
    """

    work_id: str
    result: Any
    seq: int
    token: str | None = None
    epoch: int | None = None
    rank: int | None = None
    ts: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``work_id`` and ``result`` first."""
        return {
            "work_id": self.work_id,
            "result": self.result,
            "seq": self.seq,
            "token": self.token,
            "epoch": self.epoch,
            "rank": self.rank,
            "ts": self.ts,
        }


def results_of_event(ev: Mapping[str, Any], seq: int) -> list[CommittedResult]:
    """The results a ``committed`` event holds (one, or several for a multi-item dispatch)."""
    token = ev.get("token")
    epoch: int | None = None
    if isinstance(token, str) and token.startswith("e") and "-" in token:
        head = token[1:].split("-", 1)[0]
        epoch = int(head) if head.isdigit() else None
    rank, ts = ev.get("rank"), ev.get("ts")
    if "work_ids" in ev:
        pairs = list(zip(ev["work_ids"], ev.get("results") or [], strict=False))
    else:
        pairs = [(ev.get("work_id"), ev.get("result"))]
    return [
        CommittedResult(
            str(wid),
            value,
            seq,
            token if isinstance(token, str) else None,
            epoch,
            rank if type(rank) is int else None,
            float(ts) if isinstance(ts, (int, float)) else None,
        )
        for wid, value in pairs
    ]


def read_results(
    state_dir: str | os.PathLike[str],
    work_ids: Iterable[str] | None = None,
    *,
    after_seq: int = -1,
) -> Iterator[CommittedResult]:
    """Every committed result of a campaign, in commit order (see the module docs).

    Args:
        state_dir: the campaign's state directory.
        work_ids: only these work IDs (default: all).
        after_seq: only results committed by a record after this sequence number.

    Raises:
        UsageError: not a state directory.
        JournalCorruptError: damage in one of the journals (before their torn tails).
    """
    from ..errors import UsageError

    d = os.fspath(state_dir)
    if not is_state_dir(d):
        raise UsageError(f"{d} is not a durable-dispatch state directory")
    wanted = None if work_ids is None else set(work_ids)
    seen: set[str] = set()
    moved = -1  # the greatest state-journal sequence number the results journal holds

    def keep(results: list[CommittedResult]) -> Iterator[CommittedResult]:
        for r in results:
            if r.seq > after_seq and r.work_id not in seen:
                if wanted is None or r.work_id in wanted:
                    seen.add(r.work_id)
                    yield r

    def from_results_journal(after: int) -> Iterator[CommittedResult]:
        nonlocal moved
        path = os.path.join(d, RESULTS_JOURNAL)
        if os.path.exists(path):
            for rec in _read(path):
                seq = int(rec.payload["seq"])
                if seq > after:
                    moved = max(moved, seq)
                    yield from keep(results_of_event(rec.payload, seq))

    yield from from_results_journal(-1)
    upto = moved
    path = os.path.join(d, STATE_JOURNAL)
    if os.path.exists(path):
        for rec in _read(path, from_seq=max(upto, after_seq) + 1):
            if rec.payload.get("event") == "committed":
                yield from keep(results_of_event(rec.payload, rec.seq))
    # A compaction that ran while the state journal was read moved results after ``upto``
    # into the results journal; those are read from there (nothing twice: one per work ID).
    yield from from_results_journal(upto)


def _read(path: str, from_seq: int = 0) -> Iterator[Any]:
    from ..storage.journal import read_journal

    return read_journal(path, from_seq=from_seq, max_record_bytes=RESULT_RECORD_BYTES)


_SIMPLE_OPS = {
    "EMPTY_DICT": "dict",
    "EMPTY_LIST": "list",
    "EMPTY_TUPLE": "tuple",
    "TUPLE1": "tuple",
    "TUPLE2": "tuple",
    "TUPLE3": "tuple",
    "MARK": "tuple",
    "EMPTY_SET": "set",
    "BININT": "int",
    "BININT1": "int",
    "BININT2": "int",
    "LONG1": "int",
    "LONG4": "int",
    "BINFLOAT": "float",
    "SHORT_BINUNICODE": "str",
    "BINUNICODE": "str",
    "BINUNICODE8": "str",
    "SHORT_BINBYTES": "bytes",
    "BINBYTES": "bytes",
    "BINBYTES8": "bytes",
    "BYTEARRAY8": "bytearray",
    "NONE": "NoneType",
    "NEWTRUE": "bool",
    "NEWFALSE": "bool",
}


def _pickled_type(data: bytes) -> str | None:
    """The type of a pickle's top-level value, read from its first opcodes (never loaded)."""
    import pickletools

    names: list[str] = []
    try:
        for n, (op, arg, _pos) in enumerate(pickletools.genops(data)):
            if n > 12 or op.name == "STOP":
                break
            if op.name in ("PROTO", "FRAME", "MEMOIZE"):
                continue
            if op.name == "STACK_GLOBAL" and len(names) >= 2:
                return f"{names[-2]}.{names[-1]}"
            if op.name == "GLOBAL" and isinstance(arg, str):
                return arg.replace(" ", ".")
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE") and isinstance(arg, str):
                names.append(arg)
                continue
            return _SIMPLE_OPS.get(op.name)
    except Exception:  # noqa: BLE001 - a damaged pickle: its type is unknown
        return None
    return "str" if names else None


def shown(result: Any) -> Any:
    """What the command line shows of a result: a sealed pickle of ``durable_dispatch.futures``
    as ``{"sealed": "ok" | "raised", "type": ..., "bytes": ...}``, its type read from the
    pickle's first opcodes without loading it (S7: the CLI never unpickles); any other result
    as it is."""
    import base64
    import binascii

    if not (isinstance(result, dict) and result.get("how") in ("ok", "raised")):
        return result
    if not ({"d", "tag"} <= result.keys() and ("v" in result or "blob" in result)):
        return result
    if "blob" in result:
        size = result.get("size")
        return {"sealed": result["how"], "type": None, "bytes": size, "file": result["blob"]}
    try:
        data = base64.b64decode(result["v"], validate=True)
    except (binascii.Error, TypeError, ValueError):
        return {"sealed": result["how"], "type": None, "bytes": None}
    return {"sealed": result["how"], "type": _pickled_type(data), "bytes": len(data)}


# ------------------------------------------------------------------------------------ joblog
@dataclass(frozen=True)
class JobRow:
    """One work item as ``durable-dispatch joblog`` shows it (GNU parallel's ``--joblog``).

    Attributes:
        work_id: the item's stable work ID.
        status: ``committed``, ``deferred``, ``cancelled``, ``pending``, ``waiting`` (for a
            dependency, ``WorkItem.after``) or ``in flight`` (only while a master runs: what a
            stopped master left in flight is pending).
        tries: its tries that counted: the failures charged to it, plus the try that committed
            or is running (a rollback at a master's restart, a batch split or a deferral for a
            dependency is not a try).
        last_failure_kind: the kind of its last failure (``timeout``, ``error`` ...), or None.
        last_failure: the text of its last failure, or None.
        started: when its newest dispatch was sent (wall-clock seconds), or None when no record
            of it is left (a state written before this version, or compacted by one).
        seconds: how long its newest dispatch ran (until now while in flight), or None.
        rank: the rank that ran its newest dispatch, or None.
        host: the host of that rank (what its worker named in that run's first READY), or
            None when not recorded (a state written before this version, or a worker of one).
        call: what it runs, as text: a futures call's ``function(arguments)`` (a preview stored
            at submit; never unpickled), else its payload as JSON, cut at 100 characters.
    """

    work_id: str
    status: str
    tries: int
    last_failure_kind: str | None
    last_failure: str | None
    started: float | None
    seconds: float | None
    rank: int | None
    host: str | None
    call: str | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, in the order above."""
        return dict(vars(self))


def _call_text(payload: Any) -> str | None:
    import orjson

    if isinstance(payload, dict) and isinstance(payload.get("fn"), str) and "tag" in payload:
        args = payload.get("args")
        return f"{payload['fn']}({args if isinstance(args, str) else '...'})"
    try:
        text = orjson.dumps(payload).decode()
    except TypeError:
        return None
    return text if len(text) <= 100 else text[:97] + "..."


def _payloads(d: str) -> dict[str, Any]:
    """Work ID -> payload of every item in the submissions store (committed ones included)."""
    from ..storage.journal import read_journal
    from .statedir import SUBMISSION_RECORD_BYTES, SUBMISSIONS

    out: dict[str, Any] = {}
    path = os.path.join(d, SUBMISSIONS)
    if os.path.exists(path):
        for rec in read_journal(path, max_record_bytes=SUBMISSION_RECORD_BYTES):
            for it in rec.payload.get("items") or ():  # [work_id, payload] or an item's JSON
                if type(it) is list and len(it) in (2, 3) and isinstance(it[0], str):
                    out[it[0]] = it[1]
                elif isinstance(it, dict) and isinstance(it.get("work_id"), str):
                    out[it["work_id"]] = it.get("payload")
    return out


def _ledger_payload(led: Any, wid: str) -> Any:
    """The payload the ledger holds (items not committed, of states older than the store)."""
    try:
        return led.items[wid].payload
    except KeyError:
        return None


def read_joblog(state_dir: str | os.PathLike[str], *, now: float | None = None) -> Iterator[JobRow]:
    """One :class:`JobRow` per work item, in submission order; read-only, safe beside a
    running master. Status, tries and failures come from the campaign's one view of its state
    (kept by compaction); start, duration, rank and host from the journals' history.

    Raises:
        UsageError: not a state directory.
        JournalCorruptError, SnapshotCorruptError: damage found.
    """
    import time

    from ..views.history import read_history
    from .admin import view_state

    d = os.fspath(state_dir)
    t = time.time() if now is None else now
    sv = view_state(d)
    led, running = sv.projection, sv.master_running
    h = read_history(d, now=t, running=running)
    stored = _payloads(d)
    for wid in led.ids.ids:
        if wid is None:
            continue
        if wid in led.committed:
            status = "committed"
        elif wid in led.deferred:
            status = "deferred"
        elif wid in led.cancelled:  # O1: an operator's cancel (final)
            status = "cancelled"
        elif wid in led.in_flight and running:
            status = "in flight"
        elif wid in led.waiting:
            status = "waiting"
        else:
            status = "pending"
        kinds = led.kinds.get(wid) or []
        # (a deferral for a dependency is no try: the item never ran)
        tries = len(kinds) - kinds.count("dependency")
        tries += 1 if status in ("committed", "in flight") else 0
        att = h.last.get(wid)
        payload = stored[wid] if wid in stored else _ledger_payload(led, wid)
        yield JobRow(
            wid,
            status,
            tries,
            kinds[-1] if kinds else None,
            (led.last_error.get(wid) or None) if kinds else None,
            att.start if att is not None else None,
            round(s, 3) if att is not None and (s := att.seconds(t)) is not None else None,
            att.rank if att is not None else None,
            att.host if att is not None else None,
            _call_text(payload),
        )
