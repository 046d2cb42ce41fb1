"""The translation composed with verl's own ppo_trainer config, and checked by verl."""

import pytest
from hydra.errors import ConfigCompositionException, InstantiationException
from trainer_entry.spec import ESTIMATORS, parse_job
from trainer_entry.translate import (
    CPU_OVERRIDES,
    CPU_VLLM_KV_CACHE_BYTES,
    CPU_VLLM_OVERRIDES,
    LOGICAL_GPUS_PER_CPU_WORKER,
    TOOL_CONFIG_FILE,
    hydra_value,
    tool_config,
    translate,
)
from trainer_entry.verl_entry_points import COLOCATE_ASYNC_TRAINER_MODE, TRAINER_MODE, TRAINER_MODES
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.utils.config import omega_conf_to_dataclass

from trainer_entry import verl_config

POOL = "http://j-tools.rl.svc:8080"


def job(**spec):
    base = {
        "model": {"path": "Qwen/Qwen2.5-3B-Instruct"},
        "data": {
            "trainFiles": ["/data/gsm8k/train.parquet"],
            "valFiles": ["/data/gsm8k/test.parquet"],
            "maxPromptLength": 512,
            "maxResponseLength": 1536,
        },
        "algorithm": {
            "advantageEstimator": "grpo",
            "rolloutsPerPrompt": 4,
            "klLoss": {"enabled": True, "coef": 0.002},
            "learningRate": 2.0e-6,
            "trainBatchSize": 64,
            "totalEpochs": 3,
        },
        "rollout": {
            "engine": "vllm",
            "tensorParallelSize": 2,
            "gpuMemoryUtilization": 0.5,
            "protocol": "hermes",
            "maxToolTurns": 5,
            "maxParallelCalls": 2,
            "maxToolResponseLength": 777,
        },
        "tools": [
            {"name": "python", "type": "python", "timeoutSeconds": 7},
            {"name": "search", "type": "search", "corpus": "/data/c.jsonl"},
        ],
        "reward": {"preset": "code-execution"},
        "cluster": {"workers": {"replicas": 2, "gpusPerWorker": 4}},
        "checkpoint": {
            "saveFreq": 10,
            "resume": "auto",
            "volume": {"persistentVolumeClaim": {"claimName": "c"}},
        },
    }
    base.update(spec)
    return parse_job({"metadata": {"name": "gsm8k-python", "namespace": "rl"}, "spec": base})


def composed(j):
    cfg = verl_config.compose(translate(j, POOL).overrides)
    verl_config.check(cfg)
    return cfg


