"""Public fault-injection helpers: make chosen fs operations fail, on real files or under pyfakefs.

Every durable write of this library goes through one module (the fs seam,
``durable_dispatch.storage.fs``). These helpers install a hook there that raises ``OSError`` with a
chosen errno for chosen operations, paths and call numbers, until healed. Because the hook sits in
front of the real call, it works the same on real files and under pyfakefs's ``fs`` fixture.

Example::

    import errno
    from durable_dispatch import Journal
    from durable_dispatch.testing import inject_faults

    with inject_faults() as faults:
        j = Journal.open(tmp_path / "events.jsonl", sync="always")
        faults.fail("fsync", errno.EIO, path="*.jsonl", nth=1)   # only the next fsync fails
        r = j.append({"event": "x"})
        assert not r.durable and not j.health.ok
        faults.heal()
        assert j.try_restore()

With the pytest plugin (installed with the package) the fixture ``inject_faults`` gives an
installed :class:`FaultInjector` that is removed after the test.

:func:`run_lying_worker` is a worker built on the public worker loop that lies to the master on
purpose, for tests of the master's rules (a hang, a late answer, a malformed RESULT ...).

:class:`LocalWorkers` runs a campaign's work function in-process, as the workers would, so
``run_master`` runs without ``mpiexec``: a user's test of a campaign, and the loop's own test of
its turn order.

Operations: ``open`` (file creation and opening for write, directory creation), ``write``,
``fsync``, ``dir-fsync``, ``replace``, ``close``, ``truncate``, ``unlink``, ``read``.
"""

from . import faults, workers
from .faults import *  # noqa: F403 - the package's names are its two modules' public names
from .workers import *  # noqa: F403

__all__ = faults.__all__ + workers.__all__
