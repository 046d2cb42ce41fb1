"""The recipes ported from verl (examples/recipes/) run their own tools: the GSM8K recipe's function
tool, from its ConfigMap, in a real tool pool, scores answers against each row's ground truth."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from harness.sandbox_process import SandboxProcess
from harness.tiers import process_tier

RECIPE = Path(__file__).resolve().parents[3] / "examples" / "recipes" / "gsm8k-multiturn.yaml"


@pytest.fixture(scope="module")
@process_tier
def gsm8k_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    """The pool as the operator starts it for the recipe: the job's tool entry, its source mounted
    from the recipe's ConfigMap."""
    docs = list(yaml.safe_load_all(RECIPE.read_text()))
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    [tool] = next(d for d in docs if d["kind"] == "ToolRLJob")["spec"]["tools"]
    assert config_map["metadata"]["name"] == tool["function"]["configMap"]["name"]
    root = tmp_path_factory.mktemp("recipe-pool")
    source = root / tool["function"]["configMap"]["key"]
    source.write_text(config_map["data"][source.name])
    with SandboxProcess.start(root, tools=[{**tool, "source": str(source)}]) as pool:
        yield pool


@pytest.mark.parametrize(
    ("answer", "truth", "said"),
    [
        ("#### 72", "72", "Current parsed answer='72' reward=1.0"),
        ("48 + 24 = 72, so #### 1,072", "1072", "Current parsed answer='1072' reward=1.0"),
        ("#### 70", "72", "Current parsed answer='70' reward=0.0"),
        ("I do not know", "72", "Current parsed answer='' reward=0.0"),
    ],
)
def test_the_gsm8k_recipes_tool_scores_against_the_rows_ground_truth(
    gsm8k_pool: SandboxProcess, answer: str, truth: str, said: str
) -> None:
    body = {"tool": "calc_gsm8k_reward", "input": {"answer": answer}, "sample": {"ground_truth": truth}}
    result = gsm8k_pool.post("/v1/execute", body).json()
    assert (result["status"], result["output"]) == ("ok", said), result


def test_the_gsm8k_recipes_tool_takes_no_ground_truth_from_the_model(gsm8k_pool: SandboxProcess) -> None:
    forged = {"answer": "#### 1", "ground_truth": "1"}
    body = {"tool": "calc_gsm8k_reward", "input": forged, "sample": {"ground_truth": "72"}}
    result = gsm8k_pool.post("/v1/execute", body).json()
    assert (result["status"], result["fault"]) == ("error", "code") and "reward=1.0" not in result["output"]
