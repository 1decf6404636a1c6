"""No import circles among cdcserver/ and pipeline_stages/ modules.

Read from the source with `ast`, not by importing: an edge is an import that runs when the
module is imported (its body, including `if`/`try`/`with`/class bodies), to a module of the two
packages. Imports under `if TYPE_CHECKING:` never run and are left out; so is a module's
implicit dependence on its own parent packages (a package's __init__ re-exporting its
submodules is no circle). Imports inside functions are the way to defer a dependency; they
may close a circle only where listed below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cdcserver", "pipeline_stages")

# Circles closed only by an import inside a function (the module-level graph has none).
KNOWN_DEFERRED_CIRCLES: set[frozenset[str]] = {
    # cli.py's `spark-replay` runs replay.py, whose `__main__` entry calls back cli.main
    # (being untangled by the helper that owns spark/).
    frozenset({"cdcserver.spark.cli", "cdcserver.spark.replay"}),
}


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


def _imports(tree: ast.Module, *, deferred: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run at import time; with `deferred`, those inside functions too."""

    def visit(body: list[ast.stmt], in_function: bool) -> Iterator[ast.Import | ast.ImportFrom]:
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                if deferred or not in_function:
                    yield stmt
            elif isinstance(stmt, ast.If):
                if not _is_type_checking(stmt.test):
                    yield from visit(stmt.body, in_function)
                yield from visit(stmt.orelse, in_function)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(stmt.body, True)
            else:
                for field in ("body", "orelse", "finalbody"):
                    yield from visit(getattr(stmt, field, []), in_function)
                for handler in getattr(stmt, "handlers", []):
                    yield from visit(handler.body, in_function)
                for case in getattr(stmt, "cases", []):
                    yield from visit(case.body, in_function)

    yield from visit(tree.body, False)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
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


def import_graph(*, deferred: bool) -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        own_packages = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        edges: set[str] = set()
        for node in _imports(tree, deferred=deferred):
            for target in _targets(module, path.name == "__init__.py", node):
                parts = target.split(".")
                # the module and every package on its way (importing a.b.c runs a and a.b)
                for i in range(1, len(parts) + 1):
                    name = ".".join(parts[:i])
                    if name in modules:
                        edges.add(name)
        graph[module] = edges - own_packages - {module}
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


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & inside))}" for m in component)


def test_the_graph_sees_the_projects_imports() -> None:
    graph = import_graph(deferred=False)
    assert "pipeline_stages.errors" in graph["pipeline_stages.pipeline"] or any(
        "pipeline_stages.errors" in graph[m] for m in graph if m.startswith("pipeline_stages.")
    )
    assert "cdcserver.roles" in graph["cdcserver.config"]
    assert "pipeline_stages.error_codes" in graph["pipeline_stages.errors"]
    # a circle is found when there is one
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_at_module_level() -> None:
    graph = import_graph(deferred=False)
    found = circles(graph)
    assert not found, "\n".join(_describe(c, graph) for c in found)


def test_imports_inside_functions_close_only_the_known_circles() -> None:
    graph = import_graph(deferred=True)
    found = [c for c in circles(graph) if frozenset(c) not in KNOWN_DEFERRED_CIRCLES]
    assert not found, "\n".join(_describe(c, graph) for c in found)


# pipeline_stages/ modules that reach into cdcserver/ (the pipeline is meant to stand alone,
# for Spark): none since $regex moved to pipeline_stages/regex.py.
KNOWN_LAYER_LEAKS: dict[str, set[str]] = {}


def test_pipeline_stages_imports_nothing_else_from_cdcserver() -> None:
    graph = import_graph(deferred=True)
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
    of it imports cdcserver or any module of it, at module level or inside functions, with no
    exception."""
    graph = import_graph(deferred=True)
    found = {
        m: sorted(d for d in deps if d == "cdcserver" or d.startswith("cdcserver."))
        for m, deps in graph.items() if m.split(".")[0] == "pipeline_stages"
    }
    for module, path in _modules().items():
        if module.split(".")[0] == "pipeline_stages":
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found[module] += [n for n in _dynamic_imports(tree) if n.split(".")[0] == "cdcserver"]
    assert not {m: d for m, d in found.items() if d}
