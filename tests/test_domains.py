"""Failure domains (U12, issue 60): a node is what dies on a cluster. Virtual time, the core
only: the hosts come from the workers' READYs, the losses from the runtime (ULFM)."""

from __future__ import annotations

import pytest

from durable_dispatch.core import Dispatcher, RetryPolicy, Send, WatchdogConfig, WorkItem
from durable_dispatch.core.decisions import Defer, Requeue
from durable_dispatch.core.domains import SUSPECT_SECONDS
from durable_dispatch.core.events import Requeued
from durable_dispatch.core.ranks import Ranks
from durable_dispatch.errors import UsageError

HOSTS = {1: "node1", 2: "node1", 3: "node2", 4: "node2"}


def make(n_items: int, busy: tuple[int, ...], retry: RetryPolicy | None = None) -> Dispatcher:
    """Ranks 1-2 on node1, 3-4 on node2; one item dispatched to each rank of ``busy``."""
    d = Dispatcher(epoch=1, watchdog=WatchdogConfig(60.0), retry=retry, ranks=(1, 2, 3, 4))
    for r, h in HOSTS.items():
        d.note_host(r, h)
    d.submit(WorkItem(f"w{i}", i) for i in range(n_items))
    # occupy the ranks not in ``busy`` first, so that the items land where the test wants
    return d


def send_to(d: Dispatcher, rank: int, now: float) -> Send:
    """Dispatch the head of the frontier to ``rank`` (the lower idle ranks suspect meanwhile)."""
    others = [r for r in d.idle_ranks() if r < rank]
    d._ranks.suspect(others, float("inf"))
    s = d.reserve(now)
    for r in others:
        d._ranks.heard(r)
    assert isinstance(s, Send) and s.rank == rank, s
    d.mark_dispatched(s.token, now)
    return s


def test_a_node_that_lost_its_ranks_at_once_charges_its_items_nothing() -> None:
    """Every rank of node1 reported in one check: both items go back uncharged (source
    node-lost), even with no lost-rank budget at all: none is deferred for its node's death."""
    d = make(4, (1, 2), retry=RetryPolicy(0))
    a, b = send_to(d, 1, 0.0), send_to(d, 2, 0.0)
    out = d.ranks_lost([1, 2], 1.0, "process failed")
    requeues = [x for x in out if isinstance(x, Requeue)]
    assert {r.work_id for r in requeues} == {a.items[0].work_id, b.items[0].work_id}
    assert {r.source for r in requeues} == {"node-lost"} and {r.kind for r in requeues} == {
        "lost-rank"
    }
    assert not any(isinstance(x, Defer) for x in out)
    assert d.attempts("w0") == 0 and d.attempts("w1") == 0
    st = d.statistics()
    assert (
        st.ranks_lost == 2 and st.node_lost_requeues == 2 and st.protocol_requeued_dispatches == 0
    )


def test_a_rank_that_died_alone_charges_its_item_lost_rank_once_its_host_answered() -> None:
    """Rank 3 lost alone: its item may have killed it, or its node may be dying. The charge
    waits until rank 4 (its host's other rank) answers: then it died alone, charged."""
    d = make(4, (3,))
    s = send_to(d, 3, 0.0)
    other = send_to(d, 4, 0.0)
    assert d.ranks_lost([3], 1.0) == []  # held: in flight, not yet charged
    assert d.status(s.items[0].work_id) is not None and d.attempts(s.items[0].work_id) == 0
    assert d.sweep(1.5) == []  # rank 4 has not answered yet
    d.on_result(4, str(other.token), "ok", 2.0)
    d.commit_done(other.token)
    d.on_ready(4, str(other.token), 2.0)
    out = d.sweep(2.0)
    (r,) = [x for x in out if isinstance(x, Requeue)]
    assert r.work_id == s.items[0].work_id and r.source == "rank-lost" and r.attempts == 1
    assert d.statistics().node_lost_requeues == 0


