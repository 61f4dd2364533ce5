"""``durable-dispatch launch -- CMD...``: run a campaign's launcher in a batch job, drain on the
batch system's signals and requeue the job when the campaign stopped resumably.

A job script ends with ``exec durable-dispatch launch -- mpiexec -n "$SLURM_NTASKS" python
campaign.py`` (or ``-- srun --mpi=pmix python campaign.py``), and needs no ``trap``:

- It starts ``CMD`` and waits for it. SIGUSR1, SIGTERM and SIGINT to this process are caught;
  the first of a request is passed on to ``CMD`` as SIGUSR1 (``mpiexec`` and ``srun`` forward
  SIGUSR1 to every rank, which drain), copies within
  :data:`~durable_dispatch.mpi.signals.SAME_REQUEST_SECONDS` are dropped, and a second request
  is passed on again (the ranks then stop at once). A request in the first
  :data:`HOLD_SECONDS` after the start waits until then (the ranks must be up to catch it).
  With ``#SBATCH --signal=B:USR1@120`` Slurm signals only the batch shell: ``exec`` makes this
  process that shell.
- Its exit status is ``CMD``'s (128 + the signal's number when a signal ended ``CMD``), so a
  failed launch fails the job, and the campaign's resumable code (:data:`RESUMABLE`, 3: the
  master's ``sys.exit(0 if report.finished else 3)``) reaches the batch system.
- On that code, inside a Slurm job (``SLURM_JOB_ID``), it requeues the job with ``scontrol
  requeue`` (the job needs ``--requeue``), unless the job already ran ``--max-requeues`` times
  (``SLURM_RESTART_COUNT``): a campaign that never finishes does not requeue forever; or
  unless ``scancel`` is ending the job (:func:`cancelled`): a cancel stays a cancel.
- With ``--state-dir STATE`` (``state_dir=``) it never reports success with work left: once
  ``CMD`` ended it reads the campaign's outcome from the state directory
  (:func:`campaign_outcome`) and ends with 0 only when the campaign finished there. A
  launcher or batch system that ended the job early (Open MPI's ``mpiexec`` exits 0 once its
  runtime lost a node's daemon; ``srun`` exits 14 once Slurm cancelled the step) is a
  resumable stop: exit 3, requeued as above. So is a master that died without closing the
  state directory, whatever the status. A master that closed it with work left and an exit
  status of 1 or 2 (an exception in the campaign script, a usage error) keeps that status: a
  bug is not requeued. A launcher may end before its ranks do (Open MPI's runtime tearing down
  a job that lost a node as it started): while the directory holds no campaign yet, ``launch``
  looks again for up to :data:`SETTLE_SECONDS`, so a master that opened it as the job ended
  counts as one that died. A directory that still holds none after that ends with 2 (a wrong
  ``--state-dir``): not requeued.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..batch import job_fields, parse_slurm_duration, requeue_command

__all__ = [
    "RESUMABLE",
    "HOLD_SECONDS",
    "SETTLE_SECONDS",
    "launch",
    "requeue_command",
    "job_fields",
    "cancelled",
    "campaign_outcome",
    "add_parser",
]

#: The exit status a campaign script uses for "stopped resumably, run me again".
RESUMABLE = 3
#: A request that arrives sooner than this after the launch is passed on only then: Slurm's
#: ``--signal`` can come seconds into a job, before the ranks are up to catch it.
HOLD_SECONDS = 10.0
#: How long ``launch --state-dir`` looks again at a state directory that holds no campaign
#: once the launcher ended (its master may still have been starting: see the module docs).
SETTLE_SECONDS = 10.0


def cancelled(fields: Mapping[str, str]) -> bool:
    """True when ``scancel`` (not the time limit) is ending this job. Inside the job both look
    alike (``JobState=COMPLETING``, SIGTERM to every process); a time limit has used up the
    ``TimeLimit`` (``RunTime`` at least as long), a cancel has not. A requeue after a cancel
    would undo the cancel."""
    state = fields.get("JobState", "")
    if state.startswith("CANCELLED"):
        return True
    if state != "COMPLETING":
        return False  # RUNNING: a --signal or an scancel --signal request; the job goes on
    limit = parse_slurm_duration(fields.get("TimeLimit", ""))
    run = parse_slurm_duration(fields.get("RunTime", ""))
    return limit is None or run is None or run < limit


def campaign_outcome(state_dir: str | os.PathLike[str]) -> str:
    """How the campaign in ``state_dir`` stands, as the state directory records it (read-only:
    nothing is created or changed):

    - ``"finished"``: its last master closed the directory (its owner record is released) and
      nothing is pending, waiting or in flight;
    - ``"stopped"``: its last master closed it with work left (a drain, a time limit, an
      error);
    - ``"died"``: its last master never closed it (killed, its node lost): work is left, or
      may be (a later run finds out, and finishes at once if nothing is);
    - ``"none"``: no master ever opened it (not a state directory, or not yet one).
    """
    from ..storage.owner import read_owner
    from ..views.view import FINISHED, read_view

    try:
        owner = read_owner(state_dir)
    except OSError:
        owner = None
    if owner is None:
        return "none"
    if not owner.released:
        return "died"
    try:
        view = read_view(state_dir)
    except Exception:  # noqa: BLE001 - damage or a race with a new master: not finished
        return "stopped"
    return "finished" if view.state == FINISHED else "stopped"


def _resumable_by_outcome(code: int, outcome: str, resumable: int, what: str) -> int:
    """The exit status once the state directory's ``outcome`` is known (see the module docs)."""
    if outcome == "finished" or code == resumable:
        return code
    if outcome == "none":
        if code == 0:
            _say(f"{what} exited 0 but the state directory holds no campaign: check --state-dir")
            return 2
        return code
    if outcome == "died":
        _say(f"{what} exited {code} and the master never closed the state directory: resumable")
        return resumable
    if code in (1, 2):  # the master closed it: the campaign script's own error
        return code
    _say(f"{what} exited {code} with work left in the state directory: resumable")
    return resumable


