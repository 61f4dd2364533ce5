"""The master's thread never waits for an fsync to dispatch, and never reports a commit before
its fsync (issue 49), on a real slow mount whose fsyncs the test stalls.

Needs root, /dev/fuse, fuse3 and mfusepy (CI has them: .ci/install-fuse); skipped elsewhere with
the reason.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch.core import RetryPolicy, WatchdogConfig, WorkItem
from durable_dispatch.mpi import MasterReport, run_master
from durable_dispatch.testing import LocalWorkers
from durable_dispatch.testing.sharedfs import SlowStorage, slow_mount, unavailable

_why = unavailable()
pytestmark = pytest.mark.skipif(_why is not None, reason=_why or "")


def _wait(cond: Any, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


def test_dispatch_goes_on_while_every_fsync_stalls_and_no_commit_is_reported_early(
    tmp_path: Path,
) -> None:
    """With every fsync of the state directory blocked (a stall of the shared filesystem), the
    in-process master keeps dispatching new work (its group commit carries the records later),
    while no item that started after the stall began reaches ``on_commit`` before the stall
    ends: a commit is reported only once it is durable (U6, S1). After the stall every item is
    delivered."""
    n = 400
    started: dict[str, float] = {}
    delivered: dict[str, float] = {}
    lock = threading.Lock()
    stall = {"on": False, "since": 0.0, "until": 0.0}

    def fn(x: Any) -> Any:
        with lock:
            started.setdefault(f"t{x['i']}", time.monotonic())
        time.sleep(0.002)
        return x

    def on_commit(work_id: str, result: Any) -> None:
        with lock:
            delivered.setdefault(work_id, time.monotonic())

    out: dict[str, Any] = {}
    with slow_mount(tmp_path / "fs", SlowStorage(fsync_ms=1, metadata_ms=0.2)) as m:

        def master() -> None:
            try:
                out["report"] = run_master(
                    [WorkItem(f"t{i}", {"i": i}) for i in range(n)],
                    Path(m.path) / "state",
                    on_commit,
                    comm=LocalWorkers(fn, 2),
                    watchdog=WatchdogConfig(600),
                    retry=RetryPolicy(1),
                    sync="batch",
                    batch=1,
                    linger=0,
                )
            except BaseException as e:  # noqa: BLE001 - shown by the assertion below
                out["error"] = e

        t = threading.Thread(target=master, daemon=True)
        t.start()
        try:
            assert _wait(lambda: len(delivered) >= 20, 120), "the campaign never got going"
            m.stall()  # returns once the server applies it: every fsync from here blocks
            stall["since"] = time.monotonic()
            with lock:
                at_stall = len(started)
            # dispatching goes on: new items start while no fsync can return
            assert _wait(lambda: len(started) >= at_stall + 40, 120), (
                f"dispatch stopped during the fsync stall: {len(started) - at_stall} item(s) "
                "started after it began"
            )
            assert m.counters()["waiting_fsyncs"] >= 1  # the stall really holds an fsync
            with lock:
                late = {w for w, s in started.items() if s > stall["since"]}
                early = sorted(w for w in late if w in delivered)
            assert len(late) >= 40
            assert not early, f"reported before their fsync could return: {early[:5]}"
            stall["until"] = time.monotonic()
        finally:
            m.resume()
            t.join(300)
        assert not t.is_alive()
        assert "error" not in out, out.get("error")
        report: MasterReport = out["report"]
        assert report.finished
        assert set(delivered) == {f"t{i}" for i in range(n)}
        assert all(delivered[w] > stall["until"] for w in late)
