"""Write one reference page per public module from that module's ``__all__`` (issue 47).

The pages are generated at every build into ``reference/api/`` (gitignored, as Parsl's
``stubs``), so a name another change adds to an ``__all__`` appears in the reference without
editing the docs, and a name without a docstring fails the build (``-W``).

Each object is documented once, under the first public module that exports it (the order of
``MODULES``); another module that re-exports it gets a line that links there. Names the
standard library owns (``durable_dispatch.futures`` re-exports ``concurrent.futures``' names,
as ``mpi4py.futures`` does) are listed as such, not documented again.

A reference to a private module's path (``durable_dispatch.campaign.state.CampaignState``, as type
hints name it) resolves to the public name that exports the same object.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)

#: the public modules, in the order that picks where a re-exported object is documented
MODULES = [
    "durable_dispatch",
    "durable_dispatch.mpi",
    "durable_dispatch.futures",
    "durable_dispatch.futures.aplus",
    "durable_dispatch.testing",
    "durable_dispatch.errors",
]
TITLES = {
    "durable_dispatch": "the campaign, its items and its storage",
    "durable_dispatch.mpi": "the master and worker loops",
    "durable_dispatch.futures": "the durable executor",
    "durable_dispatch.futures.aplus": "chaining futures (mpi4py's aplus)",
    "durable_dispatch.testing": "testing a campaign and injecting faults",
    "durable_dispatch.errors": "the exceptions",
}
OUT = "reference/api"

# id(object) -> the public name it is documented under, filled by write_pages
CANONICAL: dict[int, str] = {}
# "module.qualname" of the defining module -> the public name it is documented under
BY_ORIGIN: dict[str, str] = {}


def _kind(obj: Any) -> str:
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "function"
    return "data"


def _canonical_order() -> list[str]:
    """The errors module first for exceptions: its page is the hierarchy's home."""
    return ["durable_dispatch.errors", *[m for m in MODULES if m != "durable_dispatch.errors"]]