def test_an_item_is_not_handed_to_the_next_rank_of_a_dying_node() -> None:
    """Issue 60: rank 1 of a node was reported first; its item was re-sent to rank 2 of the
    same node before the runtime reported that one too, and was charged twice for one node's
    death (deferred). Now rank 2 is suspect and gets nothing, the item's charge waits, and the
    second loss of node1 shows the node died: the item goes back uncharged."""
    d = make(1, (1,), retry=RetryPolicy(0))
    send_to(d, 1, 0.0)
    assert d.ranks_lost([1], 1.0) == []
    assert d.reserve(1.5) is None  # not to rank 2 (idle, but suspect), and w0 is held
    assert d.statistics().suspect_ranks_now == 1
    out = d.ranks_lost([2], 2.0)
    (r,) = [x for x in out if isinstance(x, Requeue)]
    assert r.work_id == "w0" and r.source == "node-lost" and r.attempts == 0
    assert d.attempts("w0") == 0 and "w0" not in d.deferred()
    d.snapshot_persisted()
    s = d.reserve(2.5)
    assert isinstance(s, Send) and s.rank == 3 and s.items[0].work_id == "w0"


def test_ranks_of_one_node_reported_in_two_checks_charge_nothing() -> None:
    """The runtime reports a node's ranks a second apart: the first loss is held, the second
    shows the node died; neither item is charged."""
    d = make(2, (1, 2), retry=RetryPolicy(0))
    a = send_to(d, 1, 0.0)
    b = send_to(d, 2, 0.0)
    assert d.ranks_lost([1], 1.0) == []
    out = d.ranks_lost([2], 2.0)
    requeues = [x for x in out if isinstance(x, Requeue)]
    assert {(r.work_id, r.source, r.attempts) for r in requeues} == {
        (a.items[0].work_id, "node-lost", 0),
        (b.items[0].work_id, "node-lost", 0),
    }


def test_a_suspect_rank_serves_again_once_it_answers_or_the_window_passed() -> None:
    d = make(3, (1,))
    a = send_to(d, 1, 0.0)
    busy2 = send_to(d, 2, 0.0)
    d.ranks_lost([1], 1.0)
    assert d.statistics().suspect_ranks_now == 1
    # rank 2 finishes its dispatch: its RESULT and READY say it is alive
    d.on_result(2, str(busy2.token), "ok", 2.0)
    d.commit_done(busy2.token)
    d.on_ready(2, str(busy2.token), 2.0)
    assert d.statistics().suspect_ranks_now == 0
    d.sweep(2.0)  # rank 1 died alone: its item is charged, back at the front
    d.snapshot_persisted()
    s = d.reserve(2.0)
    assert isinstance(s, Send) and s.rank == 2 and s.items[0].work_id == a.items[0].work_id
    # a suspect that says nothing (idle) gets work again once the window passed
    d2 = make(3, (1,))
    send_to(d2, 1, 0.0)
    d2.ranks_lost([1], 1.0)
    for r in (3, 4):  # node2 busy, so only rank 2 could take work
        send_to(d2, r, 1.0)
    assert d2.sweep(1.0 + SUSPECT_SECONDS - 0.5) == []
    assert d2.reserve(1.0 + SUSPECT_SECONDS - 0.5) is None
    out = d2.sweep(1.0 + SUSPECT_SECONDS)  # no other loss of node1: rank 1 died alone
    assert [x.source for x in out if isinstance(x, Requeue)] == ["rank-lost"]
    d2.snapshot_persisted()
    s = d2.reserve(1.0 + SUSPECT_SECONDS)
    assert isinstance(s, Send) and s.rank == 2


def test_a_worker_that_said_it_failed_is_its_own_error_not_its_nodes() -> None:
    """A GONE (the worker's own exception) charges as a rank alone and suspects nobody."""
    d = make(2, (1,))
    send_to(d, 1, 0.0)
    out = d.rank_lost(1, 1.0, "worker failed: KeyError", domain=False)
    assert [x.source for x in out if isinstance(x, Requeue)] == ["rank-lost"]
    assert d.statistics().suspect_ranks_now == 0


