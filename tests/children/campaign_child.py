"""A master-side campaign over a fake transport, for the SIGKILL crash tests (test_state.py).

Usage: python campaign_child.py STATE_DIR N_ITEMS [WORK_SECONDS]
WORK_SECONDS (default 0.002) is slept per commit, standing in for the user's work.
Prints ``ack <work_id>`` (flushed) after each commit is durable, and ``done`` at the end.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from durable_dispatch import CampaignState  # noqa: E402
from durable_dispatch.core import WatchdogConfig, WorkItem  # noqa: E402
from tests.helpers import fake_campaign  # noqa: E402


def main() -> None:
    state_dir, n = sys.argv[1], int(sys.argv[2])
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.002
    out = sys.stdout
    with CampaignState.open(
        state_dir, sync="batch", ranks=(1, 2, 3, 4), watchdog=WatchdogConfig(30)
    ) as s:
        s.submit(WorkItem(f"w{i:04d}", {"i": i}) for i in range(n))

        def ack(c: object) -> None:
            out.write(f"ack {c.work_id}\n")  # type: ignore[attr-defined]
            out.flush()
            time.sleep(pause)

        fake_campaign(s, on_commit=ack)
    out.write("done\n")
    out.flush()


if __name__ == "__main__":
    main()