def test_every_field_lands_on_its_verl_key():
    cfg = composed(job())
    arr = cfg.actor_rollout_ref
    assert arr.model.path == "Qwen/Qwen2.5-3B-Instruct"
    assert list(cfg.data.train_files) == ["/data/gsm8k/train.parquet"]
    assert list(cfg.data.val_files) == ["/data/gsm8k/test.parquet"]
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (512, 1536)
    assert (arr.rollout.prompt_length, arr.rollout.response_length) == (512, 1536)
    assert cfg.data.train_batch_size == 64
    assert cfg.algorithm.adv_estimator == "grpo"
    assert arr.rollout.n == 4
    assert arr.actor.use_kl_loss is True and arr.actor.kl_loss_coef == 0.002
    assert arr.actor.optim.lr == 2.0e-6
    assert cfg.trainer.total_epochs == 3
    assert (arr.rollout.name, arr.rollout.mode) == ("vllm", "async")
    assert arr.rollout.tensor_model_parallel_size == 2
    assert arr.rollout.gpu_memory_utilization == 0.5
    mt = arr.rollout.multi_turn
    assert mt.enable and mt.format == "hermes" and mt.tool_config_path == TOOL_CONFIG_FILE
    assert (mt.max_user_turns, mt.max_assistant_turns, mt.max_parallel_calls) == (5, 6, 2)
    assert mt.max_tool_response_length == 777
    assert arr.rollout.agent.default_agent_loop == "toolrl_hermes"  # verl tool_agent + exclusion
    # rows naming another loop (agent_name) are rolled out with the job's protocol all the same
    custom_dataset = (cfg.data.custom_cls.path, cfg.data.custom_cls.name)
    assert custom_dataset == ("pkg://trainer_entry.dataset", "JobDataset")
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 4)
    assert cfg.trainer.save_freq == 10 and cfg.trainer.resume_mode == "auto"
    assert cfg.trainer.default_local_dir == "/checkpoints/rl/gsm8k-python"
    assert cfg.trainer.experiment_name == "gsm8k-python" and cfg.trainer.project_name == "rl"
    reward = cfg.reward.custom_reward_function
    assert reward.path == "pkg://trainer_entry.rewards" and reward.name == "compute_score"
    assert dict(reward.reward_kwargs) == {"preset": "code-execution", "pool_url": POOL, "tool": "python"}
    sampler = cfg.trainer.v1.sampler
    assert sampler.custom_sampler.path == "pkg://trainer_entry.breaker"
    assert sampler.custom_sampler.name == "BreakerReplayBuffer"
    assert dict(sampler.sampler_kwargs) == {
        "max_infra_failure_ratio": 0.2,  # the CRD's default
        "rollouts_per_prompt": 4,
        "pool_url": POOL,
        "recovery_seconds": 600.0,
    }


def test_every_protocol_uses_our_registered_loop():
    for protocol, loop in (
        ("tool-tags", "toolrl_tool_tags"),
        ("python-tags", "toolrl_python_tags"),
        ("react", "toolrl_react"),
        ("hermes", "toolrl_hermes"),
    ):
        j = job(rollout={"protocol": protocol})
        cfg = composed(j)
        assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == loop
        names = [entry["name"] for entry in translate(j, POOL).agent_loops]
        assert loop in names


def test_gae_adds_a_critic_and_steps_replace_epochs(tiny_model):
    algorithm = {"advantageEstimator": "gae", "rolloutsPerPrompt": 1, "totalTrainingSteps": 7}
    cfg = composed(job(algorithm=algorithm, model={"path": str(tiny_model)}))
    assert cfg.critic.model.path == str(tiny_model)
    assert cfg.algorithm.adv_estimator == "gae"
    assert cfg.trainer.total_training_steps == 7
    from verl.trainer.ppo.utils import need_critic

    assert need_critic(cfg)


def test_toolbench_weights_and_resume_path():
    weights = {
        "formatWeight": 0.2,
        "functionCallWeight": 0.2,
        "finishWeight": 0.2,
        "errorPenalty": -1.0,
        "finishBonus": 1.0,
    }
    cfg = composed(
        job(
            reward={"preset": "toolbench", "toolbench": weights},
            checkpoint={"saveFreq": -1, "resume": "/checkpoints/rl/old/global_step_40"},
        )
    )
    assert dict(cfg.reward.custom_reward_function.reward_kwargs.weights) == weights
    assert cfg.trainer.resume_mode == "resume_path"
    assert cfg.trainer.resume_from_path == "/checkpoints/rl/old/global_step_40"


def test_custom_reward_is_called_through_our_wrapper_which_names_the_users_function():
    cfg = composed(
        job(reward={"preset": "custom", "custom": {"configMap": "my-reward", "function": "score_it"}})
    )
    assert cfg.reward.custom_reward_function.name == "compute_score"
    assert cfg.reward.custom_reward_function.path == "pkg://trainer_entry.rewards"
    kwargs = cfg.reward.custom_reward_function.reward_kwargs
    assert kwargs.preset == "custom"
    assert dict(kwargs.custom) == {
        "path": "toolrl_custom_reward.py",
        "configMap": "my-reward",
        "key": "reward.py",
        "function": "score_it",
    }


