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
    "durable_dispatch.logs",
]


def test_top_level_all_is_exact() -> None:
    exported = {n for n in dir(durable_dispatch) if not n.startswith("_")}
    modules = {n for n in exported if inspect.ismodule(getattr(durable_dispatch, n))}
    assert set(durable_dispatch.__all__) == exported - modules


def test_every_public_name_has_a_docstring() -> None:
    for modname in PUBLIC_MODULES:
        mod = importlib.import_module(modname)
        assert mod.__doc__, modname
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert obj.__doc__, f"{modname}.{name}"
                if inspect.isclass(obj):
                    for attr, member in vars(obj).items():
                        if (
                            attr.startswith("_")
                            or not callable(member)
                            and not isinstance(member, property)
                        ):
                            continue
                        assert getattr(member, "__doc__", None), f"{modname}.{name}.{attr}"
