"""Where trainer_entry enters verl: every door, in one table (`ENTRY_POINTS`).

verl finds our code in seven ways: Hydra overrides naming our classes (`ConfigClass`, written by
translate.py from the entries here), the agent-loop YAML and the tool-config YAML (written by
translate.py, named by overrides), the `verl.plugins` entry point that `import verl` runs
(trainer_entry/pyproject.toml -> verl_plugin), the trainer registered by importing runner.py, the
`task_runner_class` argument of `run_ppo`, and replacements of verl's own functions (cpu_platform,
vllm_on_cpu). Every private verl, Ray or vLLM symbol those use is in verl_internals.

Pure data: no verl import, so translate.py stays a pure function of the spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainer_entry.spec import COLOCATE_TRAINER_MODE, SEPARATE_TRAINER_MODE, SYNC_TRAINER_MODE


@dataclass(frozen=True)
class ConfigClass:
    """A class (or function) verl loads from a `path` (a `pkg://` module) and a `name` under `key`."""

    key: str
    module: str
    name: str

    def overrides(self, render: Callable[[str], str]) -> list[str]:
        """The Hydra overrides that select it (`render`: translate.hydra_value)."""
        return [f"{self.key}.path={render(self.module)}", f"{self.key}.name={render(self.name)}"]


@dataclass(frozen=True)
class EntryPoint:
    """One door into verl: which part of the run, how verl finds our code, and what it finds."""

    where: str
    mechanism: str
    ours: str


# Our trainers (runner.py) by spec.trainer.mode: verl's trainers with our hooks, each registered with verl
# under its own `trainer.v1.trainer_mode` (verl treats every mode but its own "sync" as asynchronous in its
# replay buffer and checkpoints; see runner.py)
TRAINER_MODE = "toolrl-sync"
COLOCATE_ASYNC_TRAINER_MODE = "toolrl-colocate-async"
SEPARATE_ASYNC_TRAINER_MODE = "toolrl-separate-async"
TRAINER_MODES = {
    SYNC_TRAINER_MODE: TRAINER_MODE,
    COLOCATE_TRAINER_MODE: COLOCATE_ASYNC_TRAINER_MODE,
    SEPARATE_TRAINER_MODE: SEPARATE_ASYNC_TRAINER_MODE,
}
"""By spec.trainer.mode (the CRD's enum, spec.TRAINER_MODES: tests/unit/trainer_entry/test_run.py checks that
each has a trainer here)."""
# separate-async moves the actor's weights to the rollout workers through a verl checkpoint engine: on
# CPUs ours (`cpu_checkpoint_engine`, gloo). GPUs would take verl's nccl one, which needs cupy (not in
# the trainer image): the CRD refuses separate-async on GPUs for now (its rule at spec.trainer.mode).
CPU_CHECKPOINT_ENGINE = "gloo"
CPU_CHECKPOINT_ENGINE_MODULE = "trainer_entry.cpu_checkpoint_engine"
DATASET = ConfigClass("data.custom_cls", "pkg://trainer_entry.dataset", "JobDataset")
SAMPLER = ConfigClass(
    "trainer.v1.sampler.custom_sampler", "pkg://trainer_entry.breaker", "BreakerReplayBuffer"
)
REWARD = ConfigClass("reward.custom_reward_function", "pkg://trainer_entry.rewards", "compute_score")
TOOL_CLASS = "trainer_entry.tools.PoolTool"
AGENT_LOOP_CLASS = "trainer_entry.agent_loop.TagAgentLoop"
HERMES_LOOP_CLASS = "trainer_entry.agent_loop.HermesAgentLoop"
PLUGIN_MODULE = "trainer_entry.verl_plugin"  # [project.entry-points."verl.plugins"] in pyproject.toml

ENTRY_POINTS: tuple[EntryPoint, ...] = (
    EntryPoint(
        "trainer mode",
        f"`register_trainer(...)` for {', '.join(map(repr, TRAINER_MODES.values()))} when runner.py is "
        "imported; `trainer.v1.trainer_mode` by spec.trainer.mode",
        "trainer_entry.runner.ToolRLTrainer, trainer_entry.runner.ToolRLColocateAsyncTrainer, "
        "trainer_entry.runner.ToolRLSeparateAsyncTrainer",
    ),
    EntryPoint(
        "checkpoint engine",
        f"`CheckpointEngineRegistry.register({CPU_CHECKPOINT_ENGINE!r})` when verl_plugin loads; "
        "`actor_rollout_ref.rollout.checkpoint_engine.backend` in separate-async on CPUs",
        f"{CPU_CHECKPOINT_ENGINE_MODULE}.GlooCheckpointEngine",
    ),
    EntryPoint(
        "task runner",
        "`run_ppo(config, task_runner_class=...)` (run.py); Ray imports runner.py wherever it runs",
        "trainer_entry.runner.ToolRLTaskRunner",
    ),
    EntryPoint(
        "sampler", f"`{SAMPLER.key}.path/.name` + `sampler_kwargs`", f"{SAMPLER.module} {SAMPLER.name}"
    ),
    EntryPoint("dataset", f"`{DATASET.key}.path/.name`", f"{DATASET.module} {DATASET.name}"),
    EntryPoint(
        "agent loops",
        "agent-loop YAML (`_target_`), named by `actor_rollout_ref.rollout.agent.agent_loop_config_path`",
        f"{AGENT_LOOP_CLASS}, {HERMES_LOOP_CLASS}",
    ),
    EntryPoint(
        "tools",
        "tool-config YAML (`class_name`), named by `actor_rollout_ref.rollout.multi_turn.tool_config_path`",
        TOOL_CLASS,
    ),
    EntryPoint("reward", f"`{REWARD.key}.path/.name` + `reward_kwargs`", f"{REWARD.module} {REWARD.name}"),
    EntryPoint(
        "tracking",
        "a backend added to verl's Tracking in `on_train_begin` (verl_internals.add_tracking_backend)",
        "trainer_entry.hub.TrackingBackend",
    ),
    EntryPoint(
        "rollout engines",
        f"the `verl.plugins` entry point ({PLUGIN_MODULE}) registers replicas and adapters at `import "
        "verl`; `actor_rollout_ref.rollout.name` picks one",
        "hf: trainer_entry.hf_rollout.HFReplica/HFServerAdapter; vllm on CPUs: "
        "trainer_entry.vllm_on_cpu.CPUvLLMReplica",
    ),
    EntryPoint(
        "platform",
        "the same plugin registers the `cpu` platform (selected by VERL_PLATFORM=cpu) and replaces three "
        "verl functions on it (verl_internals.replace)",
        "trainer_entry.cpu_platform",
    ),
)
