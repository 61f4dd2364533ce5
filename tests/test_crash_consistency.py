"""Crash-consistency campaign: crash after every fs operation of scripted workloads (S1-S4, S6).

For each workload the fs seam records every operation; tests/crashsim.py builds each crash state a
power loss could leave (only synced data, a torn unsynced tail, a garbage block in the unsynced
region, the durable and the volatile namespace around renames). In each state the library's normal
open/recovery runs and the promises are checked. Errors (EIO, ENOSPC) are also injected at each
operation in turn. The test prints ``checked N crash states, V violations``.

``DD_CRASH_LONG=1`` runs a longer campaign (more records, every state of every workload).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import CampaignState, DeferJournal, Journal, SnapshotStore
from durable_dispatch.campaign.admin import compact_state, view_state
from durable_dispatch.campaign.statedir import SNAPSHOT_NAME
from durable_dispatch.core import RetryPolicy, Send, WatchdogConfig, WorkItem
from durable_dispatch.errors import DurableDispatchError, NotDurableError
from durable_dispatch.storage.defer import DEFAULT_DEFER_NAME
from durable_dispatch.testing import inject_faults

from .crashsim import crash_states, record, snapshot_tree
from .helpers import fake_campaign

LONG = bool(os.environ.get("DD_CRASH_LONG"))
SCALE = 4 if LONG else 1
DRAWS = 10 if LONG else 6  # random torn and garbage variants per crash point


class Tally:
    def __init__(self) -> None:
        self.states = 0
        self.violations: list[str] = []

    def check(self, what: str, ok: bool, detail: str = "") -> None:
        if not ok:
            self.violations.append(f"{what}: {detail}")


@pytest.fixture(scope="module")
def tally() -> Any:
    t = Tally()
    yield t
    print(f"\nchecked {t.states} crash states, {len(t.violations)} violations")
    for v in t.violations[:20]:
        print("  ", v)


#: Each workload checks at least this many crash states (about 85% of what it checks today; the
#: threaded one, whose interleavings vary, 50%). Together at least 10,000: a test asserts its
#: own floor, so the promise holds in any order and for any subset (the old aggregate test,
#: "runs last in this module", failed when run alone or shuffled).
FLOORS = {
    "journal-always-1": 2300,
    "journal-batch-1": 600,
    "journal-batch-3": 900,
    "journal-never-1": 2000,
    "snapshot": 1000,
    "defer": 440,
    "compaction": 350,
    "defer-compaction": 130,
    "rollback-1": 1430,
    "rollback-3": 1170,
}
assert sum(FLOORS.values()) >= 10_000


def payload(i: int) -> dict[str, Any]:
    return {"event": "e", "i": i, "pad": "x" * (i % 37)}


@contextlib.contextmanager
def _scratch(tmp: Path) -> Iterator[Path]:
    """Where the crash states are laid out and checked: a directory in memory (``/dev/shm``)
    when there is one with room, else ``tmp``. A state's check opens it as a master would,
    with every fsync, create, rename and unlink that costs; on this machine's disk those were
    half of the checks' time (18,000 fsyncs in the rollback workload alone), and what is
    checked is what the open makes of the files it finds, not whether its own writes reach a
    disk (no crash follows them). The workloads themselves are recorded on ``tmp``."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
        roomy = st.f_bavail * st.f_frsize >= 512 * 2**20 and os.access(shm, os.W_OK)
    except OSError:
        roomy = False
    if not roomy:
        yield tmp
        return
    where = Path(tempfile.mkdtemp(prefix="dd-crash-", dir=shm))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def run_states(
    tally: Tally,
    tmp: Path,
    root: Path,
    ops: list[Any],
    check: Callable[[Path, int], tuple[bool, str]],
    *,
    seed: int,
    initial: dict[str, bytes] | None = None,
    every: int = 1,
    at_least: int,
) -> int:
    """Materialize and check every crash state of ``ops`` (at least ``at_least`` of them);
    returns how many were checked."""
    rnd = random.Random(seed)
    states = crash_states(ops, str(root), rnd, every=every, initial=initial, draws=DRAWS)
    i = -1
    with _scratch(tmp) as where:
        for i, st in enumerate(states):
            target = where / f"crash{i % 2}"
            shutil.rmtree(target, ignore_errors=True)
            st.materialize(str(root), target)
            tally.states += 1
            try:
                ok, detail = check(target, st.k)
            except DurableDispatchError as e:
                ok, detail = False, f"{type(e).__name__}: {e}"
            tally.check(f"{root.name} k={st.k} {st.variant}", ok, detail)
    checked = i + 1
    assert checked >= at_least, f"{checked} crash states, fewer than the floor {at_least}"
    return checked