def _say(msg: str) -> None:
    print(f"durable-dispatch launch: {msg}", file=sys.stderr, flush=True)


def launch(
    argv: Sequence[str],
    *,
    requeue: bool = True,
    max_requeues: int = 100,
    resumable: int = RESUMABLE,
    env: Mapping[str, str] | None = None,
    hold: float = HOLD_SECONDS,
    state_dir: str | os.PathLike[str] | None = None,
) -> int:
    """Run ``argv`` (the launcher line), pass on the batch system's signals, requeue on the
    resumable code; returns the exit status to end with (see the module docs).

    Args:
        argv: the command, such as ``["mpiexec", "-n", "4", "python", "campaign.py"]``.
        requeue: run ``scontrol requeue $SLURM_JOB_ID`` when ``argv`` exits ``resumable``.
        max_requeues: do not requeue a job that already ran this many times
            (``SLURM_RESTART_COUNT``).
        resumable: the campaign's resumable exit status.
        env: the environment (``os.environ``).
        hold: a request in the first ``hold`` seconds after ``argv`` started is passed on
            only then (a rank that has not imported the library yet would die of it).
        state_dir: the campaign's state directory: the exit status then follows the
            campaign's outcome recorded there (:func:`campaign_outcome`; 0 only when it
            finished, 3 when a launcher ended the job early or the master died), not only
            ``argv``'s status. Without it, ``argv``'s status is all ``launch`` knows.
    """
    from ..mpi.launcher import remove_stale_session_dirs, remove_stale_shm
    from ..mpi.signals import DRAIN_SIGNALS, CaughtSignals

    env = os.environ if env is None else env
    if not argv:
        from ..errors import UsageError

        raise UsageError("launch needs a command: durable-dispatch launch -- mpiexec ...")
    remove_stale_session_dirs(env.get("TMPDIR"))  # (a killed mpiexec's: see the function)
    remove_stale_shm()  # (killed MPICH and Intel MPI ranks': see the function)
    forwarded: list[int] = []

    def forward(proc: subprocess.Popen[Any], signum: int) -> None:
        if proc.poll() is None:
            _say(
                f"{signal.Signals(signum).name} received: passing SIGUSR1 on to "
                f"{os.path.basename(argv[0])} (the ranks drain)"
            )
            proc.send_signal(signal.SIGUSR1)
            forwarded.append(signum)

    caught = CaughtSignals(DRAIN_SIGNALS)
    with caught:
        proc = subprocess.Popen(list(argv), env=_root_env())
        started = time.monotonic()
        seen = 0
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() - started < hold:
                continue  # the ranks may not be up yet: a signal now could kill one
            while seen < len(caught.requests):  # one SIGUSR1 per request, copies dropped
                forward(proc, caught.requests[seen])
                seen += 1
    if code < 0:
        code = 128 - code
    if forwarded and code == 128 + signal.SIGUSR1:
        # the SIGUSR1 we passed on reached CMD as it was ending (the campaign had finished or
        # drained, and mpiexec had put its handler away): its outcome is unknown, and the
        # state directory knows it. Resumable: the next allocation finishes at once if done.
        _say(f"{os.path.basename(argv[0])} ended by the SIGUSR1 passed on to it: resumable")
        code = resumable
    if state_dir is not None:  # the record, not the launcher, says whether work is left
        outcome = campaign_outcome(state_dir)
        settle = time.monotonic() + SETTLE_SECONDS
        while outcome == "none" and time.monotonic() < settle:  # (a master still starting)
            time.sleep(0.25)
            outcome = campaign_outcome(state_dir)
        code = _resumable_by_outcome(code, outcome, resumable, os.path.basename(argv[0]))
    if code == resumable and requeue:
        cmd = requeue_command(env)
        restarts = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
        if cmd is None:
            _say(f"the campaign stopped resumably (exit {code}); run the job again to resume")
        elif cancelled(job_fields(env)):
            _say(f"the job was cancelled (exit {code}): not requeued; submit it to resume")
        elif restarts >= max_requeues:
            _say(
                f"the campaign stopped resumably (exit {code}) but this job already ran "
                f"{restarts + 1} times (--max-requeues {max_requeues}): not requeued"
            )
        else:
            _say(f"the campaign stopped resumably (exit {code}): {' '.join(cmd)}")
            for attempt in range(3):
                r = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if r.returncode == 0:
                    break
                _say(f"requeue failed: {(r.stderr or r.stdout).strip()}")
                time.sleep(1.0 + attempt)
    elif code != 0:
        _say(f"{os.path.basename(argv[0])} exited {code}: not resumable, not requeued")
    return code


