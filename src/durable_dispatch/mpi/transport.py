"""How the master loop talks to its workers: the :class:`Transport` it needs, and the MPI one.

The master loop (``run_master``) never calls MPI itself: it drains messages, sends WORK, asks for
failed ranks and stops the workers through a transport. :class:`MpiTransport` is the real one
(mpi4py, ``ANY_SOURCE``/``ANY_TAG``, non-blocking); ``durable_dispatch.testing.LocalWorkers`` runs
the workers' function in-process, so a campaign, and the order of the loop's steps in a turn,
can be tested without ``mpiexec``. Pass either as ``run_master(..., comm=...)``; an mpi4py
communicator is wrapped in an :class:`MpiTransport`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

__all__ = ["Transport", "MpiTransport", "Message", "ulfm_mode"]

log = logging.getLogger("durable_dispatch.mpi")

#: :meth:`MpiTransport.post` sends a message of at most this many bytes with a blocking ``Send``
#: (far below any MPI library's eager limit: it returns once the message is copied)
SMALL_SEND = 1024

#: ``(source rank, tag, body bytes)``
Message = tuple[int, int, bytes | bytearray]


def ulfm_mode(comm: Any) -> bool:
    """True when the runtime provides ULFM failure notification for this job."""
    enabled = os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes")
    return enabled and hasattr(comm, "Get_failed") and hasattr(comm, "Ack_failed")


@runtime_checkable
class Transport(Protocol):
    """What the master loop needs from its communicator.

    A transport may also send without waiting (as :class:`MpiTransport` does): it then has
    ``post(rank, tag, data, key) -> str | None``, which starts the send and returns at once
    (None, or why it could not start), and ``unsent() -> list[tuple[key, str]]``, the sends
    started since that failed since the last call, each with why; the master loop then uses
    those two for WORK and reports each failure as the failed send of that key's dispatch; its
    ``posted`` attribute counts the sends started that ``unsent`` has not seen end (the loop
    calls ``unsent`` only while it is not 0).

    Attributes:
        size: the number of ranks, the master (rank 0) included.
        ulfm: True when the runtime reports failed ranks (:meth:`failed_ranks`).
    """

    size: int
    ulfm: bool

    def receive(self, limit: int) -> list[Message]:
        """Every message that has arrived, up to ``limit``, in arrival order; never blocks.
        Messages of one source keep the order it sent them in."""
        ...

    def send(self, rank: int, tag: int, data: bytes) -> str | None:
        """Send ``data`` to ``rank``; returns None once the send returned, or why it failed."""
        ...

    def failed_ranks(self) -> list[int]:
        """Ranks the runtime reported failed since the last call (always [] without ULFM)."""
        ...

    def stop(self, ranks: Iterable[int], data: bytes, tag: int, timeout: float) -> bool:
        """Send ``data`` to each of ``ranks`` without waiting on any one for long; False when
        some send did not complete within ``timeout``."""
        ...

    def abort(self, code: int) -> None:
        """End the whole job now (``MPI_Abort``)."""
        ...


class MpiTransport:
    """:class:`Transport` over an mpi4py communicator (``MPI.COMM_WORLD`` by default).

    Errors are returned, not raised (``MPI.ERRORS_RETURN``), so that a dead rank under ULFM is
    a failed send the loop handles, not an exception that ends rank 0.
    """

    def __init__(self, comm: Any = None) -> None:
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.size: int = self.comm.Get_size()
        self.ulfm: bool = ulfm_mode(self.comm)
        self._status = MPI.Status()
        #: the sends :meth:`post` started and no test has seen end: (request, data, key, rank)
        self._posted: list[tuple[Any, bytes, Any, int]] = []
        #: how many sends :meth:`post` started that no call of :meth:`unsent` has seen end (0:
        #: nothing to test, the usual state of a turn at batch 1)
        self.posted = 0

    def receive(self, limit: int) -> list[Message]:
        """See :meth:`Transport.receive`. Under ULFM a failed receive is logged (the failed
        rank shows in :meth:`failed_ranks`); without it, it is raised."""
        MPI, comm, status = self.MPI, self.comm, self._status
        msgs: list[Message] = []
        try:
            while len(msgs) < limit and comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
                src, tag = status.Get_source(), status.Get_tag()
                buf = bytearray(status.Get_count(MPI.BYTE))
                comm.Recv([buf, MPI.BYTE], source=src, tag=tag)
                msgs.append((src, tag, buf))
        except MPI.Exception as e:
            if not self.ulfm:
                raise
            log.warning("master: receive reported %s", e)
        return msgs

    def send(self, rank: int, tag: int, data: bytes) -> str | None:
        """See :meth:`Transport.send`."""
        try:
            self.comm.Send([data, self.MPI.BYTE], dest=rank, tag=tag)
        except self.MPI.Exception as e:
            return str(e)
        return None

    def post(self, rank: int, tag: int, data: bytes, key: Any) -> str | None:
        """Start sending ``data`` to ``rank`` (``Isend``) and return at once: None, or why the
        send could not start. ``data`` is kept until the send ends; a send that fails later is
        reported by :meth:`unsent` with ``key``. A WORK larger than the MPI library's eager
        limit (a few KB) otherwise waits in a blocking ``Send`` until its worker is scheduled
        and posts its receive, and the master's core spins meanwhile. A message of at most
        :data:`SMALL_SEND` bytes (a one-item WORK) is sent at once with a blocking ``Send``: it
        is sent eagerly by every MPI library, so that returns at once, with nothing to test
        later."""
        if len(data) <= SMALL_SEND:
            return self.send(rank, tag, data)
        try:
            req = self.comm.Isend([data, self.MPI.BYTE], dest=rank, tag=tag)
        except self.MPI.Exception as e:
            return str(e)
        self._posted.append((req, data, key, rank))
        self.posted = len(self._posted)
        return None

    def unsent(self) -> list[tuple[Any, str]]:
        """The sends :meth:`post` started that failed, each ``(key, why)``, since the last call;
        the ones that ended are forgotten (all are tested in one call: the posted ones not yet
        ended are the dispatches of the last turns, not one per rank)."""
        posted = self._posted
        if not posted:
            return []
        MPI = self.MPI
        try:  # one call for them all (each test of MPI's progress engine has a price)
            done = MPI.Request.Testsome([e[0] for e in posted])
        except MPI.Exception:
            pass  # one failed: each is tested below, to name it
        else:
            if done is None or len(done) == len(posted):
                self._posted = []
            elif done:
                ended = set(done)
                self._posted = [e for k, e in enumerate(posted) if k not in ended]
            self.posted = len(self._posted)
            return []
        failed: list[tuple[Any, str]] = []
        left = []
        for entry in posted:
            try:
                if not entry[0].Test():
                    left.append(entry)
            except MPI.Exception as e:
                failed.append((entry[2], str(e)))
        self._posted = left
        self.posted = len(left)
        return failed

    def failed_ranks(self) -> list[int]:
        """See :meth:`Transport.failed_ranks`: ``Comm.Get_failed``, then ``Ack_failed``."""
        if not self.ulfm:
            return []
        MPI, comm = self.MPI, self.comm
        try:
            group = comm.Get_failed()
        except MPI.Exception as e:
            log.warning("master: failure query failed: %s", e)
            return []
        n = group.Get_size()
        if n == 0:
            group.Free()
            return []
        ranks = MPI.Group.Translate_ranks(group, list(range(n)), comm.Get_group())
        group.Free()
        comm.Ack_failed()
        return [r for r in ranks if r is not None and r >= 0]

    def stop(self, ranks: Iterable[int], data: bytes, tag: int, timeout: float) -> bool:
        """See :meth:`Transport.stop`: one ``Isend`` each, tested until ``timeout`` with the
        sends :meth:`post` started to those ranks that have not ended (a worker reads its WORK
        before its STOP), then the ones not done are cancelled (at once: those to other ranks)."""
        MPI = self.MPI
        ranks = list(ranks)
        to = set(ranks)
        reqs = [e[0] for e in self._posted if e[3] in to]
        self._cancel([e[0] for e in self._posted if e[3] not in to])
        self._posted = []
        self.posted = 0
        failed = False
        for r in ranks:
            try:
                reqs.append(self.comm.Isend([data, MPI.BYTE], dest=r, tag=tag))
            except MPI.Exception as e:
                log.warning("master: STOP to rank %d failed: %s", r, e)
                failed = True
        end = time.monotonic() + timeout
        while reqs and time.monotonic() < end:
            try:
                reqs = [q for q in reqs if not q.Test()]
            except MPI.Exception:
                break
            time.sleep(0.001)
        self._cancel(reqs)
        return not reqs and not failed

    def _cancel(self, reqs: list[Any]) -> None:
        for q in reqs:
            try:
                q.Cancel()
            except self.MPI.Exception:
                pass

    def abort(self, code: int) -> None:
        """``MPI_Abort`` of the whole job."""
        self.comm.Abort(code)
