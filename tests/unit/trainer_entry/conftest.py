"""Fixtures: the tiny local model, a real tool_sandbox server process (nothing is downloaded), and the
Ray nodes of the RayJob the operator builds for a manifest."""

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
from harness.sandbox_process import SandboxProcess
from harness.tiers import process_tier
from trainer_entry.tiny_model import build_tiny_model

CRD = Path(__file__).resolve().parents[3] / "crds" / "toolrl.dev_toolrljobs.yaml"


@pytest.fixture(scope="session")
@process_tier
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model"))


SANDBOX_TOOLS = [
    {"name": "python", "type": "python", "timeoutSeconds": 1, "memoryLimitMiB": 256, "maxOutputBytes": 4096}
]
# a function tool with a per-sample value, as verl's GSM8K tool: the row's ground truth (keyword-only)
GSM8K_TOOL_SOURCE = """\
def calc_gsm8k_reward(answer: str, *, ground_truth: str) -> str:
    reward = 1.0 if answer.strip().lstrip("#").strip() == ground_truth else 0.0
    return f"Current parsed answer={answer!r} reward={reward}"
"""
GSM8K_TOOL = {
    "name": "calc_gsm8k_reward",
    "type": "function",
    "description": "Score an answer to the question",
    "function": {"configMap": {"name": "tools", "key": "gsm8k.py"}},
    "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
}


@pytest.fixture
def gsm8k_tool() -> dict:
    """The spec's entry of the sandbox's function tool with a per-sample value."""
    return copy.deepcopy(GSM8K_TOOL)


@pytest.fixture(scope="session")
@process_tier
def sandbox(tmp_path_factory):
    """A real tool_sandbox server process; yields its base URL."""
    root = tmp_path_factory.mktemp("sandbox")
    (root / "gsm8k.py").write_text(GSM8K_TOOL_SOURCE)
    tools = [*SANDBOX_TOOLS, {**GSM8K_TOOL, "source": str(root / "gsm8k.py")}]
    with SandboxProcess.start(root, tools=tools) as server:
        yield server.url


@pytest.fixture(scope="session")
def operator_nodes() -> Callable[[dict], list[tuple[float, float]]]:
    """The Ray nodes KubeRay starts for a ToolRLJob manifest as the operator builds its RayJob (the CRD's
    defaults applied first, as the API server does): (Ray CPUs, GPUs) of the head, then of each worker.
    Ray CPUs as rayStartParams' num-cpus; without it, as KubeRay: the CPU limit, else the request."""
    import yaml
    from toolrl_api.defaulting import apply_defaults
    from toolrl_operator.job import parse_job
    from toolrl_operator.rayjob import build_rayjob
    from toolrl_operator.settings import Settings

    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    settings = Settings(trainer_image="trainer:test", tool_sandbox_image="sandbox:test")

    def cpus(group: dict) -> float:
        params = group["rayStartParams"]
        if "num-cpus" in params:
            return float(params["num-cpus"])
        resources = group["template"]["spec"]["containers"][0]["resources"]
        return float((resources.get("limits") or {}).get("cpu") or resources["requests"]["cpu"])

    def gpus(group: dict) -> float:  # the operator's rule: a CPU worker asks for no nvidia.com/gpu
        limits = group["template"]["spec"]["containers"][0]["resources"].get("limits") or {}
        return float(limits.get("nvidia.com/gpu", 0))

    def nodes(job_doc: dict) -> list[tuple[float, float]]:
        body = copy.deepcopy(job_doc)
        apply_defaults(schema["properties"]["spec"], body["spec"])
        body["metadata"]["uid"] = "uid-1"
        cluster = build_rayjob(parse_job(body), settings)["spec"]["rayClusterSpec"]
        head = cluster["headGroupSpec"]
        workers = [(cpus(g), gpus(g)) for g in cluster["workerGroupSpecs"] for _ in range(g["replicas"])]
        return [(cpus(head), gpus(head)), *workers]

    return nodes
