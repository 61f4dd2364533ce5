"""The batch system, read: the one module that asks Slurm (``squeue``, ``scontrol``) and Flux.
The master reads the allocation's end here, the shell part of the drain before the end (the
decisions are :mod:`durable_dispatch.core.drain`'s); ``durable-dispatch launch`` reads the
job's fields and its requeue command (:func:`job_fields`, :func:`requeue_command`). It imports
no MPI.

Where the end comes from, first found first:

1. ``run_master(ends_at=...)``: a UNIX time the user gives;
2. ``DD_ENDS_AT`` in the environment (a UNIX time);
3. under Slurm (``SLURM_JOB_ID``): ``SLURM_JOB_END_TIME`` when the job's environment has it
   (Slurm 23.02 and later set it in the batch script and every step; 22.05 does not), then
   ``squeue -h -j $SLURM_JOB_ID -o "%S %e"`` (its start and end), or ``scontrol -o show job``
   when squeue fails, read again every minute (every 5 to 60 s: a quarter of the time left):
   a limit changed while the job runs (``scontrol update JobId=... TimeLimit=...``) moves the
   end, and the environment variable never changes after the start;
4. under Flux (``FLUX_JOB_ID``): ``flux job timeleft`` (whole seconds left), read as often.

The batch system is asked in a thread of its own, each question bounded by
:data:`QUERY_TIMEOUT` (the command's whole process group is killed then): a slow or failing
``squeue`` never stops the master's loop, which reads only the last answer
(:attr:`AllocationEnd.ends_at`). PBS Pro and LSF give no end time this reads: give it with
``DD_ENDS_AT`` (docs/slurm.md shows how).
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "AllocationEnd",
    "QUERY_TIMEOUT",
    "ENDS_AT_ENV",
    "parse_slurm_time",
    "parse_slurm_duration",
    "slurm_job",
    "scontrol_fields",
    "job_fields",
    "requeue_command",
]

log = logging.getLogger("durable_dispatch.mpi")

#: The environment variable that gives the allocation's end (a UNIX time).
ENDS_AT_ENV = "DD_ENDS_AT"
#: The longest a question to the batch system may take (seconds).
QUERY_TIMEOUT = 20.0
#: How often the end is read again: a quarter of the time left, within these bounds (seconds).
READ_EVERY = (5.0, 60.0)
#: ``flux job timeleft`` prints this (UINT_MAX) for a job without a time limit.
_FLUX_UNLIMITED = 2**32 - 1


def parse_slurm_time(text: str) -> float | None:
    """A time as squeue and scontrol print it (``2026-12-05T03:40:12``, the local time of the
    process) as a UNIX time; None for ``N/A``, ``Unknown``, ``NONE`` and the unreadable."""
    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def parse_slurm_duration(text: str) -> float | None:
    """A duration as scontrol prints it (``[D-]HH:MM:SS`` or ``MM:SS``) in seconds; None for
    ``UNLIMITED`` and the unreadable."""
    days, _, hms = text.rpartition("-")
    try:
        parts = [int(p) for p in hms.split(":")]
        whole_days = int(days) if days else 0
    except ValueError:
        return None
    return float(sum(p * 60**i for i, p in enumerate(reversed(parts))) + whole_days * 86400)


def slurm_job(env: Mapping[str, str]) -> str | None:
    """The Slurm job this process runs in (``SLURM_JOB_ID``, or the older ``SLURM_JOBID``), or
    None outside one."""
    return env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None


def scontrol_fields(out: str) -> dict[str, str]:
    """A job's fields as ``scontrol -o show job`` prints them (``JobState=RUNNING ...``):
    ``{"JobState": "RUNNING", ...}``."""
    return dict(w.split("=", 1) for w in out.split() if "=" in w)


def _command(name: str, env: Mapping[str, str]) -> str:
    """``name`` as found on the ``PATH`` of ``env`` (this process's when it has none)."""
    return shutil.which(name, path=env.get("PATH")) or name


def requeue_command(env: Mapping[str, str]) -> list[str] | None:
    """The command that requeues this batch job (``scontrol requeue``), or None outside a
    Slurm job."""
    job = slurm_job(env)
    return None if job is None else [_command("scontrol", env), "requeue", job]


def job_fields(env: Mapping[str, str], timeout: float = 30.0) -> dict[str, str]:
    """This Slurm job's fields as ``scontrol -o show job`` prints them (``JobState``,
    ``RunTime``, ``TimeLimit``...), or {} outside a job or when they cannot be read within
    ``timeout`` seconds."""
    job = slurm_job(env)
    if job is None:
        return {}
    try:
        r = subprocess.run(
            [_command("scontrol", env), "-o", "show", "job", job],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return scontrol_fields(r.stdout)


def _number(text: str | None) -> float | None:
    try:
        v = float(text) if text is not None else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) and v > 0 else None


def _run(argv: Sequence[str], timeout: float) -> str | None:
    """``argv``'s standard output, or None when it failed or took longer than ``timeout`` (then
    its whole process group is killed: a stub or wrapper's children too)."""
    try:
        p = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
    except OSError:
        return None
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.communicate()
        return None
    return out if p.returncode == 0 else None


class AllocationEnd:
    """The allocation's end as last read (see the module docs); :meth:`start` reads it in a
    daemon thread, :meth:`close` stops that.

    Args:
        env: the environment (``os.environ``).
        ends_at: the end the user gave (a UNIX time): nothing is asked then.
        clock: the wall clock.
        timeout: the bound of one question (:data:`QUERY_TIMEOUT`).
        run: runs a command, returns its output or None (tests pass their own).

    Attributes:
        ends_at: the end (a UNIX time), or None while unknown.
        started: when the allocation started (a UNIX time), or None.
        source: where :attr:`ends_at` came from (``"ends_at"``, ``"DD_ENDS_AT"``,
            ``"SLURM_JOB_END_TIME"``, ``"squeue"``, ``"scontrol"``, ``"flux"``), or None.
        reads: questions answered; failures: questions that failed or timed out.
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        ends_at: float | None = None,
        clock: Callable[[], float] = time.time,
        timeout: float = QUERY_TIMEOUT,
        run: Callable[[Sequence[str], float], str | None] = _run,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        self.clock, self.timeout, self._run = clock, timeout, run
        self.ends_at: float | None = None
        self.started: float | None = None
        self.source: str | None = None
        self.reads = self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._job = slurm_job(self.env)
        self._flux = self.env.get("FLUX_JOB_ID")
        if ends_at is not None:
            self._set(float(ends_at), "ends_at")
        elif (given := self.env.get(ENDS_AT_ENV)) is not None:
            v = _number(given)
            if v is None:
                log.warning("configuration: %s=%r is not a UNIX time; ignored", ENDS_AT_ENV, given)
            else:
                self._set(v, ENDS_AT_ENV)
        if self.source is None and self._job:
            self.started = _number(self.env.get("SLURM_JOB_START_TIME"))
            v = _number(self.env.get("SLURM_JOB_END_TIME"))
            if v is not None:
                self._set(v, "SLURM_JOB_END_TIME")

    @property
    def asks(self) -> bool:
        """True when the batch system is asked (Slurm or Flux, and no end was given)."""
        return self.source not in ("ends_at", ENDS_AT_ENV) and bool(self._job or self._flux)

    def _set(self, ends_at: float, source: str) -> None:
        if ends_at != self.ends_at:
            before = self.ends_at
            self.ends_at, self.source = ends_at, source
            log.info(
                "master: the allocation ends at %s (%s%s; %.0fs from now)",
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ends_at)),
                source,
                "" if before is None else f", moved {ends_at - before:+.0f}s",
                ends_at - self.clock(),
            )

    def read_once(self) -> bool:
        """Ask the batch system once; True when it answered (and :attr:`ends_at` is set)."""
        got: tuple[float, float | None, str] | None = None
        if self._job:
            got = self._slurm(self._job)
        elif self._flux:
            got = self._flux_end()
        if got is None:
            self.failures += 1
            return False
        self.reads += 1
        end, started, source = got
        if started is not None:
            self.started = started
        self._set(end, source)
        return True

    def _slurm(self, job: str) -> tuple[float, float | None, str] | None:
        out = self._run(
            [_command("squeue", self.env), "-h", "-j", job, "-o", "%S %e"], self.timeout
        )
        if out and len(words := out.split()) >= 2:
            end = parse_slurm_time(words[1])
            if end is not None:
                return end, parse_slurm_time(words[0]), "squeue"
        out = self._run([_command("scontrol", self.env), "-o", "show", "job", job], self.timeout)
        if out:
            f = scontrol_fields(out)
            end = parse_slurm_time(f.get("EndTime", ""))
            if end is not None:
                return end, parse_slurm_time(f.get("StartTime", "")), "scontrol"
        return None

    def _flux_end(self) -> tuple[float, float | None, str] | None:
        now = self.clock()
        out = self._run([_command("flux", self.env), "job", "timeleft"], self.timeout)
        left = _number(out.strip()) if out else None
        if left is None or left >= _FLUX_UNLIMITED:
            return None
        return now + left, None, "flux"

    def next_read(self) -> float:
        """Seconds until the next question: a quarter of the time left, within
        :data:`READ_EVERY` (the longest while the end is unknown)."""
        low, high = READ_EVERY
        if self.ends_at is None:
            return high
        return min(high, max(low, (self.ends_at - self.clock()) / 4))

    def start(self) -> AllocationEnd:
        """Read the end in a daemon thread, now and every :meth:`next_read` seconds, when
        :attr:`asks`; returns self."""
        if self.asks and self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="durable-dispatch-allocation", daemon=True
            )
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.read_once()
            except Exception as e:  # noqa: BLE001 - a reading never ends the campaign
                self.failures += 1
                log.warning("master: reading the allocation's end failed: %s", e)
            self._stop.wait(self.next_read())

    def close(self) -> None:
        """Stop asking (a question under way is left to end by itself: the thread is a
        daemon)."""
        self._stop.set()

    def as_dict(self) -> dict[str, Any]:
        """What the master publishes for ``stats``, ``watch`` and ``report``."""
        return {"ends_at": self.ends_at, "started": self.started, "source": self.source}
