"""Why a campaign cannot go on although work remains: no worker left, or every live worker
parked for longer than a grace. A part of the campaign's facade
(:meth:`CampaignState.stop_reason <durable_dispatch.campaign.state.CampaignState.stop_reason>`);
it asks the core only questions that cost O(1), since the master asks every turn.
"""

from __future__ import annotations

import logging

from ..core import Dispatcher

__all__ = ["Stuck"]

log = logging.getLogger("durable_dispatch.state")


class Stuck:
    """When every live worker became parked (see the module docs)."""

    def __init__(self, core: Dispatcher) -> None:
        self.core = core
        self._since: float | None = None  # since when every live worker is parked

    def reason(self, now: float, grace: float) -> str | None:
        """``"no workers left"``, ``"every worker parked"`` (for ``grace`` seconds of ``now``),
        or None; logs the reason."""
        core = self.core  # (every question O(1): this runs every turn, at 10,000 ranks too)
        live = core.live_rank_count()
        if not live:
            log.error("master: no worker left; %d item(s) pending", len(core.pending()))
            return "no workers left"
        parked = core.parked_rank_count()
        if core.done or not parked or parked + core.starting_ranks() < live:
            self._since = None  # some worker serves, or may still come up
            return None
        if self._since is None:
            self._since = now
        if now - self._since < grace:
            return None
        log.error(
            "master: every worker (%d) is parked and %d item(s) remain; no exact READY came "
            "within %.0fs: stopping (resumable; hung work functions need worker isolation to "
            "give their ranks back)",
            live,
            len(core.pending()),
            grace,
        )
        return "every worker parked"
