"""examine.py: what verify and inspect print, as values, read-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_dispatch import Journal
from durable_dispatch.errors import UsageError
from durable_dispatch.views.examine import examine, kind_of


class _Meter:
    def __init__(self) -> None:
        self.calls: list[int] = []
        self.ended = False

    def __call__(self, done: int, total: int | None = None) -> None:
        self.calls.append(done)

    def done(self) -> None:
        self.ended = True


def test_a_journal_is_examined_read_only_with_its_damage_as_values(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal.open(path, sync="always") as j:
        for i in range(3):
            j.append({"event": "x", "i": i})
    with open(path, "ab") as f:
        f.write(b'{"v":1,"crc":')  # a torn tail
    before = path.read_bytes()
    meters: list[_Meter] = []

    def progress(name: str, size: int) -> _Meter:
        assert name == "j.jsonl" and size == len(before)
        meters.append(_Meter())
        return meters[-1]

    out = examine(str(path), count_kinds=True, progress=progress)
    assert out["records"] == 3 and out["kinds"] == {"x": 3} and out["torn_tail"]
    assert not out["intact"] and out["damage"][0]["reason"]
    assert path.read_bytes() == before and meters[0].calls and meters[0].ended


def test_what_is_not_a_journal_is_a_usage_error(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text("print(1)\n")
    with pytest.raises(UsageError, match="not a journal"):
        kind_of(str(script))
    with pytest.raises(UsageError, match="no such file"):
        examine(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UsageError, match="not a durable-dispatch state directory"):
        examine(str(tmp_path))