def test_no_val_files_trains_without_validation():
    cfg = composed(job(data={"trainFiles": ["/data/t.parquet"]}))
    assert list(cfg.data.val_files) == ["/data/t.parquet"]
    assert cfg.trainer.val_before_train is False and cfg.trainer.test_freq == -1


def test_extra_args_pass_through_last():
    cfg = composed(
        job(trainer={"extraArgs": ["trainer.val_before_train=false", "actor_rollout_ref.rollout.n=2"]})
    )
    assert cfg.trainer.val_before_train is False
    assert cfg.actor_rollout_ref.rollout.n == 2


def test_a_misspelled_key_fails_composition():
    with pytest.raises(ConfigCompositionException):
        composed(job(trainer={"extraArgs": ["trainer.val_befor_train=false"]}))


def test_verls_own_checks_run():
    with pytest.raises(InstantiationException, match="ppo_micro_batch_size"):
        composed(job(trainer={"extraArgs": ["actor_rollout_ref.actor.use_dynamic_bsz=false"]}))


def test_rollout_section_converts_to_verls_dataclass():
    cfg = composed(job())
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    assert rollout.multi_turn.max_tool_response_length == 777


def test_our_estimators_are_verls():
    assert set(ESTIMATORS) <= {e.value for e in AdvantageEstimator}


def test_tool_config_carries_the_call_policy():
    j = job(
        rollout={
            "toolCall": {
                "timeoutSeconds": 12,
                "maxRetries": 5,
                "retryDelaySeconds": 0.25,
                "maxConcurrency": 64,
            }
        }
    )
    tools = tool_config(j, POOL)["tools"]
    assert [t["tool_schema"]["function"]["name"] for t in tools] == ["python", "search"]
    python = tools[0]["config"]
    assert python == {
        "type": "native",
        "pool_url": POOL,
        "tool_type": "python",
        "observation_format": "default",  # unset: the default format (observations.py)
        "timeout_seconds": 7.0,
        "request_timeout_seconds": 12.0,
        "max_retries": 5,
        "retry_delay_seconds": 0.25,
        "max_concurrency": 64,
    }
    assert tools[1]["config"]["timeout_seconds"] == 10.0  # the CRD's default for tools[].timeoutSeconds


def test_tool_config_carries_the_observation_format():
    tools = [{"name": "python", "type": "python", "observationFormat": "sandbox-fusion"}]
    (python,) = tool_config(job(tools=tools), POOL)["tools"]
    assert python["config"]["observation_format"] == "sandbox-fusion"


@pytest.mark.parametrize(
    "text", ["plain", "with space", "it's", "1e-6", "true", "a,b", "x=y", r"back\slash", "end\\", "q\\'s"]
)
def test_strings_survive_hydra(text):
    cfg = verl_config.compose([f"trainer.experiment_name={hydra_value(text)}"])
    assert cfg.trainer.experiment_name == text


def test_cpu_job_runs_verls_cpu_platform_with_logical_gpus(tiny_model):
    cpu = job(
        model={"path": str(tiny_model)},
        rollout={"engine": "hf", "protocol": "python-tags"},
        cluster={"workers": {"replicas": 1, "gpusPerWorker": 0}},
        algorithm={
            "advantageEstimator": "gae",
            "rolloutsPerPrompt": 2,
            "trainBatchSize": 4,
            "totalTrainingSteps": 2,
        },
    )
    overrides = translate(cpu, POOL).overrides
    for expected in CPU_OVERRIDES:
        assert expected in overrides
    cfg = composed(cpu)  # verl composes and validates it, critic included
    assert cfg.trainer.device == "cpu"
    assert cfg.trainer.n_gpus_per_node == LOGICAL_GPUS_PER_CPU_WORKER
    assert cfg.actor_rollout_ref.rollout.name == "hf"
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    gpu = translate(job(rollout={"engine": "hf"}), POOL).overrides
    assert not set(CPU_OVERRIDES) & set(gpu), "hf on GPUs keeps verl's GPU settings"


