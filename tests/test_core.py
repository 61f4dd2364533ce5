"""The core package is sans-I/O: it imports no clock, file, environment or MPI module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import durable_dispatch.core as core

FORBIDDEN = {
    "os",
    "time",
    "sys",
    "io",
    "pathlib",
    "subprocess",
    "socket",
    "threading",
    "asyncio",
    "mpi4py",
    "random",
    "secrets",
    "datetime",
    "logging",
    "shutil",
    "tempfile",
    "signal",
}
FORBIDDEN_NAMES = {"open", "environ", "getenv", "print", "input"}


def test_core_modules_import_nothing_that_does_io() -> None:
    for path in Path(core.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.module or "").split(".")[0]] if node.level == 0 else []
            else:
                if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
                    raise AssertionError(f"{path.name} uses {node.id}")
                if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
                    raise AssertionError(f"{path.name} uses .{node.attr}")
                continue
            bad = FORBIDDEN.intersection(names)
            assert not bad, f"{path.name} imports {bad}"


def test_importing_the_core_does_not_load_mpi() -> None:
    code = "import sys, durable_dispatch.core; print('mpi4py' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
