"""submissions.py: every submitted item's payload, once, by dense index."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_dispatch import Journal
from durable_dispatch.campaign.submissions import SubmissionStore
from durable_dispatch.core import WorkItem
from durable_dispatch.errors import RecordTooLargeError
from durable_dispatch.testing import inject_faults


def test_items_are_stored_by_index_halving_a_record_that_is_too_large(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "s.jsonl", sync="always", max_record_bytes=300) as j:
        store = SubmissionStore(j, 5)
        items = [WorkItem(f"w{i}", "x" * 60) for i in range(4)]
        store.store(items, 5)
        assert store.stored == 9 and store.durable()
        records = [r.payload for r in j.records()]
    assert [(r["first"], len(r["items"])) for r in records] == [(5, 2), (7, 2)]


def test_an_item_too_large_alone_stops_the_store_after_the_items_before_it(
    tmp_path: Path,
) -> None:
    with Journal.open(tmp_path / "s.jsonl", sync="always", max_record_bytes=300) as j:
        store = SubmissionStore(j, 0)
        items = [WorkItem("a", 1), WorkItem("big", "x" * 400), WorkItem("c", 3)]
        with pytest.raises(RecordTooLargeError, match="'big' is too large"):
            store.store(items, 0)
        assert store.stored == 1


def test_durable_says_false_while_the_disk_refuses(tmp_path: Path) -> None:
    with inject_faults() as f, Journal.open(tmp_path / "s.jsonl", sync="batch") as j:
        store = SubmissionStore(j, 0)
        assert store.durable()  # nothing stored yet
        rule = f.fail("fsync", path=f"{tmp_path}/s.jsonl*")
        store.store([WorkItem("a", 1)], 0)
        assert not store.durable()
        f.heal(rule)
        assert j.try_restore() and store.durable()
