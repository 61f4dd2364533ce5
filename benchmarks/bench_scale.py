"""The master at scale (issue 17), measured in one run: no MPI, CampaignState + core with
instant in-process workers, exactly as run_master drives them.

Usage: ``python benchmarks/bench_scale.py [--items 1000000] [--quick]``
       ``python benchmarks/bench_scale.py --end-to-end 10000000``

Prints, each as a ratio against its small case (the targets in parentheses):
  per-task cost at 8, 1,000 and 10,000 ranks, batch 1 and batch 64   (10,000 within 1.3x of 8)
  a turn's own cost (stop_reason and tick) with every rank busy, the same ranks   (the same)
  one rollback (a timeout: requeue + the S8 snapshot before the next dispatch) with 10k, 100k
  and --items queued items, in the compact snapshot form and, measured in the same run, in the
  self-contained form every snapshot had before (every payload in it)   (1M within 2x of 10k)
  bytes of memory per queued item after a reopen, and beyond its payload (about 500 at most)
  reopen (replay) and submit time per item                            (1M in at most 3 s each)
``--queue`` measures the queue dimension instead (issue 50): the per-task cost at batch 1 and 64
with 20,000 and 1,000,000 items queued (``--queue-sizes``), the queue topped up in each turn as
run_master's source refills it (the state directory on ``/dev/shm``, so the shared disk's fsync
jitter is not in it; the CPU time of this process, so other processes are not either), over
20,000 tasks at batch 1 and 200,000 at batch 64, with the longest turn and the
longest collection of the cyclic garbage collector in that loop; each point in a fresh process,
alternating between this tree and ``--base-tree DIR`` (a checkout of the base, e.g.
``git worktree add /tmp/base95 95c44ec``) round after round, each tree's ``src`` first on
``PYTHONPATH``; it prints medians and the ratios 1M/20k per tree.
``--generator N`` runs run_master over a generator of N items (in-process workers) and prints
its time and peak memory; ``--priorities K`` gives the campaign-size cases K priorities in
blocks (G2); ``--chains C`` makes them C chains (G4, issue 51: each item ``after`` the one
before it in its chain, so all but C items wait) and prints the memory a waiting item costs
beyond a queued one (the same campaign without ``after``, measured in the same run).
``--end-to-end N`` runs one campaign of N items to its end instead (submit, every item
dispatched and committed in dispatches of 64, close, reopen) and prints its times and the
process's peak memory. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from durable_dispatch import CampaignState, RetryPolicy, WatchdogConfig, WorkItem
from durable_dispatch.core import Send
from durable_dispatch.storage import SnapshotStore


def _open(d: str, ranks: int) -> CampaignState:
    return CampaignState.open(
        d,
        sync="batch",
        watchdog=WatchdogConfig(600),
        retry=RetryPolicy(5),
        ranks=range(1, ranks + 1),
    )


def per_task_us(ranks: int, batch: int, tasks: int) -> float:
    """Microseconds of master bookkeeping per task, every worker answering at once."""
    d = tempfile.mkdtemp(prefix="dd-scale-")
    try:
        st = _open(d, ranks)
        core = st.core
        st.submit(WorkItem(f"t{i}", {"i": i}) for i in range(tasks))
        t = time.perf_counter()
        while not core.done:
            now = time.monotonic()
            st.stop_reason(now, grace=5.0)  # as every turn of run_master asks
            sends = []
            while (s := st.next_send(now, batch)) is not None:
                st.sent(s.token, now)
                sends.append(s)
                if len(sends) >= 8:  # the same 8 dispatches a turn at every rank count
                    break
            for s in sends:
                st.on_results(s.rank, str(s.token), [w.payload for w in s.items], now)
            st.deliver(wait=True)
            for s in sends:
                st.on_ready(s.rank, str(s.token), now)
            st.tick(now)
        el = time.perf_counter() - t
        st.close()
        return el / tasks * 1e6
    finally:
        shutil.rmtree(d, ignore_errors=True)


def turn_us(ranks: int, turns: int = 2000) -> float:
    """Microseconds of the bookkeeping of one turn of run_master that received nothing
    (``stop_reason`` and ``tick``) while every rank is busy: the cost of a turn itself, which
    must not grow with the ranks (a master of 10,000 ranks turns thousands of times a second)."""
    d = tempfile.mkdtemp(prefix="dd-turn-")
    try:
        st = _open(d, ranks)
        st.submit(WorkItem(f"t{i}", {"i": i}) for i in range(ranks))
        while (s := st.next_send(0.0)) is not None:
            st.sent(s.token, 0.0)
        t = time.perf_counter()
        for _ in range(turns):
            st.stop_reason(1.0, grace=5.0)
            st.tick(1.0)
        el = time.perf_counter() - t
        st.close()
        return el / turns * 1e6
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _payload(i: int) -> dict[str, Any]:
    return {"seed": f"seed-{i:012d}", "rounds": 2000 + i % 97, "input": "x" * 16}  # ~60 bytes


_REOPEN = """
import sys
from durable_dispatch import CampaignState, RetryPolicy, WatchdogConfig

