"""The three test tiers, each test marked by where it lives and what it runs (never by hand):

- `cluster`: everything under tests/e2e (the local control plane; ~25 min);
- `process`: a test that starts real servers or loads the trainer stack: it uses a fixture marked
  `@process_tier` (harness.tiers), or its module imports a process launcher of the harness or
  a heavy library (verl, vLLM, torch, Ray, transformers), itself or through our own packages;
- `pure`: the rest (seconds).

`make test` runs all three, `make test-fast` the pure tier (`pytest -m pure`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.tiers import TIERS, module_tier, uses_processes

E2E = Path(__file__).parent / "e2e"


def pytest_configure(config: pytest.Config) -> None:
    for name, description in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With `-m pure` alone, modules whose every test is of another tier are not even imported
    (importing verl alone takes tens of seconds); their tests are deselected either way."""
    if config.option.markexpr != "pure" or not collection_path.name.startswith("test_"):
        return None
    if E2E in collection_path.parents or module_tier(collection_path) == "process":
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        if E2E in path.parents:
            tier = "cluster"
        elif module_tier(path) == "process" or uses_processes(item):
            tier = "process"
        else:
            tier = "pure"
        item.add_marker(getattr(pytest.mark, tier))
