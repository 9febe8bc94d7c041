"""gpubot's import graph, drawn from the code: each package file parsed once per run.

``python -m tests.import_graph`` prints the graph of layers as a Mermaid diagram (the one in
the README's Architecture section) and then every module-level cycle and every import that
climbs a layer, if any; ``tests/unit/test_layers.py`` holds the rules over the same graph.

Every import counts, those under ``if TYPE_CHECKING:`` and inside functions included: a cycle
hidden from the interpreter is still a cycle in the design.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "gpubot"

# The design's layers, lowest first (shared/design.md). A file may import its own layer's unit
# and any lower rank, never a higher one nor another unit of its own rank.
RANKS: dict[str, int] = {
    "errors": 0,
    "core": 1,
    "config": 2,
    "store": 3,
    "transport": 3,
    "sources": 3,
    "scheduler": 3,
    "metrics": 3,
    "services": 4,
    "chat": 5,
    "slack": 6,
    "console": 6,
    "matrix": 6,
    "app": 7,
    "cli": 8,
    "__main__": 9,
    "__init__": 0,
}
FRONT_ENDS = ("slack", "console", "matrix")
# Modules that belong to another unit's layer: the composition root's helpers.
UNITS = {
    "lifecycle": "app",
    "metrics_claims": "metrics",
}


@functools.cache
def tree(path: Path) -> ast.Module:
    """Return the parsed file (once per run, whatever number of rules read it)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def package_files(root: Path = PKG) -> list[Path]:
    """Return every ``.py`` file of the package, sorted."""
    return sorted(root.rglob("*.py"))


def module_name(path: Path) -> str:
    """Return ``gpubot.chat.flows`` for ``gpubot/chat/flows.py`` (a package: its folder)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    """Return the module an ``ImportFrom`` names, relative imports resolved."""
    if node.level == 0:
        return node.module or ""
    base = here.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported(path: Path) -> set[str]:
    """Return every module a package file imports."""
    return imports_of(tree(path), module_name(path), path.name == "__init__.py", _modules())


def imports_of(module: ast.Module, here: str, is_package: bool, known: frozenset[str]) -> set[str]:
    """Return every module ``module`` (named ``here``) imports; ``from a import b`` counts
    ``a.b`` when that is one of the ``known`` modules, and ``a`` only for a name that is not."""
    out: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = _absolute(node, here, is_package)
            subs = {f"{mod}.{a.name}" for a in node.names} & known
            out.update(subs)
            if len(subs) < len(node.names):  # a name from the module itself, not a submodule
                out.add(mod)
    return out


@functools.cache
def _modules() -> frozenset[str]:
    return frozenset(module_name(p) for p in package_files())


def module_graph() -> dict[str, set[str]]:
    """Return the package's modules, each with the package modules it imports."""
    known = _modules()
    return {
        module_name(p): {m for m in imported(p) if m in known and m != module_name(p)}
        for p in package_files()
    }


def unit(module: str) -> str:
    """Return the layer unit of a package module (``gpubot.cli.console`` is a front end)."""
    parts = module.split(".")[1:] or ["__init__"]
    return UNITS.get(".".join(parts[:2]), UNITS.get(parts[0], parts[0]))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def climbs(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Return every import from a module to one of a higher layer, or to another unit of the
    same layer (adapters do not import each other, nor front ends)."""
    bad = []
    for src, targets in sorted(graph.items()):
        a = unit(src)
        for t in sorted(targets):
            b = unit(t)
            if a != b and (RANKS.get(b, 99) > RANKS.get(a, -1) or RANKS.get(b) == RANKS.get(a)):
                bad.append((src, t))
    return bad


def layer_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Return the distinct (unit, unit) imports between layers, sorted."""
    edges = {(unit(s), unit(t)) for s, ts in graph.items() for t in ts if unit(s) != unit(t)}
    return sorted(e for e in edges if "__init__" not in e)


def mermaid(graph: dict[str, set[str]]) -> Iterator[str]:
    """Yield the layer graph as Mermaid lines: one line per unit, highest layer first, its
    targets highest first (the README's Architecture section holds this drawing)."""
    yield "graph TD"
    targets: dict[str, list[str]] = {}
    for a, b in layer_edges(graph):
        targets.setdefault(a, []).append(b)
    for a in sorted(targets, key=_highest_first):
        bs = " & ".join(b.strip("_") for b in sorted(targets[a], key=_highest_first))
        yield f"  {a.strip('_')} --> {bs}"


def _highest_first(unit: str) -> tuple[int, str]:
    return -RANKS.get(unit, 0), unit


def readme_drawing(readme: str) -> list[str]:
    """Return the lines of the README's Mermaid block (empty if there is none)."""
    if "```mermaid\n" not in readme:
        return []
    return readme.split("```mermaid\n", 1)[1].split("```", 1)[0].splitlines()


def main() -> int:
    graph = module_graph()
    print("\n".join(mermaid(graph)))
    found = [" → ".join(c) for c in cycles(graph)] + [f"{a} ⇡ {b}" for a, b in climbs(graph)]
    for line in found:
        print("!", line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
