"""The project's import graph, drawn from source with ``ast`` (nothing is imported).

Every ``import`` counts wherever it sits — at module level or hidden inside a function — except
the two places Python gives for imports that must not load at import time: an
``if TYPE_CHECKING:`` block and an ``AppConfig.ready`` method. Modules are the project's own
(third-party and standard-library imports are left out); an app is a module's top-level package.

``python -m tools.importgraph`` prints the summary: cycles between modules and between apps,
the arrows between apps, and any import hidden inside a function.
"""

import ast
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {".venv", "node_modules", "static", "templates", ".git", "__pycache__"}
# Support code that only points inward: drawn and checked for cycles, left out of the app summary.
NOT_APPS = {"tests", "bench", "tools", "manage"}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    in_function: bool


@dataclass
class Graph:
    modules: set[str] = field(default_factory=set)
    imports: list[Import] = field(default_factory=list)

    def arrows(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for imp in self.imports:
            if imp.source != imp.target:
                out[imp.source].add(imp.target)
        return out

    def app_arrows(self, *, apps_only: bool = False) -> dict[tuple[str, str], int]:
        """(from app, to app) -> how many module imports make that arrow."""
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for imp in self.imports:
            a, b = app_of(imp.source), app_of(imp.target)
            if a != b and not (apps_only and (a in NOT_APPS or b in NOT_APPS)):
                counts[(a, b)] += 1
        return dict(counts)

    def hidden(self) -> list[Import]:
        return [imp for imp in self.imports if imp.in_function]


def app_of(module: str) -> str:
    return module.split(".", 1)[0]


def module_files(root: Path = ROOT) -> Iterator[tuple[str, Path]]:
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIPPED_DIRS.intersection(rel.parts[:-1]):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts:
            yield ".".join(parts), path


def build(root: Path = ROOT) -> Graph:
    files = dict(module_files(root))
    graph = Graph(modules=set(files))
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, in_function in _imports(tree):
            for target in _targets(node, module=module, is_package=is_package, known=graph.modules):
                graph.imports.append(Import(module, target, node.lineno, in_function))
    return graph


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it sits inside a function; exempt places are skipped."""

    def walk(node: ast.AST, in_function: bool, in_appconfig: bool) -> Iterator:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, in_function
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                yield from _walk_list(child.orelse, in_function, in_appconfig)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, in_function, _is_appconfig(child))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if not (in_appconfig and child.name == "ready"):
                    yield from walk(child, True, False)
            else:
                yield from walk(child, in_function, in_appconfig)

    def _walk_list(nodes: Iterable[ast.AST], in_function: bool, in_appconfig: bool) -> Iterator:
        for n in nodes:
            holder = ast.Module(body=[n], type_ignores=[])
            yield from walk(holder, in_function, in_appconfig)

    yield from walk(tree, False, False)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_appconfig(cls: ast.ClassDef) -> bool:
    return any(
        (isinstance(b, ast.Name) and b.id == "AppConfig")
        or (isinstance(b, ast.Attribute) and b.attr == "AppConfig")
        for b in cls.bases
    )


def _targets(
    node: ast.Import | ast.ImportFrom, *, module: str, is_package: bool, known: set[str]
) -> list[str]:
    """The project modules an import statement loads (the most specific one per imported name)."""
    if isinstance(node, ast.Import):
        return [m for m in (_deepest(alias.name, known) for alias in node.names) if m]
    base = _absolute(node, module=module, is_package=is_package)
    found = []
    for alias in node.names:
        candidate = f"{base}.{alias.name}" if base else alias.name
        target = candidate if candidate in known else _deepest(base, known)
        if target:
            found.append(target)
    return found


def _absolute(node: ast.ImportFrom, *, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def _deepest(dotted: str, known: set[str]) -> str | None:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in known:
            return name
    return None


def cycles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one node (or a node importing itself), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm, iterative over edges would matter only past ~1000 deep
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(arrows.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in arrows.get(v, ()):
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(set(arrows) | {w for ws in arrows.values() for w in ws}):
        if v not in index:
            visit(v)
    return sorted(groups)


def shortest_loop(group: list[str], arrows: dict[str, set[str]]) -> list[str]:
    """One concrete loop through the group's first member, as a path that returns to its start."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(arrows.get(v, ()) & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return [start]


def app_graph(graph: Graph, *, apps_only: bool = False) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for a, b in graph.app_arrows(apps_only=apps_only):
        out[a].add(b)
    return out


def summary(graph: Graph) -> str:
    arrows = graph.arrows()
    module_cycles = cycles(arrows)
    apps = app_graph(graph, apps_only=True)
    app_cycles = cycles(apps)
    lines = [f"modules: {len(graph.modules)}, imports: {len(graph.imports)}"]
    lines.append(f"module cycles: {len(module_cycles)}")
    for group in module_cycles:
        lines.append(f"  {len(group)} modules: {', '.join(group)}")
        lines.append(f"    e.g. {' -> '.join(shortest_loop(group, arrows))}")
    lines.append(f"app cycles: {len(app_cycles)}")
    for group in app_cycles:
        lines.append(f"  {', '.join(group)}   e.g. {' -> '.join(shortest_loop(group, apps))}")
    lines.append("arrows between apps (module imports):")
    for (a, b), n in sorted(graph.app_arrows(apps_only=True).items()):
        back = " (both ways)" if a in apps.get(b, ()) else ""
        lines.append(f"  {a} -> {b}: {n}{back}")
    hidden = [imp for imp in graph.hidden() if app_of(imp.source) not in NOT_APPS]
    lines.append(f"imports inside functions (outside tests, bench, tools): {len(hidden)}")
    for imp in hidden:
        lines.append(f"  {imp.source}:{imp.line} -> {imp.target}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(build()))
