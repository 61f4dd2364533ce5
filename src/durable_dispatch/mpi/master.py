"""The master loop: a thin shell around the dispatch core and the durable campaign state.

It talks to the workers through a :class:`~durable_dispatch.mpi.transport.Transport`: MPI
(:class:`~durable_dispatch.mpi.transport.MpiTransport`) in a job, or
``durable_dispatch.testing.LocalWorkers`` in a test.

``run_master`` checks its arguments, opens the campaign's state, and runs the loop of
:mod:`.masterloop` (each turn a sequence of named steps) until the work is done or a stop is
due; then it stops the workers and closes the state, whatever happened.

Failure handling. With ULFM (Open MPI started with ``--with-ft ulfm``) a dead rank is seen
through MPI's failure notification (``Comm.Get_failed``): its dispatch is rolled back at once,
the failure is acknowledged and the rank is excluded (point-to-point only, so no shrink is
needed). Without ULFM the runtime gives no such signal (Open MPI then aborts the whole job when a
rank dies; the durable state makes the restart resume), and a hung rank stays parked while the
watchdog moves its work. The mode in force is reported in the result.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..batch import AllocationEnd
from ..campaign.identity import check_name, default_name, record_name
from ..campaign.state import CampaignState, OnCommit
from ..core import RetryPolicy, WatchdogConfig, WorkItem
from ..core.drain import DRAIN_MARGIN, DrainPlan
from ..errors import UsageError
from ..views.view import CampaignView, campaign_view
from . import guard
from .context import CHILD_MARKER
from .launchcheck import require_workers
from .masterloop import (
    PLAN_SECONDS,
    MasterLoop,
    Stopping,
    every,
    stop_all,
    stop_or_abort,
)
from .signals import CaughtSignals
from .transport import MpiTransport, Transport, ulfm_mode

__all__ = ["run_master", "MasterReport", "ulfm_mode", "finish", "Feed"]

log = logging.getLogger("durable_dispatch.mpi")


def finish(comm: Any = None, code: int = 0) -> None:
    """End an MPI process cleanly: call at the very end of the master and of every worker.

    Without ULFM it returns and mpi4py finalizes MPI at exit as usual. Under ULFM, after a rank
    has died, Open MPI's ``MPI_Finalize`` can wait forever for the dead process (a known runtime
    issue, open-mpi/ompi#11404), so the process flushes its output and leaves with ``os._exit``
    instead; with failure recovery enabled the runtime treats that as a normal end. Everything
    durable has been fsynced before: ``run_master`` closes its state before returning. A worker
    whose master died leaves with status 1, whatever ``code`` says: under ULFM the job's status
    is its ranks', and a batch script must not read a killed master's job as a success.
    """
    if comm is None:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    if ulfm_mode(comm):
        guard.exit_now(guard.exit_status(code))


@dataclass
class MasterReport:
    """What :func:`run_master` returns.

    Attributes:
        stats: the campaign's statistics (``CampaignStats.as_dict()``).
        mode: ``"ulfm"`` or ``"no-ulfm"``.
        finished: True when every work item was committed, deferred or cancelled. (When the
            disk refuses the journal to the end, commits live in memory only: ``run_master``
            retries it for a few seconds, then raises ``NotDurableError`` from closing the
            state.)
        lost_ranks: rank -> wall-clock time the master rolled back its dispatch: ranks the
            runtime reported dead (ULFM), and workers that said they failed (GONE).
        seconds: the campaign's duration.
        reason: why it stopped before finishing (None when ``finished``): ``"signal"`` (it
            drained on SIGTERM, SIGINT or SIGUSR1), ``"drain"`` (it drained on an operator's
            ``durable-dispatch drain``, as on SIGUSR1), ``"max_seconds"``, ``"allocation"`` (it
            drained before the allocation's end: ``ends_at``), ``"no workers left"`` or
            ``"every worker parked"`` (work remains, and no parked rank sent its exact READY
            within ``stuck_grace``), or ``"withdrawn"`` (the :class:`Feed` withdrew pending work
            from this run, as the futures executor's ``shutdown(cancel_futures=True)`` does:
            it ran everything else). The state directory resumes later.
        view: the campaign as the master left it, the numbers ``durable-dispatch stats``
            shows (:class:`~durable_dispatch.views.view.CampaignView`: committed, deferred, pending,
            failures by kind ...; nothing is in flight once the master returned).
    """

    stats: dict[str, Any]
    mode: str
    finished: bool
    lost_ranks: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0
    reason: str | None = None
    view: CampaignView | None = None


def run_master(
    work: Iterable[WorkItem] | Feed,
    state_dir: str | os.PathLike[str],
    on_commit: OnCommit | None = None,
    *,
    comm: Any = None,
    watchdog: WatchdogConfig | None = None,
    retry: RetryPolicy | None = None,
    sync: str = "batch",
    progress: Callable[[dict[str, Any]], None] | bool | None = None,
    progress_interval: float = 0.5,
    max_seconds: float | None = None,
    stop_timeout: float = 10.0,
    linger: float = 2.0,
    batch: int | str = 1,
    stuck_grace: float | None = None,
    drain_seconds: float = 60.0,
    ends_at: float | None = None,
    drain_margin: float | None = None,
    campaign: str | None = None,
) -> MasterReport:
    """Run a campaign from rank 0 until every work item is committed or deferred.

    Args:
        work: the work items (stable semantic IDs): a list, or a generator of millions,
            consumed as the frontier drains (in chunks of 65,536 whenever fewer than 16,384
            items are pending, never all in memory). On a resumed state directory known IDs are
            skipped, so pass the whole work source every time. Or a :class:`Feed`, for work
            that arrives while the campaign runs.
        state_dir: the campaign's state directory (see ``docs/state-format.md``).
        on_commit: ``on_commit(work_id, result)``, called once a result is journaled durably (while
            the journal is degraded by a disk fault, for a memory-only commit: give it a parameter
            ``durable`` to be told, ``durable=False``); at least once: a commit whose callback
            did not return (a crash, an exception) is delivered again when the campaign resumes,
            before anything is dispatched, so make it idempotent by work ID (an upsert). It may
            return the work items that result spawns: they are submitted durably before the
            commit counts as delivered, known work IDs are skipped (so a child runs once however
            often its parent's callback runs, and a child two parents name is one item); give
            children deterministic IDs (a digest of their input, a path, a node name). The campaign
            is done when nothing is pending or in flight and every callback has returned. Read every
            result back with :func:`durable_dispatch.read_results`.
        comm: the communicator (``MPI.COMM_WORLD``); rank 0 is the master, all others workers.
            Or a :class:`~durable_dispatch.mpi.transport.Transport`, such as
            ``durable_dispatch.testing.LocalWorkers(fn)`` to test a campaign in-process.
        watchdog: deadlines (default: ``WatchdogConfig.from_env(os.environ)``).
        retry: retry budgets (default: ``RetryPolicy.from_env(os.environ)``).
        sync: the state journal's sync policy.
        progress: called with the stats dict every ``progress_interval`` seconds; or True
            for a progress line on rank 0's standard error when it is a terminal (committed,
            left, in flight, deferred, parked, rate and ETA), ended cleanly at the end; off
            when standard error is not a terminal (a batch job's log).
        max_seconds: give up after this long (the state directory resumes later).
        stop_timeout: how long to wait for STOP messages to be delivered at the end.
        linger: once all work is done, keep serving for up to this many seconds while ranks are
            parked, so slow workers, and isolating workers that just killed a timed-out item,
            can send their exact READY (their late RESULTs are classified stale) and end
            unparked. It ends as soon as no rank is parked; 0 stops at once; hung ranks never
            delay the end by more than this.
        batch: work items per dispatch (one token, one WORK message, one journal record and one
            RESULT for all of them). 1 suits tasks that take seconds; for tasks of milliseconds
            or less, 16-64 spreads the per-message cost over many items. A dispatch's deadline
            is its items' timeouts added up (the watchdog's seconds once for items without
            one), so keep ``batch`` x task time well under the watchdog, or send heartbeats. If a
            multi-item dispatch fails as a whole, its items are retried alone, uncharged.
            ``"auto"`` sizes each dispatch from the measured time per item: about 50 ms of work
            and at most a quarter of the watchdog's deadline, 1 to 64 items, starting at 1 and
            at most doubling (``Dispatcher.auto_batch``); tasks of 50 ms or more go alone.
        stuck_grace: when work remains and every live worker is parked (each hung, or too slow
            to send its exact READY), wait this long (default: the watchdog's seconds, at least
            5) for one to come back, then stop with ``reason="every worker parked"`` instead of
            spinning. Hung functions need worker isolation to give their ranks back.
        drain_seconds: on SIGTERM, SIGINT or SIGUSR1 (a batch system's time limit, Ctrl-C),
            stop dispatching, wait up to this long for the work in flight, commit what comes,
            then stop with ``reason="signal"``. Signals within 5 s of the first are the same
            request (Slurm delivers one event several times); a later one stops at once. The
            handlers are installed only while this runs, in the main thread.
        ends_at: when the allocation ends (a UNIX time; default: ``DD_ENDS_AT``, else what the
            batch system says: Slurm's end time, read at the start and every minute, or Flux's
            ``flux job timeleft``; see :mod:`durable_dispatch.batch`). The master
            drains as on SIGUSR1 before it, early enough for the work in flight and its close,
            stops with ``reason="allocation"``, and near the end sends only work expected to
            finish in time (:mod:`durable_dispatch.core.drain`). No signal is needed.
        drain_margin: the least time before that end at which the drain begins (default:
            ``DD_DRAIN_MARGIN``, else 60 s), at most a quarter of the allocation's length; the
            margin is longer when the work in flight is expected to need longer, from the task
            times observed.
        campaign: the campaign's name, recorded in a fresh state directory; default: the main
            script's file name. A state directory that recorded another name is refused with
            :class:`~durable_dispatch.errors.CampaignMismatchError` before anything is added;
            one written before names were recorded adopts this one.

    Returns:
        A :class:`MasterReport`.

    Raises:
        UsageError: ``batch`` is not an integer >= 1 nor ``"auto"``, or this runs inside an
            isolated child (see ``run_worker(isolate=True)``).
        ConfigurationError: an MPI world of size 1 (no workers; several processes that each
            see a world of 1 when a launcher did not match the MPI): the message names the fix
            (:mod:`.launchcheck`).
        CampaignMismatchError: ``state_dir`` belongs to another campaign (nothing added).
    """
    if os.environ.get(CHILD_MARKER):
        raise UsageError(
            "run_master was called inside an isolated child: the campaign script runs its MPI "
            "part when imported; put it under 'if __name__ == \"__main__\":'"
        )
    if batch != "auto" and (type(batch) is not int or batch < 1):
        _refuse(f"batch must be an integer >= 1 or 'auto', got {batch!r}", comm, stop_timeout)
    link: Transport = comm if isinstance(comm, Transport) else MpiTransport(comm)
    if isinstance(link, MpiTransport):
        require_workers(link.comm)  # U10: a world of size 1 fails now, not resumably
    watchdog, retry = _configuration(watchdog, retry)
    margin_floor = _drain_margin(drain_margin)
    opening = time.monotonic()
    workers = range(1, link.size)
    state = _open(link, state_dir, campaign, on_commit, sync, watchdog, retry, stop_timeout)
    log.info(
        "master: %d workers, mode %s, watchdog %gs",
        len(workers),
        "ulfm" if link.ulfm else "no-ulfm",
        watchdog.seconds,
    )
    # the allocation's end (read in a thread of its own) and the drain that fits before it
    allocation = AllocationEnd(ends_at=ends_at).start()
    plan = DrainPlan(
        floor=margin_floor,
        close_seconds=max(5.0, 2 * (time.monotonic() - opening)),  # the close writes what it read
        started=time.time(),
        step=PLAN_SECONDS,
    )
    state.allocation = allocation.as_dict
    start = time.monotonic()
    progress, line = _progress(progress)
    grace = stuck_grace if stuck_grace is not None else max(5.0, state.core.watchdog.seconds)
    loop = MasterLoop(
        state,
        link,
        stopping=Stopping(start, max_seconds, grace, drain_seconds),
        allocation=allocation,
        plan=plan,
        batch=batch,
        linger=linger,
        ft=link.ulfm,
    )
    with CaughtSignals() as caught:
        try:
            source = work if isinstance(work, Feed) else _Source(work)  # consumed as it drains
            source.attach(state)
            # the hooks of every turn run at the delivery point, after the queued ones
            state.every_turn.append(source.refill)
            if progress is not None:
                state.every_turn.append(every(progress_interval, progress, state))
            state.deliver()  # what the last run did not deliver, first; then the first refill
            loop.run(lambda: source.exhausted, caught.requests)
            loop.end()
            stop_all(link, workers, loop.lost, stop_timeout)
            report = _report(state, loop, source.exhausted and state.done, start)
            if progress is not None:  # (the last report, at the delivery point too)
                state.notify(progress, report.stats)
                state.deliver()
        except BaseException as e:
            # never leave the job hanging: close the state durably first (what was journaled
            # stays), then stop the workers within stop_timeout, then let the error end rank 0
            log.error(
                "master: %s: %s; closing the state, stopping the workers", type(e).__name__, e
            )
            try:
                state.close()
            except Exception as e2:  # noqa: BLE001 - the first error is the one to raise
                log.error("master: closing the state after that error failed too: %s", e2)
            stop_or_abort(link, workers, loop.lost, stop_timeout)
            raise
        finally:
            allocation.close()
            if line is not None:
                line.close()
            state.close()
    return report


def _configuration(
    watchdog: WatchdogConfig | None, retry: RetryPolicy | None
) -> tuple[WatchdogConfig, RetryPolicy]:
    """The watchdog and the retry budgets, from the environment when not given; every
    correction of a value is logged."""
    if watchdog is None:
        watchdog = WatchdogConfig.from_env(os.environ)
        for c in watchdog.corrections:
            log.warning("configuration: %s", c)
    if retry is None:
        retry = RetryPolicy.from_env(os.environ)
    for c in retry.corrections if isinstance(retry, RetryPolicy) else ():
        log.warning("configuration: %s", c)
    return watchdog, retry


def _open(
    link: Transport,
    state_dir: str | os.PathLike[str],
    campaign: str | None,
    on_commit: OnCommit | None,
    sync: str,
    watchdog: WatchdogConfig,
    retry: RetryPolicy,
    stop_timeout: float,
) -> CampaignState:
    """Open the campaign's state (its name checked first, recorded after); a master that
    cannot start stops the workers, which wait for WORK (a second master on a running state
    directory, a full disk), or the job would hang forever."""
    workers = range(1, link.size)
    name = default_name() if campaign is None else campaign
    try:
        check_name(state_dir, name)  # before anything is opened or added
        state = CampaignState.open(
            state_dir,
            sync=sync,
            watchdog=watchdog,
            retry=retry,
            ranks=workers,
            starting=True,  # every worker says READY once it is up (its child is running)
            on_commit=on_commit,  # commits a crash or a failed callback kept come first
        )
    except BaseException as e:
        log.error("master: cannot start (%s: %s); stopping the workers", type(e).__name__, e)
        stop_or_abort(link, workers, {}, stop_timeout)
        raise
    try:
        record_name(state.directory, name)  # (a fresh state directory, or one of before names)
    except BaseException:
        state.close()
        stop_or_abort(link, workers, {}, stop_timeout)
        raise
    return state


def _progress(progress: Any) -> tuple[Callable[[dict[str, Any]], None] | None, Any]:
    """The progress hook, and the terminal's progress line to close at the end (or None)."""
    if progress is True:
        import sys

        from ..progress import terminal_progress

        line = terminal_progress(sys.stderr)
        return line, line
    if progress is False or progress is None:
        return None, None
    return progress, None


def _report(state: CampaignState, loop: MasterLoop, finished: bool, start: float) -> MasterReport:
    """The run's report, with the campaign as ``stats`` will show it once the master returned."""
    stats, wall, took = state.statistics().as_dict(), time.time(), time.monotonic() - start
    return MasterReport(
        stats=stats,
        mode="ulfm" if loop.ft else "no-ulfm",
        finished=finished,
        lost_ranks=loop.lost,
        seconds=took,
        reason=None if finished else loop.reason,
        view=campaign_view(
            state.core.ledger,
            {"ts": wall, "started": wall - took, "running": False, "stats": stats}
            | {"pid": os.getpid(), "host": os.uname().nodename},
            running=False,
            directory=os.fspath(state.directory),
            now=wall,
        ),
    )


#: The environment variable that sets ``drain_margin``.
DRAIN_MARGIN_ENV = "DD_DRAIN_MARGIN"


def _drain_margin(given: float | None) -> float:
    """``drain_margin``, or ``DD_DRAIN_MARGIN``, or the default (60 s); a bad value is refused."""
    if given is None:
        text = os.environ.get(DRAIN_MARGIN_ENV)
        if text is None:
            return DRAIN_MARGIN
        try:
            given = float(text)
        except ValueError:
            log.warning("configuration: %s=%r is not a number; 60 s", DRAIN_MARGIN_ENV, text)
            return DRAIN_MARGIN
    if not (isinstance(given, (int, float)) and given >= 0 and given == given):
        raise UsageError(f"drain_margin must be a number of seconds >= 0, got {given!r}")
    return float(given)


class Feed:
    """A work source that :func:`run_master` asks for work at the start of every turn, for
    campaigns whose work arrives while they run (the futures executor is one).

    The loop calls :meth:`attach` once, with the opened state (before any dispatch), then
    :meth:`refill` at the start of every turn, in the loop's thread; it ends once
    :attr:`exhausted` is True and nothing is pending, in flight or undelivered. A subclass
    submits with ``state.submit`` in :meth:`refill`, never from another thread.

    A feed may also withdraw pending work from the run in :meth:`refill`
    (:meth:`CampaignState.withdraw`): in memory only, so the campaign ends without it; the
    loop puts it back at the end, and the report says ``finished=False``, ``reason=
    "withdrawn"``: the work is still pending in the state directory and a later run does it.
    """

    exhausted: bool = False
    state: CampaignState

    def attach(self, state: CampaignState) -> None:
        """The campaign's state is open (its commits from earlier runs redelivered)."""
        self.state = state

    def refill(self) -> None:
        """Submit the work that is due (called at the start of every turn)."""


class _Source(Feed):
    """The work source, consumed as the frontier drains (G3): a list or a generator of millions
    of items is submitted in chunks of :attr:`CHUNK` whenever fewer than :attr:`LOW` items are
    pending, so it is never held whole in memory. On a resumed state directory it is iterated
    again from the start and known work IDs are skipped (``CampaignState.submit``)."""

    CHUNK = 65536
    LOW = 16384

    def __init__(self, work: Iterable[WorkItem]) -> None:
        self.items = iter(work)
        self.exhausted = False
        self._known_read = False  # U11: the part an earlier run submitted was read again

    def refill(self) -> None:
        """Submit the next chunks while fewer than :attr:`LOW` items are pending. The first
        call reads on while the chunks hold only known work IDs (what an earlier run submitted),
        so each is compared with the payload it named before anything is dispatched (U11)."""
        frontier = self.state.core.ledger.frontier
        while not self.exhausted and (len(frontier) < self.LOW or not self._known_read):
            chunk = list(itertools.islice(self.items, self.CHUNK))
            self.exhausted = len(chunk) < self.CHUNK
            if chunk and self.state.submit(chunk):
                self._known_read = True


def _refuse(message: str, comm: Any, stop_timeout: float) -> NoReturn:
    """A bad argument, found before anything started: stop the workers if they are running
    (they wait for WORK, and would keep the job alive forever, U4), then raise ``UsageError``."""
    import sys

    link: Transport | None = comm if isinstance(comm, Transport) else None
    mpi = sys.modules.get("mpi4py.MPI")
    if link is None and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        link = MpiTransport(comm)
    if link is not None:
        log.error("master: %s; stopping the workers", message)
        stop_or_abort(link, range(1, link.size), {}, stop_timeout)
    raise UsageError(message)
