"""Quick start: write a journal, tear its tail as a crash would, recover it, save a snapshot.

Run with ``python examples/quickstart.py [DIRECTORY]`` (default: a new temporary directory).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from durable_dispatch import Journal, SnapshotStore


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dd-quickstart-"))
    path = root / "state" / "events.jsonl"

    with Journal.open(path, sync="batch") as j:
        for i in range(1000):
            r = j.append({"event": "committed", "work_id": f"w-{i}"})
        j.wait_durable(r.seq)
        print(f"appended 1000 records; durable through seq {j.durable_seq}")

    # A crash in the middle of a write leaves a torn last line.
    data = path.read_bytes()
    path.write_bytes(data[:-17])
    print("tore the last record (cut 17 bytes), as a crash mid-write would")

    with Journal.open(path) as j:
        rep = j.recovery
        print(
            f"recovered {rep.records} records; cut {rep.cut_bytes} bytes at offset "
            f"{rep.cut_offset}, saved to {rep.side_file}"
        )
        last = list(j.records(from_seq=j.next_seq - 1))[0]
        print(f"last intact record: seq {last.seq} {last.payload}")

    store = SnapshotStore(root / "state", name="campaign", keep=3)
    gen = store.save({"frontier": ["w-998", "w-999"], "committed": 998})
    snap = store.load()
    assert snap is not None
    print(f"snapshot generation {gen} saved and loaded back: {snap.value}")
    print(f"state directory: {root / 'state'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
