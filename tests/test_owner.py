"""One writer without working locks (S13): the owner record of a state directory.

The FUSE tests (two masters where flock does not exclude) need root and /dev/fuse (CI has them)
and are skipped elsewhere with the reason; the others run anywhere.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch import CampaignState
from durable_dispatch.campaign.statedir import _master_running, _take_master_lock
from durable_dispatch.errors import LockHeldError, UsageError
from durable_dispatch.storage import Journal, owner
from durable_dispatch.testing.sharedfs import slow_mount, unavailable

ROOT = Path(__file__).resolve().parent.parent
HOST = socket.gethostname()


def _forge(d: Path, gen: int, **kw: Any) -> Path:
    """Write an owner record as another node's master would."""
    body = {
        "host": "node-b",
        "pid": 4242,
        "boot_id": "boot-of-node-b",
        "pidns": 1,
        "start": 1,
        "nonce": f"n{gen}",
        "beat": 0,
        "ts": time.time(),
        "started": time.time(),
        "stale": 1.0,
        "released": False,
    }
    body.update(kw)
    p = d / f"{owner.OWNER_PREFIX}{gen}"
    p.write_text(json.dumps(body))
    return p


def test_lock_held_error_names_host_and_pid_and_pickles() -> None:
    e = LockHeldError("held", path="/s/master.lock", host="n1", pid=12)
    assert (e.host, e.pid, e.path) == ("n1", 12, "/s/master.lock")
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.host, e2.pid, str(e2)) == ("n1", 12, str(e))


def test_a_second_master_gets_the_owner_named_when_flock_works(tmp_path: Path) -> None:
    """flock excludes here (a local disk): the refusal now names the holder's host and pid."""
    s = CampaignState.open(tmp_path / "s")
    try:
        with pytest.raises(LockHeldError) as ei:
            CampaignState.open(tmp_path / "s")
        assert (ei.value.host, ei.value.pid) == (HOST, os.getpid())
        assert f"pid {os.getpid()}" in str(ei.value)
        o = owner.read_owner(tmp_path / "s")
        assert o is not None and (o.host, o.pid) == (HOST, os.getpid()) and not o.released
        assert o.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    finally:
        s.close()
    o = owner.read_owner(tmp_path / "s")
    assert o is not None and o.released
    assert not _master_running(str(tmp_path / "s"))