# ------------------------------------------------------------------------------------- journal
def journal_workload(root: Path, sync: str, n: int, threads: int = 1):
    path = root / "j.jsonl"
    appended: dict[int, Any] = {}
    acked: list[tuple[int, int]] = []  # (op index at ack, seq)
    lock = threading.Lock()
    with record() as ops:
        j = Journal.open(path, sync=sync, batch_max_records=8, batch_max_delay=0.0005)

        def work(t: int) -> None:
            for i in range(n):
                p = payload(t * 100_000 + i)
                r = j.append(p)
                with lock:
                    appended[r.seq] = p
                    if r.durable:
                        acked.append((len(ops), r.seq))
                if i % 7 == 6 and sync != "always":
                    try:
                        j.wait_durable(r.seq)
                    except NotDurableError:
                        continue  # degraded: held in memory, not acknowledged
                    with lock:
                        k = len(ops)
                        acked.extend((k, s) for s in appended if s <= r.seq)

        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        j.close()
    return ops, appended, acked


def check_journal(appended: dict[int, Any], acked: list[tuple[int, int]]):
    def check(d: Path, k: int) -> tuple[bool, str]:
        with Journal.open(d / "j.jsonl") as j:
            got = [(r.seq, r.payload) for r in j.records()]
        seqs = [s for s, _ in got]
        if seqs != list(range(len(seqs))):
            return False, f"sequence numbers {seqs[:10]}..."
        for s, p in got:
            if appended.get(s) != p:
                return False, f"record {s} was invented or changed"
        need = {s for kk, s in acked if kk <= k}
        missing = need - set(seqs)
        return not missing, f"acknowledged records lost: {sorted(missing)[:5]}"

    return check


@pytest.mark.parametrize("sync,threads", [("always", 1), ("batch", 1), ("batch", 3), ("never", 1)])
def test_journal_crash_states(tally: Tally, tmp_path: Path, sync: str, threads: int) -> None:
    root = tmp_path / "w"
    root.mkdir()
    n = (100 if sync == "always" else 150) * SCALE
    ops, appended, acked = journal_workload(root, sync, n, threads)
    assert len(appended) == n * threads and acked
    floor = FLOORS[f"journal-{sync}-{threads}"]
    run_states(
        tally, tmp_path, root, ops, check_journal(appended, acked), seed=len(ops), at_least=floor
    )
    assert not tally.violations, tally.violations[:5]


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=errno.errorcode.get)
@pytest.mark.parametrize("sync", ["always", "batch"])
def test_injected_error_at_every_operation(
    tally: Tally, tmp_path: Path, err: int, sync: str
) -> None:
    """S4: after an injected failure no record since the last good sync was reported durable."""
    base_root = tmp_path / "probe"
    base_root.mkdir()
    probe_ops, _, _ = journal_workload(base_root, sync, 25)
    step = 1 if LONG else 2
    for k in range(1, len(probe_ops) + 1, step):
        root = tmp_path / f"e{k}"
        root.mkdir()
        with inject_faults() as faults:
            faults.fail("*", err, path=str(root) + "/*", nth=k)
            try:
                ops, appended, acked = journal_workload(root, sync, 25)
            except DurableDispatchError:
                continue  # e.g. close() reporting memory-only records: honest, not a violation
        rnd = random.Random(k)
        states = list(crash_states(ops, str(root), rnd))
        final = [s for s in states if s.k == len(ops) and s.variant == "durable/synced"]
        for st in final:
            target = tmp_path / "inj"
            shutil.rmtree(target, ignore_errors=True)
            st.materialize(str(root), target)
            tally.states += 1
            ok, detail = check_journal(appended, acked)(target, st.k)
            tally.check(f"inject {errno.errorcode[err]} at op {k} ({sync})", ok, detail)
        shutil.rmtree(root, ignore_errors=True)
    assert not tally.violations, tally.violations[:5]