def test_cpu_job_with_vllm_runs_vllms_cpu_build_without_sleep_mode(tiny_model):
    """vLLM refuses sleep mode on CPUs and reads gpu_memory_utilization as a share of host memory:
    a CPU vllm job turns sleep mode off and gives the KV cache a fixed size; hf and GPU jobs do not."""
    cpu = job(
        model={"path": str(tiny_model)},
        rollout={"engine": "vllm", "protocol": "python-tags"},
        cluster={"workers": {"replicas": 1, "gpusPerWorker": 0}},
        algorithm={"rolloutsPerPrompt": 2, "trainBatchSize": 4, "totalTrainingSteps": 2},
    )
    overrides = translate(cpu, POOL).overrides
    assert set(CPU_OVERRIDES) | set(CPU_VLLM_OVERRIDES) <= set(overrides)
    cfg = composed(cpu)
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.name, rollout.enable_sleep_mode) == ("vllm", False)
    assert rollout.engine_kwargs.vllm.kv_cache_memory_bytes == CPU_VLLM_KV_CACHE_BYTES
    assert cfg.trainer.device == "cpu"
    hf = translate(job(rollout={"engine": "hf"}, cluster={"workers": {"gpusPerWorker": 0}}), POOL).overrides
    gpu = translate(job(rollout={"engine": "vllm"}), POOL).overrides
    assert not set(CPU_VLLM_OVERRIDES) & (set(hf) | set(gpu)), "only vLLM on CPUs needs them"


def test_operator_and_trainer_agree_on_logical_gpus_and_cpus_of_a_cpu_worker():
    from toolrl_operator import rayjob
    from trainer_entry.translate import LOGICAL_CPUS_PER_CPU_WORKER

    assert rayjob.LOGICAL_GPUS_PER_CPU_WORKER == LOGICAL_GPUS_PER_CPU_WORKER
    assert rayjob.LOGICAL_CPUS_PER_CPU_WORKER == LOGICAL_CPUS_PER_CPU_WORKER


def test_dry_run_without_the_model_still_checks_the_rest(monkeypatch):
    """A PPO spec with a hub id this machine cannot reach: the critic's model checks are skipped with
    a note, everything else is still checked by verl. (The hub in offline mode answers as an unreachable
    one does, the same OSError, without the ~30 s of connection retries.)"""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    unreachable = {"path": "no-such-org/no-such-model"}
    ppo = {"advantageEstimator": "gae", "rolloutsPerPrompt": 2, "trainBatchSize": 4, "totalTrainingSteps": 2}
    notes = verl_config.check(
        verl_config.compose(translate(job(model=unreachable, algorithm=ppo), POOL).overrides)
    )
    assert len(notes) == 1 and "no-such-org/no-such-model" in notes[0] and "critic checks" in notes[0]
    broken = job(
        model=unreachable,
        algorithm=ppo,
        trainer={"extraArgs": ["actor_rollout_ref.actor.use_dynamic_bsz=false"]},
    )
    with pytest.raises(InstantiationException, match="ppo_micro_batch_size"):
        verl_config.check(verl_config.compose(translate(broken, POOL).overrides))


def test_loggers_become_verls_tracking_backends():
    default = translate(job(), POOL).overrides
    assert "trainer.logger=[console]" in default
    chosen = translate(job(trainer={"loggers": ["console", "wandb"]}), POOL).overrides
    assert "trainer.logger=[console,wandb]" in chosen
    assert composed(job(trainer={"loggers": ["tensorboard"]})).trainer.logger == ["tensorboard"]


def test_every_job_attends_with_sdpa_unless_its_image_has_flash_attn():
    """verl defaults the actor to flash_attention_2, which the trainer image does not build by default
    (issue 23): without it the actor does not load."""
    cfg = composed(job())
    for model in (cfg.actor_rollout_ref.model, cfg.critic.model):
        assert model.override_config.attn_implementation == "sdpa" and model.use_remove_padding is False
    flash = [
        "actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
        "actor_rollout_ref.model.use_remove_padding=true",
    ]
    cfg = composed(job(trainer={"extraArgs": flash}))
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "flash_attention_2"
    assert cfg.actor_rollout_ref.model.use_remove_padding is True


