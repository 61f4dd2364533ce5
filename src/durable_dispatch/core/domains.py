"""Failure domains (pure, no I/O): a node is what dies on a cluster, so ranks are grouped by host.

A worker's host is known from its first READY (:meth:`FailureDomains.note_host`). When a rank
is lost, every other rank of its host becomes *suspect* (a state of the rank, kept by
:class:`~durable_dispatch.core.ranks.Ranks`): it gets no new work until it answers (any message
from it) or until :attr:`FailureDomains.window` seconds pass without its loss being reported,
so an item is not handed to the next rank of a node that is dying. When ranks are lost,
:meth:`FailureDomains.lost` says, for each, whether its *node* failed: its host lost
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
from typing import Any

from .ranks import Ranks

__all__ = ["FailureDomains", "SUSPECT_SECONDS"]

#: How long a host that lost a rank stays failing, and its other ranks suspect, unless they
#: answer first: longer than the runtime takes to report the other ranks of a dead node (Open
#: MPI's ULFM reports a node's ranks within a second or two of each other), short enough that a
#: rank of a healthy node that lost one rank to its item is idle only briefly.
SUSPECT_SECONDS = 10.0


class FailureDomains:
    """Hosts of the worker ranks and the hosts that are failing. Which ranks are suspect is a
    state of the ranks: it asks :class:`~durable_dispatch.core.ranks.Ranks`, and tells it which
    ranks a loss makes suspect (:meth:`lost`)."""

    __slots__ = ("window", "_ranks", "_host", "_on_host", "_node_failed_until")

    def __init__(self, ranks: Ranks[Any], window: float = SUSPECT_SECONDS) -> None:
        self.window = window
        self._ranks = ranks
        self._host: dict[int, str] = {}
        self._on_host: dict[str, set[int]] = {}
        self._node_failed_until = float("-inf")  # a node failed: losses until then are its

    def note_host(self, rank: int, host: str) -> None:
        """``rank`` runs on ``host``."""
        old = self._host.get(rank)
        if old == host:
            return
        if old is not None:
            self._on_host[old].discard(rank)
        self._host[rank] = host
        self._on_host.setdefault(host, set()).add(rank)

    def host(self, rank: int) -> str | None:
        """The host of ``rank``, or None while unknown."""
        return self._host.get(rank)

    def lost(self, ranks: Iterable[int], now: float) -> dict[int, bool]:
        """``ranks`` were lost together (one report of the runtime); the caller then moves them
        to LOST. Returns, for each lost rank, True when its node failed (not charged), or a node
        failed less than ``window`` seconds ago (the job may be torn down around it), and False
        when it died alone (charged). Makes the other live ranks of their hosts suspect until
        ``now + window`` (:meth:`Ranks.suspect <durable_dispatch.core.ranks.Ranks.suspect>`)."""
        ranks = sorted(set(ranks))
        per_host: dict[str, int] = {}
        for r in ranks:
            h = self._host.get(r)
            if h is not None:
                per_host[h] = per_host.get(h, 0) + 1
        out: dict[int, bool] = {}
        tearing_down = now < self._node_failed_until  # a node failed moments ago
        suspect = self._ranks.is_suspect
        for r in ranks:
            h = self._host.get(r)
            out[r] = tearing_down or (h is not None and (per_host[h] > 1 or suspect(r)))
        if any(out.values()):
            self._node_failed_until = max(self._node_failed_until, now + self.window)
        gone = set(ranks)
        self._ranks.suspect(
            [r for h in per_host for r in self._on_host[h] if r not in gone], now + self.window
        )
        return out

    def host_suspect(self, host: str) -> bool:
        """True while a rank of ``host`` is suspect (it lost a rank, and not all answered)."""
        suspect = self._ranks.is_suspect
        return any(suspect(r) for r in self._on_host.get(host, ()))