def add_parser(sub: Any) -> None:
    """Add the ``launch`` subcommand to the ``durable-dispatch`` parser's subparsers."""
    import argparse

    from ._common import HelpFormatter

    lp = sub.add_parser(
        "launch",
        help="run a campaign's launcher in a batch job: pass on its signals, requeue on exit 3",
        description=(
            "Run CMD (mpiexec or srun and the campaign script). SIGUSR1, SIGTERM and SIGINT "
            "reach CMD as one SIGUSR1 per request (copies within 5 s are one request), so the "
            "ranks drain. Exits with CMD's status; when that is the resumable code inside a "
            "Slurm job, runs 'scontrol requeue $SLURM_JOB_ID' first (the job needs --requeue). "
            "With --state-dir the campaign's outcome recorded there decides: 0 only when it "
            "finished; a job its launcher ended early with work left exits 3 (requeued). "
            "As root, CMD gets Open MPI's OMPI_ALLOW_RUN_AS_ROOT=1 and "
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, as with 'durable-dispatch run'. "
            "Use it with exec as the job script's last line; see docs/slurm.md."
        ),
        epilog="Example: durable-dispatch launch --state-dir state -- mpiexec "
        '-n "$SLURM_NTASKS" python campaign.py (a job script\'s last line, after exec)',
        formatter_class=HelpFormatter,
    )
    lp.add_argument(
        "--no-requeue",
        dest="requeue",
        action="store_false",
        help="never requeue; without it, CMD's resumable status inside a Slurm job requeues it",
    )
    lp.add_argument(
        "--max-requeues", type=int, default=100, help="do not requeue a job that ran this often"
    )
    lp.add_argument(
        "--resumable-code", type=int, default=RESUMABLE, help="the campaign's resumable status"
    )
    lp.add_argument(
        "--state-dir",
        metavar="STATE",
        help="the campaign's state directory: exit 0 only when the campaign finished there; "
        "a job its launcher ended early, or whose master died, exits 3 and is requeued",
    )
    lp.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the launcher's command line")
    lp.set_defaults(func=_cmd_launch)


def _root_env() -> dict[str, str] | None:
    """As root, the command's environment with Open MPI's two root variables (as ``run`` sets
    them, and saying so on stderr); None (this process's) otherwise."""
    from ..mpi.launcher import ROOT_VARS, _wants_root_vars

    if not (hasattr(os, "geteuid") and os.geteuid() == 0) or not _wants_root_vars():
        return None
    if all(os.environ.get(k) == v for k, v in ROOT_VARS.items()):
        return None  # already set by whoever started this
    _say("running as root: setting " + " and ".join(f"{k}={v}" for k, v in ROOT_VARS.items()))
    return {**os.environ, **ROOT_VARS}


def _cmd_launch(args: Any) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    return launch(
        cmd,
        requeue=args.requeue,
        max_requeues=args.max_requeues,
        resumable=args.resumable_code,
        state_dir=args.state_dir,
    )