def test_a_journal_lock_names_the_pid_that_holds_it(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from durable_dispatch import Journal\n"
        f"j = Journal.open({str(tmp_path / 'j.jsonl')!r})\n"
        "print('open', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "open"
        with pytest.raises(LockHeldError) as ei:
            Journal.open(tmp_path / "j.jsonl")
        assert (ei.value.host, ei.value.pid) == (HOST, p.pid)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_live_owner_on_another_node_refuses_at_once_when_its_heartbeat_moves(
    tmp_path: Path,
) -> None:
    d = tmp_path / "s"
    d.mkdir()
    _forge(d, 3)
    stop = threading.Event()

    def beat() -> None:  # the other node's heartbeat thread
        n = 0
        while not stop.wait(0.1):
            n += 1
            _forge(d, 3, beat=n)

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        with pytest.raises(LockHeldError) as ei:
            owner.claim(d, stale=30)  # refused long before the bound: the beat moved
        assert (ei.value.host, ei.value.pid) == ("node-b", 4242)
        assert "node-b" in str(ei.value) and "4242" in str(ei.value)
    finally:
        stop.set()
        t.join()
    assert owner.read_owner(d).generation == 3  # type: ignore[union-attr]


def test_a_dead_owner_on_another_node_is_taken_over_after_the_bound(tmp_path: Path) -> None:
    d = tmp_path / "s"
    d.mkdir()
    _forge(d, 5, ts=time.time() - 3600)
    slept: list[float] = []
    t0 = time.monotonic()
    c = owner.claim(d, stale=1.5, sleep=lambda s: (slept.append(s), time.sleep(s)))
    waited = time.monotonic() - t0
    try:
        assert c.record.generation == 6 and c.record.pid == os.getpid()
        assert slept and waited >= 1.5  # it watched the silent heartbeat for the whole bound
        assert not (d / f"{owner.OWNER_PREFIX}5").exists()
        print(f"resume waited {waited:.2f}s for a dead owner on another node (bound 1.5s)")
    finally:
        c.release()


def test_a_dead_owner_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    """A SIGKILLed master: its pid is gone, so a resume does not wait for any bound."""
    d = tmp_path / "s"
    code = (
        "import time\n"
        "from durable_dispatch import CampaignState\n"
        f"s = CampaignState.open({str(d)!r})\n"
        "print('open', flush=True)\n"
        "time.sleep(120)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "open"
        assert _master_running(str(d))
        with pytest.raises(LockHeldError) as ei:
            CampaignState.open(d)
        assert (ei.value.host, ei.value.pid) == (HOST, p.pid)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert not _master_running(str(d))
    t0 = time.monotonic()
    s = CampaignState.open(d)
    waited = time.monotonic() - t0
    try:
        o = owner.read_owner(d)
        assert o is not None and o.pid == os.getpid() and o.generation == 2
        print(f"resume after a SIGKILLed owner on this host took {waited:.3f}s (no bound)")
    finally:
        s.close()


def test_a_reused_pid_is_not_taken_for_the_owner(tmp_path: Path) -> None:
    """The record's pid runs, but it is another process (another start time): dead."""
    d = tmp_path / "s"
    d.mkdir()
    me = owner._identity()
    _forge(d, 1, host=me["host"], boot_id=me["boot_id"], pidns=me["pidns"], pid=1, start=1)
    c = owner.claim(d, stale=30)  # pid 1 runs, with another start time
    c.release()


def test_the_owner_heartbeat_moves_and_a_reader_sees_it_running(tmp_path: Path) -> None:
    d = tmp_path / "s"
    d.mkdir()
    c = owner.claim(d, stale=1.0)  # a beat every 0.125 s
    try:
        first = owner.read_owner(d)
        assert first is not None
        end = time.monotonic() + 30
        while owner.read_owner(d).beat == first.beat:  # type: ignore[union-attr]
            assert time.monotonic() < end, "the heartbeat never moved"
            time.sleep(0.05)
        assert owner.running_owner(d) is not None
    finally:
        c.release()
    assert owner.running_owner(d) is None


def test_an_owner_taken_over_is_fenced_and_writes_nothing_more(tmp_path: Path) -> None:
    """A live owner judged dead (its heartbeat could not be written for a whole bound) finds
    the newer claim before its next flush and stops writing."""
    d = tmp_path / "s"
    lock = _take_master_lock(str(d), create=True)
    try:
        j = Journal.open(d / "events.jsonl", sync="always")
        j.append({"n": 1})
        size = (d / "events.jsonl").stat().st_size
        _forge(d, lock.claim.record.generation + 1)  # node-b took over
        with pytest.raises(LockHeldError) as ei:
            j.append({"n": 2})
        assert ei.value.host == "node-b"
        with pytest.raises(LockHeldError):
            j.append({"n": 3})
        assert (d / "events.jsonl").stat().st_size == size
        with pytest.raises(LockHeldError):
            j.close()
        assert (d / "events.jsonl").stat().st_size == size
    finally:
        lock.release()


def test_a_fenced_group_commit_raises_in_wait_durable(tmp_path: Path) -> None:
    d = tmp_path / "s"
    lock = _take_master_lock(str(d), create=True)
    try:
        j = Journal.open(d / "events.jsonl", sync="batch")
        _forge(d, lock.claim.record.generation + 1)
        r = j.append({"n": 1})
        with pytest.raises(LockHeldError):
            j.wait_durable(r.seq)
        with pytest.raises(LockHeldError):
            j.close()
    finally:
        lock.release()


def test_stale_bound_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert owner.stale_seconds({}) == owner.DEFAULT_STALE_SECONDS
    assert owner.stale_seconds({owner.STALE_ENV: "5"}) == 5.0
    assert owner.stale_seconds({owner.STALE_ENV: "0"}) == 1.0
    assert owner.stale_seconds({owner.STALE_ENV: "1e9"}) == 3600.0
    assert owner.stale_seconds({owner.STALE_ENV: "soon"}) == owner.DEFAULT_STALE_SECONDS
    with pytest.raises(UsageError):
        raise UsageError("(UsageError stays importable beside the owner module)")


# ------------------------------------------------- two masters where locks do not lock (FUSE)
_why = unavailable()
fuse = pytest.mark.skipif(_why is not None, reason=_why or "")


def _campaign(state: Path, out: Path, n: int, delay: float, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), DURABLE_DISPATCH_OWNER_STALE="3")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.children.owner_campaign", str(state), str(out), str(n)]
        + [str(delay), *extra],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        text=True,
    )


