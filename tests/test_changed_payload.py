"""U11: a work ID names one payload. Submitting a known work ID with another payload is refused
with ChangedPayloadError naming the ID, by every way work arrives (CampaignState.submit, a
run_master list or generator, a Feed, the children of on_commit), also across a restart, before
anything runs with the stale payload; the same payload is skipped silently, as before."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import CampaignState, RetryPolicy, WorkItem
from durable_dispatch.core.indexed import payload_digests
from durable_dispatch.core.ledger import LedgerLoader
from durable_dispatch.errors import ChangedPayloadError, UsageError
from durable_dispatch.mpi import Feed, run_master
from durable_dispatch.mpi import master as master_mod
from durable_dispatch.storage.journal import read_journal
from durable_dispatch.testing import LocalWorkers


def _sweep(n: int, changed: str | None = None) -> list[WorkItem]:
    """The issue's sweep: ``w<i>`` computes from ``{"x": i}``; ``changed`` gets x * 100."""
    return [
        WorkItem(f"w{i}", {"x": i * 100 if f"w{i}" == changed else i, "scale": 2}) for i in range(n)
    ]


class _Seen:
    """A work function that records the payloads it was given."""

    def __init__(self) -> None:
        self.payloads: list[Any] = []

    def __call__(self, p: Any) -> Any:
        self.payloads.append(p)
        return {"y": p["x"] * p["scale"]}


def _commit_some(state: Path, items: list[WorkItem], k: int) -> None:
    """A first run that submitted ``items`` and committed the first ``k``, then ended (as a
    killed job leaves it: the rest pending)."""
    with CampaignState.open(state, ranks=[1]) as st:
        st.submit(items)
        for _ in range(k):
            s = st.next_send(0.0)
            assert s is not None
            st.sent(s.token, 0.0)
            st.on_results(s.rank, str(s.token), [{"y": 0}], 0.0)
            st.tick(0.0)
            st.on_ready(s.rank, str(s.token), 0.0)
        st.deliver(wait=True)


def test_the_error_is_a_usage_error_that_pickles_with_its_work_id() -> None:
    e = ChangedPayloadError("w6 changed", work_id="w6")
    assert isinstance(e, UsageError) and isinstance(e, ValueError)
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is ChangedPayloadError and again.work_id == "w6"
    assert str(again) == str(e) and "w6" in str(e)
    with pytest.raises(AttributeError):
        e.work_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize("where", ["pending", "in flight", "committed", "deferred"])
def test_submit_refuses_a_known_id_with_another_payload_and_adds_nothing(
    tmp_path: Path, where: str
) -> None:
    with CampaignState.open(tmp_path / "s", ranks=[1], retry=RetryPolicy(0)) as st:
        st.submit([WorkItem("a", {"x": 1, "v": [1, 2]})])
        if where != "pending":
            s = st.next_send(0.0)
            assert s is not None
            st.sent(s.token, 0.0)
            if where == "committed":
                st.on_results(s.rank, str(s.token), [1], 0.0)
                st.deliver(wait=True)
            elif where == "deferred":
                st.on_results(s.rank, str(s.token), None, 0.0, failure="boom")
                st.on_ready(s.rank, str(s.token), 0.0)
                st.tick(0.0)
                assert "a" in st.core.ledger.deferred
        with pytest.raises(ChangedPayloadError, match=f"'a' is known \\({where}\\)") as e:
            st.submit([WorkItem("new", 0), WorkItem("a", {"x": 2, "v": [1, 2]})])
        assert e.value.work_id == "a"
        assert "new" not in st.core.ledger.ids.index  # nothing of that call was added
        # the same payload, its keys in another order: skipped (a tuple for the list would be
        # refused: it would come back as a list, see test_values.py)
        assert st.submit([WorkItem("a", {"v": [1, 2], "x": 1}), WorkItem("new", 0)]) == 1


def test_one_id_twice_in_one_submission_with_two_payloads_is_refused(tmp_path: Path) -> None:
    with CampaignState.open(tmp_path / "s", ranks=[1]) as st:
        with pytest.raises(ChangedPayloadError, match="earlier in this submission"):
            st.submit([WorkItem("a", 1), WorkItem("b", 2), WorkItem("a", 3)])
        assert not st.core.ledger.ids.index
        assert st.submit([WorkItem("a", 1), WorkItem("a", 1)]) == 1


def test_a_restart_compares_with_what_the_first_run_submitted(tmp_path: Path) -> None:
    """The user edits the script and reruns: committed and pending items alike, after a reopen
    from the snapshot, and from the journal alone (no snapshot covers the items)."""
    items = _sweep(20)
    _commit_some(tmp_path / "s", items, 5)
    with CampaignState.open(tmp_path / "s", ranks=[1]) as st:
        assert st.submit(_sweep(22)) == 2  # the same payloads: skipped, the new ones added
        for wid in ("w3", "w12"):  # committed, pending
            with pytest.raises(ChangedPayloadError, match=repr(wid)):
                st.submit(_sweep(20, changed=wid))
    # the store's records carry the digests: a reopen reads them, it does not hash again
    recs = [r.payload for r in read_journal(tmp_path / "s" / "submissions.jsonl")]
    assert recs and all(len(r["digests"]) == 16 * len(r["items"]) for r in recs)
    # a crash before any snapshot covered the items: the journal's replay alone
    for snap in (tmp_path / "s").glob("campaign.*"):
        snap.unlink()
    with CampaignState.open(tmp_path / "s", ranks=[1]) as st:
        assert st.submit(_sweep(22)) == 0
        with pytest.raises(ChangedPayloadError, match="'w3' is known \\(committed\\)"):
            st.submit(_sweep(20, changed="w3"))


