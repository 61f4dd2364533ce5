"""The committed results as a table: ``durable-dispatch results STATE --csv FILE`` (or
``--parquet FILE``).

One row per committed work ID (:func:`~durable_dispatch.campaign.results.read_results` yields
each once, whatever the callback did and however often the master was killed), in commit order.
The columns: ``work_id``; with ``with_payload``, the payload's members (``payload.<key>``, or one
``payload`` column for a payload that is not an object); then the result's, the same way
(``result.<key>`` or ``result``). Members are flattened one level: a value that is itself a list
or an object is written as JSON text. Columns come in the order they first appear, so the same
state directory gives the same file, byte for byte, every time.

The file is written beside its target and renamed over it once complete: a reader never sees a
half-written table, and an export that fails leaves the old file as it was.
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from ..campaign.results import CommittedResult, read_results, shown
from ..errors import UsageError
from ..storage import fs as _fs
from ..values import dumps_exact

__all__ = ["export_results", "EXPORT_FORMATS"]

#: the formats :func:`export_results` writes
EXPORT_FORMATS = ("csv", "parquet")


def _fields(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if type(value) is dict:
        for k, v in value.items():
            yield f"{prefix}.{k}", v
    else:
        yield prefix, value


def _row(r: CommittedResult, with_payload: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"work_id": r.work_id}
    if with_payload:
        row.update(_fields("payload", r.payload))
    row.update(_fields("result", shown(r.result)))
    return row


def _cell(v: Any) -> Any:
    """A CSV cell: a nested value as JSON text, None as empty, a float as its exact repr
    (``nan``, ``inf`` and ``-inf`` included, which pandas reads back)."""
    if type(v) in (list, dict):
        return dumps_exact(v)
    return "" if v is None else v


def export_results(
    state_dir: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    format: str = "csv",
    with_payload: bool = False,
) -> int:
    """Write every committed result of ``state_dir`` to ``path`` as a table (see the module
    docs); returns how many rows it wrote.

    Raises:
        UsageError: not a state directory; an unknown ``format``; ``parquet`` without pyarrow
            (``pip install 'durable-dispatch[parquet]'``).
    """
    if format not in EXPORT_FORMATS:
        raise UsageError(f"unknown export format {format!r}: one of {', '.join(EXPORT_FORMATS)}")
    writer: Callable[[list[str], list[dict[str, Any]], str], None]
    if format == "parquet":
        try:
            importlib.import_module("pyarrow")  # (an optional extra: no stubs needed)
        except ImportError:
            raise UsageError(
                "--parquet needs pyarrow: pip install 'durable-dispatch[parquet]'"
            ) from None
        writer = _write_parquet
    else:
        writer = _write_csv
    rows = [_row(r, with_payload) for r in read_results(state_dir, with_payload=with_payload)]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    target = os.fspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".export-", dir=os.path.dirname(target) or ".")
    os.close(fd)
    try:
        writer(columns, rows, tmp)
        _fs.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return len(rows)


def _write_csv(columns: list[str], rows: list[dict[str, Any]], tmp: str) -> None:
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(columns)
        for row in rows:
            out.writerow([_cell(row.get(c)) for c in columns])


def _write_parquet(columns: list[str], rows: list[dict[str, Any]], tmp: str) -> None:
    """One column per field; a column whose values are not all of one scalar type (None
    aside) holds their JSON text, so no value is converted behind the user's back."""
    pa: Any = importlib.import_module("pyarrow")
    pq: Any = importlib.import_module("pyarrow.parquet")

    data: dict[str, Any] = {}
    for c in columns:
        values = [row.get(c) for row in rows]
        kinds = {type(v) for v in values if v is not None}
        if kinds == {int, float}:  # ints and floats: a float column holds both exactly only
            kinds = {object}  # when the ints are small; JSON text keeps each as it is
        if len(kinds) <= 1 and not kinds & {list, dict, object}:
            data[c] = pa.array(values)
        else:
            data[c] = pa.array([None if v is None else dumps_exact(v) for v in values])
    pq.write_table(pa.table(data), tmp)
