"""Each item's output, kept with isolation: the outputs journal ``outputs.jsonl``.

With ``run_worker(isolate=True)`` the worker keeps the last 64 KiB of what each item wrote to its
standard output and error (:mod:`durable_dispatch.mpi.capture`) and sends it with the item's
RESULT; the master appends one record per item that wrote anything (``{"work_id", "token", "ts",
"stdout", "stderr", "stdout_dropped", "stderr_dropped"}``; a stream that is not UTF-8 is
``stdout_b64`` or ``stderr_b64``, its bytes in base64). ``durable-dispatch output STATE ID``
prints an item's newest one. Without isolation nothing is kept: a worker's prints go to its
standard output, the job's log, as they always did.

Durability: an output is a diagnostic, not a result. The journal is opened at the first output
(not at every open of a state directory) and written by group commit in the background: the
loop only queues the record, and the journal fsyncs at most every half second or 64 records (an
fsync per item would cost the master's loop a disk's latency per item on a shared filesystem).
A crash may lose the outputs of the last half second, never a result; a disk that refuses the
journal costs the outputs only (logged once).

Compaction (``durable-dispatch compact``) keeps each item's newest output and drops the outputs
of its earlier attempts, whatever the item's status (a committed item's output stays).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from itertools import chain
from typing import Any

import orjson

from ..errors import DurableDispatchError, JournalCorruptError, RecordTooLargeError
from ..schema import Invalid, check_output_record
from ..storage import Journal
from ..storage.journal import read_journal
from .statedir import OUTPUT_RECORD_BYTES, OUTPUTS_JOURNAL

__all__ = ["Outputs", "output_record", "compact_outputs", "newest_output"]

log = logging.getLogger("durable_dispatch.state")

_STREAM_KEYS = {
    "stdout": str,
    "stderr": str,
    "stdout_b64": str,
    "stderr_b64": str,
    "stdout_dropped": int,
    "stderr_dropped": int,
}


def output_record(work_id: str, token: str, entry: Any, ts: float) -> dict[str, Any] | None:
    """The record of a worker's ``outputs`` entry, with only the members of the schema (a
    worker's word is checked before it is kept), or None when it holds none."""
    if type(entry) is not dict:
        return None
    rec: dict[str, Any] = {"work_id": work_id, "token": token, "ts": ts}
    for k, t in _STREAM_KEYS.items():
        v = entry.get(k)
        if type(v) is t:
            rec[k] = v
    return rec if len(rec) > 3 else None


class Outputs:
    """The master's writer of the outputs journal (see the module docs); opened at the first
    record. Never raises: a journal that cannot be written costs the outputs, logged once."""

    def __init__(self, directory: str, claim: Any) -> None:
        self._path = os.path.join(directory, OUTPUTS_JOURNAL)
        self._claim = claim
        self._journal: Journal | None = None
        self._failed = False

    def append(self, rec: Mapping[str, Any]) -> None:
        """Queue one record (written and fsynced in the background)."""
        if self._failed:
            return
        try:
            if self._journal is None:
                self._journal = Journal.open(
                    self._path,
                    sync="batch",
                    batch_max_records=64,
                    batch_max_delay=0.5,
                    max_record_bytes=OUTPUT_RECORD_BYTES,
                    directory_claim=self._claim,
                )
            self._journal.append(dict(rec))
        except RecordTooLargeError as e:  # (this one only: the next may fit)
            log.warning("the output of %s is not kept: %s", rec.get("work_id"), e)
        except (DurableDispatchError, OSError) as e:
            self._failed = True
            log.warning("the items' outputs are not kept from now on (%s): %s", self._path, e)

    def close(self) -> None:
        """Write and fsync what is queued, and close (never raises)."""
        if self._journal is not None:
            try:
                self._journal.close()
            except (DurableDispatchError, OSError) as e:
                log.warning("the last items' outputs were not all kept (%s): %s", self._path, e)
            self._journal = None


def _check(path: str, rec: Any, where: str, offset: int | None = None) -> dict[str, Any]:
    try:
        check_output_record(rec)
    except Invalid as e:
        raise JournalCorruptError(
            f"{path}: {where}: {e}", path=path, offset=offset, reason=str(e)
        ) from None
    return rec  # type: ignore[no-any-return]


def newest_output(directory: str, work_id: str) -> dict[str, Any] | None:
    """The newest output record of ``work_id`` in the outputs journal, or None (read-only:
    linear in the file, bounded by the record bound; each record checked against its schema).

    Raises:
        JournalCorruptError: damage before the journal's torn tail, or a record that does not
            match its schema.
    """
    path = os.path.join(directory, OUTPUTS_JOURNAL)
    if not os.path.exists(path):
        return None
    found = None
    for r in read_journal(path, max_record_bytes=OUTPUT_RECORD_BYTES):
        p = _check(path, r.payload, f"record {r.seq}")
        if p["work_id"] == work_id:
            found = p
    return found


def compact_outputs(directory: str) -> tuple[int, int] | None:
    """Rewrite the outputs journal with each item's newest record only (atomic: temp file,
    fsync, rename, directory fsync). The caller holds the state directory's master lock.
    Returns ``(records_before, records_after)``, or None when there is no outputs journal."""
    path = os.path.join(directory, OUTPUTS_JOURNAL)
    if not os.path.exists(path):
        return None
    with Journal.open(path, sync="always", max_record_bytes=OUTPUT_RECORD_BYTES) as j:
        newest: dict[str, int] = {}
        n = 0
        for batch in j.raw_batches():
            for off, raw in zip(batch.offsets, batch.payloads, strict=True):
                n += 1
                p = _check(path, orjson.loads(raw), f"record at offset {off}", off)
                newest[p["work_id"]] = off
        keep = sorted(newest.values())
        kept = chain.from_iterable(b.payloads for b in j.raw_at(keep))  # (streamed)
        return n, j.replace_contents(kept, raw=True)
