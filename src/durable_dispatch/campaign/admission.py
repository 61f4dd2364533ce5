"""What a submission must pass before anything is added, and its announcement.

A work item is checked before the campaign takes it: a :class:`~durable_dispatch.core.WorkItem`
with a string work ID and an integer priority, an ``after`` of work IDs, a payload JSON holds
exactly as given (NaN and numpy scalars in their stored form, :mod:`durable_dispatch.values`), and
a known work ID only with the payload and ``after`` it named before. Then the payloads go to the
submissions store (:mod:`.submissions`), durably before the state journal's ``submitted`` records
name them, and the core takes the items.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from operator import attrgetter

from ..core import Dispatcher, WorkItem
from ..core.events import Submitted, encode
from ..core.indexed import DIGEST_BYTES, payload_digests
from ..errors import ChangedPayloadError, RecordEncodeError, RecordTooLargeError, UsageError
from ..storage import Journal
from ..values import Refused, all_plain, stored
from .dependencies import DependencyResults
from .statedir import SUBMIT_CHUNK
from .submissions import SubmissionStore

__all__ = ["Admission"]


class Admission:
    """Checks and adds submitted work items (see the module docs); a part of the campaign's
    facade."""

    def __init__(
        self,
        journal: Journal,
        store: SubmissionStore,
        core: Dispatcher,
        dependencies: DependencyResults,
    ) -> None:
        self._journal = journal
        self.store = store
        self.core = core
        self._dependencies = dependencies  # (told when an item names ``after``)

    def submit(self, items: Iterable[WorkItem]) -> list[WorkItem]:
        """Add the work items not already known; returns the new ones (see
        :meth:`CampaignState.submit <durable_dispatch.campaign.state.CampaignState.submit>`)."""
        new: list[WorkItem] = []
        again: list[WorkItem] = []  # known work IDs, and work IDs twice in this call
        seen: set[str] = set()
        known = self.core.ledger.ids.index
        for i in items:
            if not isinstance(i, WorkItem) or type(i.work_id) is not str:
                raise UsageError(f"expected a WorkItem with a str work_id, got {i!r}")
            if type(i.priority) is not int:
                raise UsageError(f"{i.work_id!r}: priority must be an int, got {i.priority!r}")
            if i.after:
                i = _checked_after(i)
                self._dependencies.has_after = True
            wid = i.work_id
            if wid not in known and wid not in seen:
                new.append(i)
                seen.add(wid)
            else:
                again.append(i)
        new, again = _exact(new), _exact(again)  # U15: before anything is added
        digests = _digests(new)
        if again:
            self._refuse_changed(again, new, digests)  # U11: before anything is added
        if not new:
            return new
        first = self.store.stored
        try:
            self.store.store(new, first, digests)
        except RecordTooLargeError:
            done = self.store.stored - first
            if done:
                self._announce(new[:done], first, digests[: done * DIGEST_BYTES])
            raise
        self._announce(new, first, digests)
        return new

    def _refuse_changed(self, again: list[WorkItem], new: list[WorkItem], digests: bytes) -> None:
        """U11: each of ``again`` (a known work ID, or one named earlier in the same call) must
        name the payload and the ``after`` it named before (the ``after`` of a committed item
        is not kept: it ran, what it waited for is moot); the first that does not is refused.

        Raises:
            ChangedPayloadError: naming that work ID.
        """
        led = self.core.ledger
        ids, n = led.ids, DIGEST_BYTES
        mine: dict[str, bytes] | None = None  # this call's new items' digests, when needed
        theirs = _digests(again)
        for j, item in enumerate(again):
            wid = item.work_id
            if wid in ids.index:
                was = ids.digest_of(wid)
                if was is None and wid in led.items:  # a state written before digests
                    was = _digests([led.items[wid]])
            else:
                if mine is None:
                    mine = {w.work_id: digests[k * n : k * n + n] for k, w in enumerate(new)}
                was = mine[wid]
            if was is not None and was != (now := theirs[j * n : j * n + n]):
                raise ChangedPayloadError(
                    f"work ID {wid!r} is known ({self._where(wid)}) "
                    f"with another payload (digest {was.hex()}, this one {now.hex()}): a work ID "
                    "names one payload; give the changed item a new work ID (one that digests "
                    "its payload, say) or start a new state directory",
                    work_id=wid,
                )
            if wid in ids.index:
                before = led.items.after_of(wid) if wid in led.items else None
            else:
                before = next(w.after for w in new if w.work_id == wid)
            if before is not None and set(before) != set(item.after):
                raise ChangedPayloadError(
                    f"work ID {wid!r} is known ({self._where(wid)}) with another after "
                    f"({sorted(before)}, this one {sorted(item.after)}): a work ID names one "
                    "item, its dependencies included; give the changed item a new work ID or "
                    "start a new state directory",
                    work_id=wid,
                )

    def _where(self, wid: str) -> str:
        """Where a known work ID is, in words (``pending``, ``committed`` ...), or that it was
        named earlier in the same submission."""
        st = self.core.status(wid) if wid in self.core.ledger.ids.index else None
        return st.name.lower().replace("_", " ") if st else "earlier in this submission"

    def _announce(self, items: list[WorkItem], first: int, digests: bytes) -> None:
        """Journal the submission of the stored ``items`` and hand them to the core (with
        their payload ``digests``). The records name the items by index once the store is
        durable; if the store cannot be made durable (a disk fault), they carry the items
        themselves."""
        stored = self.store.durable()
        for k in range(0, len(items), SUBMIT_CHUNK):
            chunk = tuple(items[k : k + SUBMIT_CHUNK])
            self._journal.append(encode(Submitted(chunk, first + k, stored=stored)))
        self.core.ledger.ids.set_digests(first, digests)  # (so the core computes none)
        self.core.submit(items, first=first, checked=True)


_payload_of = attrgetter("payload")


def _digests(items: list[WorkItem]) -> bytes:
    """The payload digests of ``items`` (:func:`payload_digests`).

    Raises:
        RecordEncodeError: a payload is not JSON (naming its work ID); nothing was added.
    """
    try:
        return payload_digests(map(_payload_of, items))
    except TypeError:
        for w in items:
            try:
                payload_digests((w.payload,))
            except TypeError as e:
                raise RecordEncodeError(
                    f"work item {w.work_id!r}: its payload cannot be encoded as JSON: {e}"
                ) from None
        raise


def _exact(items: list[WorkItem]) -> list[WorkItem]:
    """``items`` with each payload in its stored form (:mod:`durable_dispatch.values`): the same
    list when every payload is plain JSON (one C-level pass), else a list where the items whose
    payload needed a stored form (NaN, a numpy scalar) are copies holding it.

    Raises:
        RecordEncodeError: a payload cannot be stored as given, naming the work ID, the path
            inside the payload and the value.
    """
    if not items or all_plain([w.payload for w in items]):
        return items
    out = []
    for w in items:
        try:
            p = stored(w.payload)
        except Refused as e:
            raise RecordEncodeError(
                f"work item {w.work_id!r}: its payload {e} (nothing of this submission was added)",
                work_id=w.work_id,
                path=e.path,
            ) from None
        out.append(w if p is w.payload else replace(w, payload=p))
    return out


def _checked_after(item: WorkItem) -> WorkItem:
    """``item`` with its ``after`` as a tuple of work IDs (a list is taken as given).

    Raises:
        UsageError: ``after`` is a string (a common slip for ``[id]``) or names a non-string.
    """
    after = item.after
    if isinstance(after, str) or not all(type(a) is str for a in after):
        raise UsageError(
            f"{item.work_id!r}: after must be a list or tuple of work IDs (strings), got {after!r}"
        )
    return item if type(after) is tuple else replace(item, after=tuple(after))
