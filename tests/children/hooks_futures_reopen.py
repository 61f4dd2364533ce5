"""Done-callbacks that act on the executor's campaign (tests/test_reopen_hooks.py).

For each seed, an executor on ``MPI.COMM_SELF`` (its calls run in its manager thread) runs a
few calls (values, raised exceptions, calls that wait for others); each future's done-callback
may submit another call (perhaps waiting for an earlier one) or write an operator's cancel or
retry (a command file, as ``durable-dispatch cancel`` and ``retry`` write it). Once every
future is done, every callback has returned and no command waits, the executor shuts down, and
the campaign's state in memory is compared with the replay of its directory and with a reopen.
Prints one JSON line per seed. ``argv``: a directory, then the seeds."""

import json
import os
import random
import sys
import threading
import time
from concurrent.futures import wait

from mpi4py import MPI

from durable_dispatch import CampaignState, RetryPolicy
from durable_dispatch.campaign import control
from durable_dispatch.campaign.admin import view_state
from durable_dispatch.campaign.control import pending_commands, read_ack, write_command
from durable_dispatch.futures import MPICommExecutor
from tests.test_reopen_machine import _relations

ACTIONS = 8  # what the callbacks do, at most, per seed


def value(x):
    return x


def boom(x):
    raise KeyError(x)


class Actor:
    """The futures, their callbacks and what the callbacks did (any thread: one lock)."""

    def __init__(self, ex, state, seed):
        self.ex, self.state = ex, state
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.futures = []
        self.added = self.ran = 0
        self.acted = []
        self.commands = []  # the command IDs the callbacks wrote
        self.ended = []  # work IDs whose future failed with TaskFailed or DependencyFailed

    def submit(self):
        """A new call: a value, a raise, or a call that waits for an earlier one."""
        with self.lock:
            kind = self.rng.choice(["value", "value", "boom", "after"])
            earlier = self.rng.choice(self.futures) if self.futures else None
            n = len(self.futures)
        if kind == "after" and earlier is not None:
            fut = self.ex.submit(value, earlier)
        else:
            fut = self.ex.submit(boom if kind == "boom" else value, n)
        with self.lock:
            self.futures.append(fut)
            self.added += 1
        fut.add_done_callback(self.callback)

    def callback(self, fut):
        try:
            e = fut.exception()
            with self.lock:
                if type(e).__name__ in ("TaskFailed", "DependencyFailed") and fut.work_id:
                    self.ended.append(fut.work_id)
                if len(self.acted) >= ACTIONS:
                    return
                what = self.rng.choice(["submit", "cancel", "retry", "nothing"])
                known = [f.work_id for f in self.futures if f.work_id]
                running = [f.work_id for f in self.futures if f.work_id and not f.done()]
                if what == "retry":
                    target = self.rng.choice(self.ended or known)
                else:
                    target = self.rng.choice(running or known)
                if what != "nothing":
                    self.acted.append(what)
            if what == "submit":
                self.submit()
            elif what in ("cancel", "retry"):
                cmd = write_command(self.state, what, {"work_ids": [target]})
                with self.lock:
                    self.commands.append(cmd.id)
        finally:
            with self.lock:
                self.ran += 1

    def settle(self, seconds=60.0):
        """Until every future is done, every callback returned and no command waits."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with self.lock:
                futs, quiet = list(self.futures), self.ran == self.added
            wait(futs, timeout=end - time.monotonic())
            if quiet and not pending_commands(self.state):
                time.sleep(0.05)  # (a command applied now may still fail a future)
                with self.lock:
                    if self.ran == self.added and len(self.futures) == len(futs):
                        if all(f.done() for f in futs) and not pending_commands(self.state):
                            return
            time.sleep(0.01)
        raise TimeoutError("the callbacks never settled")


def run(base, seed):
    state = os.path.join(base, f"state-{seed}")
    with MPICommExecutor(
        MPI.COMM_SELF, 0, state_dir=state, retry=RetryPolicy(retries=1), sync="always"
    ) as ex:
        actor = Actor(ex, state, int(seed))
        for _ in range(5):
            actor.submit()
        actor.settle()
    report, campaign = ex._report, ex._feed.state
    memory = _relations(campaign.core.ledger)
    replay = _relations(view_state(state).projection)
    left = pending_commands(state)
    said = []  # each command's outcome, as its acknowledgement says
    for cid in actor.commands:
        ack = read_ack(state, cid, remove=False) or {}
        said += [f"{ack.get('op')}: {w}" for w in (ack.get("work_ids") or {}).values()]
    with CampaignState.open(state, ranks=(1,)) as again:
        reopened = _relations(again.core.ledger)
    out = {
        "seed": seed,
        "finished": report is not None and report.finished,
        "acted": actor.acted,
        "outcomes": said,
        "replay_is_memory": replay == memory,
        "reopen_is_memory": reopened == memory or bool(left),
        "commands_left": left,
    }
    if replay != memory or reopened != memory:
        out["memory"], out["replay"], out["reopened"] = memory, replay, reopened
    print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    control.POLL_SECONDS = 0.0  # the master looks at control/ every turn
    for s in sys.argv[2:]:
        run(sys.argv[1], s)
