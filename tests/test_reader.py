"""storage/reader.py: the one verified reader of a journal file and its one sequence rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_dispatch import Journal
from durable_dispatch.errors import JournalCorruptError
from durable_dispatch.storage.reader import follows


def test_the_sequence_rule_is_the_next_number_or_the_first_after_a_recorded_hole() -> None:
    holes = {5: 9}
    assert follows(7, None, holes)  # the first record read
    assert follows(4, 3, holes) and follows(10, 4, holes)
    assert not follows(3, 3, holes) and not follows(2, 3, holes)  # repeated, backwards
    assert not follows(6, 4, {}) and not follows(9, 4, holes)  # a gap the header does not name


def _swap_two_records(path: Path) -> None:
    """Splice the file: records 1 and 2 change places (each still checks out alone)."""
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2], lines[3] = lines[3], lines[2]
    path.write_bytes(b"".join(lines))


def test_every_reader_of_an_open_journal_refuses_records_out_of_order(tmp_path: Path) -> None:
    """Compaction's raw reader once copied a spliced span as it was: no reader checked the
    order but the replay and the open."""
    path = tmp_path / "j.jsonl"
    with Journal.open(path, sync="always") as j:
        for i in range(4):
            j.append({"i": i})
        _swap_two_records(path)
        with pytest.raises(JournalCorruptError, match="sequence 2"):
            list(j.raw_batches())
        with pytest.raises(JournalCorruptError, match="sequence"):
            list(j.records())
        _swap_two_records(path)  # put back: the journal closes clean
        assert [b for batch in j.raw_batches() for b in batch.seqs] == [0, 1, 2, 3]
