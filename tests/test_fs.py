"""The fs seam (durable_dispatch.storage.fs) is the only caller of the durable-write primitives."""

from __future__ import annotations

import ast
from pathlib import Path

import durable_dispatch

PRIMITIVES = {"write", "fsync", "fdatasync", "replace", "rename", "ftruncate"}


def test_only_the_seam_writes_syncs_or_renames() -> None:
    root = Path(durable_dispatch.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path == root / "storage" / "fs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in PRIMITIVES
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                offenders.append(f"{path.relative_to(root)}:{node.lineno} os.{node.attr}")
    assert not offenders, offenders
