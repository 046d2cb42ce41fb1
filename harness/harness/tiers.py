"""Which test tier a test belongs to, decided from what it runs (tests/conftest.py marks each test):
`pure` (in-process, seconds), `process` (real servers, the trainer stack) or `cluster` (tests/e2e).

A fixture that starts a process says so with `@process_tier`; a test module is `process` when
it imports, itself or through our own packages' module-level imports, a launcher of the harness
or a heavy library."""

from __future__ import annotations

import ast
import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

TIERS = {
    "pure": "in-process tests, no servers and no trainer stack (seconds): `make test-fast`",
    "process": "real sandbox servers, verl/vLLM/torch, no cluster",
    "cluster": "runs against the real local control plane (harness.localcluster)",
}

# what makes a module's tests `process`: the libraries of the trainer stack ...
HEAVY_LIBRARIES = frozenset({"verl", "vllm", "torch", "ray", "transformers"})
# ... and the modules that start servers or worker processes
LAUNCHERS = frozenset(
    {
        "harness.sandbox_process",
        "harness.operator_process",
        "harness.training_cluster",
        "tool_sandbox.sandbox.pool",
        "harness.test_streams",
    }
)
# our own distributions' packages, whose module-level imports are followed
OWN_PACKAGES = frozenset(
    {"harness", "trainer_entry", "tool_sandbox", "toolrl_operator", "toolrl_api", "chartgen"}
)

F = TypeVar("F", bound=Callable[..., Any])


def process_tier(fixture: F) -> F:
    """Mark a fixture function (below `@pytest.fixture`) as one of the process tier: it starts real
    processes or loads the trainer stack."""
    fixture.process_tier = True  # type: ignore[attr-defined]
    return fixture


def uses_processes(item: Any) -> bool:
    """Whether a collected pytest item uses (directly or through other fixtures) a fixture
    marked `@process_tier`."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        getattr(fixturedef.func, "process_tier", False)
        for fixturedefs in info.name2fixturedefs.values()
        for fixturedef in fixturedefs
    )


def _imports(tree: ast.AST, package: str, top_level_only: bool) -> set[str]:
    """Absolute names imported in `tree` (relative imports resolved against `package`)."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))  # type: ignore[attr-defined]
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _is_process(name: str) -> bool:
    return name.split(".")[0] in HEAVY_LIBRARIES or any(
        name == launcher or name.startswith(launcher + ".") for launcher in LAUNCHERS
    )


_SEEN: dict[str, bool] = {}


def _own_module_is_process(name: str) -> bool:
    """Whether importing our module `name` imports a launcher or heavy library (module level)."""
    if name in _SEEN:
        return _SEEN[name]
    _SEEN[name] = False  # an import cycle adds nothing the first visit does not find
    _SEEN[name] = _own_module_finds_process(name)
    return _SEEN[name]


def _source(name: str) -> tuple[Path, bool] | None:
    """The source file of our module `name` and whether it is a package, found without importing
    anything (importing would load what is being looked for); None for a name that is no module
    (`from package import function`)."""
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name: found, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations)))
    path = directory.joinpath(*rest)
    if (path / "__init__.py").is_file():
        return path / "__init__.py", True
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py"), False
    return None


def _own_module_finds_process(name: str) -> bool:
    found = _source(name)
    if found is None:
        return False
    path, is_package = found
    package = name if is_package else name.rpartition(".")[0]
    return _any_process(_imports(ast.parse(path.read_text(), str(path)), package, top_level_only=True))


def _any_process(names: set[str]) -> bool:
    for name in names:
        if _is_process(name):
            return True
        if name.split(".")[0] in OWN_PACKAGES and _own_module_is_process(name):
            return True
    return False


@functools.cache
def module_tier(path: Path) -> str:
    """`process` or `pure` for a test module (or conftest), from every import in its source."""
    tree = ast.parse(path.read_text(), str(path))
    return "process" if _any_process(_imports(tree, "", top_level_only=False)) else "pure"
