"""Failure domains (pure, no I/O): a node is what dies on a cluster, so ranks are grouped by host.

A worker's host is known from its first READY (:meth:`FailureDomains.note_host`). When a rank
is lost, every other rank of its host becomes *suspect*: it gets no new work until it answers
(any message from it) or until :attr:`FailureDomains.window` seconds pass without its loss being
reported, so an item is not handed to the next rank of a node that is dying. When ranks are
lost, :meth:`FailureDomains.lost` says, for each, whether its *node* failed: its host lost
several ranks at once (in one report of the runtime), or it was suspect (its host had lost a
rank, and it had not answered since). An item in flight on a failed node is requeued without
charge (its rank did not die of it); a rank that died alone charges its item ``lost-rank``: an
item that kills its own rank must not kill every rank at every retry, and a rank that answered
after its neighbour's loss and then died with the item it got next died of that item.

A node's death can end the whole job: Open MPI's runtime (PRRTE 3) tears a job down when it
loses a node's daemon, and the ranks of the surviving nodes then die one by one. So for
:attr:`FailureDomains.window` seconds after a node failed, every rank lost, on any host, counts
as lost with it: nothing is charged for a job that is being torn down.

Ranks of unknown host (no READY with ``host`` yet) are each a domain of their own.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["FailureDomains", "SUSPECT_SECONDS"]

#: How long a host that lost a rank stays failing, and its other ranks suspect, unless they
#: answer first: longer than the runtime takes to report the other ranks of a dead node (Open
#: MPI's ULFM reports a node's ranks within a second or two of each other), short enough that a
#: rank of a healthy node that lost one rank to its item is idle only briefly.
SUSPECT_SECONDS = 10.0


class FailureDomains:
    """Hosts of the worker ranks, the hosts that are failing, and the suspect ranks."""

    __slots__ = ("window", "_host", "_ranks", "_suspect", "suspect", "_node_failed_until")

    def __init__(self, window: float = SUSPECT_SECONDS) -> None:
        self.window = window
        self._host: dict[int, str] = {}
        self._ranks: dict[str, set[int]] = {}
        self._suspect: dict[int, float] = {}  # rank -> until when it gets no work (unless heard)
        #: the same dict, read by the dispatcher's hot paths (a truth test, no call): do not
        #: change it
        self.suspect = self._suspect
        self._node_failed_until = float("-inf")  # a node failed: losses until then are its

    def note_host(self, rank: int, host: str) -> None:
        """``rank`` runs on ``host``."""
        old = self._host.get(rank)
        if old == host:
            return
        if old is not None:
            self._ranks[old].discard(rank)
        self._host[rank] = host
        self._ranks.setdefault(host, set()).add(rank)

    def host(self, rank: int) -> str | None:
        """The host of ``rank``, or None while unknown."""
        return self._host.get(rank)

    def lost(self, ranks: Iterable[int], now: float, live: Iterable[int]) -> dict[int, bool]:
        """``ranks`` were lost together (one report of the runtime); ``live`` are the ranks not
        lost. Returns, for each lost rank, True when its node failed (not charged), or a node
        failed less than ``window`` seconds ago (the job may be torn down around it), and False
        when it died alone (charged). Makes the other live ranks of their hosts suspect
        (:meth:`suspects`) until ``now + window``."""
        ranks = sorted(set(ranks))
        per_host: dict[str, int] = {}
        for r in ranks:
            h = self._host.get(r)
            if h is not None:
                per_host[h] = per_host.get(h, 0) + 1
        out: dict[int, bool] = {}
        tearing_down = now < self._node_failed_until  # a node failed moments ago
        for r in ranks:
            h = self._host.get(r)
            out[r] = tearing_down or (h is not None and (per_host[h] > 1 or r in self._suspect))
        if any(out.values()):
            self._node_failed_until = max(self._node_failed_until, now + self.window)
        live_set = set(live)
        until = now + self.window
        for h in per_host:
            for r in self._ranks.get(h, ()):
                if r in live_set:
                    self._suspect[r] = until
        for r in ranks:
            self._suspect.pop(r, None)
        return out

    @property
    def any_suspect(self) -> bool:
        """True while some rank is suspect (O(1): checked on every message)."""
        return bool(self._suspect)

    def expire_due(self, now: float) -> bool:
        """True when :meth:`expire` has something to do (O(1) when no rank is suspect)."""
        return bool(self._suspect) and min(self._suspect.values()) <= now

    def host_suspect(self, host: str) -> bool:
        """True while a rank of ``host`` is suspect (it lost a rank, and not all answered)."""
        return any(r in self._suspect for r in self._ranks.get(host, ()))

    def suspects(self) -> list[int]:
        """The suspect ranks, sorted."""
        return sorted(self._suspect)

    def is_suspect(self, rank: int) -> bool:
        """True while ``rank`` gets no new work."""
        return rank in self._suspect

    def heard(self, rank: int) -> bool:
        """A message came from ``rank``: it is alive, no longer suspect. True if it was."""
        return self._suspect.pop(rank, None) is not None

    def expire(self, now: float) -> list[int]:
        """The suspect ranks whose window passed (no loss of theirs was reported): no longer
        suspect. Returns them, sorted. O(1) when none is suspect."""
        if not self._suspect:
            return []
        done = sorted(r for r, until in self._suspect.items() if until <= now)
        for r in done:
            del self._suspect[r]
        return done
