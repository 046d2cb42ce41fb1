"""Job spec → verl: Hydra overrides, the agent-loop YAML and the tool-config YAML.

A pure function: no files are read or written here, so the whole mapping is testable against verl's
own config schema. The table in trainer_entry/README.md documents every line of `_overrides`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from toolrl_api import tool_types

from trainer_entry.observations import OBSERVATION_DEFAULT
from trainer_entry.protocols import PROTOCOLS
from trainer_entry.spec import COLOCATE_TRAINER_MODE, SEPARATE_TRAINER_MODE, Job, cpu_only, mini_batch_size

# Our classes as verl's extension points name them (the table of every door: verl_entry_points)
from trainer_entry.verl_entry_points import (
    AGENT_LOOP_CLASS,
    CPU_CHECKPOINT_ENGINE,
    DATASET,
    HERMES_LOOP_CLASS,
    REWARD,
    SAMPLER,
    TOOL_CLASS,
    TRAINER_MODES,
)

# How long the trainer waits for the tool pool's /readyz: before the run, and when the circuit breaker
# holds a step (TOOLRL_POOL_WAIT_SECONDS overrides it).
DEFAULT_POOL_WAIT_SECONDS = 600.0
CHECKPOINT_ROOT = "/checkpoints"
# Files the run writes into its Ray working_dir, so every node finds them at these relative paths.
TOOL_CONFIG_FILE = "toolrl_tools.yaml"
AGENT_LOOPS_FILE = "toolrl_agent_loops.yaml"
CUSTOM_REWARD_FILE = "toolrl_custom_reward.py"
# TransferQueue's storage units (verl's default 8), each 1 CPU held and hard-pinned round-robin over every
# Ray node: a GPU job gets one per Ray node, so each node's CPU need is known (trainer_entry.placement).
STORAGE_UNITS_KEY = "transfer_queue.backend.SimpleStorage.num_data_storage_units"
# verl's cpu platform (trainer_entry.cpu_platform) for jobs whose workers have no GPUs: gloo, plain
# torch attention, FSDP2 (FSDP1 refuses CPU parameters), and one logical Ray GPU per worker, since
# verl's resource pools always ask Ray for "GPU" bundles. Sized for 2 cores and a tiny model: one
# agent-loop and one reward worker, one transfer-queue storage unit (each holds ~0.5 GiB).
CPU_OVERRIDES = (
    "trainer.device=cpu",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "critic.strategy=fsdp2",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
    f"{STORAGE_UNITS_KEY}=1",
)
# verl's vLLM server on vLLM's CPU build (trainer_entry.vllm_on_cpu): vLLM has no sleep mode on CPUs
# (it refuses to start with it; verl enables it by default), and it reads gpu_memory_utilization as a
# share of the host's memory for weights and KV cache, which on a shared node is either refused or
# far too much: the KV cache gets a fixed size instead.
CPU_VLLM_KV_CACHE_BYTES = 1 << 30
CPU_VLLM_OVERRIDES = (
    "+actor_rollout_ref.rollout.enable_sleep_mode=false",
    f"+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={CPU_VLLM_KV_CACHE_BYTES}",
)
# Every job's actor and critic attend with PyTorch's SDPA: verl defaults to flash_attention_2, which
# PyPI has no wheel of and the trainer image does not contain. Remove-padding packs sequences for
# flash-attn's varlen kernels, so it is off with SDPA. An image of the user's own with flash-attn takes
# both back through trainer.extraArgs (images/README.md).
ATTENTION_OVERRIDES = (
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "+critic.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=false",
    "critic.model.use_remove_padding=false",
)
LOGICAL_GPUS_PER_CPU_WORKER = 1
# Logical CPUs a CPU worker offers Ray: verl asks for 3 per GPU bundle (its resource pools'
# max_colocate_count) plus one for each agent-loop, reward and data-storage actor; the processes
# share the pod's real CPUs. The operator's RayJob says the same (`num-cpus`; a test checks).
LOGICAL_CPUS_PER_CPU_WORKER = 16
# CPUs verl's placement group asks for with every GPU (ResourcePoolManager.max_colocate_count: actor,
# rollout and reward processes colocated); a node with fewer waits forever. The CRD says the same.
VERL_CPUS_PER_GPU = 3
# Strings Hydra reads back unchanged without quotes (must not start with a digit: 1e-6 is a float).
PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_\-./]*")


def agent_loop_name(protocol: str) -> str:
    """Name under which our loop for a tag protocol is registered with verl."""
    return "toolrl_" + protocol.replace("-", "_")


@dataclass(frozen=True)
class Translation:
    """What the spec alone decides: verl's overrides and the agent-loop YAML. The tool-config YAML
    also depends on the tools the pool serves (`tool_config`, written once they are read)."""

    overrides: list[str]
    agent_loops: list[dict[str, Any]]


def hydra_value(value: Any) -> str:
    """Render a Python value in Hydra's override grammar (strings always quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        if PLAIN.fullmatch(value) and value.lower() not in ("true", "false", "null", "nan", "inf"):
            return value
        # Hydra: only backslashes that precede a quote (or the closing quote) are escapes.
        quoted = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        quoted = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, quoted)
        return "'" + quoted + "'"
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot render {type(value).__name__} as a Hydra value")


