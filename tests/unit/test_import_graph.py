"""Each package's modules import one another without cycles, function-level imports included; and in
tool_sandbox nothing below the protocols imports them: of the modules outside tool_sandbox/api/, only
the entry point (`__main__`, the composition root that starts api/app.py's server) imports from
tool_sandbox.api. Read from the sources by scripts/import_cycles.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
# the three images' packages, the chart's generator and the test harness
PACKAGES = [
    "operator/toolrl_operator",
    "tool_sandbox/tool_sandbox",
    "trainer_entry/trainer_entry",
    "charts/chartgen",
    "harness/harness",
]
PACKAGE = REPO / "tool_sandbox" / "tool_sandbox"
API = "tool_sandbox.api"


def _import_cycles() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", REPO / "scripts" / "import_cycles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _in_api(module: str) -> bool:
    return module == API or module.startswith(API + ".")


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_has_no_import_cycles(package: str) -> None:
    assert _import_cycles().main([str(REPO / package)]) == 0


def test_only_the_protocols_and_the_entry_point_import_the_api() -> None:
    graph = _import_cycles().import_graph(PACKAGE)
    importers = {
        module
        for module, imported in graph.items()
        if not _in_api(module) and any(_in_api(name) for name in imported)
    }
    assert importers == {"tool_sandbox.__main__"}


def test_the_script_finds_cycles_through_function_level_and_relative_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for path, source in {
        "__init__.py": "",
        "a.py": "from pkg.sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "def f():\n    from ..c import value\n",
        "c.py": "import pkg.a\nvalue = 1\n",
        "d.py": "from pkg import a, c\n",
    }.items():
        (package / path).write_text(source)
    import_cycles = _import_cycles()
    graph = import_cycles.import_graph(package)
    assert graph["pkg.d"] == {"pkg.a", "pkg.c"}
    assert import_cycles.cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert import_cycles.main([str(package)]) == 1
