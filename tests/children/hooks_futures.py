"""Where the futures executor runs its futures' done-callbacks (tests/test_delivery_point.py).

An executor on ``MPI.COMM_SELF`` (its calls run in its manager thread, in the turn that sends them).
The first call waits for a gate, so the calls submitted meanwhile, and the done-callbacks added to
them, are all in place before anything resolves. The second call ("slow") waits for a gate too:
while it runs, the call that waits for it ("cancelled") is in the campaign, and an operator's cancel
of it (a command file, as ``durable-dispatch cancel`` writes it) is written; the turn that sent
"slow" reads it once "slow" returns, before "slow" can commit and release "cancelled". The call that
waits for the cancelled one fails with DependencyFailed. Prints one JSON line: each future's outcome
and each callback's call (its hook, whether ``CampaignState.deliver`` was on the stack, the library
frames that called it). ``argv``: the state directory."""

import json
import sys
import threading
import time

from mpi4py import MPI

from durable_dispatch.campaign import control
from durable_dispatch.campaign.control import write_command
from durable_dispatch.futures import MPICommExecutor
from tests.test_delivery_point import (
    _called_by_add_done_callback,
    _inside_deliver,
    _library_callers,
)

GATES = {"first": threading.Event(), "slow": threading.Event()}


def gated(name, x):
    GATES[name].wait(30)
    return x


def square(x):
    return x * x


def boom(x):
    raise KeyError(x)


def same(x):
    return x


def main(state):
    control.POLL_SECONDS = 0.0  # the master looks at control/ every turn
    calls = []

    def record(name):
        def callback(fut):
            caller = sys._getframe(1)
            if _called_by_add_done_callback(caller):
                return  # done before it was added: the standard library calls it at once
            calls.append(
                {
                    "hook": f"done-callback ({name})",
                    "inside": _inside_deliver(caller),
                    "where": _library_callers(caller),
                    "thread": threading.current_thread().name,
                }
            )

        return callback

    with MPICommExecutor(MPI.COMM_SELF, 0, state_dir=state) as ex:
        futs = {"first": ex.submit(gated, "first", 0)}
        _running(futs["first"])  # sent: the manager thread is in the call
        futs["slow"] = ex.submit(gated, "slow", 1)
        futs["cancelled"] = ex.submit(same, futs["slow"])  # waits for "slow"
        futs["dependent"] = ex.submit(same, futs["cancelled"])
        futs["square"] = ex.submit(square, 3)
        futs["boom"] = ex.submit(boom, 4)
        for name, f in futs.items():
            f.add_done_callback(record(name))
        GATES["first"].set()
        _running(futs["slow"])
        write_command(state, "cancel", {"work_ids": [futs["cancelled"].work_id]})
        GATES["slow"].set()
        outcomes = {}
        for name, f in futs.items():
            e = f.exception(timeout=60)
            outcomes[name] = type(e).__name__ if e is not None else f"value {f.result()}"
    print(json.dumps({"outcomes": outcomes, "calls": calls}), flush=True)


def _running(fut):
    end = time.monotonic() + 30
    while not fut.running():
        assert time.monotonic() < end, "the call never started"
        time.sleep(0.005)


if __name__ == "__main__":
    main(sys.argv[1])
