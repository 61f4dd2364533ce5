"""The public face: __all__ is exactly what users import, and every public name is documented."""

from __future__ import annotations

import importlib
import inspect

import durable_dispatch

PUBLIC_MODULES = [
    "durable_dispatch",
    "durable_dispatch.errors",
    "durable_dispatch.storage",
    "durable_dispatch.testing",
    "durable_dispatch.core",
    "durable_dispatch.core.events",
    "durable_dispatch.core.ledger",
    "durable_dispatch.core.batching",
    "durable_dispatch.core.ranks",
    "durable_dispatch.core.watchdog",
    "durable_dispatch.campaign.logs",
    "durable_dispatch.mpi",
    "durable_dispatch.programs",
    "durable_dispatch.campaign.results",
    "durable_dispatch.views.report",
    "durable_dispatch.progress",
    "durable_dispatch.futures",
]


def test_every_exported_name_is_importable_and_every_public_definition_is_exported() -> None:
    """Issue 21: the old check compared __dir__ with __all__, and __dir__ is generated from
    __all__, so it could not fail. Now: every name in __all__ loads, and every public class or
    function a public module defines is in its __all__."""
    for modname in PUBLIC_MODULES:
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            assert getattr(mod, name, None) is not None, f"{modname}.{name} does not load"
        defined = {
            n
            for n, obj in vars(mod).items()
            if not n.startswith("_")
            and (inspect.isclass(obj) or inspect.isfunction(obj))
            and obj.__module__ == modname
        }
        assert defined <= set(mod.__all__), f"{modname}: not exported: {defined - set(mod.__all__)}"


def test_every_top_level_name_is_documented() -> None:
    """Each name ``from durable_dispatch import ...`` offers appears in the README or docs/."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    text = (root / "README.md").read_text() + "".join(
        p.read_text() for p in sorted((root / "docs").rglob("*.md")) if "_build" not in p.parts
    )
    for modname in ("durable_dispatch", "durable_dispatch.mpi", "durable_dispatch.futures"):
        mod = importlib.import_module(modname)
        missing = [n for n in mod.__all__ if not mentions(text, n)]
        assert not missing, f"{modname}: not in README.md or docs/: {missing}"


def mentions(text: str, name: str) -> bool:
    """``name`` appears in ``text`` as a whole name (issue 30: a substring test took
    ``Journal`` for documented because ``JournalCorruptError`` was)."""
    import re

    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


def real_docstring(obj: object) -> bool:
    """True when ``obj`` has a docstring of its own: not one that ``dataclass`` or ``Enum``
    generated (``Name(field: type, ...)``, ``An enumeration.``)."""
    doc = inspect.getdoc(obj) or ""
    name = getattr(obj, "__name__", "")
    return bool(doc) and not doc.startswith(f"{name}(") and doc != "An enumeration."


def test_the_checks_catch_what_a_substring_and_a_generated_docstring_hid() -> None:
    """Planted bugs: the old checks passed both."""
    from dataclasses import dataclass

    assert not mentions("see JournalCorruptError", "Journal")
    assert mentions("``Journal.open`` and", "Journal") and mentions("Journal", "Journal")

    @dataclass
    class Undocumented:
        x: int

    @dataclass
    class Documented:
        """What it is."""

        x: int

    assert Undocumented.__doc__ and not real_docstring(Undocumented)
    assert real_docstring(Documented)


def test_every_public_name_has_a_docstring() -> None:
    for modname in PUBLIC_MODULES:
        mod = importlib.import_module(modname)
        assert mod.__doc__, modname
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert real_docstring(obj), f"{modname}.{name}"
                if inspect.isclass(obj):
                    for attr, member in vars(obj).items():
                        if (
                            attr.startswith("_")
                            or not callable(member)
                            and not isinstance(member, property)
                        ):
                            continue
                        assert getattr(member, "__doc__", None), f"{modname}.{name}.{attr}"


def test_top_level_names_load_on_first_use() -> None:
    """A worker rank or the command line on a journal file does not load the master's parts."""
    import subprocess
    import sys

    code = (
        "import sys, durable_dispatch.mpi.worker, durable_dispatch.storage.defer\n"
        "print(sorted(m for m in ('durable_dispatch.campaign.state',"
        " 'durable_dispatch.core.dispatcher')"
        " if m in sys.modules))\n"
        "import durable_dispatch as dd\n"
        "print(all(getattr(dd, n) is not None for n in dd.__all__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]
    try:
        durable_dispatch.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("unknown names must raise AttributeError")
