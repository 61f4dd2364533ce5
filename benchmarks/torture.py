"""The torture harness: random campaigns that combine every feature under every fault, checked
against a model (issue 35; after Jepsen's nemesis and checkers, FoundationDB's simulation and
TigerBeetle's VOPR).

Usage::

    python benchmarks/torture.py --minutes 3 [--seed S ...] [--fresh]   # random scenarios
    python benchmarks/torture.py --scenario FILE [--plant BUG]          # replay one
    python benchmarks/torture.py --seed S --shrink                      # shrink a failing one

Each **scenario** (a JSON file; a seed makes the same one) is a campaign under a real
``mpiexec`` (4 to 6 ranks, isolated or not): items of every kind (:data:`KINDS`: instant,
long-tailed, hanging, segfaulting, aborting, over ``memory_limit``, a huge result, raising, flaky,
leaving a process behind), per-item timeouts, ``batch`` 1 / k / ``"auto"``, the fixed or the
adaptive watchdog, retry budgets per kind, children spawned from results, priorities; and a
**nemesis** schedule: SIGKILL of the master (the next run resumes on the same directory), of a
worker, of an isolated child; SIGSTOP/SIGCONT of each; SIGUSR1 drains; ``results`` and
``compact`` while the master runs, ``compact`` between runs; a tmpfs under the state directory
that fills up and frees (real ENOSPC, as root); a journal forged between runs (expected: a typed
refusal, the file unchanged); an operator's ``cancel``, ``retry --all``, ``submit`` and
``drain`` at random moments (issue 52: ``op-*``, drawn from a generator of their own so the
other faults of a seed stay as they were; one the full tmpfs refuses must exit 2 saying nothing
was sent, and have no effect).

The **features** (:data:`FEATURES`, issue 58) are named, and a run prints which pairs of them
its scenarios crossed (:func:`pair_table`): dependencies on static items, on children and on an
operator's submitted items, children (which may wait), a ``Feed``, each operator command,
isolation, timeouts, priorities, batches, storage faults, master kills, compaction and the
futures face. CI's fixed seeds are planned (:data:`PLAN`) so that together they cross every pair
that can occur. A pair counts when its scenario plans both features: a planned fault that the
run's end overtakes is counted all the same.

A scenario of the **futures face** (``"mode": "futures"``, ``torture_futures.py``) is a script
under ``python -m durable_dispatch.futures``: a call per item, some taking earlier calls' futures
as an argument (``after``: dependencies), under the same nemesis, and an operator's ``cancel``
(of calls named by their futures' work IDs), ``retry --all`` and ``drain`` on the executor's
state directory while the script runs or between runs (no master running: the command opens the
directory). Its checker (:func:`check_futures`) holds every run's settled futures and the last
run's record against the model: a call's value is the function of its input (and it received
its dependencies' values), a call that raised re-raises its own exception, a failed one fails
with its kind; an operator-cancelled call fails with ``TaskFailed`` of kind ``cancelled`` and
only if a ``cancel`` named it, and is cancelled no more once a later ``retry`` requeued it; a
call whose dependency failed, raised or was cancelled fails with ``DependencyFailed`` naming
that dependency (its cause that one's failure) and never runs in that run, and a call whose
dependencies succeeded never does; a call a ``retry`` requeued ran again after it (unless it
ended cancelled or its dependency failed again); a ``drain`` ends the run with
``BrokenExecutor`` and a next run finishes. A run in which an operator's command was sent is
followed by one more run without any, whose outcomes must equal the record (nothing committed
twice, nothing lost).

The **checker** (:func:`check`) reads the campaign's own record and the user's sink and holds
them against the model: every submitted or spawned work ID ends committed, deferred or (named
by an operator's cancel) cancelled, once;
each committed result is the function of its payload; every commit reached the callback; no
duplicate commit in the journal; each deferral's kinds are allowed for its item and its counts
follow the retry budgets; no rank parked at the end with isolation (unless a drain or a stop
explains it: :func:`parked_at_end`); no process of the job left;
each run ended by itself within a bound computed from the scenario's deadlines; ``verify``
passes. A failing scenario is written to ``torture-failures/`` with its seed; ``--shrink`` drops
faults and items while it still fails. Exit status: 0 no violation, 1 violations.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from torture_campaign import expected  # noqa: E402

from durable_dispatch.mpi import launcher  # noqa: E402

#: item kind -> (it commits, the failure kinds its deferral may carry, needs isolation)
KINDS: dict[str, tuple[bool, frozenset[str], bool]] = {
    "instant": (True, frozenset(), False),
    "sleep": (True, frozenset(), False),
    "flaky": (True, frozenset({"error"}), False),
    "orphan": (True, frozenset(), True),
    "raise": (False, frozenset({"error"}), False),
    "huge": (False, frozenset({"result-too-large"}), False),
    "hang": (False, frozenset({"timeout"}), True),
    "segfault": (False, frozenset({"crash"}), True),
    "abort": (False, frozenset({"crash"}), True),
    "memory": (False, frozenset({"error", "crash"}), True),
}
MEMORY_LIMIT = 256 << 20
MAX_RESULT = 64 << 10
RUN_OVERHEAD = 30.0  # seconds a run may take beyond its items' deadlines (start, linger, stop)
MAX_RUNS = 12


# ------------------------------------------------------------------------------ features
#: The features a scenario combines (issue 58): every pair of them is crossed by some scenario,
#: and a run prints which pairs it covered (:func:`pairs_covered`).
FEATURES = (
    "after-static",  # an item waits for a static item (WorkItem.after)
    "after-child",  # an item waits for a child spawned from a result
    "after-submitted",  # an operator's submitted item waits, or is waited for
    "children",  # results spawn children (on_commit returns items)
    "feed",  # the items come from a Feed, a few per turn
    "op-cancel",
    "op-retry",
    "op-drain",
    "op-submit",
    "isolation",
    "timeouts",  # per-item timeouts (the futures face: task_timeout)
    "priorities",
    "batch",  # dispatches of several items (batch k or "auto")
    "storage-faults",  # the state directory's tmpfs fills up and frees (root only)
    "master-kills",
    "compaction",  # compact while the master runs, or between runs
    "futures",  # the futures face (python -m durable_dispatch.futures)
)
#: Pairs that cannot occur, and why: the futures face has no children, Feed, priorities,
#: batch knob or operator submit (mpi4py.futures has none; its calls are the executor's own).
#: Its dependencies are futures passed as arguments: ``after-static`` (the calls a script
#: submitted).
NOT_APPLICABLE = {
    frozenset({"futures", f})
    for f in ("after-child", "after-submitted", "children", "feed", "op-submit", "priorities",
              "batch")
}  # fmt: skip


def features(s: dict[str, Any]) -> set[str]:
    """The features scenario ``s`` combines (see :data:`FEATURES`)."""
    nem = {a["do"] for a in s["nemesis"]}
    out = {f for f in ("op-cancel", "op-retry", "op-drain", "op-submit") if f in nem}
    if s.get("isolate"):
        out.add("isolation")
    if s.get("tmpfs") and "fill" in nem:
        out.add("storage-faults")
    if "kill-master" in nem:
        out.add("master-kills")
    if nem & {"compact", "compact-between"}:
        out.add("compaction")
    if s.get("mode") == "futures":
        out |= {"futures", "timeouts"}
        if any(it.get("after") for it in s["items"]):
            out.add("after-static")  # a call takes earlier calls' futures as an argument
        return out
    items = s["items"]
    static = {i["id"] for i in items}
    kids = [c for sp in s.get("spawns", ()) for c in sp["children"]]
    subs = [i for a in s["nemesis"] if a["do"] == "op-submit" for i in a["items"]]
    named = [d for i in items + kids + subs for d in i.get("after", ())]
    if any(d in static for i in items for d in i.get("after", ())):
        out.add("after-static")
    if any(d in {c["id"] for c in kids} for d in named):
        out.add("after-child")
    sub_ids = {i["id"] for i in subs}
    if any(i.get("after") for i in subs) or any(d in sub_ids for d in named):
        out.add("after-submitted")
    if kids:
        out.add("children")
    if s.get("feed"):
        out.add("feed")
    if any(i.get("timeout") for i in items + kids):
        out.add("timeouts")
    if any(i.get("priority") for i in items + kids):
        out.add("priorities")
    if s.get("batch") != 1:
        out.add("batch")
    return out


def all_pairs() -> set[frozenset[str]]:
    """Every pair of :data:`FEATURES` that can occur."""
    return {
        frozenset({a, b})
        for i, a in enumerate(FEATURES)
        for b in FEATURES[i + 1 :]
        if frozenset({a, b}) not in NOT_APPLICABLE
    }


def pairs_covered(scenarios: list[dict[str, Any]]) -> set[frozenset[str]]:
    """The pairs of features the scenarios cross (each scenario crosses all of its own)."""
    out: set[frozenset[str]] = set()
    for s in scenarios:
        f = sorted(features(s))
        out |= {frozenset({a, b}) for i, a in enumerate(f) for b in f[i + 1 :]}
    return out & all_pairs()


def pair_table(scenarios: list[dict[str, Any]]) -> str:
    """The pair coverage of a run, as text: per feature the features it met, and the pairs
    not covered."""
    got = pairs_covered(scenarios)
    want = all_pairs()
    lines = [f"pairs of features covered: {len(got)} of {len(want)}"]
    for a in FEATURES:
        met = sorted(b for b in FEATURES if frozenset({a, b}) in got)
        lines.append(f"  {a:<16} {len(met):>2}: {' '.join(met)}")
    missing = sorted(" x ".join(sorted(p)) for p in want - got)
    if missing:
        lines.append("not covered: " + ", ".join(missing))
    return "\n".join(lines)


#: The feature plan of CI's fixed seeds (.ci/run): together they cross every pair. A seed
#: outside it draws its features at random.
PLAN: dict[int, str] = {1: "all", 2: "all-shared", 3: "futures", 5: "futures-shared"}


# ------------------------------------------------------------------------------ scenarios
def generate(seed: int, profile: str = "any") -> dict[str, Any]:
    """The scenario of ``seed`` (``profile="restart"``: a master kill early in the first run
    and hanging items after it, for the planted-deadline test)."""
    rnd = random.Random(seed)
    if profile != "any":
        return _profiled(rnd, seed, profile)
    plan = PLAN.get(seed)
    if plan is not None and plan.startswith("futures") or plan is None and rnd.random() < 0.25:
        s = _futures(rnd, seed, None if plan is None else plan == "futures")
        if plan is not None:
            _force(s, rnd, {"kill-master", "compact", "fill"} if s["isolate"] else {"fill"})
            s["tmpfs"] = os.geteuid() == 0
        _futures_meet(s, seed, plan)
        return s
    isolate = rnd.random() < 0.75 if plan is None else plan == "all"
    kinds = [k for k, (_, _, iso) in KINDS.items() if isolate or not iso]
    n = rnd.randint(8, 32)
    items: list[dict[str, Any]] = []
    for i in range(n):
        kind = rnd.choice(kinds) if rnd.random() < 0.5 else rnd.choice(["instant", "sleep"])
        it: dict[str, Any] = {"id": f"i{i:03d}", "kind": kind, "priority": rnd.choice([0, 0, 1, 5])}
        if kind == "sleep":
            it["arg"] = round(rnd.expovariate(1 / 0.3), 3)  # long-tailed
        elif kind == "memory":
            it["arg"] = 2 * MEMORY_LIMIT
        elif kind == "huge":
            it["arg"] = 2 * MAX_RESULT
        if kind == "hang" or rnd.random() < 0.4:
            it["timeout"] = round(rnd.uniform(1.0, 3.0), 2)
            if kind == "sleep":
                it["arg"] = min(it["arg"], it["timeout"] / 3)
        items.append(it)
    dr = random.Random(seed * 7919 + 51)  # (its own stream: earlier seeds' draws stay)
    if dr.random() < 0.5 or plan is not None:  # issue 51: some items wait for earlier ones
        # (or for a ghost)
        for i, it in enumerate(items[1:], start=1):
            if dr.random() < 0.35:
                deps = sorted({items[j]["id"] for j in dr.sample(range(i), min(i, 3))})
                it["after"] = deps[: dr.randint(1, len(deps))]
                if dr.random() < 0.1:
                    it["after"].append(f"ghost{i}")  # never submitted
    spawns = []
    for parent in rnd.sample(items, k=min(len(items), rnd.randint(0, 4))):
        kids = []
        for j in range(rnd.randint(1, 3)):
            kind = rnd.choice(["instant", "sleep", "flaky"] + (["hang"] if isolate else []))
            kid: dict[str, Any] = {"id": f"{parent['id']}.c{j}", "kind": kind, "arg": 0.05}
            if kind == "hang":
                kid["timeout"] = 1.5
            kid["priority"] = parent.get("priority", 0) + 1
            kids.append(kid)
        spawns.append({"parent": parent["id"], "children": kids})
    watchdog: dict[str, Any] = {"seconds": rnd.choice([20.0, 30.0])}
    if rnd.random() < 0.3:
        watchdog["quantile"] = 0.95
    per_kind = {k: rnd.randint(0, 2) for k in rnd.sample(["timeout", "crash", "error"], 2)}
    scenario: dict[str, Any] = {
        "seed": seed,
        "ranks": rnd.randint(4, 8),
        "isolate": isolate,
        "memory_limit": MEMORY_LIMIT,
        "max_result": MAX_RESULT,
        "batch": rnd.choice([1, 1, 4, "auto"]),
        "watchdog": watchdog,
        "retries": rnd.randint(0, 2),
        "per_kind": per_kind,
        "items": items,
        "spawns": spawns,
        "nemesis": _nemesis(rnd, isolate, profile),
    }
    every = plan is not None
    scenario["nemesis"] = _operator_actions(seed, items, scenario["nemesis"], every=every)
    _meet(scenario, seed, every=plan is not None)
    if plan is not None:
        _force(scenario, rnd, {"kill-master", "compact", "fill"})
        scenario["batch"] = 4 if plan == "all" else "auto"
        if not scenario["spawns"]:
            parent = items[0]
            scenario["spawns"] = [
                {"parent": parent["id"], "children": [{"id": f"{parent['id']}.c0",
                                                       "kind": "instant", "arg": 0.05}]}
            ]  # fmt: skip
        _meet(scenario, seed, every=True)
        items[-1]["timeout"] = items[-1].get("timeout") or 2.5
        items[-1]["priority"] = items[-1].get("priority") or 1
    scenario["tmpfs"] = os.geteuid() == 0 and any(a["do"] == "fill" for a in scenario["nemesis"])
    # ULFM (Open MPI's --with-ft ulfm): a killed worker is a lost rank the master rolls back
    # (uncharged) while the others go on, instead of the end of the job
    scenario["ulfm"] = _ulfm() and rnd.random() < 0.3
    return scenario


def _ulfm() -> bool:
    try:
        return launcher.ulfm_available()
    except FileNotFoundError:
        return False


FUTURES_KINDS = {  # kind -> its outcome: "ok", "raised" or the kind of TaskFailed
    "instant": "ok",
    "sleep": "ok",
    "raise": "raised",
    "segfault": "crash",
    "abort": "crash",
    "hang": "timeout",
}


def _futures(rnd: random.Random, seed: int, isolate: bool | None = None) -> dict[str, Any]:
    """A scenario of the futures executor (``"mode": "futures"``): an mpi4py.futures-style
    script under ``python -m durable_dispatch.futures``, a call per item, the same nemesis
    (``isolate``: isolated or not, else drawn)."""
    drawn = rnd.random() < 0.8
    isolate = drawn if isolate is None else isolate
    kinds = list(FUTURES_KINDS) if isolate else ["instant", "sleep", "raise"]
    timeout = round(rnd.uniform(1.5, 3.0), 2)
    items: list[dict[str, Any]] = []
    for _ in range(rnd.randint(6, 24)):
        kind = rnd.choice(kinds) if rnd.random() < 0.5 else rnd.choice(["instant", "sleep"])
        it: dict[str, Any] = {"kind": kind}
        if kind == "sleep":
            it["arg"] = round(min(rnd.expovariate(1 / 0.3), timeout / 3), 3)
        items.append(it)
    scenario: dict[str, Any] = {
        "seed": seed,
        "mode": "futures",
        "ranks": rnd.randint(3, 6),
        "isolate": isolate,
        "task_timeout": timeout,
        "retries": rnd.randint(0, 1),
        "items": items,
        "nemesis": _nemesis(rnd, isolate, "any"),
    }
    scenario["tmpfs"] = os.geteuid() == 0 and any(a["do"] == "fill" for a in scenario["nemesis"])
    scenario["ulfm"] = _ulfm() and rnd.random() < 0.3
    return scenario


def _futures_meet(s: dict[str, Any], seed: int, plan: str | None = None) -> None:
    """Where the futures face meets the other features (issue 58), from a generator of its own
    (the seed's other draws are unchanged): calls that take earlier calls' futures as an
    argument (``after``, indices), and an operator's ``cancel`` (``calls``, indices),
    ``retry --all`` and ``drain`` of the executor's directory, in the first run or between runs
    (``between``: no master running). A planned seed (``plan``) gets all of them, in its first
    run (the faults that end or stop a run move to the second, so that the commands are sent):
    a chain of calls (0, then 1 and the middle one, then the last); call 1 (waiting for call 0)
    cancelled, retried (it runs again), then a drain. ``futures-shared`` (no isolation: the
    workers start at once, and the calls end within a second or two) makes call 0 slow, drains
    while it runs and cancels call 1, then between the runs retries call 1 and cancels the
    middle call (it ends cancelled, the last call failed for it)."""
    rnd = random.Random(seed * 7919 + 59)
    items, every = s["items"], plan is not None
    if every or rnd.random() < 0.5:
        for i, it in enumerate(items[1:], start=1):
            if rnd.random() < 0.3:
                it["after"] = sorted(rnd.sample(range(i), min(i, rnd.randint(1, 2))))
    if every:  # a chain: the cancelled calls have dependents, direct and through others
        items[1]["after"] = sorted({0, *items[1].get("after", ())})
        if plan == "futures-shared":  # the calls waiting for it are still pending for a while
            items[0] = {"kind": "sleep", "arg": round(s["task_timeout"] / 3, 3)}
        for a in s["nemesis"]:  # the first run is the operator's
            if a["run"] == 0 and a["do"].startswith(("kill-", "stop-", "drain")):
                a["run"] = 1
        items[-1]["after"] = sorted({1, len(items) // 2, *items[-1].get("after", ())})
        items[len(items) // 2]["after"] = sorted({0, *items[len(items) // 2].get("after", ())})
    if not every and rnd.random() < 0.5:
        return
    if every:
        order = ["op-cancel", "op-retry", "op-drain"]
        if plan == "futures-shared":  # (the retry between the runs, below)
            order = ["op-drain", "op-cancel"]
    else:
        order = [rnd.choice(["op-cancel", "op-cancel", "op-retry", "op-drain"])
                 for _ in range(rnd.randint(1, 3))]  # fmt: skip
    ends = {"kill-master", "kill-worker", "drain", "op-drain"}
    first_ends = any(a["do"] in ends and a["run"] == 0 for a in s["nemesis"]) or (
        "op-drain" in order
    )
    ops: list[dict[str, Any]] = []
    for k, do in enumerate(order):
        a: dict[str, Any] = {"run": 0, "at": round(rnd.uniform(0.3, 2.5), 2), "do": do,
                             "after": "state"}  # fmt: skip
        if every:  # in this order, in the first second or two: the drain ends the first run
            a["at"] = round(0.4 + 0.5 * k + rnd.uniform(0, 0.2), 2)
        if do == "op-cancel":
            a["calls"] = [1] if every else sorted(
                {rnd.randrange(len(items)) for _ in range(rnd.randint(1, 2))}
            )  # fmt: skip
        if not every and do != "op-drain" and first_ends and rnd.random() < 0.3:
            a |= {"run": 1, "between": True}  # no master running: the command opens it
        ops.append(a)
    if plan == "futures-shared":
        ops += [{"run": 1, "at": 0.0, "do": "op-retry", "between": True},
                {"run": 1, "at": 0.1, "do": "op-cancel", "calls": [len(items) // 2],
                 "between": True}]  # fmt: skip
    s["nemesis"] = sorted(s["nemesis"] + ops, key=lambda a: (a["run"], a["at"]))


def _profiled(rnd: random.Random, seed: int, profile: str) -> dict[str, Any]:
    """Small scenarios aimed at one promise (the harness's own tests): ``restart`` (hanging items
    with their own timeouts, and the master killed while they run), ``spawn`` (children spawned
    from results, no fault), ``commit`` (plain items, no fault)."""
    items: list[dict[str, Any]] = [
        {"id": f"i{i:03d}", "kind": "instant", "priority": 0} for i in range(6)
    ]
    spawns: list[dict[str, Any]] = []
    nemesis: list[dict[str, Any]] = []
    if profile == "restart":
        items = [
            {"id": f"h{i}", "kind": "hang", "timeout": 1.5, "priority": 1} for i in range(3)
        ] + items
        # once the state is open (its epoch journaled): a kill before that leaves no epoch to
        # restart from, and under load it came that early and the planted bug went unseen
        nemesis = [
            {"run": 0, "at": round(rnd.uniform(0.6, 1.2), 2), "do": "kill-master", "after": "state"}
        ]
    elif profile == "spawn":
        spawns = [
            {
                "parent": it["id"],
                "children": [{"id": f"{it['id']}.c{j}", "kind": "instant"} for j in range(2)],
            }
            for it in items[:3]
        ]
    return {
        "seed": seed,
        "ranks": 4,
        "isolate": True,
        "memory_limit": MEMORY_LIMIT,
        "max_result": MAX_RESULT,
        "batch": 1,
        "watchdog": {"seconds": 120.0},
        "retries": 1,
        "per_kind": {},
        "items": items,
        "spawns": spawns,
        "nemesis": nemesis,
        "tmpfs": False,
    }


def _operator_actions(
    seed: int, items: list[dict[str, Any]], nemesis: list[dict[str, Any]], every: bool = False
) -> list[dict[str, Any]]:
    """``nemesis`` with an operator's commands added (issue 52), half the time: ``op-cancel``
    (one or two items), ``op-retry`` (``--all``), ``op-submit`` (two new instant items),
    ``op-drain``; from a generator of their own (the seed's other draws are unchanged).
    ``every``: each of the four, once (a planned seed)."""
    rnd = random.Random(seed * 7919 + 52)
    if rnd.random() < 0.5 and not every:
        return nemesis
    out = list(nemesis)
    ops = ["op-cancel", "op-submit", "op-retry", "op-drain"] if every else None
    for k in range(4 if every else rnd.randint(1, 3)):
        a: dict[str, Any] = {
            "run": 0,
            "at": round(rnd.uniform(0.3, 2.5), 2),
            "do": ops[k] if ops else rnd.choice(
                ["op-cancel", "op-cancel", "op-retry", "op-submit", "op-drain"]
            ),
            "after": "state",
        }  # fmt: skip
        if ops:  # in this order, in the first second or two: the drain ends the first run
            a["at"] = round(0.4 + 0.5 * k + rnd.uniform(0, 0.2), 2)
        if a["do"] == "op-cancel":
            a["ids"] = sorted({rnd.choice(items)["id"] for _ in range(rnd.randint(1, 2))})
        elif a["do"] == "op-submit":
            a["items"] = [{"id": f"x{k}.{j}", "kind": "instant"} for j in range(2)]
        out.append(a)
    return sorted(out, key=lambda a: (a["run"], a["at"]))


def _meet(s: dict[str, Any], seed: int, every: bool = False) -> None:
    """Where the features meet (issue 58), from a generator of its own (the seed's other
    draws are unchanged): children that wait (for their parent, a sibling or a static item),
    static items that wait for a child, an operator's submitted items that wait (for a static
    item, for each other), a Feed. ``every``: each of them (a planned seed)."""
    rnd = random.Random(seed * 7919 + 58)
    items = s["items"]
    kids = [(sp["parent"], c) for sp in s["spawns"] for c in sp["children"]]
    if kids and (every or rnd.random() < 0.5):
        for k, (parent, c) in enumerate(kids):
            if every or rnd.random() < 0.5:
                dep = rnd.choice([parent, items[rnd.randrange(len(items))]["id"]])
                if k and kids[k - 1][0] == parent and rnd.random() < 0.3:
                    dep = kids[k - 1][1]["id"]  # a sibling
                c["after"] = sorted({*c.get("after", ()), dep})
        waiter = items[-1]
        child = rnd.choice(kids)[1]["id"]
        if child not in waiter.get("after", ()) and (every or rnd.random() < 0.5):
            waiter["after"] = [*waiter.get("after", ()), child]
    for a in s["nemesis"]:
        if a["do"] == "op-submit" and (every or rnd.random() < 0.5):
            first, second = a["items"][0], a["items"][-1]
            first["after"] = [rnd.choice(items)["id"]]
            if second is not first:
                second["after"] = [first["id"]]
    if every or rnd.random() < 0.2:
        s["feed"] = True


def _force(s: dict[str, Any], rnd: random.Random, wanted: set[str]) -> None:
    """Add the in-run faults of ``wanted`` that the nemesis lacks (a planned seed)."""
    have = {a["do"] for a in s["nemesis"]}
    for do in sorted(wanted - have):
        at = round(rnd.uniform(0.8, 2.0), 2)
        a = {"run": 0, "at": at, "do": do, "seconds": round(rnd.uniform(0.5, 2.0), 2)}
        if do == "kill-master":
            a["after"] = "state"
        s["nemesis"].append(a)
    s["nemesis"].sort(key=lambda a: (a["run"], a["at"]))


def _nemesis(rnd: random.Random, isolate: bool, profile: str) -> list[dict[str, Any]]:
    """In-run faults mostly in the first run; faults between runs before the second, with a
    fault that ends the first run early (a kill or a drain) so that there is a second."""
    inside = [
        "kill-master",
        "kill-worker",
        "stop-master",
        "stop-worker",
        "drain",
        "results",
        "compact",
        "fill",
    ] + (["kill-child", "stop-child"] if isolate else [])
    between = ["compact-between", "forge-between"]
    out: list[dict[str, Any]] = []
    for _ in range(rnd.randint(1, 4)):
        do = rnd.choice(inside + between)
        out.append(
            {
                "run": 1 if do in between else 0,
                "at": round(rnd.uniform(0.3, 2.5), 2),
                "do": do,
                "seconds": round(rnd.uniform(0.5, 4.0), 2),
            }
        )
    ends = {"kill-master", "kill-worker", "drain"}
    if any(a["run"] == 1 for a in out) and not any(a["do"] in ends for a in out):
        out.append(
            {"run": 0, "at": round(rnd.uniform(0.5, 2.0), 2), "do": rnd.choice(sorted(ends))}
        )
    if any(a["do"] in ends and a["run"] == 0 for a in out):
        for a in out:  # some faults in the run that resumes
            if a["do"] in inside and a["do"] not in ends and rnd.random() < 0.4:
                a["run"] = 1
    return sorted(out, key=lambda a: (a["run"], a["at"]))


# ------------------------------------------------------------------------------ running
@dataclass
class Outcome:
    """What a scenario did: its runs, its faults, and the checker's violations."""

    violations: list[str] = field(default_factory=list)
    runs: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


def _pid(workdir: Path, rank: int) -> int | None:
    try:
        return int((workdir / "pids" / str(rank)).read_text())
    except (OSError, ValueError):
        return None


def _children_of(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def _status(pid: int) -> str:
    try:
        st = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return "?"
    keep = [x.split(":", 1)[1].strip() for x in st if x.startswith(("State", "PPid"))]
    return f"state={keep[0]} ppid={keep[1]} wchan={wchan}"


def _signal(pid: int | None, sig: int) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _bound(s: dict[str, Any]) -> float:
    """How long one run may take, from the scenario's deadlines: every item's worst case (each
    attempt at its deadline) spread over the workers, plus the fixed overhead."""
    if s.get("mode") == "futures":
        wd = float(s["task_timeout"])
        every = [{**it, "timeout": wd} for it in s["items"]]
        budget = int(s["retries"]) + 1
    else:
        wd = float(s["watchdog"]["seconds"])
        every = list(s["items"]) + [c for sp in s["spawns"] for c in sp["children"]]
        budget = max([int(s["retries"]), *s["per_kind"].values()]) + 1
    total = 0.0
    for it in every:
        if it["kind"] == "hang":
            total += it["timeout"] * budget  # each attempt to its own deadline
        elif it["kind"] in ("instant", "sleep", "flaky", "orphan"):
            total += 1.0 + (it.get("arg", 0) if it["kind"] == "sleep" else 0)
        else:
            total += 1.0 * budget  # fails at once; a crashed child restarts
    workers = s["ranks"] - 1
    faults = {a["do"] for a in s["nemesis"]}
    pauses = sum(a.get("seconds", 0) for a in s["nemesis"]) + 20.0  # pauses, drain_seconds
    # a paused worker's item without a timeout of its own waits for the watchdog
    stalled = wd if faults & {"stop-worker", "stop-child"} else 0.0
    if s.get("batch", 1) != 1:  # a hang shares its dispatch's deadline: the items' own
        # timeouts added up, plus the watchdog's seconds for those without one; the dispatch
        # fails as a whole and its items go again alone (seed 917007198 took 31 s for one)
        hangs = sum(1 for it in every if it["kind"] == "hang")
        stalled += wd * -(-hangs // workers)
    return RUN_OVERHEAD + pauses + 1.5 * total / workers + stalled


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_dispatch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _statedir(s: dict[str, Any], workdir: Path) -> Path:
    """The campaign's state directory (the futures executor's: ``fstate/executor-1``)."""
    if s.get("mode") == "futures":
        return workdir / "fstate" / "executor-1"
    return workdir / "state"


def _mountdir(s: dict[str, Any], workdir: Path) -> Path:
    return workdir / "fstate" if s.get("mode") == "futures" else workdir / "state"


def run_scenario(
    s: dict[str, Any],
    root: Path,
    plant: str | None = None,
    verbose: bool = False,
    bound: float | None = None,
) -> Outcome:
    """Run ``s`` to the end (a run per restart) in ``root``, then check it. ``bound``, if
    given, caps how long one run may take (a test of a planted hang need not wait out the
    scenario's worst case)."""
    out = Outcome()
    start = time.monotonic()
    workdir = root
    state = _mountdir(s, workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "scenario.json").write_text(json.dumps(s, indent=1))
    mount = None
    if s.get("tmpfs") and os.geteuid() == 0:
        state.mkdir(exist_ok=True)
        if (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(state)], capture_output=True
            ).returncode
            == 0
        ):
            mount = state
    if mount is None:  # no tmpfs (not root, or refused): no fill, never on the real disk
        s = {**s, "tmpfs": False}
    try:
        finished = False
        for r in range(MAX_RUNS):
            out.runs += 1
            for a in s["nemesis"]:
                if a["run"] == r and a["do"] in ("compact-between", "forge-between") and r > 0:
                    _between(a["do"], s, workdir, out, plant)
                elif a["run"] == r and a.get("between") and r > 0:  # no master running
                    if (_statedir(s, workdir) / "events.jsonl").exists():  # (else no campaign)
                        _operator(a, s, workdir, out)
            finished = _one_run(s, r, workdir, out, plant, verbose, bound)
            if s.get("mode") == "futures" and finished:
                shutil.copyfile(workdir / "outcomes.json", workdir / f"outcomes-{r}.json")
                # an operator's command sent while it ran may have changed the record after
                # its futures settled: one more run, without any, must resolve them from it
                finished = not [o for o in _ops(workdir) if o["ran_in"] == r]
            if finished or out.violations:
                break
        if not finished and not out.violations:
            out.violations.append(f"not finished after {MAX_RUNS} runs")
        if not out.violations:
            if s.get("mode") == "futures":
                out.violations += check_futures(s, workdir, out.runs - 1)
            else:
                out.violations += check(s, workdir)
    finally:
        if mount is not None:
            if out.violations:  # (the state on the tmpfs, to read: it goes with the mount)
                kept = workdir / f"{mount.name}-kept"
                skip = shutil.ignore_patterns("ballast")
                shutil.copytree(mount, kept, symlinks=True, ignore=skip)
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
    out.seconds = time.monotonic() - start
    return out


def _between(what: str, s: dict[str, Any], workdir: Path, out: Outcome, plant: str | None) -> None:
    state = _statedir(s, workdir)
    if not (state / "events.jsonl").exists():
        return  # the first run was killed before its state directory was made
    if what == "compact-between":
        out.faults["compact-between"] += 1
        res = _cli("compact", str(state))
        if res.returncode != 0:
            out.violations.append(f"compact between runs failed: {res.stdout}{res.stderr}")
        return
    # A digit of the payload of a record before the last, in the state journal or the
    # results journal (whichever holds records): a damaged *last* record reads as a torn
    # tail, which recovery cuts (kept in a side file) by design (S2); one before it must be
    # refused.
    journal, original, digits = None, b"", []
    # Not the submissions store: its records that the state journal does not name yet are
    # cut at open by design (a crash between the two), so a forged one there may be "accepted"
    # (CI's fresh seed 1418017573 and seed 546550676 forged one).
    for name in ("events.jsonl", "results.jsonl"):
        path = state / name
        if not path.exists():
            continue
        original = path.read_bytes()
        lines = original.split(b"\n")
        if len(lines) < 4:  # a header, two records and the end: nothing before the tail
            continue
        # only a record that a later one proves durable (its "d", the durable sequence number
        # when it was written, reaches it): recovery refuses damage to that one (S2); damage a
        # later record does not vouch for reads as a torn tail and is cut, by design
        spans, at = [], len(lines[0]) + 1
        for line in lines[1:]:
            spans.append((at, line))
            at += len(line) + 1
        recs = []
        for off, line in spans:
            try:
                rec = json.loads(line)
                recs.append((off, len(line), int(rec["seq"]), int(rec["d"])))
            except (ValueError, KeyError, TypeError):
                continue
        vouched = [
            (off, n)
            for k, (off, n, seq, _d) in enumerate(recs)
            if any(d >= seq for _o, _n, _s, d in recs[k + 1 :])
        ]
        digits = [
            i
            for off, n in vouched
            for i in range(off, off + n)
            if original[i : i + 1].isdigit()
            and original.rfind(b'"p":', 0, i) > original.rfind(b"\n", 0, i)
        ]
        if digits:
            journal = path
            break
    if journal is None:
        return
    out.faults["forge-between"] += 1
    data = bytearray(original)
    at = digits[len(digits) // 2]
    data[at] = ord("7") if data[at] != ord("7") else ord("3")
    journal.write_bytes(bytes(data))
    cmd = launcher.mpiexec_command(s["ranks"], _argv(s, workdir, None))
    res = launcher.run_mpiexec(cmd, timeout=120)
    after = journal.read_bytes()
    journal.write_bytes(original)
    if res.timed_out:
        out.violations.append("a forged journal made the job hang")
    elif res.returncode == 0:
        out.violations.append("a forged journal was accepted")
    elif "CorruptError" not in res.stderr:
        out.violations.append(
            f"a forged journal was refused without a typed error: {res.stderr[-800:]}"
        )
    if after != bytes(data):
        out.violations.append("the refused open changed the forged journal")


def _argv(s: dict[str, Any], workdir: Path, plant: str | None) -> list[str]:
    """The command line of one run: the campaign, or the futures script under its runner."""
    args = [str(workdir / "scenario.json"), str(workdir)]
    if s.get("mode") == "futures":
        runner = [sys.executable, "-m", "durable_dispatch.futures", "--state-dir"]
        return [*runner, str(workdir / "fstate"), str(HERE / "torture_futures.py"), *args]
    return [sys.executable, str(HERE / "torture_campaign.py"), *args] + (
        ["--plant", plant] if plant else []
    )


def _one_run(
    s: dict[str, Any],
    r: int,
    workdir: Path,
    out: Outcome,
    plant: str | None,
    verbose: bool,
    cap: float | None = None,
) -> bool:
    shutil.rmtree(workdir / "pids", ignore_errors=True)
    argv = _argv(s, workdir, plant)
    env = launcher.launch_env({"TORTURE_RUN": str(r)}, quiet=True)
    proc = subprocess.Popen(
        launcher.mpiexec_command(s["ranks"], argv, ulfm=bool(s.get("ulfm"))),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    bound = _bound(s) if cap is None else min(cap, _bound(s))
    t0, t0_wall = time.monotonic(), time.time()
    todo = [
        a
        for a in s["nemesis"]
        if a["run"] == r and not a["do"].endswith("-between") and not a.get("between")
    ]
    stopped: list[tuple[float, int]] = []
    filler: Path | None = None
    fill_until = 0.0
    try:
        while proc.poll() is None:
            now = time.monotonic() - t0
            if now > bound:
                out.violations.append(f"run {r} did not end by itself within {bound:.0f} s")
                break
            for t_end, pid in list(stopped):
                if now >= t_end:
                    _signal(pid, signal.SIGCONT)
                    _log_fault(workdir, r, "cont", pid, None)
                    stopped.remove((t_end, pid))
            if filler is not None and now > fill_until:
                filler.unlink(missing_ok=True)  # the disk frees: the journal recovers
                filler = None
            while todo and now >= todo[0]["at"]:
                a = todo[0]
                done, made = _act(a, s, workdir, proc, stopped, now, out)
                if made is not None:
                    filler, fill_until = made, now + a.get("seconds", 2.0)
                if done or now > a["at"] + (30.0 if a.get("after") else 5.0):  # up, or never
                    todo.pop(0)
                else:
                    break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            launcher.kill_session(proc)
        for _, pid in stopped:
            _signal(pid, signal.SIGCONT)
            _log_fault(workdir, r, "cont", pid, None)
        if filler is not None:
            filler.unlink(missing_ok=True)
        stdout, stderr = proc.communicate()
    (workdir / f"run-{r}.out").write_text(stdout)
    (workdir / f"run-{r}.err").write_text(stderr)
    time.sleep(0.5)
    left = [p for p in launcher.pids_in_session(proc.pid) if p != proc.pid]
    if left:
        what = sorted({_cmdline(p)[:120] + " " + _status(p) for p in left})
        out.violations.append(f"run {r}: {len(left)} process(es) of the job left: {left} {what}")
        for p in left:
            _signal(p, signal.SIGKILL)
    launcher.remove_session_dir(proc.pid)
    launcher.remove_stale_shm()
    if verbose:
        print(f"  run {r}: rc {proc.returncode} in {time.monotonic() - t0:.1f}s", flush=True)
    if proc.returncode == 0 and _finished_since(s, workdir, t0_wall) and not _left(s, workdir):
        return True
    if "Traceback" in stderr and "CorruptError" in stderr:
        out.violations.append(f"run {r} refused its own state: {stderr[-1500:]}")
    return False


def _log_fault(workdir: Path, run: int, do: str, pid: int, rank: int | None) -> None:
    """Log a signal the nemesis sent in ``faults.jsonl`` (``{"run", "do", "pid", "rank",
    "t"}``; ``do`` is ``"cont"`` for the SIGCONT that ends a stop): which rank it hit and when,
    for the checker (a stopped rank cannot answer) and for whoever reads a failure."""
    with open(workdir / "faults.jsonl", "a") as f:
        f.write(
            json.dumps({"run": run, "do": do, "pid": pid, "rank": rank, "t": time.time()}) + "\n"
        )


def _rank0(ranks: list[int]) -> int:
    """Rank 0 among the runner's rank processes (Open MPI's ``OMPI_COMM_WORLD_RANK``)."""
    for p in ranks:
        try:
            env = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK=0" in env or b"PMI_RANK=0" in env:
            return p
    return ranks[0]


def _left(s: dict[str, Any], workdir: Path) -> bool:
    """Work an operator's command gave the campaign after its master finished (a ``retry`` or
    ``submit`` applied with no master running, or a command still queued): run again."""
    if s.get("mode") == "futures" or not any(a["do"].startswith("op-") for a in s["nemesis"]):
        return False
    from durable_dispatch.campaign.admin import view_state
    from durable_dispatch.campaign.control import pending_commands

    state = _statedir(s, workdir)
    return bool(view_state(state).projection.frontier) or bool(pending_commands(str(state)))


def _finished_since(s: dict[str, Any], workdir: Path, since: float) -> bool:
    """The campaign's own word (its report, or the futures script's outcomes), not the exit
    status alone: a drained or broken run ends with status 0 or 3."""
    if s.get("mode") == "futures":
        f = workdir / "outcomes.json"
        return f.exists() and f.stat().st_mtime >= since
    for f in workdir.glob("report-*.json"):
        if f.stat().st_mtime >= since and json.loads(f.read_text()).get("finished"):
            return True
    return False


def _act(
    a: dict[str, Any],
    s: dict[str, Any],
    workdir: Path,
    proc: subprocess.Popen[str],
    stopped: list[tuple[float, int]],
    now: float,
    out: Outcome,
) -> tuple[bool, Path | None]:
    """Inject ``a``; ``(done, ballast file)``, done False when its target is not up yet."""
    do = a["do"]
    if a.get("after") == "state" and not (_statedir(s, workdir) / "events.jsonl").exists():
        return False, None
    rank_of = {p: k for k in range(1, s["ranks"]) if (p := _pid(workdir, k))}
    workers = list(rank_of)
    master = _pid(workdir, 0)
    if s.get("mode") == "futures":  # the runner's ranks: mpiexec's children, rank 0 the first
        ranks = sorted(c for c in _children_of(proc.pid) if "python" in _cmdline(c))
        # not before the script wrote pids/0: MPI is up then. A rank killed inside MPI_Init
        # leaves the others waiting there forever under ULFM (Open MPI's fault tolerance starts
        # after it: docs/mpi.md), which no library above MPI can change.
        if len(ranks) < s["ranks"] or master is None:
            return False, None
        master, workers = _rank0(ranks), [p for p in ranks if p != _rank0(ranks)]
        rank_of = {}  # (the runner's ranks: not known by number)
    target: int | None = None
    rank: int | None = None  # the rank the target is (or serves: an isolated child's worker)
    if do in ("kill-master", "stop-master"):
        target, rank = master, 0
    elif do in ("kill-worker", "stop-worker") and workers:
        target = random.Random(a["at"]).choice(workers)
        rank = rank_of.get(target)
    elif do in ("kill-child", "stop-child") and workers:
        kids = [(c, w) for w in workers for c in _children_of(w)]
        if kids:
            target, parent = random.Random(a["at"]).choice(kids)
            rank = rank_of.get(parent)
    if do.startswith(("kill-", "stop-")):
        if target is None:
            return False, None
        if do.startswith("kill-") and _signal(target, signal.SIGKILL):
            out.faults[do] += 1
            _log_fault(workdir, a["run"], do, target, rank)
        elif do.startswith("stop-") and _signal(target, signal.SIGSTOP):
            out.faults[do] += 1
            _log_fault(workdir, a["run"], do, target, rank)
            stopped.append((now + a.get("seconds", 1.0), target))
        return True, None
    if do == "drain":
        if _signal(proc.pid, signal.SIGUSR1):
            out.faults[do] += 1
            _log_fault(workdir, a["run"], do, proc.pid, None)
        return True, None
    if do.startswith("op-"):
        return _operator(a, s, workdir, out), None
    if do in ("results", "compact"):
        if not (_statedir(s, workdir) / "events.jsonl").exists():
            return False, None
        out.faults[do] += 1
        res = _cli(do, str(_statedir(s, workdir)), *(["--jsonl"] if do == "results" else []))
        if res.returncode not in ((0,) if do == "results" else (0, 1)):
            out.violations.append(
                f"{do} beside the master: exit {res.returncode}: {res.stderr[-800:]}"
            )
        return True, None
    if do == "fill" and s.get("tmpfs"):
        if not (_statedir(s, workdir) / "events.jsonl").exists():
            return False, None
        ballast = _mountdir(s, workdir) / "ballast"
        try:
            with open(ballast, "wb") as f:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
        except OSError:
            pass  # full: ENOSPC for the master from now on
        out.faults[do] += 1
        return True, ballast
    return True, None


def _operator(a: dict[str, Any], s: dict[str, Any], workdir: Path, out: Outcome) -> bool:
    """An operator's command beside the master (issue 52), or between runs (``between``: it
    opens the directory): exit 0, or 1 for a finding (an ID left alone, no master to drain, no
    acknowledgement in time: it stays queued); each is logged in ``ops.jsonl`` for the checker
    (with ``ran_in``, the run it was sent in, None between runs, and ``t``, when). False when
    its target is not known yet (the futures face's work IDs, which its script writes)."""
    state = str(_statedir(s, workdir))
    do = a["do"]
    stdin = None
    ids = a.get("ids")
    if do == "op-cancel" and ids is None:  # the futures face: calls named by their index
        try:
            wids = json.loads((workdir / "wids.json").read_text())
        except (OSError, ValueError):
            return False
        ids = [wids[n] for n in a["calls"]]
    if do == "op-cancel":
        args = ["cancel", state, *ids]
    elif do == "op-retry":
        args = ["retry", state, "--all"]
    elif do == "op-submit":
        args = ["submit", state, "-"]
        stdin = "".join(
            json.dumps({"work_id": i["id"], "payload": i, "after": i.get("after", [])}) + "\n"
            for i in a["items"]
        )
    else:
        args = ["drain", state]
    t = time.time()
    res = subprocess.run(
        [sys.executable, "-m", "durable_dispatch", *args, "--json", "--timeout", "15"],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
    )
    out.faults[do] += 1
    if res.returncode not in (0, 1) and not _refused_by_full_disk(s, res):
        out.violations.append(
            f"{do}: exit {res.returncode}: {res.stdout[-400:]}{res.stderr[-400:]}"
        )
    with open(workdir / "ops.jsonl", "a") as f:
        try:
            answer = json.loads(res.stdout)
        except ValueError:
            answer = None
        ran_in = None if a.get("between") else a["run"]
        f.write(
            json.dumps(
                {**a, "ids": ids, "t": t, "ran_in": ran_in, "rc": res.returncode,
                 "out": res.stdout[-2000:], "answer": answer}
            ) + "\n"
        )  # fmt: skip
    return True


def _refused_by_full_disk(s: dict[str, Any], res: subprocess.CompletedProcess[str]) -> bool:
    """A command the filled tmpfs refused: exit 2, ENOSPC, and it says nothing was sent
    (docs/how-to/steer.md); the checker then holds that it had no effect."""
    if res.returncode != 2 or not s.get("tmpfs"):
        return False
    try:
        err = json.loads(res.stdout)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    msg = str(err.get("message", ""))
    return "[Errno 28]" in msg and "nothing was sent" in msg


def _sent(o: dict[str, Any]) -> bool:
    """An operator's command that was written (all but one the disk refused: exit 2)."""
    return o.get("rc") != 2


def _ops(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "ops.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


# ------------------------------------------------------------------------------ the checker
def check(s: dict[str, Any], workdir: Path) -> list[str]:
    """The model's promises, held against the campaign's record (see the module docs)."""
    from durable_dispatch import read_results
    from durable_dispatch.campaign.admin import view_state
    from durable_dispatch.core import RetryPolicy

    v: list[str] = []
    state = workdir / "state"
    policy = RetryPolicy(s["retries"], per_kind=s["per_kind"])
    p = view_state(state).projection
    committed = {r.work_id: r.result for r in read_results(state)}
    deferred_ids = set(p.deferred)
    spec = {i["id"]: i for i in s["items"]}
    kids = {sp["parent"]: sp["children"] for sp in s["spawns"]}
    for parent, children in kids.items():
        if parent in committed:
            spec.update({c["id"]: c for c in children})
    ops = _ops(workdir)  # issue 52: what an operator may have cancelled or added
    may_cancel = {w for o in ops if o["do"] == "op-cancel" and _sent(o) for w in o["ids"]}
    for o in ops:
        if o["do"] == "op-submit" and _sent(o):
            spec.update({i["id"]: i for i in o["items"] if p.known(i["id"])})
        elif o["do"] == "op-submit":  # refused by the full disk: nothing of it may be known
            v += [f"{i['id']}: known, but its submit was refused" for i in o["items"]
                  if p.known(i["id"])]  # fmt: skip
    nemesis = {a["do"] for a in s["nemesis"]}
    suspect = set()
    if nemesis & {"stop-worker", "stop-child", "stop-master"} or s["watchdog"].get("quantile"):
        suspect.add("timeout")
    if "kill-child" in nemesis:
        suspect.add("crash")
    if "kill-worker" in nemesis:  # under ULFM a lost rank, charged (docs/protocol.md)
        suspect.add("lost-rank")
    for wid, it in spec.items():
        commits, allowed, _ = KINDS[it["kind"]]
        c, d = wid in committed, wid in deferred_ids
        if wid in p.cancelled:
            if wid not in may_cancel:
                v.append(f"{wid}: cancelled, but no operator cancelled it")
            if c or d:
                v.append(f"{wid}: cancelled and {'committed' if c else 'deferred'}")
            continue
        if c == d:
            how = "both committed and deferred" if c else "neither committed nor deferred"
            v.append(f"{wid} ({it['kind']}): {how}")
            continue
        waits = [x for x in it.get("after", ()) if x not in committed]
        if waits:  # issue 51: a dependency never committed: deferred, never run
            if c or tuple(p.kinds.get(wid, ())) != ("dependency",):
                v.append(
                    f"{wid} waits for {waits} (not committed), but it is "
                    f"{'committed' if c else 'deferred with ' + str(p.kinds.get(wid))}"
                )
            continue
        if c:
            if not commits and not (it["kind"] == "memory"):
                v.append(f"{wid} ({it['kind']}) was committed, but it cannot succeed")
            elif commits and committed[wid] != expected(it):
                v.append(f"{wid}: committed {committed[wid]!r}, expected {expected(it)!r}")
        else:
            kinds = tuple(p.kinds.get(wid, ()))
            ok = allowed | suspect
            if commits:
                ok = (allowed | suspect) if it["kind"] == "flaky" else suspect
            bad = [k for k in kinds if k not in ok]
            if bad or not kinds:
                v.append(f"{wid} ({it['kind']}) deferred with kinds {kinds}, allowed {sorted(ok)}")
            for n, k in enumerate(kinds[:-1], start=1):
                if n > policy.retries_for(k):
                    v.append(f"{wid}: failure {n} ({k}) was over its budget but requeued: {kinds}")
            if kinds and len(kinds) <= policy.retries_for(kinds[-1]):
                v.append(
                    f"{wid}: deferred after {len(kinds)} failure(s) within its budget: {kinds}"
                )
    unknown = (set(committed) | deferred_ids | set(p.cancelled)) - set(spec)
    if unknown:
        v.append(f"work IDs nobody submitted or spawned: {sorted(unknown)[:5]}")
    if p.duplicate_commits:
        v.append(f"{p.duplicate_commits} duplicate commit(s) in the projection")
    v += _duplicate_commits(state)
    sink = workdir / "sink.jsonl"
    delivered = (
        {json.loads(line)["id"] for line in sink.read_text().splitlines()}
        if sink.exists()
        else set()
    )
    missing = set(committed) - delivered
    if missing:
        v.append(f"commits that never reached the callback: {sorted(missing)[:5]}")
    v += parked_at_end(s, workdir)
    res = _cli("verify", str(state))
    if res.returncode != 0:
        v.append(f"verify: exit {res.returncode}: {res.stdout[-500:]}")
    return v


#: How long ``run_master`` keeps serving parked ranks once the work is done (its ``linger``,
#: which torture_campaign.py leaves at its default).
LINGER = 2.0


def parked_at_end(s: dict[str, Any], workdir: Path) -> list[str]:
    """With isolation, no rank is parked when the last run ends: an isolated worker answers a
    dispatch the master rolled back (a timeout, an operator's cancel) with the READY of its
    exact token once it has killed its child and started a fresh one, and the master, once the
    work is done, keeps serving for :data:`LINGER` seconds while a rank is parked. Two ends
    leave a rank parked by design, and are not violations:

    - a drained run (an operator's ``drain`` that the master applied, or SIGUSR1, in that run):
      a drain stops once nothing is in flight and does not linger, and a parked rank has
      nothing in flight (its dispatch was rolled back). Its worker may still be starting its
      fresh child (an interpreter and the campaign script: up to a second on a loaded machine)
      when the master ends (seed 2144568252: a cancel in flight, then that child SIGSTOPped
      while it started, then the drain);
    - ranks whose worker, or an isolated child of it, the nemesis SIGSTOPped and continued only
      after the linger began (at the latest, :data:`LINGER` before the master's end): they
      could not answer in time (a worker restarts a killed child before it says READY, so a
      child stopped while it starts holds its worker).

    The run and its end are the last report's (``torture_campaign.py`` writes them), the
    drains those of ``ops.jsonl`` and ``faults.jsonl``, the stops and their SIGCONTs those of
    ``faults.jsonl``.
    """
    reports = sorted(workdir.glob("report-*.json"), key=lambda f: f.stat().st_mtime)
    if not reports or not s["isolate"]:
        return []
    st = json.loads(reports[-1].read_text())
    parked = _find(st["stats"], "parked_ranks_now")
    if not parked:
        return []
    run = st.get("run")  # (None in a report of before: then nothing excuses a parked rank)
    end = st.get("t", reports[-1].stat().st_mtime)
    faults = _faults(workdir)
    ops = _ops(workdir)
    drained = run is not None and (
        any(f["do"] == "drain" and f["run"] == run for f in faults)
        or any(
            o["do"] == "op-drain"
            and o.get("ran_in") == run
            and (o.get("answer") or {}).get("ok") is True
            and (o.get("answer") or {}).get("applied_by") == "master"
            for o in ops
        )
    )
    if drained:
        return []
    stopped: set[int] = set()
    for n, f in enumerate(faults):
        if run is None or f["run"] != run or f["do"] not in ("stop-worker", "stop-child"):
            continue
        conts = [g["t"] for g in faults[n + 1 :] if g["do"] == "cont" and g["pid"] == f["pid"]]
        if f["rank"] is not None and (conts[0] if conts else float("inf")) >= end - LINGER:
            stopped.add(f["rank"])
    if parked <= len(stopped):
        return []
    return [
        f"{parked} rank(s) parked at the end with isolation on (run {run} was not drained; "
        f"ranks stopped into the linger: {sorted(stopped) or 'none'})"
    ]


def _faults(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "faults.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _duplicate_commits(state: Path) -> list[str]:
    """Work IDs that two records of the journals commit (results.jsonl keeps the sequence
    number of the state-journal record it came from, so a moved result is not counted twice)."""
    from durable_dispatch.storage.journal import read_journal

    seqs: dict[str, set[int]] = {}  # work ID -> the state-journal records that committed it
    for name in ("results.jsonl", "events.jsonl"):
        path = state / name
        if path.exists():
            for rec in read_journal(str(path)):
                ev = rec.payload
                if name == "events.jsonl" and ev.get("event") != "committed":
                    continue
                seq = int(ev["seq"]) if name == "results.jsonl" else rec.seq
                for wid in ev.get("work_ids") or [ev.get("work_id")]:
                    seqs.setdefault(wid, set()).add(seq)
    dup = [w for w, n in seqs.items() if len(n) > 1]
    return [f"work IDs committed more than once in the journal: {dup[:5]}"] if dup else []


def check_futures(s: dict[str, Any], workdir: Path, final_run: int) -> list[str]:
    """The futures executor's promises (see the module docs). Every run's settled futures: a
    call's outcome is its kind's (a value that is the function of its input, its own exception
    re-raised, or TaskFailed of the right kind), ``cancelled`` only when an operator's
    ``cancel`` named it, ``DependencyFailed`` only when a dependency's future failed in that
    run (naming it, its cause that one's failure), never when every dependency succeeded. The
    final run: each call's outcome is the record's (committed, deferred or cancelled), once (a
    call whose dependencies all committed, one of them a raise, is committed with its
    DependencyFailed, which names one that raised; a deferred one's names one deferred or
    cancelled); every call that ended by running ran; a call a ``retry`` requeued ran again
    after it; a call cancelled, then requeued, is cancelled no more; a call whose dependency
    failed did not run in it; and it ran no call an earlier run had committed (it resolved them
    from the record)."""
    from durable_dispatch import read_results
    from durable_dispatch.campaign.admin import view_state

    v: list[str] = []
    state = _statedir(s, workdir)
    items = s["items"]
    faults = {a["do"] for a in s["nemesis"]}
    suspect = {"timeout"} if faults & {"stop-worker", "stop-child", "stop-master"} else set()
    if "kill-child" in faults:
        suspect.add("crash")
    if "kill-worker" in faults:
        suspect.add("lost-rank")
    committed = {r.work_id: r for r in read_results(state)}
    p = view_state(state).projection
    final_epoch = max([r.epoch or 0 for r in committed.values()] + [p.epoch])
    runs: dict[int, set[int]] = {}  # call -> the runs it ran in
    ran_at: dict[int, list[float]] = {}  # call -> when each execution started
    for line in (workdir / "count").read_text().split("\n") if (workdir / "count").exists() else []:
        if line.strip():
            n, run, t = line.split()
            runs.setdefault(int(n), set()).add(int(run) if run.isdigit() else -1)
            ran_at.setdefault(int(n), []).append(float(t))
    ops = [o for o in _ops(workdir) if _sent(o)]
    cancels = [o for o in ops if o["do"] == "op-cancel"]
    # every run's settled futures: the runs that finished, and those a drain (or another end
    # of the campaign) broke, with what had settled by then
    seen: dict[int, list[dict[str, Any] | None]] = {}
    for f in workdir.glob("outcomes-*.json"):
        seen[int(f.stem.split("-")[1])] = json.loads(f.read_text())
    for f in workdir.glob("broken-*.json"):
        r = int(f.stem.split("-")[1])
        b = json.loads(f.read_text())
        seen[r] = b["out"]
        drained = "drain" in faults or any(o["do"] == "op-drain" for o in ops)
        if "drain" in b["why"] and not drained:
            v.append(f"run {r} was drained ({b['why']}), but nobody drained it")
    if final_run not in seen or seen[final_run] is None:
        return v + [f"the final run {final_run} left no outcomes"]
    for r, outs in sorted(seen.items()):
        if len(outs) != len(items):
            v.append(f"run {r}: {len(outs)} outcomes for {len(items)} calls")
            continue
        named = {w for o in cancels if o["ran_in"] is None or o["ran_in"] <= r for w in o["ids"]}
        for n, (it, o) in enumerate(zip(items, outs, strict=True)):
            if o is not None:
                v += [f"run {r}: {x}" for x in _futures_outcome(n, it, o, outs, named, suspect)]
    outcomes = seen[final_run]
    cancelled_last: dict[str, float] = {}  # work ID -> when a cancel that cancelled it was sent
    requeued: dict[str, float] = {}  # work ID -> when a retry that requeued it was sent
    for o in ops:
        got = (o.get("answer") or {}).get("work_ids")
        if got is None and o["do"] == "op-cancel":  # queued, or no answer: it may cancel later
            got = {w: "cancelled" for w in o["ids"]}
        for wid, what in (got or {}).items():
            if o["do"] == "op-cancel" and str(what).startswith("cancelled"):
                cancelled_last[wid] = max(cancelled_last.get(wid, 0.0), o["t"])
            elif o["do"] == "op-retry" and what == "requeued":
                requeued[wid] = max(requeued.get(wid, 0.0), o["t"])
    records = [
        "cancelled" if w in p.cancelled else "deferred" if w in p.deferred
        else "committed" if w in committed else "pending"
        for w in (o["work_id"] for o in outcomes)
    ]  # fmt: skip
    for n, (it, o) in enumerate(zip(items, outcomes, strict=True)):
        wid, record = o["work_id"], records[n]
        failed = o.get("failed")
        want = "cancelled" if failed == "cancelled" else "deferred" if failed else "committed"
        if failed == "dependency" and all(records[j] == "committed" for j in it.get("after", ())):
            want = "committed"  # a dependency raised: its DependencyFailed is its outcome
        dep = o.get("dependency")
        if failed == "dependency" and isinstance(dep, int) and want != records[dep] != "cancelled":
            v.append(
                f"call {n} is {record}, but its DependencyFailed names call {dep}, "
                f"{records[dep]} (deferred for one deferred, committed when all were)"
            )
        if record != want:
            v.append(f"call {n} ({it['kind']}): outcome {o} but the record says {record}")
        if failed == "dependency" and final_run in runs.get(n, ()):
            v.append(f"call {n}: its dependency failed, but it ran in the final run")
        # (a rank lost with the call's dispatch may have died before the call began)
        if failed not in ("dependency", "cancelled", "lost-rank") and n not in runs:
            v.append(f"call {n} ({it['kind']}) never ran")
        if wid in requeued and failed not in ("dependency", "cancelled"):
            if not any(t >= requeued[wid] for t in ran_at.get(n, ())):
                v.append(f"call {n}: requeued by a retry, and it never ran after it")
        if failed == "cancelled" and requeued.get(wid, 0.0) > cancelled_last.get(wid, 1e18):
            v.append(f"call {n}: cancelled, then requeued by a retry, and it ends cancelled")
        r = committed.get(wid)
        if r is not None and (r.epoch or 0) < final_epoch and final_run in runs.get(n, ()):
            v.append(f"call {n} was committed in epoch {r.epoch}, and ran again in the final run")
    v += _duplicate_commits(state)
    res = _cli("verify", str(state))
    if res.returncode != 0:
        v.append(f"verify: exit {res.returncode}: {res.stdout[-500:]}")
    return v


def _futures_outcome(
    n: int,
    it: dict[str, Any],
    o: dict[str, Any],
    outs: list[dict[str, Any] | None],
    named: set[str],
    suspect: set[str],
) -> list[str]:
    """What is wrong with call ``n``'s settled outcome ``o`` in a run whose settled outcomes
    are ``outs`` (None: not settled when the run ended), ``named`` the work IDs a sent cancel
    named by the end of that run."""
    want, failed = FUTURES_KINDS[it["kind"]], o.get("failed")
    deps = [(j, outs[j]) for j in it.get("after", ())]
    bad = [(j, d) for j, d in deps if d is not None and "ok" not in d]
    if failed == "cancelled":
        return [] if o["work_id"] in named else [f"call {n}: cancelled, but no cancel named it"]
    if failed == "dependency":
        j = o.get("dependency")
        if j not in it.get("after", ()):
            return [f"call {n}: DependencyFailed names {j}, not one of its dependencies"]
        d = outs[j]
        if d is not None and "ok" in d:
            return [f"call {n}: DependencyFailed names call {j}, which returned {d['ok']}"]
        if d is not None and o.get("cause") != _futures_failure(d):
            return [f"call {n}: DependencyFailed caused by {o.get('cause')}, call {j}: {d}"]
        return []
    if bad:
        return [f"call {n}: outcome {o}, though its dependency {bad[0][0]} ended {bad[0][1]}"]
    if want == "ok" and o.get("ok") == {"n": n, "square": n * n}:
        return []
    if want == "raised" and o.get("raised") == n:
        return []
    if failed is not None and failed in ({want} | suspect) - {"ok", "raised"}:
        return []
    return [f"call {n} ({it['kind']}): outcome {o}, expected {want}"]


def _futures_failure(o: dict[str, Any]) -> str:
    """How a settled call failed, as its dependents' DependencyFailed names its cause."""
    return "raised" if "raised" in o else f"failed:{o.get('failed')}"


def _find(d: Any, key: str) -> Any:
    if isinstance(d, dict):
        if key in d:
            return d[key]
        for x in d.values():
            got = _find(x, key)
            if got is not None:
                return got
    return None


# ------------------------------------------------------------------------------ shrinking
def shrink(s: dict[str, Any], root: Path, plant: str | None = None) -> dict[str, Any]:
    """Drop faults, then items, while the scenario still fails; the smallest one found."""
    best = s
    attempt = 0

    def fails(c: dict[str, Any]) -> bool:
        nonlocal attempt
        attempt += 1
        return bool(run_scenario(c, root / f"shrink-{attempt}", plant).violations)

    for i in range(len(best["nemesis"]) - 1, -1, -1):
        c = {**best, "nemesis": best["nemesis"][:i] + best["nemesis"][i + 1 :]}
        if fails(c):
            best = c
    chunk = max(1, len(best["items"]) // 2)
    while chunk >= 1:
        i = 0
        while i < len(best["items"]) and len(best["items"]) > 1:
            c = {**best, "items": best["items"][:i] + best["items"][i + chunk :]}
            c["spawns"] = [
                sp for sp in c["spawns"] if sp["parent"] in {x["id"] for x in c["items"]}
            ]
            if fails(c):
                best = c
            else:
                i += chunk
        chunk //= 2
    return best


# ------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--seed", type=int, action="append", default=[])
    ap.add_argument("--fresh", action="store_true", help="add one fresh random seed (printed)")
    ap.add_argument("--scenario", type=Path)
    ap.add_argument("--plant", choices=["double-commit", "drop-child", "deadline-after-restart"])
    ap.add_argument("--profile", choices=["any", "restart", "spawn", "commit"], default="any")
    ap.add_argument("--ulfm", action="store_true", help="every scenario under ULFM")
    ap.add_argument("--shrink", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("torture-failures"))
    ap.add_argument("--json", type=Path, help="write the totals here")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="dd-torture-"))
    totals: Counter[str] = Counter()
    scenarios = violations = 0
    ran: list[dict[str, Any]] = []  # (for the pair coverage printed at the end)
    try:
        if a.scenario:
            queue = [json.loads(a.scenario.read_text())]
            end = float("inf")
        else:
            seeds = list(a.seed)
            if a.fresh or not seeds:
                seeds.append(random.SystemRandom().randrange(1 << 31))
            queue = None
            end = time.monotonic() + 60 * a.minutes
        k = 0
        while True:
            if queue is not None:
                if not queue:
                    break
                s = queue.pop(0)
            else:
                if time.monotonic() >= end and k >= len(seeds):
                    break
                seed = seeds[k] if k < len(seeds) else random.SystemRandom().randrange(1 << 31)
                s = generate(seed, a.profile)
                if a.ulfm:
                    s["ulfm"] = True
            k += 1
            faults = [x["do"] for x in s["nemesis"]]
            print(
                f"scenario seed={s['seed']} ranks={s['ranks']} ulfm={s.get('ulfm', False)} "
                f"isolate={s['isolate']} "
                f"batch={s.get('batch', 'futures')} items={len(s['items'])} faults={faults}",
                flush=True,
            )
            o = run_scenario(s, tmp / f"s{k}", a.plant, verbose=True)
            scenarios += 1
            ran.append(s)
            totals.update(o.faults)
            if o.violations:
                violations += len(o.violations)
                a.out.mkdir(exist_ok=True)
                path = a.out / f"seed-{s['seed']}.json"
                if a.shrink:
                    s = shrink(s, tmp / f"shrink{k}", a.plant)
                path.write_text(json.dumps(s, indent=1))
                kept = a.out / f"seed-{s['seed']}-work"  # the runs' output and state, to read
                shutil.rmtree(kept, ignore_errors=True)
                shutil.copytree(tmp / f"s{k}", kept, symlinks=True, ignore_dangling_symlinks=True)
                print(f"  VIOLATIONS (seed {s['seed']}, scenario {path}, work {kept}):", flush=True)
                for err in sorted((tmp / f"s{k}").glob("run-*.err"))[-1:]:
                    print("  last run's stderr:", err.read_text()[-3000:], flush=True)
                for x in o.violations:
                    print(f"    - {x}", flush=True)
            else:
                print(
                    f"  ok: {o.runs} run(s), faults {dict(o.faults)}, {o.seconds:.1f}s", flush=True
                )
            if queue is None and time.monotonic() >= end and k >= len(seeds):
                break
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{scenarios} scenario(s), faults injected {dict(totals)}, {violations} violation(s)")
    print(pair_table(ran), flush=True)
    if a.json:
        pairs = sorted(" x ".join(sorted(p)) for p in pairs_covered(ran))
        a.json.write_text(
            json.dumps(
                {
                    "scenarios": scenarios,
                    "faults": dict(totals),
                    "violations": violations,
                    "pairs": pairs,
                    "pairs_possible": len(all_pairs()),
                }
            )
        )
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