MCP_SEPARATOR = "__"  # the pool serves a remote tool as `<entry name>__<remote name>`


def mcp_tools(entry: dict[str, Any], pool_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools an mcp entry serves, as the pool lists them (GET /v1/tools: name, description,
    inputSchema); the pool learns them from the server at its start."""
    prefix = entry["name"] + MCP_SEPARATOR
    return [t for t in pool_tools if t.get("type") == "mcp" and t["name"].startswith(prefix)]


def model_parameters(input_schema: dict[str, Any]) -> dict[str, Any]:
    """The parameters a model is offered of a tool that takes its type's input: the input schema's
    required properties (the rest, such as python's stdin and search's topK, the trainer never sends)."""
    required = list(input_schema.get("required") or [])
    properties = input_schema.get("properties") or {}
    return {"type": "object", "properties": {key: properties[key] for key in required}, "required": required}


def tool_schema(tool: dict[str, Any], listed: dict[str, Any] | None = None) -> dict[str, Any]:
    """OpenAI function schema the model sees for one spec.tools entry (an mcp entry's tools: `_served`).
    A function tool's parameters are its own; another's are its type's input schema (model_parameters)
    as the pool serves it: `listed`, the entry's item of the pool's GET /v1/tools, or without one (a dry
    run, before the pool is asked) the API package's copy of the pool's registry, toolrl_api.tool_types,
    which says the same (tests/unit/test_tool_types.py)."""
    kind = tool_types.TOOL_TYPES[tool["type"]]
    description = tool.get("description") or kind.description
    if tool["type"] == "function":
        parameters = tool["parameters"]
    elif listed is not None:  # its description is the entry's, or the type's
        description, parameters = listed["description"], model_parameters(listed["inputSchema"])
    else:
        parameters = model_parameters(kind.input_schema)
    return {
        "type": "function",
        "function": {"name": tool["name"], "description": description, "parameters": parameters},
    }


def _served(
    tool: dict[str, Any], pool_tools: list[dict[str, Any]] | None
) -> list[tuple[dict[str, Any], Any]]:
    """(entry, schema the model sees) of each tool a spec.tools entry serves: itself, or an mcp
    entry's remote tools as the pool lists them (none before the pool has been asked)."""
    if tool["type"] != "mcp":
        listed = next((t for t in pool_tools or [] if t["name"] == tool["name"]), None)
        return [(tool, tool_schema(tool, listed))]
    return [
        (
            tool,
            {
                "type": "function",
                "function": {
                    "name": remote["name"],
                    "description": remote.get("description") or tool_types.TOOL_TYPES["mcp"].description,
                    "parameters": remote.get("inputSchema") or {"type": "object", "properties": {}},
                },
            },
        )
        for remote in mcp_tools(tool, pool_tools or [])
    ]


def tool_config(job: Job, pool_url: str, pool_tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """verl tool-config YAML: one PoolTool per tool served, all sharing the spec's call policy; the
    schemas the model is offered come from `pool_tools` (the pool's GET /v1/tools, read once it is
    ready: an mcp entry's tools are known only there), or without it from the copy of the pool's
    registry (toolrl_api.tool_types: a dry run shows what the pool will serve, mcp entries aside)."""
    call = job.spec["rollout"]["toolCall"]
    entries = []
    for tool, schema in (pair for t in job.spec["tools"] for pair in _served(t, pool_tools)):
        entries.append(
            {
                "class_name": TOOL_CLASS,
                "config": {
                    "type": "native",
                    "pool_url": pool_url,
                    "tool_type": tool["type"],
                    # python tools only (the CRD's rule): what the model reads back (observations.py)
                    "observation_format": tool.get("observationFormat", OBSERVATION_DEFAULT),
                    "timeout_seconds": float(tool["timeoutSeconds"]),
                    "request_timeout_seconds": float(call["timeoutSeconds"]),
                    "max_retries": int(call["maxRetries"]),
                    "retry_delay_seconds": float(call["retryDelaySeconds"]),
                    "max_concurrency": int(call["maxConcurrency"]),
                },
                "tool_schema": schema,
            }
        )
    return {"tools": entries}


def agent_loops() -> list[dict[str, Any]]:
    """Our loops: one per text protocol (protocols.PROTOCOLS), and hermes (verl's own `tool_agent` that
    excludes infra failures)."""
    return [{"name": agent_loop_name(p), "_target_": AGENT_LOOP_CLASS, "protocol": p} for p in PROTOCOLS] + [
        {"name": agent_loop_name("hermes"), "_target_": HERMES_LOOP_CLASS}
    ]


def breaker_overrides(job: Job, pool_url: str, pool_wait_seconds: float) -> list[str]:
    """The circuit breaker (breaker.py) as verl's custom sampler, with its settings as sampler kwargs."""
    kwargs = {
        "max_infra_failure_ratio": float(job.spec["rollout"]["toolCall"]["maxInfraFailureRatio"]),
        "rollouts_per_prompt": int(job.spec["algorithm"]["rolloutsPerPrompt"]),
        "pool_url": pool_url,
        "recovery_seconds": float(pool_wait_seconds),
    }
    dynamic = job.spec["algorithm"]["dynamicSampling"]
    if dynamic["enabled"]:  # verl skips its own filtering when a custom sampler is set: ours does it
        kwargs["filter_groups_metric"] = dynamic["metric"]
        kwargs["max_generation_batches"] = dynamic["maxGenerationBatches"]
    return SAMPLER.overrides(hydra_value) + [
        f"+trainer.v1.sampler.sampler_kwargs.{key}={hydra_value(value)}" for key, value in kwargs.items()
    ]


def dynamic_sampling_overrides(dynamic: dict[str, Any]) -> list[str]:
    """verl's own keys for DAPO's dynamic sampling, as its config shows them (the job's sampler applies
    them: breaker_overrides)."""
    if not dynamic["enabled"]:
        return []
    return [
        "algorithm.filter_groups.enable=true",
        f"algorithm.filter_groups.metric={hydra_value(dynamic['metric'])}",
        f"algorithm.filter_groups.max_num_gen_batches={dynamic['maxGenerationBatches']}",
    ]


def trainer_mode_overrides(job: Job) -> list[str]:
    """Our trainer for spec.trainer.mode; an asynchronous one with its warm-up and staleness bound."""
    trainer = job.spec["trainer"]
    mode = trainer["mode"]
    out = [f"trainer.v1.trainer_mode={TRAINER_MODES[mode]}"]
    if mode in (COLOCATE_TRAINER_MODE, SEPARATE_TRAINER_MODE):
        knobs = trainer["async"]
        section = mode.replace("-", "_")  # verl's trainer.v1.colocate_async / .separate_async
        out += [
            f"trainer.v1.{section}.num_warmup_batches={hydra_value(knobs['warmupBatches'])}",
            f"trainer.v1.sampler.max_off_policy_threshold={int(knobs['maxPolicyVersions'])}",
            f"trainer.v1.sampler.max_off_policy_strategy={knobs['onStale']}",
        ]
    if mode == SEPARATE_TRAINER_MODE:
        out += separate_rollout_overrides(job)
    return out


def _reward(job: Job, pool_url: str) -> list[str]:
    reward = job.spec["reward"]
    kwargs: dict[str, Any] = {"preset": reward["preset"], "pool_url": pool_url}
    if reward["preset"] == "custom":
        # called through rewards.compute_score, which stops the run when the function raises
        kwargs["custom"] = {"path": CUSTOM_REWARD_FILE, **reward["custom"]}
    if reward["preset"] == "toolbench":
        kwargs["weights"] = dict(reward["toolbench"])
    if reward["preset"] == "code-execution":
        kwargs["tool"] = next(t["name"] for t in job.spec["tools"] if t["type"] == "python")
    return [
        *REWARD.overrides(hydra_value),
        f"+{REWARD.key}.reward_kwargs={hydra_value(kwargs)}",
        *overlong_penalty(job),
    ]


DAPO_REWARD_MANAGER = "dapo"


def overlong_penalty(job: Job) -> list[str]:
    """DAPO's overlong penalty (spec.reward.overlongPenalty) as verl 0.9.1 applies it: its `dapo` reward
    manager (experimental/reward_loop/reward_manager/dapo.py) reads `reward.reward_kwargs.overlong_buffer_cfg`
    {enable, len, penalty_factor, log} and `max_resp_len`, and adds min(0, -(length - (max_resp_len - len))
    / len x penalty_factor) to each response's score. Nothing when disabled: verl's naive manager stays."""
    penalty = job.spec["reward"]["overlongPenalty"]
    if not penalty["enabled"]:
        return []
    kwargs = {
        "overlong_buffer_cfg": {
            "enable": True,
            "len": int(penalty["bufferLength"]),
            "penalty_factor": float(penalty["penaltyFactor"]),
            "log": False,  # read unconditionally; True would add per-sample fields the job does not use
        },
        "max_resp_len": int(job.spec["data"]["maxResponseLength"]),
    }
    return [
        f"reward.reward_manager.name={DAPO_REWARD_MANAGER}",
        f"+reward.reward_kwargs={hydra_value(kwargs)}",
    ]


def _checkpoint(job: Job) -> list[str]:
    ckpt = job.spec["checkpoint"]
    local_dir = f"{CHECKPOINT_ROOT}/{job.namespace}/{job.name}"
    out = [f"trainer.save_freq={ckpt['saveFreq']}", f"trainer.default_local_dir={hydra_value(local_dir)}"]
    resume = ckpt["resume"]
    if resume in ("auto", "disable"):
        out.append(f"trainer.resume_mode={resume}")
    else:
        out += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={hydra_value(resume)}"]
    if ckpt.get("maxToKeep") is not None:
        keep = ckpt["maxToKeep"]
        out += [f"trainer.max_actor_ckpt_to_keep={keep}", f"trainer.max_critic_ckpt_to_keep={keep}"]
    return out


def separate_rollout_overrides(job: Job) -> list[str]:
    """separate-async: generation only on `cluster.rolloutWorkers` (verl's standalone rollout pool, no
    rollout replicas on the training workers), weights synced every `parameterSyncStep` mini-batches
    through our gloo checkpoint engine (the spec admits separate-async on CPU workers only:
    the CRD's rule at spec.trainer.mode)."""
    rollout_workers = job.spec["cluster"]["rolloutWorkers"]
    return [
        "actor_rollout_ref.hybrid_engine=false",
        f"actor_rollout_ref.rollout.nnodes={rollout_workers['replicas']}",
        f"actor_rollout_ref.rollout.n_gpus_per_node={rollout_gpus_per_node(job)}",
        f"actor_rollout_ref.rollout.checkpoint_engine.backend={CPU_CHECKPOINT_ENGINE}",
        f"trainer.v1.separate_async.parameter_sync_step={job.spec['trainer']['async']['parameterSyncStep']}",
    ]


def rollout_gpus_per_node(job: Job) -> int:
    """verl's `rollout.n_gpus_per_node` in separate-async: the rollout workers' GPUs, or one logical GPU
    per CPU rollout worker."""
    gpus = job.spec["cluster"]["rolloutWorkers"]["gpusPerWorker"]
    return gpus if gpus else LOGICAL_GPUS_PER_CPU_WORKER


def ray_gpus(job: Job) -> int:
    """The (logical, on CPUs) GPUs of all the job's workers: training, and separate-async's rollout."""
    total = job.spec["cluster"]["workers"]["replicas"] * gpus_per_node(job)
    if job.spec["trainer"]["mode"] == SEPARATE_TRAINER_MODE:
        total += job.spec["cluster"]["rolloutWorkers"]["replicas"] * rollout_gpus_per_node(job)
    return total


def ray_nodes(job: Job) -> int:
    """The Ray nodes of the job's cluster as the operator builds it: the head and every worker."""
    nodes = 1 + job.spec["cluster"]["workers"]["replicas"]
    if job.spec["trainer"]["mode"] == SEPARATE_TRAINER_MODE:
        nodes += job.spec["cluster"]["rolloutWorkers"]["replicas"]
    return nodes


def gpus_per_node(job: Job) -> int:
    """verl's `trainer.n_gpus_per_node`: the workers' GPUs, or on CPUs the logical Ray GPUs a
    worker advertises (one training process each)."""
    gpus = job.spec["cluster"]["workers"]["gpusPerWorker"]
    return gpus if gpus else LOGICAL_GPUS_PER_CPU_WORKER


def _overrides(job: Job, pool_url: str, pool_wait_seconds: float) -> list[str]:
    s = job.spec
    data, algo, rollout = s["data"], s["algorithm"], s["rollout"]
    workers = s["cluster"]["workers"]
    seq_len = data["maxPromptLength"] + data["maxResponseLength"]
    val_files = data.get("valFiles") or data["trainFiles"]
    mini_batch = mini_batch_size(s)
    v = hydra_value
    out = [
        f"actor_rollout_ref.model.path={v(s['model']['path'])}",
        f"critic.model.path={v(s['model']['path'])}",
        f"data.train_files={v(data['trainFiles'])}",
        f"data.val_files={v(val_files)}",
        f"data.max_prompt_length={data['maxPromptLength']}",
        f"data.max_response_length={data['maxResponseLength']}",
        f"data.train_batch_size={algo['trainBatchSize']}",
        "data.return_raw_chat=true",
        *DATASET.overrides(v),
        f"algorithm.adv_estimator={algo['advantageEstimator']}",
        f"actor_rollout_ref.rollout.n={algo['rolloutsPerPrompt']}",
        f"actor_rollout_ref.actor.use_kl_loss={v(bool(algo['klLoss']['enabled']))}",
        f"actor_rollout_ref.actor.kl_loss_coef={v(float(algo['klLoss']['coef']))}",
        f"actor_rollout_ref.actor.optim.lr={v(float(algo['learningRate']))}",
        f"actor_rollout_ref.actor.clip_ratio_low={v(float(algo['clipRatio']['low']))}",
        f"actor_rollout_ref.actor.clip_ratio_high={v(float(algo['clipRatio']['high']))}",
        f"actor_rollout_ref.actor.loss_agg_mode={algo['lossAggregation']}",
        *dynamic_sampling_overrides(algo["dynamicSampling"]),
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini_batch}",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={max(16384, seq_len)}",
        f"critic.ppo_max_token_len_per_gpu={max(32768, 2 * seq_len)}",
        f"actor_rollout_ref.rollout.name={rollout['engine']}",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={rollout['tensorParallelSize']}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={v(float(rollout['gpuMemoryUtilization']))}",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={v(TOOL_CONFIG_FILE)}",
        f"actor_rollout_ref.rollout.multi_turn.max_user_turns={rollout['maxToolTurns']}",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={rollout['maxToolTurns'] + 1}",
        f"actor_rollout_ref.rollout.multi_turn.max_parallel_calls={rollout['maxParallelCalls']}",
        f"actor_rollout_ref.rollout.multi_turn.max_tool_response_length={rollout['maxToolResponseLength']}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={v(AGENT_LOOPS_FILE)}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={agent_loop_name(rollout['protocol'])}",
        f"trainer.nnodes={workers['replicas']}",
        f"trainer.n_gpus_per_node={gpus_per_node(job)}",
        f"trainer.project_name={v(job.namespace)}",
        f"trainer.experiment_name={v(job.name)}",
        f"trainer.logger={v(list(s['trainer']['loggers']))}",
    ]
    out += trainer_mode_overrides(job)
    if algo.get("totalTrainingSteps") is not None:
        out.append(f"trainer.total_training_steps={algo['totalTrainingSteps']}")
    else:
        out.append(f"trainer.total_epochs={algo['totalEpochs']}")
    if not data.get("valFiles"):
        out += ["trainer.val_before_train=false", "trainer.test_freq=-1"]
    else:
        out.append(f"trainer.test_freq={data.get('valFreq', -1)}")
    out += list(ATTENTION_OVERRIDES)
    if cpu_only(s):
        out += list(CPU_OVERRIDES)
        if rollout["engine"] == "vllm":
            out += list(CPU_VLLM_OVERRIDES)
    else:
        out.append(f"{STORAGE_UNITS_KEY}={ray_nodes(job)}")
    out += _reward(job, pool_url) + _checkpoint(job) + breaker_overrides(job, pool_url, pool_wait_seconds)
    return out + list(s["trainer"].get("extraArgs") or [])


# Where each verl key the job sets comes from (the README's table as data): the spec field, by verl key or
# key prefix. A key the job sets that is not here is forced by the job (FORCED_REASONS says why).
SPEC_SOURCES: tuple[tuple[str, str], ...] = (
    ("actor_rollout_ref.model.path", "spec.model.path"),
    ("critic.model.path", "spec.model.path"),
    ("data.train_files", "spec.data.trainFiles"),
    ("data.val_files", "spec.data.valFiles (empty: trainFiles)"),
    ("data.max_prompt_length", "spec.data.maxPromptLength"),
    ("data.max_response_length", "spec.data.maxResponseLength"),
    ("data.train_batch_size", "spec.algorithm.trainBatchSize"),
    ("algorithm.adv_estimator", "spec.algorithm.advantageEstimator"),
    ("actor_rollout_ref.rollout.n", "spec.algorithm.rolloutsPerPrompt"),
    ("actor_rollout_ref.actor.use_kl_loss", "spec.algorithm.klLoss.enabled"),
    ("actor_rollout_ref.actor.kl_loss_coef", "spec.algorithm.klLoss.coef"),
    ("actor_rollout_ref.actor.optim.lr", "spec.algorithm.learningRate"),
    ("actor_rollout_ref.actor.clip_ratio_low", "spec.algorithm.clipRatio.low"),
    ("actor_rollout_ref.actor.clip_ratio_high", "spec.algorithm.clipRatio.high"),
    ("actor_rollout_ref.actor.loss_agg_mode", "spec.algorithm.lossAggregation"),
    ("algorithm.filter_groups", "spec.algorithm.dynamicSampling"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "spec.algorithm.ppoMiniBatchSize (or trainBatchSize)"),
    (
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "spec.data.maxPromptLength + maxResponseLength, at least 16384",
    ),
    ("critic.ppo_max_token_len_per_gpu", "2 x (spec.data.maxPromptLength + maxResponseLength), >= 32768"),
    ("actor_rollout_ref.rollout.name", "spec.rollout.engine"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "spec.rollout.tensorParallelSize"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization", "spec.rollout.gpuMemoryUtilization"),
    ("actor_rollout_ref.rollout.multi_turn.tool_config_path", f"spec.tools ({TOOL_CONFIG_FILE})"),
    ("actor_rollout_ref.rollout.multi_turn.max_user_turns", "spec.rollout.maxToolTurns"),
    ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", "spec.rollout.maxToolTurns + 1"),
    ("actor_rollout_ref.rollout.multi_turn.max_parallel_calls", "spec.rollout.maxParallelCalls"),
    ("actor_rollout_ref.rollout.multi_turn.max_tool_response_length", "spec.rollout.maxToolResponseLength"),
    ("actor_rollout_ref.rollout.agent.default_agent_loop", "spec.rollout.protocol"),
    ("trainer.nnodes", "spec.cluster.workers.replicas"),
    ("trainer.n_gpus_per_node", "spec.cluster.workers.gpusPerWorker (0: one logical GPU)"),
    ("trainer.project_name", "metadata.namespace"),
    ("trainer.experiment_name", "metadata.name"),
    ("trainer.logger", "spec.trainer.loggers"),
    ("trainer.v1.trainer_mode", "spec.trainer.mode"),
    ("trainer.v1.colocate_async.num_warmup_batches", "spec.trainer.async.warmupBatches"),
    ("trainer.v1.separate_async.num_warmup_batches", "spec.trainer.async.warmupBatches"),
    ("trainer.v1.separate_async.parameter_sync_step", "spec.trainer.async.parameterSyncStep"),
    ("trainer.v1.sampler.max_off_policy_threshold", "spec.trainer.async.maxPolicyVersions"),
    ("trainer.v1.sampler.max_off_policy_strategy", "spec.trainer.async.onStale"),
    ("actor_rollout_ref.rollout.nnodes", "spec.cluster.rolloutWorkers.replicas"),
    ("actor_rollout_ref.rollout.n_gpus_per_node", "spec.cluster.rolloutWorkers.gpusPerWorker"),
    ("trainer.total_training_steps", "spec.algorithm.totalTrainingSteps"),
    ("trainer.total_epochs", "spec.algorithm.totalEpochs"),
    ("trainer.val_before_train", "spec.data.valFiles (empty: no validation)"),
    ("trainer.test_freq", "spec.data.valFreq (unset: -1, before training only; no valFiles: -1)"),
    ("reward.custom_reward_function.reward_kwargs", "spec.reward"),
    ("reward.reward_manager.name", "spec.reward.overlongPenalty.enabled (verl's dapo reward manager)"),
    ("reward.reward_kwargs", "spec.reward.overlongPenalty"),
    ("trainer.save_freq", "spec.checkpoint.saveFreq"),
    ("trainer.default_local_dir", f"{CHECKPOINT_ROOT}/<metadata.namespace>/<metadata.name>"),
    ("trainer.resume_mode", "spec.checkpoint.resume"),
    ("trainer.resume_from_path", "spec.checkpoint.resume"),
    (
        "trainer.v1.sampler.sampler_kwargs",
        "the circuit breaker: spec.rollout.toolCall.maxInfraFailureRatio, spec.algorithm.rolloutsPerPrompt;"
        " dynamic sampling: spec.algorithm.dynamicSampling",
    ),
)
# verl keys a spec field covers even where it leaves them to verl (a disabled overlong penalty sets no
# reward_kwargs): an extraArgs entry setting one is warned about all the same.
COVERED_WHEN_UNSET: tuple[str, ...] = ("reward.reward_kwargs",)
FORCED_REASONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (ATTENTION_OVERRIDES, "SDPA attention: the image has no flash-attn (images/README.md)"),
    (CPU_OVERRIDES, "CPU workers (verl's cpu platform)"),
    (CPU_VLLM_OVERRIDES, "vLLM's CPU build"),
    (("actor_rollout_ref.actor.use_dynamic_bsz=true",), "micro-batches by token count, sized from spec.data"),
)


def override_key(override: str) -> str:
    """The key an override sets: `+a.b=1` -> `a.b`."""
    return override.split("=", 1)[0].lstrip("+~")


def spec_source(key: str) -> str | None:
    """The spec field a verl key comes from (SPEC_SOURCES), or None."""
    return next((src for k, src in SPEC_SOURCES if key == k or key.startswith(k + ".")), None)


def source_of(key: str, translation: Translation, extra_args: list[str]) -> str:
    """Where the value of verl key `key` in the job's config comes from: extraArgs, a spec field, the job
    itself (why), or verl's default."""

    def sets(override: str) -> bool:
        k = override_key(override)
        return key == k or key.startswith(k + ".")

    if any(sets(o) for o in extra_args):
        return "spec.trainer.extraArgs"
    own = translation.overrides[: len(translation.overrides) - len(extra_args)]
    if not any(sets(o) for o in own):
        return "verl's default"
    source = spec_source(key)
    if source:
        return source
    reason = next(
        (why for group, why in FORCED_REASONS if any(sets(o) and o in own for o in group)),
        "the job's own classes, files and settings",
    )
    return f"forced by the job ({reason})"


def translate(job: Job, pool_url: str, pool_wait_seconds: float = DEFAULT_POOL_WAIT_SECONDS) -> Translation:
    """Everything verl needs for this job but the tool config (`tool_config`); `extraArgs` come last so
    they win."""
    return Translation(overrides=_overrides(job, pool_url, pool_wait_seconds), agent_loops=agent_loops())