def test_every_door_in_the_entry_point_table_leads_to_our_code():
    """verl_entry_points names what verl loads; a renamed class fails here, not in a Ray worker."""
    import importlib
    import re

    from trainer_entry.verl_entry_points import DATASET, ENTRY_POINTS, REWARD, SAMPLER

    for ref in (DATASET, REWARD, SAMPLER):
        module = importlib.import_module(ref.module.removeprefix("pkg://"))
        assert callable(getattr(module, ref.name)), ref
    named = {name for entry in ENTRY_POINTS for name in re.findall(r"trainer_entry(?:\.\w+)+", entry.ours)}
    assert len(named) >= 8
    for dotted in named:
        module, _, attr = dotted.rpartition(".")
        try:
            target = importlib.import_module(dotted)  # a module
        except ModuleNotFoundError:
            target = getattr(importlib.import_module(module), attr)
        assert target is not None, dotted


def test_each_trainer_mode_runs_our_trainer_of_that_mode(tiny_model):
    """sync and colocate-async each compose to a config verl checks, naming our trainer for the mode; the
    async knobs land on verl's keys, and only in an asynchronous mode (sync keeps verl's sampler)."""
    cpu = {
        "model": {"path": str(tiny_model)},
        "rollout": {"engine": "hf", "protocol": "python-tags"},
        "cluster": {"workers": {"replicas": 1, "gpusPerWorker": 0}},
        "algorithm": {"rolloutsPerPrompt": 2, "trainBatchSize": 4, "totalTrainingSteps": 2},
    }
    knobs = {"warmupBatches": 1.5, "maxPolicyVersions": 3, "onStale": "wait"}
    sync = composed(job(**cpu, trainer={"async": knobs}))
    assert sync.trainer.v1.trainer_mode == TRAINER_MODE == TRAINER_MODES["sync"]
    assert sync.trainer.v1.sampler.max_off_policy_threshold == 8  # verl's default, untouched
    assert sync.trainer.v1.sampler.max_off_policy_strategy == "drop"

    colocated = composed(job(**cpu, trainer={"mode": "colocate-async", "async": knobs}))
    assert colocated.trainer.v1.trainer_mode == COLOCATE_ASYNC_TRAINER_MODE
    assert colocated.trainer.v1.colocate_async.num_warmup_batches == 1.5
    assert colocated.trainer.v1.sampler.max_off_policy_threshold == 3
    assert colocated.trainer.v1.sampler.max_off_policy_strategy == "wait"
    # the circuit breaker stays verl's sampler in every mode
    assert colocated.trainer.v1.sampler.custom_sampler.name == sync.trainer.v1.sampler.custom_sampler.name
    defaults = composed(job(**cpu, trainer={"mode": "colocate-async"}))
    assert defaults.trainer.v1.colocate_async.num_warmup_batches == 1
    assert defaults.trainer.v1.sampler.max_off_policy_threshold == 8