def kib(name):  # VmHWM (peak) or VmRSS (now) of this process, from /proc (per process image)
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024

before = kib("VmRSS")
st = CampaignState.open(sys.argv[1], sync="batch", watchdog=WatchdogConfig(600),
                        retry=RetryPolicy(5), ranks=range(1, 5))
print(kib("VmHWM") - before, kib("VmRSS") - before)
st.close()
"""


def _reopen_growth(d: str) -> tuple[int, int]:
    """Bytes by which a reopen of ``d`` raises a fresh process's memory: at its peak, and once
    open (in a process of its own: in this one, earlier peaks would hide it; ``ru_maxrss``
    even keeps the parent's across ``exec``, so it is read from ``/proc/self/status``)."""
    out = subprocess.run(
        [sys.executable, "-c", _REOPEN, d], capture_output=True, text=True, check=True
    )
    peak, now = out.stdout.split()[-2:]
    return int(peak), int(now)


def _deep_size(v: Any) -> int:
    """Bytes of ``v`` and the values it holds (dicts, lists, strings, numbers); a dict's keys
    are not counted (the decoder shares them between payloads)."""
    n = sys.getsizeof(v)
    if isinstance(v, dict):
        n += sum(_deep_size(x) for x in v.values())
    elif isinstance(v, (list, tuple)):
        n += sum(_deep_size(x) for x in v)
    return n


def _items(n: int, levels: int = 1, chains: int = 0) -> list[WorkItem]:
    """``n`` items; with ``levels`` > 1, of priorities 0 .. levels-1 in blocks (G2); with
    ``chains`` > 0, that many chains of consecutive items, each waiting for the one before it
    (G4)."""
    if chains:
        k = max(1, n // chains)
        return [
            WorkItem(f"w{i:09d}", _payload(i), after=(f"w{i - 1:09d}",) if i % k else ())
            for i in range(n)
        ]
    if levels > 1:
        return [WorkItem(f"w{i:09d}", _payload(i), priority=i * levels // n) for i in range(n)]
    return [WorkItem(f"w{i:09d}", _payload(i)) for i in range(n)]


def scale_case(items: int, levels: int = 1, chains: int = 0) -> dict[str, float]:
    """Submit, one rollback, reopen and memory for a campaign of ``items`` queued items (of
    ``levels`` priorities, in blocks; in ``chains`` chains of waiting items)."""
    d = tempfile.mkdtemp(prefix="dd-scale-")
    try:
        st = _open(d, 4)
        t = time.perf_counter()
        work = _items(items, levels, chains)
        build = time.perf_counter() - t
        t = time.perf_counter()
        st.submit(work)
        submit = time.perf_counter() - t
        del work
        times, now = [], time.monotonic()
        s = st.next_send(now)
        for _ in range(7):  # the median of 7: one fsync's jitter is not the figure
            assert isinstance(s, Send)
            st.sent(s.token, now)
            now += 10_000
            t = time.perf_counter()
            st.tick(now)  # the deadline passed: requeue and park (the S8 snapshot is due)
            s2 = st.next_send(now)  # the snapshot is written before the next dispatch
            times.append(time.perf_counter() - t)
            st.on_ready(s.rank, str(s.token), now)  # the parked rank's exact READY
            s = s2
        rollback = sorted(times)[3]
        # The same rollback's snapshot in the self-contained form (what every snapshot was
        # before the compact form): the state with every payload, saved atomically.
        old = SnapshotStore(d, name="old-form", keep=1)
        t = time.perf_counter()
        old.save({"journal_seq": st.journal.next_seq - 1, "state": st.core.snapshot()})
        rollback_old = time.perf_counter() - t + rollback  # the requeue part is the same
        waiting = len(st.core.ledger.waiting)
        st.close()
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        del st
        gc.collect()
        t = time.perf_counter()
        st = _open(d, 4)
        reopen = time.perf_counter() - t
        st.close()
        peak, steady = _reopen_growth(d)
        payload = sum(_deep_size(_payload(i)) for i in range(0, items, max(1, items // 1000)))
        payload /= len(range(0, items, max(1, items // 1000)))
        return {
            "build_s": build,
            "submit_s": submit,
            "rollback_s": rollback,
            "rollback_old_s": rollback_old,
            "reopen_s": reopen,
            "peak_growth_bytes_per_item": peak / items,
            "steady_bytes_per_item": steady / items,
            "payload_bytes": payload,
            "dir_bytes": size,
            "waiting": float(waiting),
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def end_to_end(n: int) -> int:
    """One campaign of ``n`` items to its end (dispatches of 64, every worker answering at
    once), then a reopen of the finished state: times and the process's peak memory."""
    d = tempfile.mkdtemp(prefix="dd-e2e-")
    try:
        t0 = time.perf_counter()
        st = _open(d, 8)
        t = time.perf_counter()
        for k in range(0, n, 1_000_000):  # a work source read in parts, as a user would
            st.submit(_items_range(k, min(n, k + 1_000_000)))
        submit = time.perf_counter() - t
        rss_queued = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t = time.perf_counter()
        core, done = st.core, 0
        while not core.done:
            now = time.monotonic()
            sends = []
            while (s := st.next_send(now, 64)) is not None:
                st.sent(s.token, now)
                sends.append(s)
            for s in sends:
                st.on_results(s.rank, str(s.token), [None] * len(s.items), now)
            st.deliver(wait=True)
            for s in sends:
                st.on_ready(s.rank, str(s.token), now)
                done += len(s.items)
            st.tick(now)
        run = time.perf_counter() - t
        committed = len(core.ledger.committed)
        st.close()
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        t = time.perf_counter()
        st = _open(d, 8)
        reopen = time.perf_counter() - t
        again = len(st.core.ledger.committed)
        st.close()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(
            f"end to end, {n:,} items: submit {submit:.1f} s ({submit / n * 1e6:.2f} us/item), "
            f"run {run:.1f} s ({run / n * 1e6:.2f} us/item), reopen of the finished state "
            f"{reopen:.1f} s, total {time.perf_counter() - t0:.1f} s"
        )
        print(
            f"  committed {committed:,} (after the reopen: {again:,}); peak RSS with the queue "
            f"full {rss_queued / 2**30:.2f} GiB ({rss_queued / n:.0f} B/item), at the end "
            f"{peak / 2**30:.2f} GiB; state directory {size / 2**30:.2f} GiB"
        )
        return 0 if committed == again == n else 1
    finally:
        shutil.rmtree(d, ignore_errors=True)


def generator_source(n: int) -> int:
    """run_master over in-process workers (batch 64) with a generator of ``n`` items as its
    work source (G3): the time and this process's peak memory, which the source's size must
    not set (the items are read in chunks as the frontier drains)."""
    from durable_dispatch.mpi import run_master
    from durable_dispatch.testing import LocalWorkers

    def kib(name: str) -> int:  # this process's VmHWM (peak) or VmRSS, in KiB
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith(name + ":"))

    d = tempfile.mkdtemp(prefix="dd-gen-")
    try:
        before = kib("VmHWM")
        t = time.perf_counter()
        source = (WorkItem(f"w{i:09d}", _payload(i)) for i in range(n))
        report = run_master(source, d, comm=LocalWorkers(lambda p: None, 8), batch=64)
        took = time.perf_counter() - t
        peak = kib("VmHWM")
        print(
            f"a generator of {n:,} items through run_master: {took:.1f} s "
            f"({took / n * 1e6:.1f} us/item), finished {report.finished}, committed "
            f"{report.stats['core']['commits']:,}; peak RSS {peak / 1024:.0f} MiB "
            f"({(peak - before) * 1024 / n:.0f} B/item over the {before / 1024:.0f} MiB before)"
        )
        return 0 if report.finished else 1
    finally:
        shutil.rmtree(d, ignore_errors=True)


#: Tasks timed per point of the queue dimension, by batch: enough that one collection of a
#: million objects (about 0.2 s) can neither hide in nor make up the figure.
QUEUE_TASKS = {1: 20_000, 64: 200_000}


def queue_point(queued: int, batch: int, tasks: int) -> dict[str, float]:
    """Per-task master cost with ``queued`` items queued (issue 50): submit them (in parts of
    1M, as a user's source would), then run turns of up to 8 dispatches of ``batch`` items, as
    :func:`per_task_us` does, until ``tasks`` tasks committed; after each turn the queue is
    topped up by what it committed in the same turn, as run_master's work source refills it.
    Returns the turns' CPU time per task (us; their wall time too), the longest turn (ms, wall
    and CPU) and the longest collection of the cyclic collector in the loop (ms)."""
    # On tmpfs where there is one: the master's own cost, which the collector's walks add to;
    # the fsyncs of a turn on the shared disk (tens of ms of jitter) would hide them or pass
    # for them.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    d = tempfile.mkdtemp(prefix="dd-queue-", dir=shm)
    try:
        st = _open(d, 8)
        pauses: list[float] = []
        began = [0.0]
        turns: list[float] = []
        cpu: list[float] = []  # this process's CPU time per turn: what other processes of a
        # shared machine do is not in it, the collector's walks are
        done, nxt = 0, queued
        sends: list[Any] = []

        def on_gc(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                began[0] = time.perf_counter()
            elif turns or sends == [None]:  # the submit is over (what it paused comes now)
                pauses.append(time.perf_counter() - began[0])

        gc.callbacks.append(on_gc)
        # Nothing is made between the submit's end and the first timed turn: the collections
        # the submit left due (the collector was paused while it built the items) fall in it.
        for k in range(0, queued, 1_000_000):
            b = min(queued, k + 1_000_000)
            st.submit(WorkItem(f"q{i:09d}", _payload(i)) for i in range(k, b))
        sends.append(None)
        try:
            while done < tasks:
                t, c = time.perf_counter(), time.process_time()
                now = time.monotonic()
                st.stop_reason(now, grace=5.0)
                sends = []
                while (s := st.next_send(now, batch)) is not None:
                    st.sent(s.token, now)
                    sends.append(s)
                    if len(sends) >= 8:
                        break
                for s in sends:
                    st.on_results(s.rank, str(s.token), [w.payload for w in s.items], now)
                st.deliver(wait=True)
                for s in sends:
                    st.on_ready(s.rank, str(s.token), now)
                st.tick(now)
                n = sum(len(s.items) for s in sends)
                done += n
                # the source's refill, as run_master's turn does it (a collection that the
                # items made here set off counts in the turn)
                st.submit([WorkItem(f"q{i:09d}", _payload(i)) for i in range(nxt, nxt + n)])
                nxt += n
                turns.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
        finally:
            gc.callbacks.remove(on_gc)
        st.close()
        return {
            "per_task_us": sum(cpu) / done * 1e6,
            "wall_per_task_us": sum(turns) / done * 1e6,
            "max_turn_ms": max(turns) * 1e3,
            "max_turn_cpu_ms": max(cpu) * 1e3,
            "max_gc_ms": max(pauses, default=0.0) * 1e3,
            "collections": len(pauses),
        }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def queue_dimension(base: str | None, sizes: list[int], rounds: int) -> int:
    """The queue dimension (see the module docs), alternating trees round after round."""
    import json
    import statistics

    here = os.path.dirname(os.path.abspath(__file__))
    trees = [("this", os.path.dirname(here))] + ([("base", base)] if base else [])
    got: dict[tuple[str, int, int], list[dict[str, float]]] = {}
    for r in range(rounds):
        for batch in (1, 64):
            for n in sizes:
                for name, tree in trees if r % 2 == 0 else trees[::-1]:
                    env = dict(os.environ)
                    env["PYTHONPATH"] = os.pathsep.join(
                        [os.path.join(tree, "src"), env.get("PYTHONPATH", "")]
                    )
                    cmd = [sys.executable, os.path.abspath(__file__), "--queue-point"]
                    cmd += [str(n), str(batch), str(QUEUE_TASKS[batch])]
                    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
                    if out.returncode:
                        raise SystemExit(f"{name} {n} {batch}: {out.stderr[-3000:]}")
                    point = json.loads(out.stdout.splitlines()[-1])
                    got.setdefault((name, batch, n), []).append(point)
                    print(f"  round {r + 1} {name} batch {batch} {n:,} queued: {point}", flush=True)
    print("per-task master cost against the queue's length (medians of the rounds):")
    for batch in (1, 64):
        for name, _tree in trees:
            row = []
            med = {
                n: {
                    k: statistics.median(p[k] for p in got[(name, batch, n)])
                    for k in got[(name, batch, n)][0]
                }
                for n in sizes
            }
            first = med[sizes[0]]["per_task_us"]
            for n in sizes:
                m = med[n]
                row.append(
                    f"{n:,}: {m['per_task_us']:6.1f} us ({m['per_task_us'] / first:4.2f}x), "
                    f"longest turn {m['max_turn_ms']:6.1f} ms (CPU {m['max_turn_cpu_ms']:5.1f}), "
                    f"longest collection {m['max_gc_ms']:6.1f} ms"
                )
            print(f"  batch {batch:<3} {name:<5} " + "; ".join(row))
        if base:
            for n in sizes:
                a = statistics.median(p["per_task_us"] for p in got[("this", batch, n)])
                b = statistics.median(p["per_task_us"] for p in got[("base", batch, n)])
                print(f"  batch {batch:<3} {n:,} queued: this/base per-task cost {a / b:4.2f}x")
    print("targets: 1M within 1.3x of 20k at batch 1 and 64; the longest turn after 1M < 20 ms")
    return 0


def _items_range(a: int, b: int) -> list[WorkItem]:
    return [WorkItem(f"w{i:09d}", _payload(i)) for i in range(a, b)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--items", type=int, default=1_000_000, help="the largest campaign")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a look in seconds")
    ap.add_argument(
        "--end-to-end", type=int, metavar="N", help="one campaign of N items, to its end"
    )
    ap.add_argument(
        "--priorities",
        type=int,
        default=1,
        metavar="K",
        help="the campaign-size cases with K priorities, in blocks (G2); skips the per-task rows",
    )
    ap.add_argument(
        "--generator", type=int, metavar="N", help="run_master over a generator of N items"
    )
    ap.add_argument(
        "--chains",
        type=int,
        default=0,
        metavar="C",
        help="the campaign-size cases as C chains of waiting items (G4); skips the per-task rows",
    )
    ap.add_argument("--queue", action="store_true", help="the queue dimension (issue 50)")
    ap.add_argument("--base-tree", metavar="DIR", help="--queue: a checkout of the base")
    ap.add_argument("--rounds", type=int, default=3, help="--queue: rounds per tree")
    ap.add_argument(
        "--queue-sizes", default="20000,1000000", help="--queue: items queued, comma-separated"
    )
    ap.add_argument("--queue-point", nargs=3, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.queue_point:
        import json

        print(json.dumps(queue_point(*a.queue_point)))
        return 0
    if a.queue:
        sizes = [int(x) for x in a.queue_sizes.split(",")]
        return queue_dimension(a.base_tree, sizes, a.rounds)
    if a.generator:
        return generator_source(a.generator)
    if a.end_to_end:
        return end_to_end(a.end_to_end)
    tasks = 2_000 if a.quick else 20_000
    sizes = [10_000, 100_000, a.items] if not a.quick else [2_000, 20_000, 100_000]
    print("per-task master cost (us), instant workers:")
    per_task_us(8, 1, tasks // 4)  # warm up (imports, caches)
    for batch in (1, 64) if a.priorities == 1 and not a.chains else ():
        base = per_task_us(8, batch, tasks)
        row = [f"8 ranks {base:7.1f}"]
        for ranks in (1_000, 10_000):
            us = per_task_us(ranks, batch, tasks)
            row.append(f"{ranks:,} ranks {us:7.1f} ({us / base:4.2f}x)")
        print(f"  batch {batch:<3} " + "   ".join(row) + "   (target: 10,000 within 1.3x)")
    if a.priorities == 1 and not a.chains:
        turn_us(8)  # warm up
        base = turn_us(8)
        row = [f"8 ranks {base:7.1f}"]
        for ranks in (1_000, 10_000):
            us = turn_us(ranks)
            row.append(f"{ranks:,} ranks {us:7.1f} ({us / base:4.2f}x)")
        print("  a turn, every rank busy " + "   ".join(row) + "   (target: 10,000 within 1.3x)")
    print(
        "campaign size (one rollback = requeue + the S8 snapshot before the next dispatch)"
        + (f", {a.priorities} priorities in blocks" if a.priorities > 1 else "")
        + (f", {a.chains} chains of waiting items" if a.chains else "")
        + ":"
    )
    first = None
    for n in sizes:
        r = scale_case(n, a.priorities, a.chains)
        first = first or r
        mem = r["peak_growth_bytes_per_item"]
        old, us = r["rollback_old_s"], 1e6 / n
        print(
            f"  {n:>9,} items: rollback {r['rollback_s'] * 1e3:7.1f} ms "
            f"({r['rollback_s'] / first['rollback_s']:5.2f}x); the self-contained form "
            f"{old * 1e3:8.1f} ms ({old / first['rollback_old_s']:6.1f}x)"
        )
        print(
            f"  {'':>9}        submit {r['submit_s']:5.2f} s ({r['submit_s'] * us:4.2f} us/item; "
            f"building the items {r['build_s'] * us:4.2f} us/item more)  "
            f"reopen {r['reopen_s']:5.2f} s ({r['reopen_s'] * us:4.2f} us/item)"
        )
        print(
            f"  {'':>9}        memory of a reopen, per item: {mem:4.0f} B at its peak, "
            f"{r['steady_bytes_per_item']:4.0f} B once open, "
            f"{r['steady_bytes_per_item'] - r['payload_bytes']:4.0f} B of it beyond the payload "
            f"({r['payload_bytes']:.0f} B); directory {r['dir_bytes'] / n:4.0f} B/item"
        )
        if a.chains:
            plain = scale_case(n, a.priorities)  # the same items without after, this run
            extra = r["steady_bytes_per_item"] - plain["steady_bytes_per_item"]
            print(
                f"  {'':>9}        {int(r['waiting']):,} waiting; without after: rollback "
                f"{plain['rollback_s'] * 1e3:7.1f} ms, {plain['steady_bytes_per_item']:4.0f} "
                f"B/item once open: a waiting item costs {extra:4.0f} B more (its after list "
                "and its place in the waiting set)"
            )
    print(
        "targets: rollback at 1M within 2x of 10k; <= ~500 B/item beyond the payload; reopen and "
        "submit of 1M <= 3 s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