def test_a_suspect_rank_that_said_it_failed_is_suspect_no_more() -> None:
    """A GONE is a message from its rank: a suspect rank that sends one answered, then left.
    Before, the lost rank stayed counted suspect and kept its host suspect until the window
    passed (the two records of suspicion disagreed). A lost rank is never suspect: its host is
    judged by the ranks it has left, and the item of the rank lost before it is charged at the
    next sweep (that rank died alone)."""
    d = make(2, (1,))
    send_to(d, 1, 0.0)
    assert d.ranks_lost([1], 1.0) == []  # rank 2 (node1) is suspect, w0's charge waits
    assert d.statistics().suspect_ranks_now == 1
    d.rank_lost(2, 2.0, "worker failed: KeyError", domain=False)
    assert d.statistics().suspect_ranks_now == 0 and d.live_ranks() == [3, 4]
    out = d.sweep(2.0)
    assert [(x.work_id, x.source) for x in out if isinstance(x, Requeue)] == [("w0", "rank-lost")]


def test_an_unknown_rank_changes_nothing() -> None:
    d = make(1, ())
    with pytest.raises(UsageError):
        d.ranks_lost([1, 9], 1.0)
    assert d.statistics().ranks_lost == 0 and d.live_ranks() == [1, 2, 3, 4]


def test_a_node_lost_requeue_is_uncharged_in_the_journal_too() -> None:
    """Replay reads the same: a ``node-lost`` requeue charges nothing (U2's master-restart
    kind of requeue), and its record round-trips."""
    ev = Requeued("w0", None, "node-lost", "lost-rank", 0, "process failed")
    assert not ev.charged
    rec = ev.encode()
    Requeued.check(rec)
    assert Requeued.decode(rec) == ev


def test_an_item_that_kills_every_rank_it_runs_on_is_charged_on_one_host_too() -> None:
    """U2's reason holds on one host: a rank that answered after its neighbour's loss and then
    died with the item it got next died of that item, so each such loss is charged, and the
    item is deferred once its budget is spent instead of killing every rank."""
    d = make(1, (1,), retry=RetryPolicy(1))
    s1 = send_to(d, 1, 0.0)  # (one item: the other ranks idle)
    d.ranks_lost([1], 1.0)  # w0 kills rank 1
    d.on_ready(2, None, 1.2)  # rank 2 (node1) says it is alive: rank 1 died alone
    d.sweep(1.2)
    assert d.attempts("w0") == 1
    d.snapshot_persisted()
    s2 = d.reserve(1.2)
    assert isinstance(s2, Send) and s2.rank == 2 and s2.items == s1.items
    d.mark_dispatched(s2.token, 1.2)
    out = d.ranks_lost([2], 2.0)  # w0 kills rank 2 too: its own doing, charged
    assert [type(x).__name__ for x in out][:1] == ["Defer"] and "w0" in d.deferred()


def test_an_operator_may_cancel_an_item_held_since_its_rank_was_lost() -> None:
    d = make(1, (1,))
    send_to(d, 1, 0.0)
    d.ranks_lost([1], 1.0)
    what, out, stop = d.cancel("w0")
    assert (what, out, stop) == ("cancelled", [], None)
    assert d.sweep(100.0) == [] and "w0" in d.ledger.cancelled and d.done


def test_a_rank_lost_alone_while_a_node_just_failed_is_lost_with_it() -> None:
    """Open MPI's runtime tears the whole job down when it loses a node's daemon: the ranks of
    the surviving nodes then die one by one. Within the window after a node failed, a rank of
    another host lost alone charges nothing (the cluster in a box found 4 ``lost-rank`` charges
    so); after the window, a rank lost alone charges its item again."""
    from durable_dispatch.core.domains import FailureDomains

    def domains() -> tuple[FailureDomains, Ranks[object]]:
        ranks: Ranks[object] = Ranks()
        fd = FailureDomains(ranks, window=10.0)
        for r, h in HOSTS.items():
            ranks.add(r)
            fd.note_host(r, h)
        return fd, ranks

    def lose(fd: FailureDomains, ranks: Ranks[object], lost: list[int], now: float) -> dict:
        out = fd.lost(lost, now)
        for r in lost:
            ranks.lose(r)
        return out

    fd, ranks = domains()
    assert lose(fd, ranks, [1, 2], 100.0) == {1: True, 2: True}  # node1 died
    assert lose(fd, ranks, [3], 101.0) == {3: True}  # torn down with it, not charged
    fd, ranks = domains()
    assert lose(fd, ranks, [1, 2], 100.0) == {1: True, 2: True}
    assert lose(fd, ranks, [4], 111.0) == {4: False}  # later, alone: its item's doing
