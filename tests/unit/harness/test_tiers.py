"""harness.tiers: which tier a test module or a test's fixtures put it in, read from sources."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import tiers
from harness.tiers import module_tier, process_tier, uses_processes


def _module(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "test_example.py"
    path.write_text(source)
    return path


@pytest.mark.parametrize(
    "source",
    [
        "import verl\n",
        "from vllm import LLM\n",
        "import torch.nn as nn\n",
        "from harness.sandbox_process import SandboxProcess\n",
        "from harness import operator_process\n",
        "def test_x():\n    from harness.training_cluster import training_cluster\n",
        "from tool_sandbox.sandbox.pool import Pool\n",
        # through our own package: trainer_entry.runner imports verl at module level
        "from trainer_entry.runner import ToolRLTaskRunner\n",
    ],
)
def test_modules_that_start_processes_or_load_the_trainer_stack_are_process(
    tmp_path: Path, source: str
) -> None:
    assert module_tier(_module(tmp_path, source)) == "process"


@pytest.mark.parametrize(
    "source",
    [
        "import json\nimport yaml\n",
        "from harness.localcluster.cluster import free_port\n",
        "from trainer_entry.spec import check_spec\n",
        "from toolrl_operator.builders import build_children\n",
        "from tool_sandbox.config import ToolConfig\n",
    ],
)
def test_in_process_modules_are_pure(tmp_path: Path, source: str) -> None:
    assert module_tier(_module(tmp_path, source)) == "pure"


def test_the_tier_is_read_without_importing_the_module_it_names(tmp_path: Path) -> None:
    """Looking up trainer_entry.runner must not import it (it would load verl, the thing looked for)."""
    import sys

    tiers._SEEN.clear()
    before = "trainer_entry.runner" in sys.modules
    assert module_tier(_module(tmp_path, "from trainer_entry.runner import X\nimport os\n")) == "process"
    assert ("trainer_entry.runner" in sys.modules) == before


def _item(*fixture_funcs: object) -> SimpleNamespace:
    defs = {f"f{i}": [SimpleNamespace(func=func)] for i, func in enumerate(fixture_funcs)}
    return SimpleNamespace(_fixtureinfo=SimpleNamespace(name2fixturedefs=defs))


def test_a_test_using_a_process_tier_fixture_is_process() -> None:
    @process_tier
    def server() -> None: ...

    def secret() -> None: ...

    assert uses_processes(_item(secret, server)) is True
    assert uses_processes(_item(secret)) is False


def test_every_collected_test_has_exactly_one_tier(request: pytest.FixtureRequest) -> None:
    marks = {mark.name for mark in request.node.iter_markers()} & set(tiers.TIERS)
    assert marks == {"pure"}
