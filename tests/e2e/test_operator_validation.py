"""The apiserver rejects invalid ToolRLJobs with the CRD's own messages (one case per rule).

Server-side dry-run runs the real admission chain: schema, defaults, CEL. No operator needed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.operator_process import install_crd

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "toolrljob.yaml"
DELETE = object()
PYTHON = {"name": "python", "type": "python"}


def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def changed(changes: dict[str, Any]) -> dict[str, Any]:
    """The example with dotted-path changes applied (DELETE removes the field)."""
    job = example()
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = job
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return job


CASES: list[tuple[str, dict[str, Any], str]] = [
    # CEL rules
    ("name-length", {"metadata.name": "a" * 48}, "metadata.name must be at most 47 characters"),
    ("name-dns1035", {"metadata.name": "9lives"}, "must start with a lowercase letter"),
    ("tp-divides-gpus", {"rollout.tensorParallelSize": 3}, "must divide cluster.workers.gpusPerWorker"),
    (
        "cpu-tp-is-1",
        {"cluster.workers": {"gpusPerWorker": 0}, "rollout.engine": "hf", "rollout.tensorParallelSize": 2},
        "rollout.tensorParallelSize must be 1 when cluster.workers.gpusPerWorker is 0",
    ),
    (
        "protocol-needs-python",
        {
            "rollout.protocol": "python-tags",
            "reward.preset": "exact-match",
            "tools": [{"name": "web", "type": "http", "url": "http://x:80"}],
        },
        "rollout.protocol tool-tags and python-tags run code",
    ),
    (
        "code-execution-needs-python",
        {"tools": [{"name": "web", "type": "http", "url": "http://x:80"}]},
        "reward.preset code-execution runs code in the tool pool",
    ),
    ("parquet-files", {"data.trainFiles": ["/data/train.csv"]}, "data files must be .parquet files"),
    ("epochs-and-steps", {"algorithm.totalTrainingSteps": 10}, "set exactly one of spec.algorithm"),
    ("epochs-or-steps", {"algorithm.totalEpochs": DELETE}, "set exactly one of spec.algorithm"),
    ("group-needs-2-rollouts", {"algorithm.rolloutsPerPrompt": 1}, "rolloutsPerPrompt to 2 or more"),
    ("mini-batch-divides", {"algorithm.ppoMiniBatchSize": 100}, "must divide spec.algorithm.trainBatchSize"),
    ("unique-tool-names", {"tools": [PYTHON, PYTHON]}, "tool names must be unique"),
    ("http-needs-url", {"tools": [PYTHON, {"name": "web", "type": "http"}]}, "a tool of type http needs url"),
    ("search-needs-corpus", {"tools": [PYTHON, {"name": "s", "type": "search"}]}, "needs corpus"),
    (
        "url-only-for-http",
        {"tools": [{"name": "python", "type": "python", "url": "http://x:80"}]},
        "url is only used by tools of type http",
    ),
    (
        "url-is-http",
        {"tools": [PYTHON, {"name": "web", "type": "http", "url": "ftp://x/y"}]},
        "url must be an absolute http:// or https:// URL",
    ),
    ("tool-name-identifier", {"tools": [{"name": "my-tool", "type": "python"}]}, "must be an identifier"),
    ("mcp-needs-server", {"tools": [PYTHON, {"name": "m", "type": "mcp"}]}, "type mcp needs mcp.url"),
    (
        "mcp-only-for-mcp",
        {"tools": [{**PYTHON, "mcp": {"url": "http://m.tools.svc:8000/mcp"}}]},
        "mcp is only used by tools of type mcp",
    ),
    (
        "observation-format-only-for-python",
        {"tools": [PYTHON, {"name": "s", "type": "search", "corpus": "/c", "observationFormat": "default"}]},
        "observationFormat is only used by tools of type python",
    ),
    (
        "mcp-url-is-http",
        {"tools": [PYTHON, {"name": "m", "type": "mcp", "mcp": {"url": "m.tools.svc:8000"}}]},
        "mcp.url must be an absolute http:// or https:// URL",
    ),
    (
        "mcp-tool-names",
        {"tools": [PYTHON, {"name": "m", "type": "mcp", "mcp": {"url": "http://m", "tools": ["a b"]}}]},
        "mcp.tools names a remote tool as the server lists it",
    ),
    (
        "mcp-tools-unique",
        {"tools": [PYTHON, {"name": "m", "type": "mcp", "mcp": {"url": "http://m", "tools": ["a", "a"]}}]},
        "Duplicate value",
    ),
    ("pool-min-le-max", {"toolPool.replicas": {"min": 5, "max": 4}}, "min must be less than or equal"),
    (
        "target-within-capacity",
        {"toolPool.targetConcurrencyPerReplica": 40, "toolPool.capacityPerReplica": 32},
        "targetConcurrencyPerReplica must not exceed spec.toolPool.capacityPerReplica",
    ),
    ("custom-needs-configmap", {"reward.preset": "custom"}, "preset custom needs reward.custom"),
    ("val-freq-nonzero", {"data.valFreq": 0}, "valFreq must be a positive step count"),
    (
        "val-freq-needs-val-files",
        {"data.valFreq": 5, "data.valFiles": DELETE},
        "data.valFreq needs data.valFiles",
    ),
    ("save-freq-nonzero", {"checkpoint": {"saveFreq": 0}}, "saveFreq must be a positive step"),
    (
        "save-freq-needs-volume",
        {"checkpoint": {"saveFreq": 10}},
        "checkpoint.saveFreq needs checkpoint.volume",
    ),
    (
        "cpus-per-gpu-request",
        {"cluster.workers.resources": {"requests": {"cpu": "16"}}},
        "a GPU worker needs 3 CPUs per GPU + 2",
    ),
    (
        # exactly 3 per GPU: verl's group takes every CPU, the node's storage unit and server actors wait
        "cpus-per-gpu-request-exactly-3",
        {"cluster.workers.resources": {"requests": {"cpu": "24"}}},
        "(26 for 8 GPUs)",
    ),
    (
        "cpus-per-gpu-limit",
        {"cluster.workers.resources": {"requests": {"cpu": "32"}, "limits": {"cpu": "20"}}},
        "a GPU worker needs 3 CPUs per GPU + 2",
    ),
    ("sglang-not-yet", {"rollout.engine": "sglang"}, "sglang is not supported yet"),
    ("engine-known", {"rollout.engine": "tgi"}, "rollout.engine must be vllm or hf"),
    (
        "separate-async-needs-rollout-workers",
        {"trainer.mode": "separate-async"},
        "rolloutWorkers (the worker group that generates) is required with trainer.mode separate-async",
    ),
    (
        "colocate-async-needs-2-versions",
        {"trainer.mode": "colocate-async", "trainer.async": {"maxPolicyVersions": 1}},
        "set maxPolicyVersions to 2 or more, or use trainer.mode sync",
    ),
    ("mode-enum", {"trainer.mode": "async"}, 'Unsupported value: "async"'),
    ("on-stale-enum", {"trainer.async": {"onStale": "keep"}}, 'Unsupported value: "keep"'),
    ("resume-value", {"checkpoint": {"resume": "sometimes"}}, "checkpoint.resume must be auto, disable"),
    ("extra-args-hydra", {"trainer": {"extraArgs": ["--lr 1"]}}, "must be a Hydra override"),
    # schema constraints
    ("enum", {"rollout.protocol": "json"}, 'Unsupported value: "json"'),
    ("minimum", {"rollout.maxToolTurns": 0}, "should be greater than or equal to 1"),
    ("maximum", {"rollout.gpuMemoryUtilization": 0.99}, "should be less than or equal to 0.95"),
    ("required", {"model": DELETE}, "spec.model: Required value"),
    ("min-items", {"tools": []}, "should have at least 1 items"),
    ("type", {"algorithm.trainBatchSize": "big"}, "must be of type integer"),
    ("gpus-minimum", {"cluster.workers.gpusPerWorker": -1}, "should be greater than or equal to 0"),
    ("autoscaler-enum", {"toolPool.autoscaler": "hpa"}, 'Unsupported value: "hpa"'),
    ("pool-min-1", {"toolPool.replicas": {"min": 0, "max": 4}}, "should be greater than or equal to 1"),
    (
        "data-no-hostpath",
        {"data.volume": {"hostPath": {"path": "/var/lib"}}},
        "hostPath volumes are not allowed (they expose the node's files to the job): "
        "use a persistentVolumeClaim",
    ),
    (
        "model-cache-volume-or-size",
        {"model.cache": {"volume": {"persistentVolumeClaim": {"claimName": "c"}}, "size": "20Gi"}},
        "spec.model.cache: give volume (a shared cache, downloaded into once) or size",
    ),
    ("model-cache-size-min", {"model.cache": {"size": "1Ki"}}, "spec.model.cache.size: at least 1Mi"),
    ("model-cache-no-hostpath", {"model.cache": {"volume": {"hostPath": {"path": "/"}}}}, "hostPath volumes"),
    (
        "checkpoint-no-hostpath",
        {"checkpoint": {"volume": {"hostPath": {"path": "/"}}}},
        "hostPath volumes are not allowed",
    ),
]


@pytest.fixture(scope="module")
def crd(cluster) -> None:
    install_crd(cluster)


def dry_run(cluster, namespace: str, job: dict[str, Any]):
    return cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(job), check=False
    )


def test_the_example_is_accepted(cluster, crd, namespace) -> None:
    res = dry_run(cluster, namespace, example())
    assert res.returncode == 0, res.stderr


def test_the_cpu_example_is_accepted(cluster, crd, namespace) -> None:
    cpu = yaml.safe_load((EXAMPLE.parent / "toolrljob-cpu.yaml").read_text())
    res = dry_run(cluster, namespace, cpu)
    assert res.returncode == 0, res.stderr


def test_a_cpu_job_with_the_vllm_engine_is_accepted(cluster, crd, namespace) -> None:
    """vLLM's CPU build serves CPU jobs (trainer_entry.vllm_on_cpu)."""
    cpu = yaml.safe_load((EXAMPLE.parent / "toolrljob-cpu.yaml").read_text())
    cpu["spec"]["rollout"]["engine"] = "vllm"
    res = dry_run(cluster, namespace, cpu)
    assert res.returncode == 0, res.stderr


