"""The rules the code names are the repository's own: every rule label used in ``src/``,
``tests/`` and ``benchmarks/`` (``U6``, ``G4``, ``S8``, ..., in comments, strings and names
alike) is defined by docs/explanation/invariants.md, and every test that page names as a guard
of a rule exists.

A label is a family letter and a number (the families the page lists, and ``M`` for gangs,
which no code names yet); a range such as ``W1-W9`` names every label between its ends.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "explanation" / "invariants.md"
SCANNED = ("src", "tests", "benchmarks")
RULE = re.compile(r"\b([WSUGMROVF])([0-9]{1,2})\b(?:\s*[-\u2013]\s*\1([0-9]{1,2})\b)?")
# a rule's heading on the page: its anchor line, then "### W1: what it says"
DEFINED = re.compile(r"^\(([a-z][0-9]{1,2})\)=\n#{2,4} ([A-Z][0-9]{1,2}): \S", re.M)
GUARD = re.compile(r"`(tests/[\w/]+\.py)::(\w+(?:::\w+)?)`")


def rule_labels(text: str) -> Iterator[str]:
    """Every rule label ``text`` names, each label of a range included."""
    for m in RULE.finditer(text):
        family, first, last = m.group(1), int(m.group(2)), m.group(3)
        for n in range(first, int(last) + 1 if last else first + 1):
            yield f"{family}{n}"


def _files() -> Iterator[Path]:
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield path


def _page() -> str:
    return PAGE.read_text() if PAGE.exists() else ""


@cache
def _sections() -> dict[str, str]:
    """Each label the page defines -> the text of its section (up to the next heading)."""
    text = _page()
    found = list(DEFINED.finditer(text))
    out = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        nxt = re.search(r"^## ", text[m.end() : end], re.M)
        out[m.group(2)] = text[m.start() : m.end() + nxt.start() if nxt else end]
    return out


def test_the_pattern_finds_labels_and_ranges_and_nothing_else() -> None:
    assert list(rule_labels("a rollback's S8 snapshot, see U11 (W6/W7)")) == [
        "S8",
        "U11",
        "W6",
        "W7",
    ]
    assert list(rule_labels("G1-G3, S1\u2013S4 and W10")) == [
        "G1",
        "G2",
        "G3",
        "S1",
        "S2",
        "S3",
        "S4",
        "W10",
    ]
    assert not list(rule_labels("x86_64 F401 T1 O(1) S_IFREG MPI_ERR_PROC_FAILED U+2019 v5.0"))


def test_every_label_in_the_code_and_the_tests_is_defined_by_the_rules_page() -> None:
    defined = set(_sections())
    missing, used = [], set()
    for path in _files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # not text
        for n, line in enumerate(text.splitlines(), 1):
            for label in rule_labels(line):
                used.add(label)
                if label not in defined:
                    missing.append(f"{path.relative_to(ROOT)}:{n}: {label}")
    assert used, "no label found at all: the scan is broken"
    assert not missing, f"{PAGE.relative_to(ROOT)} does not define these labels:\n" + "\n".join(
        missing
    )


def test_each_rule_of_the_page_has_its_anchor_and_the_tests_that_guard_it() -> None:
    sections = _sections()
    assert sections, f"{PAGE.relative_to(ROOT)} defines no rule"
    for label, text in sections.items():
        assert text.startswith(f"({label.lower()})="), f"{label}: anchor and heading disagree"
        assert GUARD.search(text), f"{label}: no test named as its guard"


@cache
def _tests_of(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(f"{node.name}::{member.name}")
    return frozenset(n for n in names if n.rsplit("::", 1)[-1].startswith("test"))


def test_every_test_the_rules_page_names_exists() -> None:
    named = GUARD.findall(_page())
    assert named, f"{PAGE.relative_to(ROOT)} names no test"
    gone = []
    for file, test in named:
        path = ROOT / file
        if not path.is_file() or test not in _tests_of(path):
            gone.append(f"{file}::{test}")
    assert not gone, "the rules page names tests that do not exist:\n" + "\n".join(gone)
