"""The core package is sans-I/O: it imports no clock, file, environment or MPI module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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


#: what the core may import from the rest of the package (no I/O in any of them)
ALLOWED_OUTSIDE = {
    "durable_dispatch.errors",
    "durable_dispatch.schema",
    "durable_dispatch.tokens",
    "durable_dispatch._lazy",
    "durable_dispatch.cost",  # the Cost type and its validator (events.py's records carry it)
}


def io_uses(path: Path, package: str = "durable_dispatch.core") -> list[str]:
    """What the module at ``path`` (of ``package``) imports or calls that does I/O: absolute
    imports of I/O modules, relative imports that leave the core for anything but
    ``ALLOWED_OUTSIDE``, and I/O builtins."""
    bad: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
            bad += [f"imports {n}" for n in names if n in FORBIDDEN]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                top = (node.module or "").split(".")[0]
                bad += [f"imports {top}"] if top in FORBIDDEN else []
                continue
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            targets = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            for t in targets:
                inside = t == package or t.startswith(package + ".")
                if not inside and not any(t == a or t.startswith(a + ".") for a in ALLOWED_OUTSIDE):
                    bad.append(f"imports {t}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            bad.append(f"uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            bad.append(f"uses .{node.attr}")
    return bad


def test_core_modules_import_nothing_that_does_io() -> None:
    for path in Path(core.__file__).parent.glob("*.py"):
        assert io_uses(path) == [], path.name


@pytest.mark.parametrize(
    "planted",
    [
        "from ..storage import fs",  # issue 30: relative imports were not checked at all
        "from .. import state",
        "from ..mpi.transport import MpiTransport",
        "import os.path",
        "from time import monotonic",
        "x = open",
    ],
)
def test_the_purity_check_catches_a_planted_import(tmp_path: Path, planted: str) -> None:
    module = tmp_path / "planted.py"
    module.write_text(
        f"from __future__ import annotations\nfrom ..errors import UsageError\n{planted}\n"
    )
    assert io_uses(module) != []
    module.write_text("from ..errors import UsageError\nfrom .tokens import Token\n")
    assert io_uses(module) == []


def test_importing_the_core_does_not_load_mpi() -> None:
    code = "import sys, durable_dispatch.core; print('mpi4py' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
