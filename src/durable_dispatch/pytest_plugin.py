"""pytest plugin (entry point ``pytest11``): ``inject_faults``, and cleanup of storage left open.

Installed with the package, so ``pip install durable-dispatch[test]`` users get it without
importing anything.

``inject_faults``: an installed :class:`~durable_dispatch.testing.FaultInjector`, removed after
the test::

    def test_my_master_survives_eio(inject_faults, tmp_path):
        inject_faults.fail("fsync", errno.EIO, path="*.jsonl")
        ...

**Storage left open.** A test that opens a :class:`~durable_dispatch.Journal`, a defer journal
or a :class:`~durable_dispatch.CampaignState` and never closes it (a slip, or a failure before
its ``close()``) would keep a descriptor and a flusher thread past the test. Under pyfakefs that
descriptor's number names a *real* descriptor once the fake filesystem is gone. So at every test's
teardown the plugin closes, newest first, each such object that the test opened and left open, and
reports it as a :class:`~durable_dispatch.testing.StorageLeftOpenWarning`. When the test uses one
of pyfakefs's fixtures (``fs``, ``fs_module``, ``fs_class``, ``fs_session``), this runs *before*
pyfakefs tears its filesystem down, whatever order the test names its fixtures in. Objects opened
by fixtures of a wider scope than the test are left alone. Objects that pyfakefs's ``Patcher``
(used directly, without a fixture) left behind abandon themselves instead: they never touch a
descriptor of a filesystem that is gone.

A journal left open while degraded (a disk fault the test injected) cannot write the records
it held only in memory when it is closed: the warning names them (``NotDurableError: ... held
only in memory (seq 1..3)``), and the test still passes; any other failure to close is raised.

Turn the cleanup off with ``-p no:durable_dispatch`` (that removes ``inject_faults`` too).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from .errors import StorageDegradedError
from .storage import resources
from .testing import FaultInjector, StorageLeftOpenWarning

#: pyfakefs's fixtures; the cleanup must run before theirs is torn down.
PYFAKEFS_FIXTURES = ("fs", "fs_module", "fs_class", "fs_session")


@pytest.fixture(name="inject_faults")
def inject_faults_fixture() -> Iterator[FaultInjector]:
    """An installed :class:`~durable_dispatch.testing.FaultInjector`, removed after the test."""
    with FaultInjector() as injector:
        yield injector


@pytest.fixture(autouse=True)
def _durable_dispatch_close_left_open(request: pytest.FixtureRequest) -> Iterator[None]:
    """Close (and warn of) the storage objects a test opened and did not close."""
    for name in PYFAKEFS_FIXTURES:
        if name in request.fixturenames:
            # Set up pyfakefs first, so that it is torn down after this fixture.
            request.getfixturevalue(name)
    stamp = resources.mark()
    resources.track(True)
    try:
        yield
        left = resources.open_since(stamp)
    finally:
        resources.track(False)
    errors: list[BaseException] = []
    for obj in left:
        if not resources.is_open(obj):
            continue  # closed by an object closed before it (a state closes its journals)
        said = f"{request.node.nodeid}: {obj!r} was left open; durable_dispatch's pytest plugin"
        try:
            obj.close()
        except StorageDegradedError as e:
            # What the test left behind, not a failure of the run: the records it held only
            # in memory (a disk fault the test set up) are named, and the run goes on.
            said += f" closed it and {type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - report every close failure, then go on
            errors.append(e)
            said += " could not close it"
        else:
            said += " closed it"
        warnings.warn(
            StorageLeftOpenWarning(said + " (call close() or use it as a context manager)"),
            stacklevel=1,
        )
    if errors:
        raise errors[0]