def _verify(state: Path) -> None:
    """``durable-dispatch verify`` finds the state directory intact."""
    r = subprocess.run(
        [sys.executable, "-m", "durable_dispatch", "verify", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _kill_all(procs: list[subprocess.Popen[str]]) -> None:
    """SIGKILL the process group of each campaign still running, and reap it."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _result(out: Path, p: subprocess.Popen[str], timeout: float = 240) -> dict[str, Any]:
    p.wait(timeout=timeout)
    return dict(json.loads(out.read_text()))


@fuse
@pytest.mark.parametrize("where", ["same-host", "other-node"])
def test_two_masters_with_locks_that_do_not_lock(tmp_path: Path, where: str) -> None:
    """The second master is refused, naming the first; the first finishes intact (verify is
    clean, every item committed once)."""
    procs: list[subprocess.Popen[str]] = []
    with slow_mount(tmp_path, locks="none") as m:
        try:
            state = Path(m.path) / "state"
            first = _campaign(state, tmp_path / "a.json", 300, 0.01)
            procs.append(first)
            end = time.monotonic() + 120
            while not (state / "events.jsonl").exists() or owner.read_owner(state) is None:
                assert first.poll() is None and time.monotonic() < end
                time.sleep(0.05)
            assert _master_running(str(state))  # no flock says so here: the owner record does
            extra = ("--as-node", "node-b") if where == "other-node" else ()
            second = _campaign(state, tmp_path / "b.json", 300, 0.01, *extra)
            procs.append(second)
            b = _result(tmp_path / "b.json", second)
            a = _result(tmp_path / "a.json", first)
            assert b["error"] == "LockHeldError", b
            assert (b["host"], b["pid"]) == (HOST, first.pid), b
            assert a == {"finished": True}, a
            assert (
                not (tmp_path / "b.json.commits").exists()
                or not (tmp_path / "b.json.commits").read_text()
            )
            commits = (tmp_path / "a.json.commits").read_text().split()
            assert sorted(commits) == [f"w{i:04d}" for i in range(300)]
            _verify(state)
        finally:
            _kill_all(procs)


@fuse
def test_a_killed_owner_then_a_resume_on_a_mount_without_locks(tmp_path: Path) -> None:
    """SIGKILL the master mid-campaign (its record stays, naming it); a resume on this host
    takes over at once, one from another node after the bound; every item is committed once."""
    procs: list[subprocess.Popen[str]] = []
    with slow_mount(tmp_path, locks="none") as m:
        try:
            state = Path(m.path) / "state"
            first = _campaign(state, tmp_path / "a.json", 200, 0.02)
            procs.append(first)
            end = time.monotonic() + 120
            commits = tmp_path / "a.json.commits"
            while not commits.exists() or len(commits.read_text().split()) < 20:
                assert first.poll() is None and time.monotonic() < end
                time.sleep(0.05)
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            t0 = time.monotonic()
            second = _campaign(state, tmp_path / "b.json", 200, 0.0, "--as-node", "node-b")
            procs.append(second)
            b = _result(tmp_path / "b.json", second)
            took = time.monotonic() - t0
            assert b == {"finished": True}, b
            done = set(commits.read_text().split()) | set(
                (tmp_path / "b.json.commits").read_text().split()
            )
            assert done == {f"w{i:04d}" for i in range(200)}
            print(f"a resume from another node after a SIGKILLed owner took {took:.1f}s (bound 3s)")
            _verify(state)
        finally:
            _kill_all(procs)


def test_a_zombie_owner_is_dead(tmp_path: Path) -> None:
    """A master killed but not yet reaped by its parent (mpiexec's daemon) still has a pid that
    signals reach; it writes nothing more, so a resume or a compaction takes over at once."""
    d = tmp_path / "s"
    code = (
        "import time\n"
        "from durable_dispatch.storage import owner\n"
        f"c = owner.claim({str(d)!r})\n"
        "print('claimed', flush=True)\n"
        "time.sleep(120)\n"
    )
    d.mkdir()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "claimed"
        os.kill(p.pid, signal.SIGKILL)
        end = time.monotonic() + 30
        while owner._stat_of(p.pid)[0] != "Z":  # dead, not reaped: we are its parent
            assert time.monotonic() < end
            time.sleep(0.01)
        c = owner.claim(d, stale=30)
        c.release()
    finally:
        p.kill()
        p.wait()


def test_a_record_cannot_make_a_newcomer_wait_past_the_largest_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound a record carries is clamped (1 to 3600 s): a damaged or hostile record that
    says 1e300 seconds does not block a resume for ever."""
    assert owner._clamp(1e300) == 3600.0
    assert owner._clamp(float("nan")) == owner.DEFAULT_STALE_SECONDS
    assert owner._clamp(-5) == 1.0
    d = tmp_path / "s"
    d.mkdir()
    _forge(d, 1, stale=1e300, ts=time.time() - 3600)
    waited: list[float] = []
    calls = [0]

    def sleep(s: float) -> None:  # a virtual clock: each look costs the whole bound
        calls[0] += 1
        waited.append(s)
        if calls[0] > 20_000:
            raise AssertionError("watched for ever")
        time.sleep(0)

    t0 = time.monotonic()
    monkeypatch.setattr(owner.time, "monotonic", lambda: t0 + 0.25 * calls[0])
    c = owner.claim(d, stale=1.0, sleep=sleep)
    monkeypatch.undo()
    c.release()
    assert sum(waited) <= 3600.0 + 1e-6  # the virtual clock's float steps, not a real wait
