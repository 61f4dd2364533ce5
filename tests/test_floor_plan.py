"""The package's floor plan, read from its own imports (issue 36): no circle, and the lower
floors never reach up. Every ``import`` counts, a function-local one too (hiding a circle in a
function does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "durable_dispatch"


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports (a package's ``__init__`` by its name)."""
    mods = {_module(p): p for p in SRC.rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for alias in node.names:
                    full = f"{mod}.{alias.name}"
                    deps.add(full if full in mods else mod)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        out[name] = {d for d in deps if d in mods and d != name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _below(graph: dict[str, set[str]], pkg: str) -> dict[str, set[str]]:
    return {m: deps for m, deps in graph.items() if m == pkg or m.startswith(pkg + ".")}


def test_the_package_has_no_import_circle() -> None:
    assert cycles(imports()) == []


def test_the_circle_finder_finds_a_planted_circle() -> None:
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(planted) == [["a", "b", "c"]] and cycles({"a": {"b"}, "b": set()}) == []


def test_the_ground_floor_stands_on_nothing_above_it() -> None:
    """errors and tokens import nothing of the package; storage never reaches the core, the
    MPI shell or the campaign state above it (it once reached the core through schema)."""
    g = imports()
    ground = {"durable_dispatch.errors", "durable_dispatch.tokens"}
    assert all(g[m] <= ground for m in ground), {m: g[m] for m in ground}
    above = ("durable_dispatch.core", "durable_dispatch.mpi", "durable_dispatch.campaign.state")
    for m, deps in _below(g, "durable_dispatch.storage").items():
        reach = {d for d in deps if d.startswith(above)}
        assert not reach, f"{m} imports {reach}"
    assert not {d for d in g["durable_dispatch.schema"] if d.startswith(above)}


def test_the_mpi_shell_and_the_fault_injection_do_not_reach_up() -> None:
    """The MPI shell imports neither the test helpers, the demo nor the command line above it
    (the demo used to sit in mpi/ and import testing); the fs fault injection stands on the
    storage layer only, so a storage test pulls in no MPI code."""
    g = imports()
    above_mpi = (
        "durable_dispatch.testing",
        "durable_dispatch.cli.demo",
        "durable_dispatch.cli",
        "durable_dispatch.futures",
    )
    for m, deps in _below(g, "durable_dispatch.mpi").items():
        reach = {d for d in deps if d.startswith(above_mpi)}
        assert not reach, f"{m} imports {reach}"
    allowed = {"durable_dispatch.errors", "durable_dispatch.storage.fs"}
    assert g["durable_dispatch.testing.faults"] <= allowed, g["durable_dispatch.testing.faults"]


def test_the_core_imports_no_io() -> None:
    """The sans-I/O core (DESIGN.md): it stands on errors, tokens, schema and cost (pure codecs
    of records) only, and of the standard library it imports no module that reaches files,
    clocks, processes or MPI."""
    g = imports()
    allowed = {"durable_dispatch.errors", "durable_dispatch.tokens", "durable_dispatch.schema"}
    allowed |= {"durable_dispatch.cost"}
    allowed |= {"durable_dispatch._lazy"}
    io = {"os", "io", "time", "socket", "subprocess", "threading", "signal", "mpi4py", "pathlib"}
    io |= {"shutil", "tempfile", "select", "asyncio", "multiprocessing", "logging", "sys"}
    for path in (SRC / "core").glob("*.py"):
        name = _module(path)
        assert {d for d in g[name] if not d.startswith("durable_dispatch.core")} <= allowed, name
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            assert not {n.split(".")[0] for n in names} & io, f"{name} imports {names}"


# ------------------------------------------------------------------------------- the layers
#: Each layer of the package (docs/explanation/architecture.md), lowest first. A module may
#: import its own layer and the layers below it, never one above; two packages in one layer
#: (core and storage) do not import each other. The futures face stands on the testing
#: package's in-process workers (an executor on a communicator of one runs its calls there).
#: The facade on top (the package's ``__init__``, ``__main__``, the pytest plugin) may import
#: anything.
LAYERS: list[tuple[str, ...]] = [
    (
        "errors",
        "tokens",
        "schema",
        "values",
        "_lazy",
        "processes",
        "progress",
        "programs",
        "batch",
        "cost",
    ),
    ("core", "storage"),
    ("campaign",),
    ("views",),
    ("mpi",),
    ("testing",),
    ("futures",),
    ("cli",),
    ("(facade)", "__main__", "pytest_plugin"),
]
#: packages of one layer that stand side by side and never import each other
APART = [{"core", "storage"}]
MAX_LINES = 700


def _part(module: str) -> str:
    """The top-level part of the package a module belongs to (``(facade)`` for the package)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(facade)"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that reaches a layer above its module's, or a sibling package of its layer,
    as ``"a imports b"``; a part that is in no layer is reported too (place it on purpose)."""
    rank = {part: i for i, layer in enumerate(LAYERS) for part in layer}
    out = []
    for m, deps in sorted(graph.items()):
        a = _part(m)
        if a not in rank:
            out.append(f"{m} is in no layer")
            continue
        for d in sorted(deps):
            b = _part(d)
            if b != a and b in rank and (rank[b] > rank[a] or {a, b} in APART):
                out.append(f"{m} imports {d}")
    return out


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward_imports(imports()) == []


def test_the_layer_check_finds_an_upward_import() -> None:
    """The check can fail: the campaign reaching up to the views, the MPI shell to the command
    line, the core to storage (a sibling), and a part placed in no layer."""
    planted = {
        "durable_dispatch.campaign.state": {"durable_dispatch.views.view"},
        "durable_dispatch.mpi.master": {"durable_dispatch.cli.launch"},
        "durable_dispatch.core.ledger": {"durable_dispatch.storage.fs"},
        "durable_dispatch.newthing": set(),
        "durable_dispatch.views.view": {"durable_dispatch.campaign.admin"},
    }
    assert upward_imports(planted) == [
        "durable_dispatch.campaign.state imports durable_dispatch.views.view",
        "durable_dispatch.core.ledger imports durable_dispatch.storage.fs",
        "durable_dispatch.mpi.master imports durable_dispatch.cli.launch",
        "durable_dispatch.newthing is in no layer",
    ]


def long_modules(root: Path = SRC, limit: int = MAX_LINES) -> dict[str, int]:
    """Each module of the package over ``limit`` lines, with its line count."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        n = len(p.read_text().splitlines())
        if n > limit:
            out[str(p.relative_to(root))] = n
    return out


def test_no_module_passes_700_lines() -> None:
    """Modules of one job, a few hundred lines each: a module over 700 lines does several jobs
    and is split by job, not by length."""
    assert long_modules() == {}


def test_the_length_check_finds_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "short.py").write_text("x = 1\n" * 700)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 701)
    assert long_modules(tmp_path) == {"pkg/long.py": 701}


# ------------------------------------------------------------------------ parts, not mixins
#: The packages whose parts talk through narrow public faces: no module reads or calls another
#: object's private name (``other._name``), only its own (``self._name``, ``cls._name``).
PARTS = ("campaign", "futures", "mpi")
#: The standard library's own private names that the package uses on purpose, each with why.
STDLIB_PRIVATE = {
    # leaves the process at once, without exit handlers or ``MPI_Finalize`` (the documented way
    # to end a process without its clean-up: a rank that must not wait for the others)
    "os._exit",
    # the runner's worker ranks import a script run as a module (``-m``) under ``__mp_main__``
    # as multiprocessing's spawn does; the module has no public name for it
    "spawn._fixup_main_from_name",
    # the caller's frame (documented in sys, named private only to say CPython has it)
    "sys._getframe",
}
#: The methods and fields of a ``collections.namedtuple``: public, named with an underscore
#: so that they cannot clash with the fields a user names.
NAMEDTUPLE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def private_reaches(root: Path = SRC, parts: tuple[str, ...] = PARTS) -> list[str]:
    """Each ``X._name`` (one leading underscore, not a dunder) in the modules of ``parts`` whose
    ``X`` is not ``self`` or ``cls``, as ``"file:line: X._name"``, but the standard library's
    own that :data:`STDLIB_PRIVATE` and :data:`NAMEDTUPLE` allow."""
    out = []
    for part in parts:
        for path in sorted((root / part).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Attribute):
                    continue
                name = node.attr
                if not name.startswith("_") or name.startswith("__") or name in NAMEDTUPLE:
                    continue
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                expr = ast.unparse(node)
                if expr in STDLIB_PRIVATE:
                    continue
                out.append(f"{path.relative_to(root)}:{node.lineno}: {expr}")
    return sorted(out)


def test_no_part_reads_another_objects_private_names() -> None:
    """Parts, not mixins: the executor, its feed, the campaign state and the MPI shell share
    what they must through public names (the executor's record of its calls is a part of its
    own, the board), so a part's private names can change without reading the others."""
    assert private_reaches() == []


def test_the_private_name_check_finds_a_reach(tmp_path: Path) -> None:
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "a.py").write_text(
        "import os\n"
        "class A:\n"
        "    def f(self, other):\n"
        "        self._mine = other._theirs\n"
        "        os._exit(0)\n"
        "        return self.ex._queue, cls._x, other.__dict__, p._replace(x=1)\n"
    )
    assert private_reaches(tmp_path, ("part",)) == [
        "part/a.py:4: other._theirs",
        "part/a.py:6: self.ex._queue",
    ]