def _summary(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip().split("\n\n", 1)[0].replace("\n", " ")


def write_pages(app: Sphinx) -> None:
    """Write ``reference/api/<module>.rst`` for every public module."""
    out = Path(app.srcdir) / OUT
    out.mkdir(parents=True, exist_ok=True)
    CANONICAL.clear()
    BY_ORIGIN.clear()
    home: dict[int, str] = {}
    for modname in _canonical_order():
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if _stdlib(obj) or id(obj) in home:
                continue
            if isinstance(obj, (str, int, float, dict, tuple, frozenset)):
                continue  # a constant: documented where it is exported, each time
            home[id(obj)] = f"{modname}.{name}"
            origin = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
            BY_ORIGIN[origin] = f"{modname}.{name}"
    CANONICAL.update(home)
    for where in home.values():
        modname, _, name = where.rpartition(".")
        for missing in _undocumented(getattr(importlib.import_module(modname), name)):
            logger.warning(
                "%s%s has no docstring: the reference would be empty", where, missing,
                type="apipages", subtype="no-docstring",
            )
    pages = []
    for modname in MODULES:
        text = _page(modname, home)
        page = out / f"{modname}.rst"
        if not page.exists() or page.read_text() != text:  # unchanged pages stay unchanged
            page.write_text(text)
        pages.append(modname)
    for stale in out.glob("*.rst"):
        if stale.stem not in pages:
            stale.unlink()


def _undocumented(obj: Any) -> list[str]:
    """``""`` when ``obj`` has no docstring of its own (``dataclass`` and ``Enum`` write one),
    and ``".name"`` for each public method or property of a class that has none."""
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return []
    doc = inspect.getdoc(obj) or ""
    name = getattr(obj, "__name__", "")
    out = [] if doc and not doc.startswith(f"{name}(") and doc != "An enumeration." else [""]
    if inspect.isclass(obj):
        for attr, member in vars(obj).items():
            if attr.startswith("_") or not (callable(member) or isinstance(member, property)):
                continue
            if not getattr(member, "__doc__", None):
                out.append(f".{attr}")
    return out


def _stdlib(obj: Any) -> bool:
    module = str(getattr(obj, "__module__", ""))
    return module.startswith("concurrent.futures") or module == "builtins"


#: modules whose classes are parts of a public class, split out by job: their members are
#: documented as the public class's own
PARTS = ("durable_dispatch.campaign.loop",)


def _parts(obj: Any, home: dict[int, str]) -> str:
    """The ``:inherited-members:`` option's argument for class ``obj`` (the bases whose members
    are not its own: all but its parts in :data:`PARTS`), or "" when it has no such part."""
    bases = obj.__mro__[1:]
    if not any(b.__module__ in PARTS for b in bases):
        return ""
    return ", ".join(b.__name__ for b in bases if b.__module__ not in PARTS)


def _page(modname: str, home: dict[int, str]) -> str:
    mod = importlib.import_module(modname)
    title = f"``{modname}``: {TITLES.get(modname, '')}".rstrip(": ")
    lines = [
        ".. This page is generated from the module's __all__ at every build; do not edit.",
        "",
        title,
        "=" * len(title),
        "",
        f".. automodule:: {modname}",
        "   :no-members:",
        "",
    ]
    own, elsewhere, stdlib = [], [], []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if _stdlib(obj):
            stdlib.append(name)
        elif home.get(id(obj), f"{modname}.{name}") == f"{modname}.{name}":
            own.append(name)
        else:
            elsewhere.append((name, home[id(obj)]))
    if own:
        lines += [".. autosummary::", ""]
        lines += [f"   {n}" for n in own]
        lines += [""]
    for name in own:
        obj = getattr(mod, name)
        kind = _kind(obj)
        full = f"{modname}.{name}"
        if kind in ("class", "exception"):
            lines += [f".. auto{kind}:: {full}", "   :members:", "   :show-inheritance:"]
            if parts := _parts(obj, home):  # a class split by job: its parts' members
                lines += [f"   :inherited-members: {parts}"]
            lines += [""]
        elif kind == "function":
            lines += [f".. autofunction:: {full}", ""]
        else:
            lines += [f".. autodata:: {full}", "   :no-value:", ""]
    if elsewhere:
        lines += ["Also exported here", "------------------", ""]
        for name, where in elsewhere:
            lines += [f"* ``{name}``: the same object as :py:obj:`{where}`."]
        lines += [""]
    if stdlib:
        lines += ["From the standard library", "-------------------------", ""]
        lines += [
            "Re-exported from :mod:`concurrent.futures` so that a script written for "
            "``mpi4py.futures`` imports them from one place, as it did: "
            + ", ".join(f"``{n}``" for n in stdlib)
            + ".",
            "",
        ]
    return "\n".join(lines)


def resolve_private_path(
    app: Sphinx, env: Any, node: nodes.Element, contnode: nodes.Element
) -> nodes.Element | None:
    """A reference to ``durable_dispatch.<private module>.Name`` (as a type hint spells it)
    resolves to the public name that documents the same object."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    public = BY_ORIGIN.get(target)
    if public is None:
        origin = _existing(node, target)
        if origin is None:
            return None  # a name that does not exist: the warning stands (-W fails)
        public = BY_ORIGIN.get(origin)
        if public is None:
            return contnode  # a real but private name: shown as code, without a link
    domain = env.get_domain("py")
    found = domain.objects.get(public)
    if found is None:
        return None
    return make_refnode(
        app.builder, node["refdoc"], found.docname, found.node_id, contnode, public
    )


def _existing(node: nodes.Element, target: str) -> str | None:
    """The ``module.qualname`` of the object a docstring's short reference names, looked up
    from where the docstring is (its module, its class), or None when no such object exists:
    a docstring may name a private helper (``mpi_flavor``), never a name that is not there."""
    target = target.lstrip(".~")
    source = str(node.source or "")
    contexts = []
    if "docstring of " in source:
        contexts.append(source.rsplit("docstring of ", 1)[1])
    for key in ("py:class", "py:module"):
        if node.get(key):
            contexts.append(node[key])
    if node.get("py:module") and node.get("py:class"):
        contexts.append(f"{node['py:module']}.{node['py:class']}")
    bases: list[str] = [""]
    for ctx in contexts:
        parts = ctx.split(".")
        bases += [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
        where = _lookup(ctx)  # the documented object's own module (a public name's home)
        if where is not None and getattr(where, "__module__", None):
            bases.append(where.__module__)
    for base in bases:
        full = f"{base}.{target}" if base else target
        if not full.startswith("durable_dispatch"):
            continue
        obj = _lookup(full)
        if obj is not None:
            return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
    head, _, rest = target.partition(".")
    for name, mod in list(sys.modules.items()):  # a name a module defines or imports
        if name.startswith("durable_dispatch") and mod is not None:
            obj = _lookup(f"{name}.{target}")
            if obj is not None:
                return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
    for ctx in contexts:  # an instance attribute a method of the documented class sets
        cls = _lookup(ctx)
        if inspect.isclass(cls) and any(
            target in getattr(getattr(f, "__code__", None), "co_names", ())
            for f in vars(cls).values()
        ):
            return ""
    return None


_MISSING = object()


def _lookup(dotted: str) -> Any:
    """The object at ``dotted`` (a module, then attributes), or None."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return None
        return obj
    return None


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", write_pages)
    app.connect("missing-reference", resolve_private_path)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
