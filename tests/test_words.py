"""What a user reads carries no internal label: no rule label (U6, G3, S8, O1, ...: their
meaning is docs/explanation/invariants.md, the one page that carries them) and no issue number,
in the docs pages, the docstrings of public names (every name the API reference shows, and every
public name of every public module, which ``help()`` and the source show), the ``--help`` of
every command, and every string the library can print (error messages, logs).

Module-internal comments and private docstrings (of a name or a module that starts with ``_``)
may keep them: they are for whoever works on the code. The built site is checked by
``test_docs.py::test_the_site_builds_with_warnings_as_errors`` with :func:`labels` below.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "durable_dispatch"


def _reference_setting(name: str) -> list[str]:
    """A list of docs/_ext/apipages.py (read, not imported: it needs Sphinx)."""
    tree = ast.parse((ROOT / "docs" / "_ext" / "apipages.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return list(ast.literal_eval(node.value))
    raise LookupError(name)


# the modules the API reference has a page for, and the modules of the parts whose members it
# shows as the public class's own
PUBLIC = _reference_setting("MODULES")
PARTS = _reference_setting("PARTS")
# a rule label (W, U, G, S, O, V, F, R families: docs/explanation/invariants.md), or an issue
# number
LABEL = re.compile(r"\b[WUGSOVFR][0-9]{1,2}\b|\b[Ii]ssues? #?[0-9]+")


def labels(text: str) -> list[str]:
    """The internal labels ``text`` carries, each with a little context."""
    return [text[max(0, m.start() - 30) : m.end() + 30] for m in LABEL.finditer(text)]


def test_the_pattern_finds_what_it_should() -> None:
    assert labels("a rollback's S8 snapshot (issue 50)") and labels("see U11") and labels("G1-G3")
    assert not labels("x86_64 SIGSEGV MPI_ERR_PROC_FAILED O(1) 3.11 v5.0 utf-8 S_IFREG")


# The one page whose point is the labels: it says what each label the code and the tests use
# means, for whoever changes the library (tests/test_invariants.py checks it). Every other page
# says the same things without them.
RULES_PAGE = ROOT / "docs" / "explanation" / "invariants.md"


def _pages() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted(
            p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts and p != RULES_PAGE
        ),
    ]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_docs_page_carries_an_internal_label(page: Path) -> None:
    found = labels(page.read_text())
    assert not found, f"{page.name}: {found}"


def _public_docstrings() -> Iterator[tuple[str, str]]:
    seen: set[int] = set()
    for modname in PUBLIC:
        mod = importlib.import_module(modname)
        yield modname, inspect.getdoc(mod) or ""
        for name in mod.__all__:
            obj = getattr(mod, name)
            if id(obj) in seen or str(getattr(obj, "__module__", "")).startswith("concurrent"):
                continue
            seen.add(id(obj))
            if isinstance(obj, (str, int, float, dict, tuple, frozenset)):
                continue
            yield f"{modname}.{name}", inspect.getdoc(obj) or ""
            if inspect.isclass(obj):
                yield f"{modname}.{name} attributes", _attribute_docs(obj)
                parts = [b for b in obj.__mro__[1:] if b.__module__ in PARTS]
                members = [m for cls in (*parts[::-1], obj) for m in vars(cls).items()]
                for attr, raw in members:
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    member = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
                    if isinstance(member, property) or callable(member):
                        doc = getattr(member, "__doc__", None)
                        yield f"{modname}.{name}.{attr}", inspect.cleandoc(doc or "")


def _attribute_docs(cls: type) -> str:
    """What the reference shows of a class's attributes: its ``#:`` comments and the string
    after an attribute (autodoc's attribute docstrings)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return ""
    out, block = [], []
    for line in source.splitlines():
        if line.strip().startswith("#:"):
            block.append(line.strip()[2:])
            continue
        name = line.strip().removeprefix("self.")
        if block and not name.startswith("_"):  # a private attribute's comment is not shown
            out += block
        block = []
    body = ast.parse(textwrap.dedent(source)).body[0]
    for prev, node in zip(body.body, body.body[1:], strict=False):  # type: ignore[attr-defined]
        if isinstance(prev, (ast.Assign, ast.AnnAssign)) and isinstance(node, ast.Expr):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                out.append(node.value.value)
    return "\n".join(out)


def test_no_public_docstring_carries_an_internal_label() -> None:
    assert "durable_dispatch.futures.aplus" in PUBLIC and PARTS
    bad = {where: labels(doc) for where, doc in _public_docstrings() if labels(doc)}
    assert not bad, bad


def _public(name: str) -> bool:
    return not name.startswith("_") or name == "__init__"


def _public_modules() -> Iterator[Path]:
    """Every module of the package whose dotted name has no private part."""
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if all(not p.startswith("_") or p in ("__init__", "__main__") for p in parts):
            yield path


def _source_docstrings(path: Path) -> Iterator[tuple[int, str, str]]:
    """``(line, name, text)`` of module ``path``'s docstring, of every public class, function,
    method and property in it (not those inside a function), and of the ``#:`` comments and
    docstrings of their public attributes: what ``help()``, an editor and autodoc show."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)

    def comment_above(node: ast.stmt) -> str:
        block, n = [], node.lineno - 2
        while n >= 0 and lines[n].strip().startswith("#:"):
            block.insert(0, lines[n].strip()[2:])
            n -= 1
        return "\n".join(block)

    def attributes(
        scope: ast.AST, prefix: str, *, in_methods: bool
    ) -> Iterator[tuple[int, str, str]]:
        body = scope.body  # type: ignore[attr-defined]
        nodes = ast.walk(scope) if in_methods else iter(body)
        for node in nodes:
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    name = target.id
                elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                    if target.value.id != "self":
                        continue
                    name = target.attr
                else:
                    continue
                if _public(name) and (text := comment_above(node)):
                    yield node.lineno, f"{prefix}{name}", text
        for prev, node in zip(body, body[1:], strict=False):
            if isinstance(prev, (ast.Assign, ast.AnnAssign)) and isinstance(node, ast.Expr):
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    yield node.lineno, f"{prefix}{ast.unparse(prev).split()[0]}", node.value.value

    def walk(scope: ast.AST, prefix: str) -> Iterator[tuple[int, str, str]]:
        for node in scope.body:  # type: ignore[attr-defined]
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if not _public(node.name):
                continue
            if doc := ast.get_docstring(node, clean=False):
                yield node.body[0].lineno, f"{prefix}{node.name}", doc
            if isinstance(node, ast.ClassDef):
                yield from attributes(node, f"{prefix}{node.name}.", in_methods=True)
                yield from walk(node, f"{prefix}{node.name}.")

    if doc := ast.get_docstring(tree, clean=False):
        yield 1, "(module)", doc
    yield from attributes(tree, "", in_methods=False)
    yield from walk(tree, "")


def test_the_public_names_of_every_module_are_found() -> None:
    modules = {p.relative_to(SRC).as_posix() for p in _public_modules()}
    assert {"storage/journal.py", "cli/inspection.py", "futures/__main__.py"} <= modules
    assert "futures/__init__.py" in modules and "futures/_executor.py" not in modules
    found = {name for _, name, _ in _source_docstrings(SRC / "views" / "view.py")}
    assert {"(module)", "CampaignView", "read_view"} <= found
    assert not any(name.startswith("_") for name in found)


def test_no_docstring_of_a_public_name_in_any_module_carries_an_internal_label() -> None:
    """What a user reads of a public name (its docstring, in ``help()``, an editor or the
    reference) says the rule in words, not by its label: the labels are for whoever changes the
    code, in comments and private docstrings."""
    bad = []
    for path in _public_modules():
        for line, name, text in _source_docstrings(path):
            if found := labels(text):
                bad.append(f"{path.relative_to(SRC)}:{line}: {name}: {found}")
    assert not bad, "\n".join(bad)


def _helps() -> Iterator[tuple[str, str]]:
    from durable_dispatch.cli import build_parser

    def walk(name: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
        yield name, parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    yield from walk(f"{name} {sub}", p)

    yield from walk("durable-dispatch", build_parser())


def test_no_help_of_any_command_carries_an_internal_label() -> None:
    helps = list(_helps())
    assert len(helps) > 15
    bad = {name: labels(text) for name, text in helps if labels(text)}
    assert not bad, bad


def _printable_strings(path: Path) -> Iterator[tuple[int, str]]:
    """Every string constant of ``path`` that is not a docstring (a message, a log line, a help
    text), f-strings' literal parts included; private docstrings and comments are not here."""
    tree = ast.parse(path.read_text())
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.add(id(value))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            docstrings.add(id(node.value))  # an attribute's docstring, a bare string
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node.lineno, node.value


def test_no_message_or_log_line_carries_an_internal_label() -> None:
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        for line, text in _printable_strings(path):
            if labels(text):
                bad.append(f"{path.relative_to(SRC)}:{line}: {labels(text)}")
    assert not bad, "\n".join(bad)


def test_each_flags_help_says_what_happens_by_default() -> None:
    """``--no-isolate ... (default: True)`` reads as the opposite of what the flag does: a flag
    shows no ``(default: ...)``, and each ``--no-...`` flag says what happens without it."""
    from durable_dispatch.cli import build_parser

    def walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for p in action.choices.values():
                    yield from walk(p)

    for name, text in _helps():
        flat = " ".join(text.split())
        for shown in ("(default: True)", "(default: False)", "(default: None)"):
            assert shown not in flat, (name, shown)
    negating = 0
    for parser in walk(build_parser()):
        for action in parser._actions:
            if any(o.startswith("--no-") for o in action.option_strings) and action.default:
                negating += 1  # a flag that turns off what happens by default
                assert "without it" in str(action.help), (parser.prog, action.option_strings)
    assert negating >= 2
