"""Tests of durable_dispatch.storage.defer: deferred items and honest persisted/in-memory counts."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_dispatch import DeferJournal
from durable_dispatch.errors import UsageError
from durable_dispatch.storage.defer import DEFAULT_DEFER_NAME
from durable_dispatch.testing import inject_faults


def test_defer_persists_and_survives_reopen(tmp_path: Path) -> None:
    with DeferJournal.open(tmp_path) as d:
        r = d.defer("w-1", {"seed": "a"}, attempts=3, kinds=["timeout", "timeout"], last_error="t")
        assert r.persisted
        d.defer("w-2", {"seed": "b"}, attempts=2, kinds=["malformed-result"], self_contained=True)
        assert d.statistics().persisted == 2 and d.statistics().in_memory == 0
    assert (tmp_path / DEFAULT_DEFER_NAME).exists()
    with DeferJournal.open(tmp_path) as d:
        assert [i.work_id for i in d.items()] == ["w-1", "w-2"]
        item = d.get("w-1")
        assert item is not None
        assert (
            item.attempts == 3 and item.kinds == ("timeout", "timeout") and item.last_error == "t"
        )
        assert d.resolve("w-1", "requeued")
        assert "w-1" not in d and len(d) == 1
    with DeferJournal.open(tmp_path) as d:
        assert [i.work_id for i in d.items()] == ["w-2"]


def test_failed_append_is_counted_in_memory_never_persisted(tmp_path: Path) -> None:
    with inject_faults() as faults, DeferJournal.open(tmp_path) as d:
        faults.fail("fsync", errno.EIO)
        r = d.defer("w-9", {"x": 1}, attempts=2, kinds=["timeout"])
        assert not r.persisted
        s = d.statistics()
        assert (s.persisted, s.in_memory, s.live) == (0, 1, 1)
        assert "w-9" in d  # still visible, in memory
        assert not d.try_restore()
        assert d.statistics().persisted == 0
        faults.heal()
        assert d.try_restore()
        s = d.statistics()
        assert (s.persisted, s.in_memory) == (1, 0)
    with DeferJournal.open(tmp_path) as d:
        assert [i.work_id for i in d.items()] == ["w-9"]


@pytest.mark.parametrize("sync", ["batch", "never"])
def test_defer_waits_for_durability_under_other_policies(tmp_path: Path, sync: str) -> None:
    with DeferJournal.open(tmp_path / "d.jsonl", sync=sync) as d:
        assert d.defer("w", None, attempts=1).persisted
        assert d.journal.durable_seq == 0


def test_replayable_needs_inputs_unless_self_contained(tmp_path: Path) -> None:
    seed = tmp_path / "seed.bin"
    seed.write_bytes(b"x")
    with DeferJournal.open(tmp_path) as d:
        d.defer("a", {}, attempts=1, inputs=[str(seed)])
        d.defer("b", {}, attempts=1, inputs=[str(tmp_path / "gone")])
        d.defer(
            "c", {"all": "inside"}, attempts=1, inputs=[str(tmp_path / "gone")], self_contained=True
        )
        got = {i.work_id: i.replayable() for i in d.items()}
    assert got == {"a": True, "b": False, "c": True}


def test_bad_input(tmp_path: Path) -> None:
    with DeferJournal.open(tmp_path) as d:
        with pytest.raises(UsageError):
            d.defer("", {}, attempts=1)
        with pytest.raises(UsageError):
            d.resolve("nope", "requeued")
        d.defer("w", {}, attempts=1)
        with pytest.raises(UsageError):
            d.resolve("w", "forgotten")


def test_compaction_keeps_exactly_the_live_items_with_awkward_ids(tmp_path: Path) -> None:
    ids = ["plain", 'quo"te', "back\\slash", "ünï☃", "new\nline", "w-5"]
    with DeferJournal.open(tmp_path) as d:
        for i, w in enumerate(ids):
            d.defer(w, {"i": i}, attempts=1)
        d.resolve("w-5", "dropped")
        d.resolve('quo"te', "requeued")
        d.defer('quo"te', {"i": 99}, attempts=2)  # deferred again: the newest one is kept
        d.journal.append({"event": "note", "free": "form"})  # foreign records are dropped
        before, after = d.compact()
        assert (before, after) == (10, 5)
        items = {i.work_id: i.item for i in d.items()}
    assert items == {
        "plain": {"i": 0},
        'quo"te': {"i": 99},
        "back\\slash": {"i": 2},
        "ünï☃": {"i": 3},
        "new\nline": {"i": 4},
    }
    with DeferJournal.open(tmp_path) as d:
        assert {i.work_id: i.item for i in d.items()} == items


def test_compaction_across_many_batches_matches_a_plain_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deferrals resolved many blocks later, deferred again, and records in a foreign form (keys
    reordered, escaped IDs) that the compactor must decode: the kept set equals what a plain
    decoding replay of the journal says is live."""
    import random

    from durable_dispatch import Journal
    from durable_dispatch.storage import defer
    from durable_dispatch.storage.defer import compact_journal

    decoded: list[bytes] = []  # payloads the compactor had to decode (the slow path)
    slow = defer._event_and_id
    monkeypatch.setattr(defer, "_event_and_id", lambda raw: decoded.append(raw) or slow(raw))
    rng = random.Random(7)
    path = tmp_path / DEFAULT_DEFER_NAME
    ids = [f"w-{i}" for i in range(400)] + ['q"-1', "é-2", "b\\-3"]
    with Journal.open(path, sync="never") as j:
        for n in range(6000):
            early = n < 1500  # blocks with escaped IDs and foreign forms, then plain ones
            wid = rng.choice(ids if early else ids[:400])
            if rng.random() < 0.55:
                p = {"event": "deferred", "work_id": wid, "item": {"n": n}, "attempts": 1}
                if early and n % 11 == 0:  # another writer's key order
                    p = {"work_id": wid, "attempts": 1, "item": {"n": n}, "event": "deferred"}
            else:
                p = {"event": "resolved", "work_id": wid, "how": "dropped"}
            j.append(p)
        j.sync_now()
        expect: dict[str, object] = {}
        for rec in j.records():
            if rec.payload["event"] == "deferred":
                expect[rec.payload["work_id"]] = rec.payload
            else:
                expect.pop(rec.payload["work_id"], None)
        assert compact_journal(j, dry_run=True) == (6000, len(expect))
        assert 0 < len(decoded) < 3000  # both paths ran
        assert compact_journal(j) == (6000, len(expect))
        got = [rec.payload for rec in j.records()]
    assert {p["work_id"]: p for p in got} == expect
    assert len(got) == len(expect)
    # The kept records keep their journal order.
    order = [p["item"]["n"] for p in got]
    assert order == sorted(order)