# ----------------------------------------------------------------------------------- snapshots
def test_snapshot_crash_states(tally: Tally, tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    values = {}
    acked: list[tuple[int, int]] = []
    with record() as ops:
        store = SnapshotStore(root, name="s", keep=2)
        for i in range(8 * SCALE):
            v = {"i": i, "frontier": [f"w{x}" for x in range(i * 3)]}
            g = store.save(v)
            values[g] = v
            acked.append((len(ops), g))

    def check(d: Path, k: int) -> tuple[bool, str]:
        snap = SnapshotStore(d, name="s", keep=2).load()
        need = max((g for kk, g in acked if kk <= k), default=0)
        if snap is None:
            return need == 0, f"nothing loaded, generation {need} was saved"
        if values.get(snap.generation) != snap.value:
            return False, f"generation {snap.generation} is a mix"
        return snap.generation >= need, f"loaded {snap.generation}, {need} was saved"

    run_states(tally, tmp_path, root, ops, check, seed=3, at_least=FLOORS["snapshot"])
    assert not tally.violations, tally.violations[:5]


# ------------------------------------------------------------------------------- defer journal
def test_defer_journal_crash_states(tally: Tally, tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    acked: list[tuple[int, str]] = []
    with record() as ops, DeferJournal.open(root) as dj:
        for i in range(15 * SCALE):
            r = dj.defer(f"w{i}", {"i": i}, attempts=2, kinds=["timeout"])
            if r.persisted:
                acked.append((len(ops), f"w{i}"))

    def check(d: Path, k: int) -> tuple[bool, str]:
        with DeferJournal.open(d) as dj2:
            have = {i.work_id for i in dj2.items()}
        need = {w for kk, w in acked if kk <= k}
        return need <= have, f"deferrals lost: {sorted(need - have)[:5]}"

    run_states(tally, tmp_path, root, ops, check, seed=5, at_least=FLOORS["defer"])
    assert not tally.violations, tally.violations[:5]


# ---------------------------------------------------------------------------------- compaction
def test_compaction_crash_states(tally: Tally, tmp_path: Path) -> None:
    root = tmp_path / "w"
    with CampaignState.open(root, ranks=(1,)) as s:
        s.submit(WorkItem(f"w{i}") for i in range(40 * SCALE))
        fake_campaign(s)
    expected = view_state(root).projection.committed
    assert len(expected) == 40 * SCALE
    initial = snapshot_tree(str(root))
    with record() as ops:
        compact_state(root)

    def check(d: Path, k: int) -> tuple[bool, str]:
        got = view_state(d).projection.committed
        if got != expected:
            return False, f"{len(got)} committed after the crash, {len(expected)} before"
        with CampaignState.open(d, ranks=(1,)) as s2:  # the next open handles the state
            return s2.core.committed() == expected, "reopen disagrees"

    floor = FLOORS["compaction"]
    run_states(tally, tmp_path, root, ops, check, seed=9, initial=initial, at_least=floor)
    assert not tally.violations, tally.violations[:5]


def test_defer_compaction_crash_states(tally: Tally, tmp_path: Path) -> None:
    """``durable-dispatch compact`` on a defer journal (S6): a crash at any point leaves the old
    file or the new one, and both hold exactly the same live deferred items."""
    from durable_dispatch.storage.defer import compact_file

    root = tmp_path / "w"
    root.mkdir()
    with DeferJournal.open(root, sync="never") as dj:
        for i in range(30 * SCALE):
            dj.defer(f"w{i % (10 * SCALE)}", {"i": i}, attempts=2, kinds=["timeout"])
            if i % 3 == 1:
                dj.resolve(f"w{i % (10 * SCALE)}", "requeued")
        dj.journal.sync_now()
        expected = {d.work_id: d.item for d in dj.items()}
    assert expected
    initial = snapshot_tree(str(root))
    with record() as ops:
        compact_file(root / DEFAULT_DEFER_NAME)

    def check(d: Path, k: int) -> tuple[bool, str]:
        with DeferJournal.open(d) as dj2:
            got = {i.work_id: i.item for i in dj2.items()}
        return got == expected, f"{len(got)} live items after the crash, {len(expected)} before"

    floor = FLOORS["defer-compaction"]
    run_states(tally, tmp_path, root, ops, check, seed=13, initial=initial, at_least=floor)
    assert not tally.violations, tally.violations[:5]


# ------------------------------------------------------------------- rollback, then snapshot
@pytest.mark.parametrize("batch", [1, 3])
def test_rollback_then_snapshot_crash_states(tally: Tally, tmp_path: Path, batch: int) -> None:
    root = tmp_path / "w"
    ids = [f"w{i}" for i in range(12 * SCALE)]
    acked: list[tuple[int, str]] = []
    with record() as ops:
        s = CampaignState.open(root, ranks=(1, 2), watchdog=WatchdogConfig(3), retry=RetryPolicy(2))
        s.submit(WorkItem(w, {"payload of": w}) for w in ids)
        submitted = len(ops)  # from here on every item is durable (the store and the journal)
        n = {"k": 0}

        def behave(send: Send) -> str:
            n["k"] += 1
            return ("silent", "malformed", "ok", "partial", "ok")[n["k"] % 5]

        fake_campaign(
            s, behave=behave, on_commit=lambda c: acked.append((len(ops), c.work_id)), batch=batch
        )
        s.close()
    assert len(acked) + len(view_state(root).projection.deferred) == len(ids)
    snap = SnapshotStore(root, name=SNAPSHOT_NAME).load()
    assert snap is not None and snap.value["state"]["form"] == 2  # the compact form (S8)

    def check(d: Path, k: int) -> tuple[bool, str]:
        with CampaignState.open(d, ranks=(1, 2)) as s2:
            core = s2.core
            committed = core.committed()
            need = {w for kk, w in acked if kk <= k}
            if not need <= committed:
                return False, f"acknowledged commits lost: {sorted(need - committed)[:5]}"
            known = set(committed) | set(core.deferred()) | set(core.pending())
            known |= set(core.in_flight())
            if not known <= set(ids):
                return False, "unknown work IDs appeared"
            if k >= submitted and known != set(ids):
                return False, f"submitted items lost: {sorted(set(ids) - known)[:5]}"
            items = core.ledger.items
            if any(items[w].payload != {"payload of": w} for w in core.pending()):
                return False, "a pending item's payload changed"
            if s2.statistics().duplicate_commits_in_journal:
                return False, "a work ID was committed twice in the record"
        return True, ""

    floor = FLOORS[f"rollback-{batch}"]
    run_states(tally, tmp_path, root, ops, check, seed=11, every=1 if LONG else 2, at_least=floor)
    assert not tally.violations, tally.violations[:5]


# --------------------------------------------------------------- G1: children from a callback
def _children(wid: str) -> list[str]:
    """A small DAG with shared children: n<i> spawns n<2i+1> and n<2i+2> below 40, and n<i+7>."""
    i = int(wid[1:])
    return [f"n{j}" for j in (2 * i + 1, 2 * i + 2, i + 7) if j < 40]


def test_commit_and_children_crash_states(tally: Tally, tmp_path: Path) -> None:
    """Issue 31: a commit whose callback returns children. At every crash point, either every
    child of a committed parent is known (pending, in flight, committed or deferred), or the
    parent's callback is delivered again when the state opens; and no child is known twice."""
    root = tmp_path / "g"
    closure, todo = set(), ["n0"]
    while todo:
        w = todo.pop()
        if w not in closure:
            closure.add(w)
            todo += _children(w)
    with record() as ops:
        s = CampaignState.open(root, ranks=(1, 2), watchdog=WatchdogConfig(3))
        s.submit([WorkItem("n0", {"node": 0})])
        fake_campaign(
            s,
            on_commit=lambda c: [WorkItem(w, {"node": int(w[1:])}) for w in _children(c.work_id)],
        )
        s.close()
    assert view_state(root).projection.committed == closure

    def check(d: Path, k: int) -> tuple[bool, str]:
        again: list[str] = []
        with CampaignState.open(d, ranks=(1,), on_commit=lambda w, r: again.append(w)) as s2:
            s2.deliver()  # (the open queues the redelivery; the delivery point runs it)
            core = s2.core
            committed = core.committed()
            known = set(committed) | set(core.deferred()) | set(core.pending())
            known |= set(core.in_flight())
            if not known <= closure:
                return False, f"unknown work IDs: {sorted(known - closure)[:5]}"
            for parent in committed:
                missing = set(_children(parent)) - known
                if missing and parent not in again:
                    return False, f"{parent}'s children {sorted(missing)} lost, not redelivered"
            if s2.statistics().duplicate_commits_in_journal:
                return False, "a work ID was committed twice in the record"
        return True, ""

    run_states(tally, tmp_path, root, ops, check, seed=31, every=2, at_least=200)
    assert not tally.violations, tally.violations[:5]


def test_a_fresh_state_keeps_every_acknowledged_commit_at_every_crash_point(
    tally: Tally, tmp_path: Path
) -> None:
    """Issue 49: the journals a fresh open creates share one directory fsync, and a new
    journal's header is fsynced with its first record, not alone. At every crash point (with
    and without the names no directory fsync covered), the state opens, and every commit
    handed to the callback before that point is committed in it. Without the shared directory
    fsync and the pending one a journal's first fsync does, the journals' names are never
    durable and the acknowledged commits are lost."""
    root = tmp_path / "fresh"
    acked: list[tuple[int, str]] = []  # (op index at the callback, work ID)
    with record() as ops:
        s = CampaignState.open(root, ranks=(1, 2), watchdog=WatchdogConfig(3))
        s.submit([WorkItem(f"w{i}", {"i": i}) for i in range(10)])
        fake_campaign(s, on_commit=lambda c: acked.append((len(ops), c.work_id)))
        s.close()
    assert len(acked) == 10

    def check(d: Path, k: int) -> tuple[bool, str]:
        with CampaignState.open(d, ranks=(1,)) as s2:
            committed = set(s2.core.committed())
        missing = {w for kk, w in acked if kk <= k} - committed
        return not missing, f"acknowledged commits lost: {sorted(missing)[:5]}"

    run_states(tally, tmp_path, root, ops, check, seed=49, every=1, at_least=100)
    assert not tally.violations, tally.violations[:5]  # (was missing: it could not fail)


@pytest.mark.parametrize(("sync", "restart"), [("never", False), ("never", True)])
def test_no_token_leaves_whose_epoch_a_crash_could_forget(
    tally: Tally, tmp_path: Path, sync: str, restart: bool
) -> None:
    """Issue 49: the open does not wait for its epoch record's fsync; the first dispatch does.
    At every crash point after a token left (``next_send`` returned it, the shell would send
    it), the next open starts an epoch above the token's: no later dispatch can carry the same
    token. Under ``never`` (nothing fsyncs unless someone waits; under ``batch`` the group
    commit usually fsyncs the epoch first anyway): a fresh open, which fails without the wait
    in ``next_send``, and a restart that rolls a dispatch back (its snapshot covers the epoch).
    (From a review's scratch test.)"""
    root = tmp_path / "r"
    initial = None
    if restart:  # a first run that leaves a dispatch in flight (rolled back at the next open)
        s = CampaignState.open(root, ranks=(1, 2), sync=sync)
        s.submit([WorkItem(f"w{i}") for i in range(6)])
        first = s.next_send(0.0)
        assert first is not None
        s.sent(first.token, 0.0)
        s.journal.sync_now()
        s.close()
        initial = snapshot_tree(str(root))
    sent: list[tuple[int, Any]] = []  # (op index when it left, token)
    with record() as ops:
        s = CampaignState.open(root, ranks=(1, 2), watchdog=WatchdogConfig(3), sync=sync)
        s.submit([WorkItem(f"x{i}") for i in range(3)])
        for _ in range(3):
            d = s.next_send(0.0)
            if d is None:
                break
            sent.append((len(ops), d.token))
            s.sent(d.token, 0.0)
        s.close()
    assert sent

    def check(d: Path, k: int) -> tuple[bool, str]:
        with CampaignState.open(d, ranks=(1,)) as s2:
            epoch = s2.core.epoch
        bad = [str(t) for kk, t in sent if kk <= k and t.epoch >= epoch]
        return not bad, f"token(s) {bad} left, yet the reopen starts epoch {epoch}"

    run_states(tally, tmp_path, root, ops, check, seed=7, initial=initial, every=1, at_least=700)
    assert not tally.violations, tally.violations[:5]


# --------------------------------------------------------------- G4: work that waits for work
def _after(i: int) -> tuple[str, ...]:
    """d<i> waits for d<i-1> and d<i//2> (fan-in and fan-out); d9 also for one never submitted."""
    deps = {f"d{j}" for j in (i - 1, i // 2) if 0 <= j < i}
    if i == 9:
        deps.add("missing")
    return tuple(sorted(deps))


def test_dependencies_crash_states(tally: Tally, tmp_path: Path) -> None:
    """Issue 51: a campaign whose items wait for others, with failing dispatches (some items
    deferred, their dependents after them) and an ID never submitted. At every crash point: no
    acknowledged commit is lost, no work ID is committed twice, every item that is pending or
    in flight has each dependency committed in the recovered record (a dependent is never
    dispatched before its dependencies' commits are durable), every waiting item has one that
    is not, and the recovered campaign runs to an end whose deferred items are exactly the
    failed ones and what waits for them."""
    root = tmp_path / "d"
    n = 16
    ids = [f"d{i}" for i in range(n)]
    acked: list[tuple[int, str]] = []
    with record() as ops:
        s = CampaignState.open(root, ranks=(1, 2), watchdog=WatchdogConfig(3), retry=RetryPolicy(1))
        s.submit(WorkItem(w, {"i": i}, after=_after(i)) for i, w in reversed(list(enumerate(ids))))
        submitted = len(ops)

        def behave(send: Send) -> str:
            return "malformed" if any(w.work_id in ("d5", "d12") for w in send.items) else "ok"

        fake_campaign(
            s, behave=behave, on_commit=lambda c: acked.append((len(ops), c.work_id)), batch=2
        )
        s.close()
    final = view_state(root).projection
    assert not final.waiting and not final.frontier
    failed = set(final.deferred)
    assert {"d5", "d12", "d9"} <= failed and "d4" in final.committed

    def check(d: Path, k: int) -> tuple[bool, str]:
        with CampaignState.open(d, ranks=(1, 2), watchdog=WatchdogConfig(3)) as s2:
            led = s2.core.ledger
            need = {w for kk, w in acked if kk <= k}
            if not need <= set(led.committed):
                return False, f"acknowledged commits lost: {sorted(need - set(led.committed))[:5]}"
            if s2.statistics().duplicate_commits_in_journal:
                return False, "a work ID was committed twice in the record"
            for w in (*led.frontier, *led.in_flight):
                early = [x for x in _after(int(w[1:])) if x not in led.committed]
                if early:
                    return False, f"{w} is ready before the commit of {early}"
            for w in led.waiting:
                if all(x in led.committed for x in _after(int(w[1:]))):
                    return False, f"{w} waits with every dependency committed"
            known = set(led.committed) | set(led.deferred) | set(led.frontier)
            known |= set(led.waiting) | set(led.in_flight)
            if k >= submitted and known != set(ids):
                return False, f"submitted items lost: {sorted(set(ids) - known)[:5]}"
            if k < submitted:
                return True, ""
            fake_campaign(s2, behave=behave)
            if set(led.deferred) != failed or set(led.committed) != set(ids) - failed:
                return False, f"ended with deferred {sorted(led.deferred)}, not {sorted(failed)}"
        return True, ""

    run_states(tally, tmp_path, root, ops, check, seed=51, every=2, at_least=150)
    assert not tally.violations, tally.violations[:5]
