"""The ToolRLJob spec as the trainer reads it: loading, defaults, and the value checks verl does not do.

The CRD (crds/toolrl.dev_toolrljobs.yaml) is the one home of defaults: the operator writes `job.json`
with them applied. `DEFAULTS` are the CRD's, from the module generated from it (crd_defaults.py, by
`make chart-generate`), applied the way the apiserver would, so a hand-written spec means the same as
one that went through the cluster. A field without a CRD default must be in the spec.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .crd_defaults import DEFAULTS_WHEN_PRESENT, SPEC_DEFAULTS

PROTOCOLS = ("hermes", "tool-tags", "python-tags", "react")
ENGINES = ("vllm", "hf")  # both run without GPUs too (gpusPerWorker 0): vllm as vLLM's CPU build
# Not supported yet: the trainer image has no sglang, and sglang's server rejects the tag protocols'
# `include_stop_str_in_output` and stop strings with verl's default `skip_tokenizer_init` (issue 23).
UNSUPPORTED_ENGINES = {"sglang": "not supported yet (the trainer image has no sglang): use vllm"}
TRAINER_MODES = ("sync", "colocate-async", "separate-async")
ASYNC_TRAINER_MODES = ("colocate-async", "separate-async")
SEPARATE_TRAINER_MODE = "separate-async"
UNSUPPORTED_TRAINER_MODES: dict[str, str] = {}
SEPARATE_ON_GPUS = (
    "separate-async runs on CPU workers only so far (gpusPerWorker 0): on GPUs verl syncs the weights "
    "through its nccl checkpoint engine, which needs cupy (verl's cupy-cu130 extra), not in the trainer "
    "image, and no GPU run has checked it: use colocate-async on GPUs"
)
STALE_STRATEGIES = ("drop", "wait")  # verl's trainer.v1.sampler.max_off_policy_strategy
# The estimators of verl's AdvantageEstimator that need no extra config (tested against verl's enum).
ESTIMATORS = ("grpo", "gae", "rloo", "reinforce_plus_plus", "remax", "grpo_passk", "gpg", "opo")
GROUP_ESTIMATORS = ("grpo", "rloo", "grpo_passk", "opo")
PRESETS = ("code-execution", "exact-match", "toolbench", "custom")
TOOL_TYPES = ("python", "search", "http", "function", "mcp")
LOGGERS = ("console", "wandb", "mlflow", "tensorboard")

DEFAULTS: dict[str, Any] = SPEC_DEFAULTS
SAVE_FREQ_WITH_VOLUME = 20
"""`checkpoint.saveFreq` when unset and a checkpoint volume is given (the CRD has no default: without a
volume nothing is saved, as /checkpoints is then neither writable nor kept)."""
NEVER = -1
TOOL_DEFAULTS: dict[str, Any] = DEFAULTS_WHEN_PRESENT["tools[]"]
"""CRD defaults of each `spec.tools[]` entry."""
CUSTOM_REWARD_DEFAULTS: dict[str, Any] = DEFAULTS_WHEN_PRESENT["reward.custom"]
"""CRD defaults of `spec.reward.custom` (when it is given)."""
ROLLOUT_WORKERS_DEFAULTS: dict[str, Any] = DEFAULTS_WHEN_PRESENT["cluster.rolloutWorkers"]
"""CRD defaults of `spec.cluster.rolloutWorkers` (when it is given: separate-async)."""


def cpu_only(spec: dict[str, Any]) -> bool:
    """Whether the job trains on CPUs (verl's `cpu` platform): workers without GPUs."""
    return spec["cluster"]["workers"]["gpusPerWorker"] == 0


class SpecError(ValueError):
    """A spec value the trainer cannot run with; the message names the field to fix."""


@dataclass(frozen=True)
class Job:
    """The parts of `job.json` the trainer uses."""

    name: str
    namespace: str
    uid: str
    spec: dict[str, Any]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with the CRD defaults filled in where the apiserver would fill them."""
    out = _merge(DEFAULTS, spec)
    if isinstance(out.get("tools"), list):
        out["tools"] = [_merge(TOOL_DEFAULTS, t) if isinstance(t, dict) else t for t in out["tools"]]
    if isinstance(out["reward"].get("custom"), dict):
        out["reward"]["custom"] = _merge(CUSTOM_REWARD_DEFAULTS, out["reward"]["custom"])
    if isinstance(out["cluster"].get("rolloutWorkers"), dict):
        out["cluster"]["rolloutWorkers"] = _merge(ROLLOUT_WORKERS_DEFAULTS, out["cluster"]["rolloutWorkers"])
    checkpoint = out["checkpoint"]
    if isinstance(checkpoint, dict) and "saveFreq" not in checkpoint:
        checkpoint["saveFreq"] = SAVE_FREQ_WITH_VOLUME if checkpoint.get("volume") else NEVER
    return out


def parse_job(doc: dict[str, Any]) -> Job:
    """Build a Job from the ConfigMap document, applying defaults and checking values."""
    if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict):
        raise SpecError("job.json: expected an object with 'spec' (the ToolRLJob written by the operator)")
    meta = doc.get("metadata") or {}
    if not meta.get("name"):
        raise SpecError("job.json: metadata.name is missing")
    job = Job(
        name=str(meta["name"]),
        namespace=str(meta.get("namespace") or "default"),
        uid=str(meta.get("uid") or ""),
        spec=with_defaults(doc["spec"]),
    )
    check_spec(job.spec)
    return job


def load_job(path: str | Path) -> Job:
    """Read and check `job.json`."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(
            f"{path}: job spec not found (the operator mounts it from the J-config ConfigMap)"
        ) from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not valid JSON: {exc}") from None
    return parse_job(doc)