def test_compact_file_collects_the_live_set_during_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clean file is read once by the open's scan (no second verifying pass); a file whose open
    repaired damage is read again after the repair. Both keep exactly the live items."""
    from durable_dispatch import Journal
    from durable_dispatch.storage.defer import compact_file

    def build() -> tuple[Path, dict[str, object]]:
        with DeferJournal.open(tmp_path, sync="never") as d:
            for i in range(3000):
                d.defer(f"w-{i % 700}", {"i": i}, attempts=1)
                if i % 3 == 0:
                    d.resolve(f"w-{i % 700}", "dropped")
            live = {x.work_id: x.item for x in d.items()}
        return tmp_path / DEFAULT_DEFER_NAME, live

    path, live = build()
    passes: list[int] = []
    real = Journal.raw_batches
    monkeypatch.setattr(Journal, "raw_batches", lambda j: passes.append(1) or real(j))
    assert compact_file(path, dry_run=True) == (4000, len(live))
    assert compact_file(path) == (4000, len(live))
    assert passes == []
    with DeferJournal.open(tmp_path) as d:
        assert {x.work_id: x.item for x in d.items()} == live
    with path.open("ab") as f:
        f.write(b'{"v":1,"crc":"12')  # a torn tail: cut by the open, then a second pass
    assert compact_file(path) == (len(live), len(live))
    assert passes == [1]
    with DeferJournal.open(tmp_path) as d:
        assert {x.work_id: x.item for x in d.items()} == live


def test_compaction_reads_duplicate_keys_as_a_decoder_does(tmp_path: Path) -> None:
    """Payload bytes that start like one event but name another later (duplicate keys: decoders
    keep the last) are read by the compactor as DeferJournal reads them."""
    from durable_dispatch import Journal
    from durable_dispatch.storage.defer import compact_journal

    with Journal.open(tmp_path / DEFAULT_DEFER_NAME, sync="always") as j:
        j.replace_contents(
            [
                b'{"event":"deferred","work_id":"a","item":1,"attempts":1}',
                b'{"event":"resolved","work_id":"a","event":"deferred","item":2,"attempts":1}',
                b'{"event":"deferred","work_id":"b","item":3,"attempts":1}',
                b'{"event":"deferred","work_id":"b","event":"resolved","how":"dropped"}',
            ],
            raw=True,
        )
        assert compact_journal(j) == (4, 1)
    with DeferJournal.open(tmp_path) as d:
        assert {x.work_id: x.item for x in d.items()} == {"a": 2}


@pytest.mark.parametrize("via", ["open", "journal"])
def test_compaction_refuses_an_intact_record_that_is_not_json(tmp_path: Path, via: str) -> None:
    """Checksummed bytes that do not decode (no writer of this library makes them) are damage to
    report, not a record to drop silently; the file is left as it was."""
    from durable_dispatch import Journal
    from durable_dispatch.errors import JournalCorruptError
    from durable_dispatch.storage.defer import compact_file, compact_journal

    path = tmp_path / DEFAULT_DEFER_NAME
    with Journal.open(path, sync="always") as j:
        j.replace_contents(
            [b'{"event":"deferred","work_id":"a","item":1}', b'{"event":"deferred",oops}'], raw=True
        )
    before = path.read_bytes()
    bad = len(before) - len(before.splitlines(keepends=True)[-1])
    with pytest.raises(JournalCorruptError) as ei:
        if via == "open":
            compact_file(path)
        else:
            with Journal.open(path) as j:
                compact_journal(j)
    assert ei.value.offset == bad and ei.value.reason == "payload is not JSON"
    assert path.read_bytes() == before


def _reference_last_events(offsets: list[int], payloads: list[bytes]) -> dict[bytes, int]:
    """What a decoding reader concludes: each work ID's last event (offset, or 0 if resolved)."""
    import orjson

    last: dict[bytes, int] = {}
    for off, raw in zip(offsets, payloads, strict=True):
        p = orjson.loads(raw)
        if isinstance(p, dict) and isinstance(p.get("work_id"), str):
            key = orjson.dumps(p["work_id"])[1:-1]
            if p.get("event") == "deferred":
                last[key] = off
            elif p.get("event") == "resolved":
                last[key] = 0
    return last