def test_a_colocate_async_job_is_accepted(cluster, crd, namespace) -> None:
    changes = {"spec.trainer": {"mode": "colocate-async", "async": {"warmupBatches": 0.5, "onStale": "wait"}}}
    res = dry_run(cluster, namespace, changed(changes))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    "changes",
    [
        {"cluster.workers.resources": {"requests": {"cpu": "26"}}},
        {"cluster.workers.resources": {"requests": {"cpu": "8"}, "limits": {"cpu": "25500m"}}},  # Ray: 26
        {"cluster.workers": {"replicas": 1, "gpusPerWorker": 1, "resources": {"requests": {"cpu": "4500m"}}}},
        {"cluster.workers": {"replicas": 1, "gpusPerWorker": 1}},  # no cpu given: Ray counts the node's
        {"checkpoint": {"saveFreq": -1}},
        {"checkpoint": {}},  # no volume, no saveFreq: never saves
    ],
    ids=["cpu-request", "cpu-limit-rounded-up", "fraction", "no-cpu-given", "never-saves", "no-checkpoints"],
)
def test_workers_and_checkpoints_that_can_run_are_accepted(cluster, crd, namespace, changes) -> None:
    res = dry_run(cluster, namespace, changed({f"spec.{k}": v for k, v in changes.items()}))
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(("changes", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_job_is_rejected_with_the_rules_message(cluster, crd, namespace, changes, message) -> None:
    spec_changes = {k if k.startswith("metadata.") else f"spec.{k}": v for k, v in changes.items()}
    res = dry_run(cluster, namespace, changed(spec_changes))
    assert res.returncode != 0, f"accepted: {changes}"
    assert message in res.stderr, res.stderr


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"spec": {"model": {"path": "Qwen/Other"}}}, "spec.model.path is immutable"),
        ({"spec": {"cluster": {"workers": {"gpusPerWorker": 4}}}}, "gpusPerWorker is immutable"),
        ({"spec": {"toolPool": {"autoscaler": "keda"}}}, "spec.toolPool.autoscaler is immutable"),
    ],
    ids=["model-path", "gpus-per-worker", "autoscaler"],
)
def test_immutable_fields_cannot_change(cluster, crd, namespace, patch, message) -> None:
    cluster.kubectl("create", "-n", namespace, "-f", str(EXAMPLE))
    res = cluster.kubectl(
        "patch", "trj", "gsm8k-python", "-n", namespace, "--type=merge", "-p", json.dumps(patch), check=False
    )
    assert res.returncode != 0, "the patch was accepted"
    assert message in res.stderr, res.stderr
    mutable = {"spec": {"toolPool": {"replicas": {"min": 3}}}}
    ok = cluster.kubectl(
        "patch",
        "trj",
        "gsm8k-python",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps(mutable),
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
