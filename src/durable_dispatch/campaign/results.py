"""Results are user data: every committed result stays readable for the campaign's life.

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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..core.events import Committed, decode_moved
from ..values import TAG, restore
from .statedir import (
    RESULT_RECORD_BYTES,
    RESULTS_JOURNAL,
    STATE_JOURNAL,
    SUBMISSION_RECORD_BYTES,
    SUBMISSIONS,
    is_state_dir,
)

__all__ = [
    "CommittedResult",
    "read_results",
    "stored_results",
    "RESULTS_JOURNAL",
    "results_of_event",
    "shown",
]


@dataclass(frozen=True)
class CommittedResult:
    """One committed work item and its result.

    Attributes:
        work_id: the item's stable work ID.
        result: the value the work function returned, exactly (NaN and the infinities
            included; a numpy scalar as the equal Python number).
        seq: the sequence number of the state journal record that committed it (commit order).
        token: the dispatch's token (``e<epoch>-<n>``), or None in records that lack it.
        epoch: the master epoch it was committed in (from the token), or None.
        rank: the worker rank that ran it, or None in records that lack it.
        ts: when it was committed (seconds since the epoch), or None in records that lack it.
        payload: the item's payload, exactly as submitted (from the work list, a callback's
            children, a ``Feed`` or ``durable-dispatch submit``), when read with
            ``read_results(..., with_payload=True)``; else None.
    """

    work_id: str
    result: Any
    seq: int
    token: str | None = None
    epoch: int | None = None
    rank: int | None = None
    ts: float | None = None
    payload: Any = None

    def as_dict(self, with_payload: bool = False) -> dict[str, Any]:
        """JSON-ready: ``work_id`` and ``result`` first (``payload`` third, when asked)."""
        out = {"work_id": self.work_id, "result": self.result}
        if with_payload:
            out["payload"] = self.payload
        out.update(seq=self.seq, token=self.token, epoch=self.epoch, rank=self.rank, ts=self.ts)
        return out


def results_of_event(ev: Mapping[str, Any], seq: int) -> list[CommittedResult]:
    """The results a ``committed`` record holds (one, or several for a multi-item dispatch),
    decoded by :mod:`durable_dispatch.core.events` (a moved result's record too).

    Raises:
        Invalid: the record does not match the ``committed`` schema.
    """
    return _rows(_committed(ev), seq)


def _rows(c: Committed, seq: int) -> list[CommittedResult]:
    token = c.token
    name, epoch = (None, None) if token is None else (str(token), token.epoch)
    return [
        CommittedResult(wid, value, seq, name, epoch, c.rank, c.ts)
        for wid, value in zip(c.work_ids, c.results, strict=False)
    ]


def read_results(
    state_dir: str | os.PathLike[str],
    work_ids: Iterable[str] | None = None,
    *,
    after_seq: int = -1,
    with_payload: bool = False,
) -> Iterator[CommittedResult]:
    """Every committed result of a campaign, in commit order (see the module docs).

    Args:
        state_dir: the campaign's state directory.
        work_ids: only these work IDs (default: all).
        after_seq: only results committed by a record after this sequence number.
        with_payload: each row carries its item's payload (``CommittedResult.payload``), read
            from the submissions store and the state journal (compaction keeps both).

    Raises:
        UsageError: not a state directory.
        JournalCorruptError: damage in one of the journals (before their torn tails).
    """
    rows = stored_results(state_dir, work_ids, after_seq=after_seq)
    payloads = _payloads(os.fspath(state_dir)) if with_payload else None
    for r in rows:
        if type(r.result) is dict and TAG in r.result:
            r = replace(r, result=restore(r.result))
        if payloads is not None:
            r = replace(r, payload=restore(payloads.get(r.work_id)))
        yield r


def _payloads(d: str) -> dict[str, Any]:
    """Every submitted item's payload (its stored form) by work ID: the submissions store's
    records (compaction keeps the store), then the items the state journal's ``submitted``
    events carry themselves (a store the disk refused, a state directory of an earlier version:
    once compacted, those are gone, and the row's payload is None)."""
    from ..core.indexed import stored_item
    from ..schema import Invalid

    out: dict[str, Any] = {}

    def take(items: Any) -> None:
        for v in items if type(items) is list else ():
            try:
                w = stored_item(v)
            except Invalid:
                continue
            out.setdefault(w.work_id, w.payload)

    path = os.path.join(d, SUBMISSIONS)
    if os.path.exists(path):
        for rec in _read(path, max_bytes=SUBMISSION_RECORD_BYTES):
            if isinstance(rec.payload, dict):
                take(rec.payload.get("items"))
    path = os.path.join(d, STATE_JOURNAL)
    if os.path.exists(path):
        for rec in _read(path):
            p = rec.payload
            if isinstance(p, dict) and p.get("event") == "submitted" and "items" in p:
                take(p["items"])
    return out


def stored_results(
    state_dir: str | os.PathLike[str],
    work_ids: Iterable[str] | None = None,
    *,
    after_seq: int = -1,
) -> Iterator[CommittedResult]:
    """As :func:`read_results`, each result in its stored form (:mod:`durable_dispatch.values`:
    what the master sends on as a dependency's result)."""
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
                m = _checked(path, rec, decode_moved)
                if m.seq > after:
                    moved = max(moved, m.seq)
                    yield from keep(_rows(m.commit, m.seq))

    yield from from_results_journal(-1)
    upto = moved
    path = os.path.join(d, STATE_JOURNAL)
    if os.path.exists(path):
        for rec in _read(path, from_seq=max(upto, after_seq) + 1):
            if rec.payload.get("event") == "committed":
                yield from keep(_rows(_checked(path, rec, _committed), rec.seq))
    # A compaction that ran while the state journal was read moved results after ``upto``
    # into the results journal; those are read from there (nothing twice: one per work ID).
    yield from from_results_journal(upto)


_T = TypeVar("_T")


def _committed(rec: Any) -> Committed:
    Committed.check(rec)
    return Committed.decode(rec)


def _checked(path: str, rec: Any, decode: Callable[[Any], _T]) -> _T:
    """``decode(rec.payload)``; a record that does not match its schema is damage."""
    from ..errors import JournalCorruptError
    from ..schema import Invalid

    try:
        return decode(rec.payload)
    except Invalid as e:
        raise JournalCorruptError(
            f"{path}: invalid committed record (seq {rec.seq}): {e}", path=path, reason=str(e)
        ) from None


def _read(path: str, from_seq: int = 0, max_bytes: int = RESULT_RECORD_BYTES) -> Iterator[Any]:
    from ..storage.journal import read_journal

    return read_journal(path, from_seq=from_seq, max_record_bytes=max_bytes)


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
    pickle's first opcodes without loading it (the CLI never unpickles); any other result
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