def test_a_store_written_before_digests_is_digested_as_it_loads() -> None:
    load = LedgerLoader(None)
    load.take(0, [["a", {"x": 1}], None, {"work_id": "c", "payload": [1], "priority": 2}])
    led, _tail = load.finish()
    assert led.ids.digests[:8] == payload_digests([{"x": 1}])
    assert led.ids.digests[8:16] == bytes(8)  # void: unknown
    assert led.ids.digests[16:] == payload_digests([(1,)])


def test_a_payload_digest_is_blake2b_of_its_json_with_sorted_keys() -> None:
    """The digests are stored (docs/state-format.md): 8 bytes of BLAKE2b over the payload's JSON
    with its keys sorted, so a state written by any version compares with this one."""
    import hashlib

    import orjson

    payloads = [{"b": 1, "a": [1.5, None, {"z": "é", "y": True}]}, None, "x", [], {"k": -2}]
    want = b"".join(
        hashlib.blake2b(orjson.dumps(p, option=orjson.OPT_SORT_KEYS), digest_size=8).digest()
        for p in payloads
    )
    assert payload_digests(payloads) == want
    assert payload_digests(iter(payloads)) == want  # any iterable, once through
    assert payload_digests([]) == b""
    with pytest.raises(TypeError):
        payload_digests([{"a": object()}])


def test_run_master_refuses_a_changed_list_before_running_the_stale_payload(
    tmp_path: Path,
) -> None:
    """The issue's case: a sweep killed after 5 commits, rerun with w6 edited: today w6 ran with
    its old payload. Now run_master raises naming w6, and nothing ran."""
    _commit_some(tmp_path / "s", _sweep(30), 5)
    fn = _Seen()
    with pytest.raises(ChangedPayloadError, match="'w6'"):
        run_master(_sweep(30, changed="w6"), tmp_path / "s", comm=LocalWorkers(fn, 2), linger=0)
    assert fn.payloads == []
    fn = _Seen()
    report = run_master(_sweep(30), tmp_path / "s", comm=LocalWorkers(fn, 2), linger=0)
    assert report.finished and len(fn.payloads) == 25  # the same list: resumed silently


def test_a_generator_is_read_through_its_known_part_before_the_first_dispatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generator source is read in chunks as the frontier drains (G3); with more known items
    pending than the low-water mark, the loop used to dispatch them before reading the chunk
    that held the changed one."""
    monkeypatch.setattr(master_mod._Source, "CHUNK", 4)
    monkeypatch.setattr(master_mod._Source, "LOW", 2)
    _commit_some(tmp_path / "s", _sweep(12), 0)  # 12 pending, far above LOW

    def source() -> Iterator[WorkItem]:
        yield from _sweep(16, changed="w9")

    fn = _Seen()
    with pytest.raises(ChangedPayloadError, match="'w9'"):
        run_master(source(), tmp_path / "s", comm=LocalWorkers(fn, 2), linger=0)
    assert fn.payloads == []


def test_a_feed_that_submits_a_changed_payload_is_refused(tmp_path: Path) -> None:
    class Twice(Feed):
        def refill(self) -> None:
            if not self.state.core.ledger.ids.index:
                self.state.submit(_sweep(3))
            elif len(self.state.core.ledger.committed) == 3:
                self.state.submit(_sweep(3, changed="w1"))

    fn = _Seen()
    with pytest.raises(ChangedPayloadError, match="'w1' is known \\(committed\\)"):
        run_master(Twice(), tmp_path / "s", comm=LocalWorkers(fn, 2), linger=0)
    assert len(fn.payloads) == 3


def test_children_named_twice_with_two_payloads_are_refused(tmp_path: Path) -> None:
    """G1: a child two parents name is one item, so long as they name one payload."""

    def on_commit(wid: str, result: Any) -> list[WorkItem] | None:
        if wid.startswith("w"):
            return [WorkItem("child", {"x": 1, "scale": result["y"]})]  # differs by parent
        return None

    fn = _Seen()
    with pytest.raises(ChangedPayloadError, match="'child'"):
        run_master(_sweep(2), tmp_path / "s", on_commit, comm=LocalWorkers(fn, 1), linger=0)
    # the same child from both parents: one item, no error
    fn = _Seen()

    def same(wid: str, result: Any) -> list[WorkItem] | None:
        return [WorkItem("kid", {"x": 7, "scale": 1})] if wid.startswith("w") else None

    report = run_master(_sweep(2), tmp_path / "t", same, comm=LocalWorkers(fn, 1), linger=0)
    assert report.finished and [p["x"] for p in fn.payloads].count(7) == 1


def test_the_futures_feed_does_not_resubmit_a_call_pending_from_an_earlier_run(
    tmp_path: Path,
) -> None:
    """The futures executor names a call by its canonical digest; the pickle in its payload
    may differ byte for byte between runs (a set's order under another PYTHONHASHSEED). A call
    pending from an earlier run is therefore not submitted again, so U11 does not refuse it."""
    from durable_dispatch.futures._executor import _CallFeed

    with CampaignState.open(tmp_path / "s", ranks=[1]) as st:
        st.submit([WorkItem("f/abc/0", {"call": "pickle of run 1"})])
        feed = _CallFeed.__new__(_CallFeed)
        feed.state = st
        feed._submit(
            [WorkItem("f/abc/0", {"call": "pickle of run 2"}), WorkItem("f/def/0", {"call": 1})]
        )
        assert st.core.ledger.items["f/abc/0"].payload == {"call": "pickle of run 1"}
        assert "f/def/0" in st.core.ledger.items
