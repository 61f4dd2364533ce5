"""Worker isolation: the work function runs in a supervised child process, so that what it
does (a hang, a crash, a program it left running) costs its item, never the rank.

``run_worker(fn, isolate=True)`` starts one child per worker rank and keeps it across items. The
child is a fresh interpreter (``python -c _BOOTSTRAP``, which runs this module), never a
``fork()`` of the MPI process: it loads the campaign script the way ``multiprocessing``'s spawn
start method does (``multiprocessing.spawn.prepare``: the script is imported as
``__mp_main__``, so code under ``if __name__ == "__main__":`` does not run again), then finds
``fn`` by its module and name.
The launcher's variables are removed from its environment: Open MPI's ``OMPI_*``, ``PMIX_*``
and ``PRTE_*``, and Hydra's (MPICH, Intel MPI) ``PMI_*``, ``HYDI_*``, ``HYDRA_*`` and
``MPI_LOCAL*`` (an MPI_Init with them would wait for a rank that is not part of the job, or talk
to a PMI descriptor it does not have). It never initialises MPI (``mpi4py.rc.initialize`` is
off) unless the runner is made with ``child_mpi=True``: then an MPI call of the script (at its
import) initializes MPI in the child as a singleton, a world of its own.

The child runs in a process group of its own inside the job's session, and dies with its worker
(``PR_SET_PDEATHSIG``); the worker's reaper (:func:`~durable_dispatch.processes.start_reaper`)
then kills that group, so what the child started dies too. The worker is the subreaper of its
descendants. At an item's deadline, or when the child dies, or on STOP, the worker kills the
child's group and every descendant it can still find, so a hang costs a deadline and a crash
costs a restart, never the rank.

Frames on the two pipes (``multiprocessing.connection`` framing): the worker sends the pickled
set-up, then one JSON frame per dispatch (``{"job", "ids", "payloads", "deadline", "lease"}``, and
the WORK's ``attempts`` and ``dependencies`` when it has them: the columns of
:class:`~.context.Batch`); the child
answers ``S`` (ready) or ``X`` + reason (cannot start) once; then ``B`` for each heartbeat, and
frames of entries (a tag, a 4-byte length, a body), two entries per item in order: ``C`` + its
cost (:data:`.child.COST`; see :mod:`.usage`), then ``R`` + result JSON or ``E`` + ``{"kind",
"reason"}``. Before each item the child writes the job number, the item's index and its own
CPU time into a shared page (a ``memfd``), so the worker knows which item a crash belongs to
even when the results of the items before it were not sent yet, and what that item cost
(``wait4``'s figure for the child, less its CPU time when the item started).
"""

from __future__ import annotations

import logging
import mmap
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import orjson

from .. import processes
from ..errors import IsolationError
from .capture import Relay, item_key
from .child import COST, PROGRESS, unpack
from .context import CHILD_MARKER, Batch, ItemOutcome, Outcomes
from .usage import cost, peak_of

__all__ = ["IsolatedRunner", "IsolationError", "CHILD_MARKER", "child_environment"]

log = logging.getLogger("durable_dispatch.mpi")
_LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "PMI_", "HYDI_", "HYDRA_", "MPI_LOCAL")
_START_TIMEOUT = 120.0
_START_ATTEMPTS = 3  # starts in a row a signal may kill before the worker gives up


def child_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: this process's without the MPI launcher's variables."""
    base = dict(os.environ if env is None else env)
    out = {k: v for k, v in base.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    out[CHILD_MARKER] = "1"
    return out


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


# The child's first lines, before any import of this package: it asks to die with its worker
# (PR_SET_PDEATHSIG), then leaves at once if the worker is already gone. Done after the imports,
# a worker killed while its child was still importing (a second or more on a loaded machine)
# left the child running on (the torture harness found six at once).
_BOOTSTRAP = """\
import ctypes, os, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[5]):
    os._exit(1)
