"""Package re-exports loaded on first use (PEP 562)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, where: dict[str, str], public: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name in ``where`` is imported from its
    module (relative to the package) the first time it is used, then cached in the package."""
    if set(where) != set(public):
        raise AssertionError(f"{package}: __all__ and the lazy names differ")

    def getattr_(name: str) -> Any:
        mod = where.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        pkg = importlib.import_module(package)
        value = getattr(importlib.import_module(mod, package), name)
        setattr(pkg, name, value)
        return value

    def dir_() -> list[str]:
        return sorted(public)

    return getattr_, dir_
