"""Import cycles inside a Python package: `python scripts/import_cycles.py PACKAGE_DIR...`.

Reads every module's source (nothing is imported), takes each import statement, at module level or
inside a function, that names a module of the same package, and prints the strongly connected
components of that graph with more than one module. Exits 1 when there is any.

An import names the module it spells (`from a.b import c` names `a.b.c` when that is a module,
else `a.b`); the packages above it, which Python initialises on the way, are not counted."""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def modules(package_dir: Path) -> dict[str, Path]:
    """Every module of the package in `package_dir` by its dotted name (the directory's name first)."""
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(tree: ast.AST, package: str, known: set[str]) -> set[str]:
    """The modules of `known` that the imports in `tree` name (relative ones resolved against
    `package`): `from a.b import c` names a.b.c when that is a module, else a.b."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
    return found & known


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the other modules of the same package it imports."""
    paths = modules(package_dir)
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = imported_modules(tree, package, set(paths)) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), largest first."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = lowlink[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                lowlink[module] = min(lowlink[module], lowlink[imported])
            elif imported in stack:
                lowlink[module] = min(lowlink[module], index[imported])
        if lowlink[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found, key=lambda component: (-len(component), component))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    status = 0
    for package_dir in map(Path, argv):
        graph = import_graph(package_dir)
        found = cycles(graph)
        sizes = ", ".join(str(len(component)) for component in found) or "none"
        print(f"{package_dir}: {len(graph)} modules, {len(found)} import cycle(s) (modules in each: {sizes})")
        for component in found:
            print("  " + " <-> ".join(component))
        status |= bool(found)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
