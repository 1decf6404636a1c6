"""No import circles among cdcserver/ and pipeline_stages/ modules, counting every import.

Read from the source with `ast`, not by importing. An edge is any import statement of a module
of the two packages, wherever it is: at module level (including `if`/`try`/`with`/class
bodies), inside a function (a deferred import), or under `if TYPE_CHECKING:` (a type-only
import). Deferring an import or making it type-only hides a circle from the interpreter, not
from the design: two modules that need each other's types want the type in a third module (or
a Protocol). A module's implicit dependence on its own parent packages is left out (a
package's __init__ re-exporting its submodules is no circle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cdcserver", "pipeline_stages")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


Import = ast.Import | ast.ImportFrom


def _imports(tree: ast.Module) -> Iterator[tuple[Import, str]]:
    """Every import statement of the module, with where it is: "module level", "deferred"
    (inside a function) or "type-only" (under `if TYPE_CHECKING:`)."""

    def visit(node: ast.AST, where: str) -> Iterator[tuple[Import, str]]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, where
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            where = "deferred" if where == "module level" else where
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                yield from visit(stmt, "type-only")
            for stmt in node.orelse:
                yield from visit(stmt, where)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, where)

    yield from visit(tree, "module level")


def _targets(module: str, is_package: bool, node: Import) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    # `from a import b` imports a, and a.b when b is a submodule
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


# (module, imported module) -> where each import making that edge is ("line 12, type-only")
Edges = dict[tuple[str, str], list[str]]


def module_edges(
    module: str, is_package: bool, source: str, modules: set[str]
) -> dict[str, list[str]]:
    """The modules of `modules` that `module` imports, each with where it does."""
    own_packages = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    edges: dict[str, list[str]] = {}
    for node, where in _imports(ast.parse(source)):
        for target in _targets(module, is_package, node):
            parts = target.split(".")
            # the module and every package on its way (importing a.b.c runs a and a.b)
            for i in range(1, len(parts) + 1):
                name = ".".join(parts[:i])
                if name in modules and name not in own_packages and name != module:
                    places = edges.setdefault(name, [])
                    place = f"line {node.lineno}, {where}"
                    if place not in places:
                        places.append(place)
    return edges


def import_edges() -> Edges:
    modules = _modules()
    out: Edges = {}
    for module, path in modules.items():
        found = module_edges(
            module, path.name == "__init__.py", path.read_text(encoding="utf-8"), set(modules)
        )
        for target, places in found.items():
            out[(module, target)] = places
    return out


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {module: set() for module in _modules()}
    for module, target in import_edges():
        graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _describe(component: list[str], edges: Edges) -> str:
    """A circle and the imports inside it, one per line (where each is)."""
    inside = set(component)
    lines = [f"circle of {len(component)}: {', '.join(component)}"]
    for (module, target), places in sorted(edges.items()):
        if module in inside and target in inside:
            lines.append(f"    {module} -> {target}  ({'; '.join(places)})")
    return "\n".join(lines)


def _report(found: list[list[str]], edges: Edges) -> str:
    return "all import circles:\n" + "\n".join(_describe(c, edges) for c in found)


def test_the_graph_sees_the_projects_imports() -> None:
    graph = import_graph()
    assert "pipeline_stages.errors" in graph["pipeline_stages.pipeline"]
    assert "cdcserver.roles" in graph["cdcserver.config"]
    assert "pipeline_stages.error_codes" in graph["pipeline_stages.errors"]
    # a circle is found when there is one
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_every_kind_of_import_is_an_edge() -> None:
    source = "\n".join([
        "from __future__ import annotations",
        "import typing",
        "from typing import TYPE_CHECKING",
        "from p import a",
        "if TYPE_CHECKING:",
        "    from p.b import B",
        "if typing.TYPE_CHECKING:",
        "    import p.c",
        "else:",
        "    from . import d",
        "class K:",
        "    def f(self) -> None:",
        "        from .e import E",
        "    g = lambda: __import__('x')",
        "try:",
        "    from p import f",
        "except ImportError:",
        "    pass",
    ])
    modules = {"p", "p.a", "p.b", "p.c", "p.d", "p.e", "p.f", "p.m"}
    edges = module_edges("p.m", False, source, modules)
    assert edges == {
        "p.a": ["line 4, module level"],
        "p.b": ["line 6, type-only"],
        "p.c": ["line 8, type-only"],
        "p.d": ["line 10, module level"],
        "p.e": ["line 13, deferred"],
        "p.f": ["line 16, module level"],
    }


def test_no_import_circles() -> None:
    """None at all: there is no allow-list (a circle found is printed with every import in it,
    and where each is)."""
    found = circles(import_graph())
    assert not found, _report(found, import_edges())


# pipeline_stages/ modules that reach into cdcserver/ (the pipeline is meant to stand alone,
# for Spark): none since $regex moved to pipeline_stages/regex.py.
KNOWN_LAYER_LEAKS: dict[str, set[str]] = {}


def test_pipeline_stages_imports_nothing_else_from_cdcserver() -> None:
    graph = import_graph()
    leaks = {
        m: {d for d in deps if d.startswith("cdcserver.") and not _is_package(d)}
        for m, deps in graph.items() if m.startswith("pipeline_stages")
    }
    leaks = {m: d - KNOWN_LAYER_LEAKS.get(m, set()) for m, d in leaks.items()}
    assert not {m: sorted(d) for m, d in leaks.items() if d}


def _is_package(module: str) -> bool:
    return _modules()[module].name == "__init__.py"


def _dynamic_imports(tree: ast.Module) -> Iterator[str]:
    """Module names given as constants to importlib.import_module / __import__."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.args[0].value


def test_pipeline_stages_never_imports_cdcserver() -> None:
    """pipeline_stages/ is pure and synchronous (no asyncio, sockets, subprocesses): no module
    of it imports cdcserver or any module of it, at module level, inside functions or for
    types only, with no exception."""
    graph = import_graph()
    found = {
        m: sorted(d for d in deps if d == "cdcserver" or d.startswith("cdcserver."))
        for m, deps in graph.items() if m.split(".")[0] == "pipeline_stages"
    }
    for module, path in _modules().items():
        if module.split(".")[0] == "pipeline_stages":
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found[module] += [n for n in _dynamic_imports(tree) if n.split(".")[0] == "cdcserver"]
    assert not {m: d for m, d in found.items() if d}
