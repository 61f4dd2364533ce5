"""storage/recovery.py: the plan for what opening does with what the scan found (pure), and the
side file that keeps every byte a plan drops."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from durable_dispatch.errors import JournalCorruptError, StorageError
from durable_dispatch.storage.format import Header
from durable_dispatch.storage.recovery import RECOVERY_MODES, Plan, plan_recovery, save_side
from durable_dispatch.storage.scan import Damage, ScanResult
from durable_dispatch.testing import inject_faults

HDR = Header("salt", 0)


def scan(
    *, header: bool = True, damage: int | None = None, tail_only: bool = True, after: int = 0
) -> ScanResult:
    res = ScanResult(
        header=HDR if header else None, size=1000, tail_only=tail_only, after_damage=after
    )
    if damage is not None:
        res.damage.append(Damage(damage, 10, "bad checksum"))
    return res


@pytest.mark.parametrize("mode", RECOVERY_MODES)
def test_nothing_to_recover_creates_or_keeps_in_every_mode(mode: str) -> None:
    assert plan_recovery(None, mode, "j") == Plan("create")
    assert plan_recovery(scan(), mode, "j") == Plan("keep")


@pytest.mark.parametrize(
    ("mode", "tail_only", "after", "expect"),
    [
        ("tolerate-torn-tail", True, 0, Plan("cut", 500)),
        ("tolerate-torn-tail", False, 3, None),  # a later record vouches for the damage
        ("absolute", True, 0, None),
        ("point-in-time", False, 3, Plan("cut", 500)),
        ("skip-corrupted", False, 3, Plan("salvage")),
        ("skip-corrupted", True, 0, Plan("cut", 500)),
    ],
)
def test_damage_is_cut_salvaged_or_refused_as_the_mode_says(
    mode: str, tail_only: bool, after: int, expect: Plan | None
) -> None:
    res = scan(damage=500, tail_only=tail_only, after=after)
    if expect is None:
        with pytest.raises(JournalCorruptError, match="offset 500") as e:
            plan_recovery(res, mode, "j")
        assert e.value.offset == 500
    else:
        assert plan_recovery(res, mode, "j") == expect


def test_a_torn_header_restarts_unless_a_record_vouches_or_the_mode_is_absolute() -> None:
    assert plan_recovery(scan(header=False, damage=0), "tolerate-torn-tail", "j") == Plan("restart")
    for res, mode in [
        (scan(header=False, damage=0, tail_only=False), "tolerate-torn-tail"),
        (scan(header=False, damage=0), "absolute"),
    ]:
        with pytest.raises(JournalCorruptError, match="header is damaged"):
            plan_recovery(res, mode, "j")


def test_save_side_copies_the_span_to_a_new_file_each_time(tmp_path: Path) -> None:
    j = tmp_path / "j"
    j.write_bytes(b"0123456789")
    first = save_side(str(j), 4, 10, 0o600)
    second = save_side(str(j), 4, 8, 0o600)
    assert Path(first).read_bytes() == b"456789" and Path(second).read_bytes() == b"4567"
    assert first != second and os.stat(first).st_mode & 0o777 == 0o600


def test_save_side_that_cannot_finish_leaves_nothing_and_says_so(tmp_path: Path) -> None:
    j = tmp_path / "j"
    j.write_bytes(b"0123456789")
    with inject_faults() as f:
        f.fail("fsync", path=f"{tmp_path}/j.damaged-*")
        with pytest.raises(StorageError, match="nothing was cut"):
            save_side(str(j), 4, 10, 0o600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j"]