import runpy
runpy.run_module("durable_dispatch.mpi.isolation", run_name="__main__", alter_sys=True)
"""


class _StartKilled(IsolationError):
    """A signal killed the child before it said it was up: the start is tried again, as that
    says nothing about the work function (a load that fails says ``X``, or exits non-zero)."""


class _Child:
    """One running child: its process, its two pipe ends."""

    def __init__(self, setup: bytes, memory_limit: int | None, output: Relay) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # Which item the child is running (job number, index), written by the child before
        # each item: no syscall per item, and a crash is still charged to the right item.
        progress = os.memfd_create("durable-dispatch-progress")
        with os.fdopen(progress, "r+b", closefd=False) as page:  # memory, not storage
            page.truncate(PROGRESS.size)
        self.progress = mmap.mmap(progress, PROGRESS.size)
        argv = [sys.executable, "-c", _BOOTSTRAP, str(to_child_r)]
        argv += [str(from_child_w), str(progress), str(memory_limit or 0), str(os.getpid())]
        argv.append(str(output.page_fd))  # (which item its output belongs to: .capture)
        try:
            # Started and counted live under the lock: a sweep of another session's thread
            # (which holds it) never sees this child unaccounted for and kills it as a leftover.
            with _live_lock:
                self.proc = subprocess.Popen(
                    argv,
                    pass_fds=(to_child_r, from_child_w, progress, output.page_fd),
                    stdin=subprocess.DEVNULL,
                    stdout=output.fds[0],
                    stderr=output.fds[1],
                    env=child_environment(),
                    process_group=0,  # its own group, still in the job's session
                )
                _live.add(self.proc.pid)
                processes.reap_group(self.proc.pid)  # killed with it if the worker dies first
            # the peak memory the kernel carries over from this worker into the child's (exec
            # keeps the old one's): a child's own peak, after it died, counts only above it
            self.floor = peak_of(os.getpid()) or 0
            self.ended: tuple[int, Any] | None = None  # (status, rusage) once reaped here
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
            os.close(progress)
        self.send = Connection(to_child_w, readable=False)
        self.recv = Connection(from_child_r, writable=False)
        try:
            self.send.send_bytes(setup)
        except OSError:  # it died before it read it (killed): its status says so, below
            pass
        end = time.monotonic() + _START_TIMEOUT
        first = self._first_frame(end)
        if first is None and self._exit_code() < 0:
            self.kill()  # SIGKILLed (the OOM killer, an operator) before it was up
            raise _StartKilled(f"the isolated child {self._ended()} while it started")
        if first != b"S":
            self.kill()
            raise IsolationError(
                "the isolated child could not start the work function: "
                + (first[1:].decode(errors="replace") if first else self._ended())
                + ". With isolate=True the campaign script is imported again in a fresh "
                "interpreter, as multiprocessing's spawn does: define the function at module "
                "level, and put the MPI part (run_master, run_worker, MPI calls) under "
                "'if __name__ == \"__main__\":'"
            )

    def _first_frame(self, end: float) -> bytes | None:
        while time.monotonic() < end:
            if self.recv.poll(0.05):
                try:
                    return self.recv.recv_bytes()
                except (EOFError, OSError):
                    return None
            if self.proc.poll() is not None and not self.recv.poll(0):
                return None
        return b"Xit did not start within %ds" % int(_START_TIMEOUT)

    def _exit_code(self) -> int:
        """The status of a child whose pipe closed (0 when it is still alive after a while)."""
        try:
            return self.proc.wait(timeout=processes.REAP_SECONDS)
        except subprocess.TimeoutExpired:
            return 0

    def _ended(self) -> str:
        code = self.proc.wait()
        if code < 0:
            return f"it was killed by {_signal_name(code)}"
        return f"it exited with code {code} (its error output is above)"

    def kill(self) -> None:
        """Kill the child's group and every descendant left, and close the pipes (bounded: a
        child stuck in the kernel is left to die later). Beside another session's child (an
        executor's calls next to another's) it kills its own tree only."""
        pid = self.proc.pid
        reaped: dict[int, tuple[int, Any]] = {}
        processes.kill_trees([pid], reaped)  # its descendants, while they are still below it
        if pid in reaped:  # (its rusage: what an item it died in cost)
            self.ended = reaped[pid]
            self.proc.returncode = os.waitstatus_to_exitcode(reaped[pid][0])
        processes.kill_group(pid)
        try:
            self.proc.wait(timeout=processes.REAP_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("isolated child %d did not die at once; not waiting", pid)
        processes.forget_group(pid)
        with _live_lock:
            _live.discard(pid)
            if not _live:  # no other session's child: the orphans re-parented here are its
                processes.kill_descendants()
        self.close()

    def running(self) -> tuple[int, int]:
        """``(job, index)`` the child last said it started."""
        job, index, _cpu = PROGRESS.unpack(self.progress[: PROGRESS.size])
        return int(job), int(index)

    def reap(self, timeout: float) -> int | None:
        """Wait (at most ``timeout``) for the child to end and reap it with ``wait4``, keeping
        its rusage in :attr:`ended`; its exit code, or None when it is still alive."""
        end = time.monotonic() + timeout
        while True:
            try:
                pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
            except ChildProcessError:  # (reaped already)
                return self.proc.returncode
            if pid:
                self.ended = (status, ru)
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                return self.proc.returncode
            if time.monotonic() >= end:
                return None
            time.sleep(0.005)

    def page(self) -> tuple[int, int, float]:
        """``(job, index, CPU seconds at its start)`` the child last said it started."""
        job, index, cpu0 = PROGRESS.unpack(self.progress[: PROGRESS.size])
        return int(job), int(index), float(cpu0)

    def ended_cost(
        self, job: int, page: tuple[int, int, float], peak: int | None = None
    ) -> dict[str, Any]:
        """The cost of the item of ``job`` the child was running when it ended (a crash or a
        kill; see :mod:`.usage`), once reaped: ``wait4``'s CPU time less the child's at the
        item's start (``page``, read before the kill); ``peak`` (read before a kill), else
        ``wait4``'s peak when it is the child's own."""
        started, index, cpu0 = page
        cpu = None
        if self.ended is not None:
            ru = self.ended[1]
            if started == job and index >= 0:
                cpu = ru.ru_utime + ru.ru_stime - cpu0
            if peak is None and ru.ru_maxrss * 1024 > self.floor:
                peak = ru.ru_maxrss * 1024
        return cost(cpu, peak, "child-ended")

    def close(self) -> None:
        for c in (self.send, self.recv):
            try:
                c.close()
            except OSError:
                pass
        self.progress.close()


class IsolatedRunner:
    """Runs items in a supervised child (see the module docs); used by ``run_worker``.

    Args:
        fn: the work function, found by the child by its module and qualified name.
        mode: how it is called (:data:`~.context.CALL_MODES`).
        max_result: a result's bound in bytes.
        memory_limit: the child's address-space limit (``RLIMIT_AS``) in bytes, or None.
        subreaper: make this process the subreaper of its descendants (``run_worker`` does;
            a test in a long-lived process may not want orphans re-parented to it).
        child_mpi: the child may initialize MPI as a singleton (see the module docs).

    Raises:
        IsolationError: ``fn`` cannot be found by name (a lambda, a nested function), or the
            child cannot start.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        mode: str,
        max_result: int,
        memory_limit: int | None,
        *,
        subreaper: bool = True,
        child_mpi: bool = False,
    ) -> None:
        if os.environ.get(CHILD_MARKER):
            raise IsolationError(
                "an isolated worker was started inside an isolated child: the campaign script "
                "starts its workers when imported; put that under 'if __name__ == \"__main__\":'"
            )
        try:
            ref = pickle.dumps(fn)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise IsolationError(
                f"isolate=True runs {fn!r} in a fresh interpreter, which finds it by its module "
                f"and name; a lambda or a nested function cannot be found ({e})"
            ) from e
        import multiprocessing.spawn

        prep = multiprocessing.spawn.get_preparation_data("durable-dispatch-child")
        prep.pop("authkey", None)
        self._setup = pickle.dumps(
            {"prepare": prep, "fn": ref, "mode": mode, "max": max_result, "mpi": child_mpi}
        )
        self._memory_limit = memory_limit
        self._subreaper = subreaper  # then the orphans of its items are its children
        if subreaper:
            processes.become_subreaper()
        self._output = Relay()
        self._child: _Child | None = None
        try:
            self._child = self._new_child()
        except BaseException:
            self._output.close()
            raise
        self.restarts = 0
        self._job = 0  # jobs sent to a child, numbered

    def run(
        self,
        batch: Batch,
        out: Outcomes,
        deadline: float | None,
        lease: float,
        tick: Callable[[], bool],
        beat: Callable[[], None],
        report: Callable[[int], None] | None = None,
    ) -> ItemOutcome | None:
        """Run a dispatch's items in the child, each one's outcome into ``out``; returns the
        failure of the whole dispatch when its (shared) deadline passed, else None.
        ``report(index)`` is called as each item's outcome arrives.

        The items go to the child in one frame; it runs them in order and sends their outcomes
        in batches (after the last item, and at least every 20 ms), so a dispatch of many short
        items costs one round trip, not one per item. A crash fails the item the child was
        running (it says which in shared memory); the items not yet answered run again in a
        fresh child, uncharged. ``tick()`` is called about every millisecond and returns True
        when the worker must stop (STOP arrived): the child is then killed and
        :class:`StopRequested` raised. At ``deadline`` the child is killed and the dispatch
        fails with kind ``timeout``. An item of several with its own ``timeout`` (seconds, in
        its entry) gets it from when it starts, as it would alone (its own timeout is its
        deadline on every path): past it, the child is
        killed, that item fails with kind ``timeout``, and the items after it run in a fresh
        child (the dispatch's deadline, the sum of its items' times, stays the bound of all).
        """
        # Kill a little before the master's deadline (5% of the dispatch's time, 20 to 500
        # ms), so that this worker's report of kind timeout arrives first and its rank is never
        # parked (the watchdog stays the backstop).
        left = 0.0 if deadline is None else deadline - time.monotonic()
        margin = min(0.5, max(0.02, 0.05 * left))
        n = len(batch)
        have = [False] * n  # (the items whose outcome is in ``out``)
        self._output.forget()  # (what a dispatch before left is nobody's now)
        own = n > 1 and bool(batch.timeouts)
        while todo := [i for i, got in enumerate(have) if not got]:
            self._job += 1
            these = batch if len(todo) == n else batch.select(todo)
            child, deadline = self._send(these, deadline, lease, beat)
            answered = 0
            spent: tuple[float, int] | None = None  # the next outcome's cost (its ``C`` entry)
            running, since = -1, time.monotonic()  # the item the child runs, from when
            while answered < len(todo):
                if child.recv.poll(0.001):
                    try:
                        frame = child.recv.recv_bytes()
                    except (EOFError, OSError):
                        job, index = child.running()
                        crashed = todo[index] if job == self._job else todo[answered]
                        died = self._died(child, batch.ids[crashed])
                        died.output = self._last_output(
                            self._job, index if job == self._job else answered
                        )
                        out.put(crashed, died)
                        have[crashed] = True
                        if report is not None:
                            report(crashed)
                        break  # the rest (unanswered, or not yet sent back) go to a new child
                    for tag, body in unpack(frame):
                        if tag == b"C":  # the next outcome's cost
                            spent = COST.unpack(body)
                            continue
                        if tag == b"B":
                            beat()
                            if deadline is not None:
                                deadline = max(deadline, time.monotonic() + lease)
                            continue
                        at = todo[answered]
                        if tag == b"R":  # (into the columns as it came: no object an item)
                            out.raw[at] = body
                        else:
                            failure = orjson.loads(body)
                            out.put(
                                at,
                                ItemOutcome(
                                    None,
                                    failure["kind"],
                                    failure["reason"],
                                    failure.get("final") is True,
                                    failure.get("traceback"),
                                ),
                            )
                        if spent is not None:
                            out.cpu[at] = round(spent[0], 6) if spent[0] > 0 else 0.0
                            out.rss[at] = None if spent[1] < 0 else spent[1]
                            out.by[at] = "child"
                            spent = None
                        if self._output.holds:  # (else nothing was written: no call)
                            said = self._output.take(item_key(self._job, answered))
                            if said is not None:
                                out.outputs[at] = said
                        have[at] = True
                        if report is not None:
                            report(at)
                        answered += 1
                    continue
                if own:
                    job, index = child.running()
                    if job == self._job and index != running:
                        running, since = index, time.monotonic()
                    limit = batch.timeout(todo[running]) if running >= 0 else None
                    if limit is not None and time.monotonic() >= since + limit:
                        late = todo[running]
                        killed = self._kill_costing(child)
                        why = f"{batch.ids[late]}: its own timeout ({limit:g} s) passed"
                        o = ItemOutcome(
                            None, "timeout", why + "; its processes were killed", cost=killed
                        )
                        o.output = self._last_output(self._job, running)
                        out.put(late, o)
                        have[late] = True
                        if report is not None:
                            report(late)
                        break  # the rest (not answered yet) go to a new child
                if deadline is not None and time.monotonic() >= deadline - margin:
                    job, index = child.running()
                    killed = self._kill_costing(child)
                    wid = batch.ids[todo[index] if job == self._job else todo[answered]]
                    why = f"{wid}: deadline passed; its processes were killed"
                    whole = ItemOutcome(None, "timeout", why, cost=killed, about=wid)
                    whole.output = self._last_output(
                        self._job, index if job == self._job else answered
                    )
                    return whole
                if stop := tick():
                    if stop is CANCEL_REQUESTED:  # an operator cancelled the dispatch (O1)
                        self._kill()
                        self._kill_leftovers()
                        raise CancelRequested
                    self.close()
                    raise StopRequested
        self._kill_leftovers()
        return None

    def _kill_leftovers(self) -> None:
        """U3: kill what the dispatch's items left running: the child's own children, and the
        orphans re-parented to this worker (its subreaper) from a daemon's double fork. Left
        alive, such a process outlives a worker that is SIGKILLed (the OOM killer) and holds
        the job's output pipes, so ``mpiexec`` never ends. Two small reads when nothing was
        left."""
        child = self._child
        keep = child.proc.pid if child is not None else None
        with _live_lock:  # no other session's child starts while its siblings are swept
            # beside another session's child an orphan may be that one's: swept once alone
            alone = self._subreaper and not (_live - {keep})
            left = [p for p in processes.children() if p != keep] if alone else []
            if keep is not None:
                left += processes.children(keep)
            killed = processes.kill_trees(left) if left else []
        if killed:
            log.warning("worker: killed %d process(es) its last items left running", len(killed))

    def run_item(
        self,
        work_id: str,
        payload: Any,
        deadline: float | None,
        lease: float,
        tick: Callable[[], bool],
        beat: Callable[[], None],
        attempt: int = 0,
    ) -> ItemOutcome:
        """Run one item (see :meth:`run`); its outcome, kind ``timeout`` at the deadline."""
        out = Outcomes(1)
        whole = self.run(Batch([work_id], [payload], [attempt]), out, deadline, lease, tick, beat)
        return whole or out.item(0)

    def _send(
        self,
        items: Batch,
        deadline: float | None,
        lease: float,
        beat: Callable[[], None],
    ) -> tuple[_Child, float | None]:
        """Hand ``items`` to the child, starting a fresh one if the last was killed or died."""
        child = self._child
        try:
            if child is None:
                raise BrokenPipeError
            child.send.send_bytes(self._job_frame(items, deadline, lease))
            return child, deadline
        except OSError:  # the last one was killed, or died between items
            self._kill()
        child = self._start()
        # A fresh interpreter takes a while to start (only here when a child died between
        # items or mid-dispatch: after a kill or a crash, prepare() restarts it before READY).
        # Items without their own timeout get their time back through a heartbeat, at the
        # master too; with lease 0 every item has its own timeout, which nothing extends (U9).
        if lease > 0:
            beat()
            if deadline is not None:
                deadline = max(deadline, time.monotonic() + lease)
        child.send.send_bytes(self._job_frame(items, deadline, lease))
        return child, deadline

    @staticmethod
    def seal_part(part: Outcomes) -> None:
        """Nothing to add to a part sent ahead: each item's peak is its own, measured in the
        child."""

    def prepare(self) -> None:
        """Between dispatches: start a fresh child if the last one was killed or died, so the
        next item's deadline never pays for a start-up (nothing extends an item's own timeout).

        Raises:
            IsolationError: the child cannot start.
        """
        if self._child is None:
            self._start()

    def _job_frame(self, items: Batch, deadline: float | None, lease: float) -> bytes:
        job = items.to_json()
        job["job"], job["deadline"], job["lease"] = self._job, deadline, lease
        return orjson.dumps(job)

    def _start(self) -> _Child:
        self.restarts += 1
        self._child = self._new_child()
        return self._child

    def _new_child(self) -> _Child:
        """A started child; a start a signal killed is tried again, up to
        ``_START_ATTEMPTS`` in a row (then :class:`IsolationError`, and the rank ends: U8)."""
        attempt = 1
        while True:
            try:
                return _Child(self._setup, self._memory_limit, self._output)
            except _StartKilled as e:
                if attempt == _START_ATTEMPTS:
                    raise IsolationError(f"{e}, {attempt} times in a row") from e
                log.warning("worker: %s; starting it again", e)
                attempt += 1

    def _kill(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child = None

    def _last_output(self, job: int, index: int) -> dict[str, Any] | None:
        """The tails of the item a child was running when it died or was killed, once the
        worker has read what it wrote (see :mod:`.capture`)."""
        self._output.settle()
        return self._output.take(item_key(job, index))

    def _kill_costing(self, child: _Child) -> dict[str, Any]:
        """Kill the child (at a timeout) and say what the item it ran cost: its peak read
        just before the kill, its CPU time from ``wait4`` (see :mod:`.usage`)."""
        peak = peak_of(child.proc.pid)  # (reset when the item started)
        page = child.page()
        self._kill()
        return child.ended_cost(self._job, page, peak)

    def _died(self, child: _Child, work_id: Any) -> ItemOutcome:
        # alive (None), but it closed its end of the pipe: of no use any more
        code = child.reap(processes.REAP_SECONDS)
        page = child.page()
        self._kill()
        if code is None:
            why = "closed its pipe to the worker (it was killed)"
        elif code < 0:
            why = f"killed by {_signal_name(code)}"
        else:
            why = f"exited with code {code}"
        why = f"{work_id}: the work function's process {why}"
        return ItemOutcome(None, "crash", why, cost=child.ended_cost(self._job, page))

    def close(self) -> None:
        """Kill the child and every descendant (on STOP and when the worker ends), then copy
        the last of their output."""
        self._kill()
        with _live_lock:
            if not _live:  # else another session's child runs: it keeps its tree
                processes.kill_descendants()
        self._output.close()


#: The pids of this process's live isolated children: one per session of a futures worker, where
#: several executors open at once are served side by side (each kills its own tree only). A
#: child is started and added under the lock, and every sweep of this process's descendants
#: decides and kills under it: a child another thread is starting is never taken for a leftover.
_live: set[int] = set()
_live_lock = threading.Lock()


class StopRequested(Exception):
    """STOP arrived while an item ran (the worker ends; the child was killed)."""


class CancelRequested(Exception):
    """CANCEL arrived for the dispatch that ran (an operator cancelled it): its child and the
    child's process tree were killed; the worker goes on (it sends READY with the dispatch's
    token)."""


#: What a runner's ``tick()`` returns when the dispatch was cancelled (a true value, so a
#: runner that does not know it stops as on STOP).
CANCEL_REQUESTED: Any = type("CancelRequestedMark", (), {"__repr__": lambda s: "CANCEL"})()


if __name__ == "__main__":  # the child (see _BOOTSTRAP): its side is in .child
    from .child import child_main

    sys.exit(child_main(sys.argv[1:]))
