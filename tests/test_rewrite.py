"""storage/rewrite.py: a file replaced whole is the old or the new one at every instant (S6)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_dispatch.storage import fs
from durable_dispatch.storage.rewrite import replace_file
from durable_dispatch.testing import inject_faults


def test_the_new_file_replaces_the_old_whole_and_its_descriptors_can_be_kept(
    tmp_path: Path,
) -> None:
    target = tmp_path / "t"
    target.write_bytes(b"old")
    done = replace_file(str(target), str(tmp_path / "t.tmp"), [b"ne", b"w"], 0o640)
    assert target.read_bytes() == b"new" and done == (None, None, 3)
    assert os.stat(target).st_mode & 0o777 == 0o640 and not (tmp_path / "t.tmp").exists()
    kept = replace_file(str(target), str(tmp_path / "u.tmp"), [b"x"], keep_open=True, lock=True)
    try:
        assert kept.fd is not None and kept.inode_lock is not None
        assert os.fstat(kept.fd).st_ino == os.stat(target).st_ino
    finally:
        fs.close(kept.fd)
        fs.close(kept.inode_lock)


@pytest.mark.parametrize("op", ["write", "fsync", "replace"])
def test_a_failure_before_the_rename_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, op: str
) -> None:
    target = tmp_path / "t"
    target.write_bytes(b"old")
    with inject_faults() as f:
        f.fail(op, path=f"{tmp_path}/*")
        with pytest.raises(OSError):
            replace_file(str(target), str(tmp_path / "t.tmp"), [b"new"])
    assert target.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["t"]


def test_before_rename_runs_once_the_new_file_is_whole_and_a_failure_there_changes_nothing(
    tmp_path: Path,
) -> None:
    """Issue 49: a snapshot waits there for the journal fsync its content depends on, which
    runs while the file is written. The hook sees the new file whole beside the old target;
    if it raises, the target keeps the old file and the temporary one is gone."""
    target, tmp = tmp_path / "t", tmp_path / "t.tmp"
    target.write_bytes(b"old")
    seen: list[tuple[bytes, bytes]] = []
    replace_file(
        str(target),
        str(tmp),
        [b"ne", b"w"],
        before_rename=lambda: seen.append((tmp.read_bytes(), target.read_bytes())),
    )
    assert seen == [(b"new", b"old")] and target.read_bytes() == b"new"

    def refuse() -> None:
        raise RuntimeError("the journal could not be made durable")

    with pytest.raises(RuntimeError, match="durable"):
        replace_file(str(target), str(tmp), [b"newer"], before_rename=refuse)
    assert target.read_bytes() == b"new" and sorted(os.listdir(tmp_path)) == ["t"]
