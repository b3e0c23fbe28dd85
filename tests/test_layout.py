"""The package's layout: no import cycles, the command line above the library, every module
importable on its own.

The import graph is read from the source (every import statement, inside functions too; imports
under `if TYPE_CHECKING:` are left out, as they never run), so a cycle fails here even where lazy
imports would let it run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyspec

PACKAGE_DIR = Path(pyspec.__file__).resolve().parent
# The installed package may be an editable install of the checkout or a copy in site-packages;
# either way its sources are next to pyspec/__init__.py.


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}
    return {name: path for name, path in found.items() if not name.endswith("__main__")}


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                for sub in child.orelse:  # the else branch runs
                    walk(sub)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child)

    walk(tree)
    return found


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports: `import a.b`, `from a import b` (b a module or a
    name defined in a), relative forms resolved."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
            continue
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            if sub in known:
                out.add(sub)
            elif source in known:
                out.add(source)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    compiled = {f"pyspec.{p.name.split('.')[0]}" for p in PACKAGE_DIR.glob("*.so")} | {"pyspec._core"}
    known = set(mods) | compiled  # the compiled module is a leaf
    return {name: imported_modules(name, path, known) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_reader_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_reader_resolves_relative_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nfrom . import engine\nfrom ..config import X\n"
                   "from .bench import runner\nif TYPE_CHECKING:\n    from .results import R\n"
                   "def f():\n    import pyspec.models\n")
    known = {"pyspec.engine", "pyspec.config", "pyspec.bench", "pyspec.bench.runner", "pyspec.results",
             "pyspec.models", "pyspec.cli.m"}
    assert imported_modules("pyspec.cli.m", src, known) == {"pyspec.config", "pyspec.models"}
    assert imported_modules("pyspec.m", src, known) == {"pyspec.engine", "pyspec.bench.runner", "pyspec.models"}


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert len(graph) > 40 and "pyspec.cli.main" in graph  # the reader saw the whole package
    assert "pyspec.engine" in graph["pyspec"] and "pyspec.cli.options" in graph["pyspec.cli.generate"]
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_command_line_sits_above_the_library() -> None:
    graph = import_graph()
    cli = {name for name in graph if name == "pyspec.cli" or name.startswith("pyspec.cli.")}
    commands = cli - {"pyspec.cli", "pyspec.cli.main", "pyspec.cli.options"}
    assert {"pyspec.cli.generate", "pyspec.cli.serve", "pyspec.cli.bench"} <= commands
    for name, deps in graph.items():
        if name not in cli:
            assert not deps & cli, f"{name} (library) imports the command line: {sorted(deps & cli)}"
        elif name in commands:
            assert deps & cli <= {"pyspec.cli.options"}, f"{name} imports {sorted(deps & cli)}"
    assert graph["pyspec.cli"] == set()  # the package's __init__ imports nothing
    assert graph["pyspec.cli.options"] & cli == set()
    assert commands <= graph["pyspec.cli.main"]  # main registers every command
    assert not any("pyspec.cli.main" in deps for deps in graph.values())


def _import_alone(name: str) -> tuple[str, int, str]:
    proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True,
                          cwd=tempfile.gettempdir())  # not the checkout: its pyspec/ has no _core
    return name, proc.returncode, proc.stderr[-2000:]


def test_every_module_imports_on_its_own() -> None:
    """Each module imported first in a fresh interpreter: a cycle between module-level imports, or
    a module that only works after another was imported, fails here."""
    names = sorted(modules())
    with ThreadPoolExecutor(max_workers=2) as pool:
        failures = [(name, err) for name, code, err in pool.map(_import_alone, names) if code != 0]
    assert not failures, "\n\n".join(f"import {name}:\n{err}" for name, err in failures)
