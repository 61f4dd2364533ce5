"""What each campaign's durable journal says happened: the attempts of each item, and the
measures of a campaign (recovery, false suspicions, duplicate and hung CPU ...), pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Attempt:
    """One dispatch of one item, as the journal tells it."""

    work_id: str
    index: int  # 0 for the item's first dispatch
    start: float
    end: float | None = None
    outcome: str = "open"  # committed | requeued | deferred | open (in flight at the end)
    kind: str | None = None  # the failure kind of a requeue or deferral


def attempts_of(records: Iterable[Mapping[str, Any]]) -> dict[str, list[Attempt]]:
    """Each work ID's attempts, in order, from a state journal's records (one item per dispatch;
    the experiments run with ``batch=1``).

    Raises:
        ValueError: a multi-item dispatch, or an outcome for a token never dispatched.
    """
    by_token: dict[str, Attempt] = {}
    out: dict[str, list[Attempt]] = {}
    for r in records:
        ev = r.get("event")
        if ev not in ("dispatched", "committed", "requeued", "deferred"):
            continue
        if "work_ids" in r:
            raise ValueError("the experiments' accounting counts one item per dispatch")
        wid, tok = r["work_id"], r.get("token")
        if ev == "dispatched":
            a = Attempt(wid, len(out.get(wid, [])), float(r["ts"]))
            out.setdefault(wid, []).append(a)
            by_token[tok] = a
            continue
        a = by_token.pop(tok, None) if tok is not None else None
        if a is None:
            if ev == "deferred" and tok is None:
                continue  # an operator's or a restart's deferral: no attempt ends here
            raise ValueError(f"{ev} for token {tok!r}, which was never dispatched")
        a.end, a.outcome = float(r["ts"]), ev
        if ev == "requeued":
            a.kind = r.get("kind")
        elif ev == "deferred":
            kinds = r.get("kinds") or [None]
            a.kind = kinds[-1]
    return out


def account(
    attempts: Mapping[str, list[Attempt]],
    hangs: Mapping[str, Sequence[int]],
    end: float,
) -> dict[str, Any]:
    """Group 1's measures of one campaign.

    Args:
        attempts: from :func:`attempts_of`.
        hangs: work ID -> the attempt indices that hang (the plan); every other attempt would
            have finished.
        end: when the campaign ended (an attempt still open ran until then).
    """
    hung_ids, recovered = set(), 0
    false_suspicions = good_deferred = 0
    duplicate = hung = 0.0
    committed = deferred = 0
    for wid, tries in attempts.items():
        planned = set(hangs.get(wid, ()))
        ever_hung = False
        for a in tries:
            ran = (a.end if a.end is not None else end) - a.start
            if a.index in planned:
                ever_hung = True
                hung += ran
                continue
            if a.outcome != "committed":
                duplicate += ran
                if a.kind == "timeout":
                    false_suspicions += 1
        final = tries[-1].outcome
        committed += final == "committed"
        deferred += final == "deferred"
        if ever_hung:
            hung_ids.add(wid)
            recovered += final in ("committed", "deferred")
        elif final == "deferred":
            good_deferred += 1
    return {
        "hung_items": len(hung_ids),
        "recovery": recovered / len(hung_ids) if hung_ids else None,
        "false_suspicions": false_suspicions,
        "duplicate_cpu": duplicate,
        "hung_cpu": hung,
        "committed": committed,
        "deferred": deferred,
        "good_deferred": good_deferred,
    }
