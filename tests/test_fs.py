"""The fs seam (durable_dispatch.storage.fs) is the only caller of the durable-write primitives."""

from __future__ import annotations

import ast
from pathlib import Path

import durable_dispatch

PRIMITIVES = {"write", "fsync", "fdatasync", "replace", "rename", "ftruncate"}
#: Writes that are not storage, each with why: they never touch a file of a state directory.
NOT_STORAGE = {
    "mpi/usage.py os.write": "of '5' to /proc/self/clear_refs: resets the process's peak size",
}


def test_only_the_seam_writes_syncs_or_renames() -> None:
    root = Path(durable_dispatch.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path == root / "storage" / "fs.py":
            continue
        if path.parent == root / "testing" and "sharedfs" in path.name:
            continue  # a test mount's FUSE server and its control file: not our storage

        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in PRIMITIVES
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                if f"{path.relative_to(root)} os.{node.attr}" not in NOT_STORAGE:
                    offenders.append(f"{path.relative_to(root)}:{node.lineno} os.{node.attr}")
    assert not offenders, offenders


def test_the_real_filesystem_is_recognised_while_pyfakefs_patches() -> None:
    """pyfakefs rebinds every module-level name bound to ``os``: the seam's notion of the real
    filesystem must not be one of them, or a journal on real files would look fake."""
    from pyfakefs.fake_filesystem_unittest import Patcher

    from durable_dispatch.storage import fs

    assert fs.filesystem() is fs.REAL_FILESYSTEM
    with Patcher():
        fake = fs.filesystem()
        assert fake is not fs.REAL_FILESYSTEM
        assert not fs.reaches(fs.REAL_FILESYSTEM) and fs.comes_back(fs.REAL_FILESYSTEM)
        assert fs.reaches(fake)
    assert fs.reaches(fs.REAL_FILESYSTEM) and not fs.comes_back(fake)


def test_a_batch_journal_outlives_pyfakefs_pausing_its_patcher() -> None:
    """pyfakefs pauses patching while pytest writes a report. A flusher that woke then must wait,
    not abandon the journal (which made the next wait_durable spin forever)."""
    import time

    from pyfakefs.fake_filesystem_unittest import Patcher, Pause

    from durable_dispatch import Journal

    with Patcher() as patcher:
        j = Journal.open("/j.jsonl", sync="batch", batch_max_delay=0.001)
        with Pause(patcher):
            j.append({"a": 1})  # queued; the flusher wakes during the pause
            time.sleep(0.2)
        j.wait_durable(0, timeout=30)
        j.close()
        with Journal.open("/j.jsonl") as again:
            assert [r.payload for r in again.records()] == [{"a": 1}]