def test_separate_async_generates_only_on_its_own_worker_group(tiny_model):
    """separate-async: our trainer over verl's separate_async, no rollout on the training workers
    (hybrid_engine false), the rollout pool sized by cluster.rolloutWorkers, the weights synced every
    parameterSyncStep mini-batches through our gloo checkpoint engine on CPUs, and a
    mini-batch of trainBatchSize / parameterSyncStep, which verl's own rule checks."""
    from trainer_entry.translate import ray_gpus
    from trainer_entry.verl_entry_points import CPU_CHECKPOINT_ENGINE, SEPARATE_ASYNC_TRAINER_MODE

    trainer = {
        "mode": "separate-async",
        "async": {"warmupBatches": 2, "maxPolicyVersions": 3, "onStale": "wait", "parameterSyncStep": 2},
    }
    cpu = {
        "model": {"path": str(tiny_model)},
        "rollout": {"engine": "hf", "protocol": "python-tags"},
        "cluster": {
            "workers": {"replicas": 1, "gpusPerWorker": 0},
            "rolloutWorkers": {"replicas": 2, "gpusPerWorker": 0},
        },
        "algorithm": {"rolloutsPerPrompt": 2, "trainBatchSize": 4, "totalTrainingSteps": 2},
        "trainer": trainer,
    }
    cfg = composed(job(**cpu))
    assert cfg.trainer.v1.trainer_mode == SEPARATE_ASYNC_TRAINER_MODE == TRAINER_MODES["separate-async"]
    assert cfg.actor_rollout_ref.hybrid_engine is False
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.nnodes, rollout.n_gpus_per_node) == (2, LOGICAL_GPUS_PER_CPU_WORKER)
    assert rollout.checkpoint_engine.backend == CPU_CHECKPOINT_ENGINE
    separate = cfg.trainer.v1.separate_async
    assert (separate.parameter_sync_step, separate.num_warmup_batches) == (2, 2)
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 2
    assert cfg.trainer.v1.sampler.max_off_policy_threshold == 3
    assert cfg.trainer.v1.sampler.max_off_policy_strategy == "wait"
    # Ray's logical GPUs on CPUs: one per training worker and one per rollout worker
    assert ray_gpus(job(**cpu)) == 3


def test_a_function_tool_is_offered_with_its_own_schema_in_verls_shape():
    from trainer_entry.tools import pool_input
    from trainer_entry.translate import tool_schema
    from verl.tools.schemas import OpenAIFunctionToolSchema

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "where"}},
        "required": ["city"],
    }
    tool = {"name": "weather", "type": "function", "description": "Weather in a city", "parameters": schema}
    offered = tool_schema(tool)
    assert offered["function"] == {
        "name": "weather",
        "description": "Weather in a city",
        "parameters": schema,
    }
    parsed = OpenAIFunctionToolSchema.model_validate(offered)  # what verl's tool loader makes of it
    assert parsed.function.parameters.required == ["city"]
    assert parsed.function.parameters.properties["city"].type == "string"
    # the model's arguments go to the pool as they are (it checks them on the schema)
    assert pool_input("function", {"city": "Oslo"}, {"ignored": 1}) == {"city": "Oslo"}
    with pytest.raises(ValueError, match="must be a JSON object"):
        pool_input("function", ["Oslo"], {})  # type: ignore[arg-type]


def test_an_mcp_entry_offers_the_remote_tools_the_pool_serves_with_their_schemas():
    """An mcp entry names a server; the model is offered each of its tools as the ready pool
    lists them (GET /v1/tools), under the pool's name for it, and none before the pool is asked."""
    from trainer_entry.tools import pool_input
    from verl.tools.schemas import OpenAIFunctionToolSchema

    entry = {"name": "remote", "type": "mcp", "mcp": {"url": "http://my-mcp.tools.svc:8000/mcp"}}
    j = job(tools=[{"name": "python", "type": "python"}, entry], rollout={"protocol": "hermes"})
    add_schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    pool_tools = [
        {"name": "python", "type": "python", "description": "Run", "inputSchema": {"type": "object"}},
        {"name": "remote__add", "type": "mcp", "description": "Add two integers.", "inputSchema": add_schema},
        {"name": "remote__fail", "type": "mcp", "description": "", "inputSchema": {"type": "object"}},
    ]
    before = tool_config(j, POOL)["tools"]  # the pool not asked yet: no remote tool
    assert [t["tool_schema"]["function"]["name"] for t in before] == ["python"]
    tools = tool_config(j, POOL, pool_tools)["tools"]
    assert [t["tool_schema"]["function"]["name"] for t in tools] == ["python", "remote__add", "remote__fail"]
    add = tools[1]
    assert add["config"]["tool_type"] == "mcp" and add["config"]["timeout_seconds"] == 10.0
    assert add["tool_schema"]["function"]["parameters"] == add_schema
    assert add["tool_schema"]["function"]["description"] == "Add two integers."
    assert tools[2]["tool_schema"]["function"]["description"] == "A tool of a remote MCP server."
    parsed = OpenAIFunctionToolSchema.model_validate(add["tool_schema"])  # what verl's loader makes of it
    assert parsed.function.parameters.required == ["a"]
    assert pool_input("mcp", {"a": 1}, {"ignored": 1}) == {"a": 1}