_IDS = ["w-1", "w-2", 'q"uote', "back\\slash", "ünï", "tab\t", "w-3"]


@st.composite
def _payload_runs(draw: st.DrawFn) -> list[bytes]:
    """Runs of payload bytes as this library writes them, mixed with other writers' forms:
    reordered keys, nested "event"/"work_id" keys, duplicate keys, foreign records."""
    import orjson

    out = []
    # Half the runs hold only payloads that start like ours (where the fast path is tried).
    forms = ["ours", "ours", "dup", "nested"]
    if draw(st.booleans()):
        forms += ["reordered", "bare"]
    for _ in range(draw(st.integers(1, 12))):
        wid = draw(st.sampled_from(_IDS))
        ev = draw(st.sampled_from(["deferred", "resolved", "note"]))
        form = draw(st.sampled_from(forms))
        if form == "ours":
            body = {"event": ev, "work_id": wid, "item": {"n": draw(st.integers(0, 9))}}
            out.append(orjson.dumps(body))
        elif form == "reordered":
            out.append(orjson.dumps({"work_id": wid, "event": ev}))
        elif form == "nested":
            out.append(orjson.dumps({"event": ev, "work_id": wid, "item": {"event": "x"}}))
        elif form == "dup":
            other = draw(st.sampled_from(["deferred", "resolved"]))
            head = orjson.dumps({"event": ev, "work_id": wid})[:-1]
            out.append(head + b',"event":' + orjson.dumps(other) + b"}")
        else:
            out.append(orjson.dumps(draw(st.sampled_from([[1], "s", {"work_id": 3}]))))
    return out


@given(runs=st.lists(_payload_runs(), min_size=1, max_size=6))
def test_fast_event_reading_agrees_with_decoding(runs: list[list[bytes]]) -> None:
    """The compactor's C-level reading of event and work ID gives, run by run and over a whole
    journal, exactly what decoding every payload gives: the property its safety rests on."""
    from durable_dispatch.storage.defer import _last_events, _LiveSet
    from durable_dispatch.storage.scan import RawBatch

    live, expect = _LiveSet(), {}
    off = 100
    for payloads in runs:
        offsets = list(range(off, off + len(payloads)))
        off += len(payloads)
        ref = _reference_last_events(offsets, payloads)
        assert _last_events(offsets, payloads) == ref
        live.add(RawBatch(offsets, list(range(len(offsets))), payloads))
        for k, v in ref.items():
            if v:
                expect[k] = v
            else:
                expect.pop(k, None)
    assert live.ids == expect
