"""pytest plugin (entry point ``pytest11``): provides the ``inject_faults`` fixture.

Installed with the package, so ``pip install durable-dispatch[test]`` users get the fixture
without importing anything::

    def test_my_master_survives_eio(inject_faults, tmp_path):
        inject_faults.fail("fsync", errno.EIO, path="*.jsonl")
        ...
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .testing import FaultInjector


@pytest.fixture(name="inject_faults")
def inject_faults_fixture() -> Iterator[FaultInjector]:
    """An installed :class:`~durable_dispatch.testing.FaultInjector`, removed after the test."""
    with FaultInjector() as injector:
        yield injector