DAPO_ALGORITHM = {
    "advantageEstimator": "grpo",
    "rolloutsPerPrompt": 4,
    "trainBatchSize": 64,
    "totalEpochs": 1,
    "clipRatio": {"low": 0.2, "high": 0.28},
    "lossAggregation": "seq-mean-token-mean",
}
OVERLONG = {"enabled": True, "bufferLength": 512, "penaltyFactor": 0.5}


def test_clip_higher_and_loss_aggregation_land_on_the_actors_keys():
    """DAPO's clip-higher and the loss aggregation as typed fields (issue 38); the CRD's defaults are
    verl's."""
    cfg = composed(job(algorithm=DAPO_ALGORITHM))
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert actor.loss_agg_mode == "seq-mean-token-mean"
    assert cfg.critic.loss_agg_mode == "seq-mean-token-mean"  # verl's critic follows the actor's
    defaults = composed(job()).actor_rollout_ref.actor
    verl = verl_config.compose([]).actor_rollout_ref.actor
    for key in ("clip_ratio_low", "clip_ratio_high", "loss_agg_mode"):
        assert defaults[key] == verl[key], key


class _Tokens:
    def decode(self, ids, skip_special_tokens=True):
        return "the answer is \\boxed{4}"


async def test_the_overlong_penalty_is_applied_by_verls_dapo_reward_manager_as_composed():
    """spec.reward.overlongPenalty -> verl's dapo reward manager and its reward_kwargs keys, as verl 0.9.1
    reads them: its own run_single on a 1280-token response of a job with maxResponseLength 1536 and a
    512-token buffer loses 0.5 x (1280 - 1024) / 512 = 0.125 of a score of 1."""
    import numpy as np
    import torch
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls

    off = composed(job())  # no penalty: verl's naive manager, which adds num_turns etc. to extra_info
    assert off.reward.reward_manager.name == "naive" and "reward_kwargs" not in off.reward
    cfg = composed(job(algorithm=DAPO_ALGORITHM, reward={"preset": "math", "overlongPenalty": OVERLONG}))
    assert cfg.reward.reward_manager.name == "dapo"
    assert dict(cfg.reward.reward_kwargs.overlong_buffer_cfg) == {
        "enable": True,
        "len": 512,
        "penalty_factor": 0.5,
        "log": False,
    }
    assert cfg.reward.reward_kwargs.max_resp_len == 1536  # spec.data.maxResponseLength

    def score(data_source, solution_str, ground_truth, extra_info):
        return {"score": 1.0}

    manager = get_reward_manager_cls(cfg.reward.reward_manager.name)(cfg, _Tokens(), score)
    prompt, response, valid = 8, 1536, 1280
    data = DataProto.from_dict(
        tensors={
            "responses": torch.ones(1, response, dtype=torch.long),
            "attention_mask": torch.cat(
                [torch.ones(1, prompt + valid), torch.zeros(1, response - valid)], dim=1
            ).long(),
        },
        non_tensors={
            "data_source": np.array(["math"], dtype=object),
            "reward_model": np.array([{"ground_truth": "4"}], dtype=object),
            "extra_info": np.array([{}], dtype=object),
        },
    )
    result = await manager.run_single(data)
    assert float(result["reward_score"]) == pytest.approx(1.0 - 0.5 * (1280 - 1024) / 512)