def _get(spec: dict[str, Any], field: str) -> Any:
    node: Any = spec
    for part in field.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _need(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise SpecError(f"spec.{field}: {message}")


def _positive_int(spec: dict[str, Any], field: str) -> None:
    value = _get(spec, field)
    _need(
        isinstance(value, int) and not isinstance(value, bool) and value > 0,
        field,
        f"must be a positive integer, got {value!r}",
    )


def _number(spec: dict[str, Any], field: str, low: float | None = None, high: float | None = None) -> None:
    value = _get(spec, field)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and (low is None or value >= low) and (high is None or value <= high)
    bounds = (
        f" in [{low}, {high}]"
        if low is not None and high is not None
        else (f" >= {low}" if low is not None else "")
    )
    _need(ok, field, f"must be a number{bounds}, got {value!r}")


def _one_of(spec: dict[str, Any], field: str, choices: tuple[str, ...]) -> None:
    value = _get(spec, field)
    _need(value in choices, field, f"unknown value {value!r}; use one of {', '.join(choices)}")


def check_spec(spec: dict[str, Any]) -> None:
    """Reject values verl would accept and then fail on (or silently misuse) much later."""
    _need(bool(_get(spec, "model.path")), "model.path", "is required (a hub id or a path inside a volume)")
    train = _get(spec, "data.trainFiles")
    _need(isinstance(train, list) and len(train) > 0, "data.trainFiles", "needs at least one parquet file")
    for field in ("data.trainFiles", "data.valFiles"):
        files = _get(spec, field) or []
        _need(isinstance(files, list), field, "must be a list of parquet paths")
        for i, path in enumerate(files):
            _need(
                isinstance(path, str) and path.endswith(".parquet"),
                f"{field}[{i}]",
                f"{path!r} is not a .parquet file (prepare data with `python -m trainer_entry.data`)",
            )
    for field in (
        "data.maxPromptLength",
        "data.maxResponseLength",
        "algorithm.rolloutsPerPrompt",
        "algorithm.trainBatchSize",
        "rollout.tensorParallelSize",
        "rollout.maxToolTurns",
        "rollout.maxParallelCalls",
        "rollout.maxToolResponseLength",
        "rollout.toolCall.maxConcurrency",
        "cluster.workers.replicas",
    ):
        _positive_int(spec, field)
    _one_of(spec, "algorithm.advantageEstimator", ESTIMATORS)
    if _get(spec, "algorithm.advantageEstimator") in GROUP_ESTIMATORS:
        _need(
            _get(spec, "algorithm.rolloutsPerPrompt") >= 2,
            "algorithm.rolloutsPerPrompt",
            "a group estimator needs at least 2 rollouts per prompt (with 1 every advantage is 0)",
        )
    mini = _get(spec, "algorithm.ppoMiniBatchSize")
    if mini is not None:
        _positive_int(spec, "algorithm.ppoMiniBatchSize")
        _need(
            _get(spec, "algorithm.trainBatchSize") % mini == 0,
            "algorithm.ppoMiniBatchSize",
            f"must divide algorithm.trainBatchSize ({_get(spec, 'algorithm.trainBatchSize')})",
        )
    _number(spec, "algorithm.learningRate", 0.0)
    _number(spec, "algorithm.klLoss.coef", 0.0)
    steps, epochs = _get(spec, "algorithm.totalTrainingSteps"), _get(spec, "algorithm.totalEpochs")
    _need(
        (steps is None) != (epochs is None),
        "algorithm.totalEpochs",
        "set exactly one of algorithm.totalEpochs and algorithm.totalTrainingSteps (the CRD has no default)",
    )
    _positive_int(spec, "algorithm.totalTrainingSteps" if steps is not None else "algorithm.totalEpochs")
    engine = _get(spec, "rollout.engine")
    unsupported = isinstance(engine, str) and engine in UNSUPPORTED_ENGINES
    _need(not unsupported, "rollout.engine", f"{engine} is {UNSUPPORTED_ENGINES.get(engine)}")
    _one_of(spec, "rollout.engine", ENGINES)
    _one_of(spec, "rollout.protocol", PROTOCOLS)
    _number(spec, "rollout.gpuMemoryUtilization", 0.05, 0.95)
    _number(spec, "rollout.toolCall.timeoutSeconds", 0.1)
    _number(spec, "rollout.toolCall.retryDelaySeconds", 0.0)
    _number(spec, "rollout.toolCall.maxInfraFailureRatio", 0.0, 1.0)
    retries = _get(spec, "rollout.toolCall.maxRetries")
    _need(
        isinstance(retries, int) and retries >= 0,
        "rollout.toolCall.maxRetries",
        f"must be >= 0, got {retries!r}",
    )
    gpus = _get(spec, "cluster.workers.gpusPerWorker")
    _need(
        isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0,
        "cluster.workers.gpusPerWorker",
        f"must be an integer >= 0, got {gpus!r}",
    )
    if gpus == 0:
        _need(
            _get(spec, "rollout.tensorParallelSize") == 1,
            "rollout.tensorParallelSize",
            "must be 1 when cluster.workers.gpusPerWorker is 0 (CPU)",
        )
    else:
        _need(
            gpus % _get(spec, "rollout.tensorParallelSize") == 0,
            "rollout.tensorParallelSize",
            f"must divide cluster.workers.gpusPerWorker ({gpus})",
        )
    _check_tools(spec)
    _check_reward(spec)
    _check_checkpoint(spec)
    _check_trainer_mode(spec)
    loggers = _get(spec, "trainer.loggers")
    _need(
        isinstance(loggers, list) and all(name in LOGGERS for name in loggers),
        "trainer.loggers",
        f"must be a list of {', '.join(LOGGERS)}, got {loggers!r}",
    )
    extra = _get(spec, "trainer.extraArgs")
    _need(
        extra is None or (isinstance(extra, list) and all(isinstance(a, str) and "=" in a for a in extra)),
        "trainer.extraArgs",
        "must be a list of Hydra overrides like 'trainer.val_before_train=false'",
    )


def _check_trainer_mode(spec: dict[str, Any]) -> None:
    mode = _get(spec, "trainer.mode")
    unsupported = isinstance(mode, str) and mode in UNSUPPORTED_TRAINER_MODES
    _need(not unsupported, "trainer.mode", f"{mode} is {UNSUPPORTED_TRAINER_MODES.get(mode)}")
    _one_of(spec, "trainer.mode", TRAINER_MODES)
    _number(spec, "trainer.async.warmupBatches", 0, 16)
    _positive_int(spec, "trainer.async.maxPolicyVersions")
    _one_of(spec, "trainer.async.onStale", STALE_STRATEGIES)
    if mode in ASYNC_TRAINER_MODES:
        _need(
            _get(spec, "trainer.async.maxPolicyVersions") >= 2,
            "trainer.async.maxPolicyVersions",
            "1 drops every sample begun before the last update (all that overlapping generation "
            f"produced) in trainer.mode {mode}: set it to 2 or more, or use trainer.mode sync",
        )
    if mode == SEPARATE_TRAINER_MODE:
        _check_separate(spec)
    else:
        _need(
            _get(spec, "cluster.rolloutWorkers") is None,
            "cluster.rolloutWorkers",
            f"is for trainer.mode separate-async only (rollout on its own workers); trainer.mode {mode} "
            "generates on the training workers: remove it, or set trainer.mode separate-async",
        )


def mini_batch_size(spec: dict[str, Any]) -> int:
    """verl's `ppo_mini_batch_size`: `algorithm.ppoMiniBatchSize`, else one update per sync interval
    (the whole batch; in separate-async the batch over `trainer.async.parameterSyncStep`)."""
    given = _get(spec, "algorithm.ppoMiniBatchSize")
    if given is not None:
        return given
    batch = _get(spec, "algorithm.trainBatchSize")
    if _get(spec, "trainer.mode") == SEPARATE_TRAINER_MODE:
        return batch // _get(spec, "trainer.async.parameterSyncStep")
    return batch


def _check_separate(spec: dict[str, Any]) -> None:
    _need(
        isinstance(_get(spec, "cluster.rolloutWorkers"), dict),
        "cluster.rolloutWorkers",
        "is required with trainer.mode separate-async: the worker group that generates "
        "({replicas, gpusPerWorker}; gpusPerWorker 0 on CPUs, like cluster.workers)",
    )
    _positive_int(spec, "cluster.rolloutWorkers.replicas")
    gpus = _get(spec, "cluster.rolloutWorkers.gpusPerWorker")
    _need(
        isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0,
        "cluster.rolloutWorkers.gpusPerWorker",
        f"must be an integer >= 0, got {gpus!r}",
    )
    _need(
        (gpus == 0) == cpu_only(spec),
        "cluster.rolloutWorkers.gpusPerWorker",
        f"is {gpus} but cluster.workers.gpusPerWorker is {_get(spec, 'cluster.workers.gpusPerWorker')}: "
        "both groups train on GPUs or both on CPUs (0)",
    )
    if gpus:
        tp = _get(spec, "rollout.tensorParallelSize")
        _need(
            gpus % tp == 0,
            "rollout.tensorParallelSize",
            f"must divide cluster.rolloutWorkers.gpusPerWorker ({gpus})",
        )
    _positive_int(spec, "trainer.async.parameterSyncStep")
    batch, step = _get(spec, "algorithm.trainBatchSize"), _get(spec, "trainer.async.parameterSyncStep")
    mini = mini_batch_size(spec)
    _need(
        batch == step * mini,
        "trainer.async.parameterSyncStep",
        f"separate-async updates the rollout's weights every parameterSyncStep mini-batches, so "
        f"algorithm.trainBatchSize ({batch}) must equal parameterSyncStep ({step}) x "
        f"algorithm.ppoMiniBatchSize ({mini}) (verl's rule): change one of them",
    )
    _need(cpu_only(spec), "trainer.mode", SEPARATE_ON_GPUS)


def _check_tools(spec: dict[str, Any]) -> None:
    tools = spec.get("tools")
    _need(tools is not None, "tools", "is required: the tools the policy may call (a list, may be empty)")
    _need(isinstance(tools, list), "tools", "must be a list")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        field = f"tools[{i}]"
        _need(isinstance(tool, dict), field, "must be an object with name and type")
        name = tool.get("name")
        _need(
            isinstance(name, str) and name.isidentifier(),
            f"{field}.name",
            f"{name!r} must be an identifier (the model calls the tool by this name)",
        )
        _need(name not in names, f"{field}.name", f"duplicate tool name {name!r}")
        names.add(name)
        _need(
            tool.get("type") in TOOL_TYPES,
            f"{field}.type",
            f"unknown type {tool.get('type')!r}; use one of {', '.join(TOOL_TYPES)}",
        )
        if tool["type"] == "function":
            parameters = tool.get("parameters")
            _need(
                isinstance(parameters, dict) and parameters.get("type") == "object",
                f"{field}.parameters",
                "a function tool needs parameters, the JSON schema of an object (its keyword arguments)",
            )
        if tool["type"] == "mcp":
            url = (tool.get("mcp") or {}).get("url")
            _need(
                isinstance(url, str) and url.startswith(("http://", "https://")),
                f"{field}.mcp.url",
                "a tool of type mcp needs mcp.url, the MCP server's streamable-HTTP endpoint (http:// or https://)",
            )
    if spec["rollout"]["protocol"] in ("tool-tags", "python-tags"):
        _need(
            any(t["type"] == "python" for t in tools),
            "tools",
            f"protocol {spec['rollout']['protocol']} runs code: add a tool of type python",
        )
    if spec["rollout"]["protocol"] == "hermes":
        _need(len(tools) > 0, "tools", "protocol hermes needs at least one tool to call")


def _check_reward(spec: dict[str, Any]) -> None:
    _one_of(spec, "reward.preset", PRESETS)
    preset = spec["reward"]["preset"]
    if preset == "custom":
        custom = _get(spec, "reward.custom") or {}
        _need(bool(custom.get("configMap")), "reward.custom.configMap", "is required for preset custom")
        _need(
            isinstance(custom["function"], str) and custom["function"].isidentifier(),
            "reward.custom.function",
            "must be a Python function name",
        )
    if preset == "toolbench":
        for key in DEFAULTS["reward"]["toolbench"]:
            _number(spec, f"reward.toolbench.{key}")
    if preset == "code-execution":
        _need(
            any(t["type"] == "python" for t in spec["tools"]),
            "tools",
            "reward preset code-execution runs code in the tool pool: add a tool of type python",
        )


def _check_checkpoint(spec: dict[str, Any]) -> None:
    save = _get(spec, "checkpoint.saveFreq")
    _need(
        isinstance(save, int) and (save > 0 or save == -1),
        "checkpoint.saveFreq",
        f"must be a positive step count or -1 (never), got {save!r}",
    )
    _need(
        save == NEVER or bool(_get(spec, "checkpoint.volume")),
        "checkpoint.saveFreq",
        "needs checkpoint.volume: checkpoints are written under /checkpoints, which without a volume is "
        "not writable and is lost with the pod; add a volume, or set saveFreq to -1 (or leave it unset)",
    )
    resume = _get(spec, "checkpoint.resume")
    _need(
        isinstance(resume, str) and (resume in ("auto", "disable") or resume.startswith("/")),
        "checkpoint.resume",
        f"use auto, disable or an absolute checkpoint path, got {resume!r}",
    )
