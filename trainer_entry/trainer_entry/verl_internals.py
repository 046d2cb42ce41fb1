"""Every private verl, Ray and vLLM internal that trainer_entry uses, reached only through here, and a
probe that says which of them a new version moved.

verl offers extension points for most of what we do (see `verl_entry_points`); where it offers none
we override a private method, read a private attribute or replace a module attribute. Each such use
is an `Internal` in `INTERNALS` (what we use it for, and why no public API serves), and the rest of
trainer_entry reaches it through this module's mixins and accessors, never by its name.

`probe()` checks that each still exists with the parameters we call it with (and, for attributes and
text we rely on, that the source still has them); `check()` raises `InternalsMoved` listing what moved.
`python -m trainer_entry run` calls `check()` before Ray starts, so a verl upgrade fails at once with
that list instead of mid-training; tests/unit/trainer_entry/test_verl_internals.py checks every entry
on the installed versions. `python -m trainer_entry.verl_internals` prints the probe's report.

This module imports verl, Ray and vLLM only when a symbol is resolved: the probe can report a module
that no longer imports, and the mixins below carry no import of their own.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from trainer_entry.spec import SEPARATE_TRAINER_MODE

# What the run uses an internal for: every run, the cpu platform, vLLM's CPU build (engine vllm on CPUs).
ALWAYS, CPU, VLLM_CPU = "always", "cpu", "vllm-cpu"
SEPARATE = SEPARATE_TRAINER_MODE  # trainer.mode separate-async
SUPPORTED = {"verl": "0.9.1", "vllm": "0.24.0"}  # what INTERNALS were written against (pyproject pins)


@dataclass(frozen=True)
class Internal:
    """One internal we rely on: `module:qualname`, what for, and what of it we rely on."""

    path: str
    use: str  # what we use it for, and why no public API serves
    params: tuple[str, ...] = ()  # leading parameters (after self) we call or override it with
    source_has: tuple[str, ...] = ()  # text its source must hold (attributes it sets, a log line)
    when: str = ALWAYS

    @property
    def module(self) -> str:
        return self.path.split(":")[0]

    @property
    def qualname(self) -> str:
        return self.path.split(":")[1]

    @property
    def distribution(self) -> str:
        return self.module.split(".")[0]


# Keys of the internals reached by `resolve` / `replace` (the others are used by the mixins below).
PROCESS_GROUP_INIT = "verl.utils.distributed:initialize_global_process_group_ray"
FSDP_OFFLOAD_POLICY = "verl.utils.fsdp_utils:CPUOffloadPolicy"
VALUEHEAD_LOADER = "verl.utils.model:load_valuehead_model"
ROLLOUT_REGISTRY = "verl.workers.rollout.base:_ROLLOUT_REGISTRY"
VLLM_LINEAR_METHOD = "vllm.model_executor.layers.linear:UnquantizedLinearMethod.process_weights_after_loading"
VLLM_CPU_GEMM = "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm"
SEPARATE_ASYNC_LOGGER = "verl.trainer.ppo.v1.trainer_separate_async:logger"
# verl 0.9.1's separate_async trainer logs with `logger.info(..., flush=True)` (a print() keyword) where
# actor_rollout_ref.hybrid_engine is false, which logging refuses (TypeError): every run with rollout on
# its own workers only would stop there.
SEPARATE_ASYNC_FLUSH_LOG = "flush=True"
# The text of verl's log line for a prompt group whose trajectory raised (our messages point to it).
RUN_PROMPT_ERROR_LOG = "Error in _run_prompt"

INTERNALS: tuple[Internal, ...] = (
    # runner.ToolRLTrainer (TrainerStepHooks): the v1 trainer has on_* hooks, none around these steps
    Internal(
        "verl.trainer.ppo.v1:PPOTrainerSync._balance_batch",
        "marks the training phase: the first step of an update after sampling; no hook runs there",
        params=("batch", "metrics"),
    ),
    Internal(
        "verl.trainer.ppo.v1:PPOTrainerSync._compute_advantage",
        "counts the trajectories an update trains on and the infra-tainted ones: the only step that "
        "sees the update's batch keys before training",
        params=("batch", "metrics"),
    ),
    Internal(
        "verl.trainer.ppo.v1:PPOTrainerSync._compute_metrics",
        "adds the step's idle fractions to the metrics verl logs: the first point where a step's whole "
        "timing (`timing_s/step`) is in its metrics, before verl logs them; no hook runs there",
        params=("batch", "metrics", "timing_raw", "global_steps", "epoch"),
    ),
    Internal(
        "verl.trainer.ppo.v1:PPOTrainerSync._save_checkpoint",
        "turns a checkpoint that cannot be written into CheckpointWriteError; no hook wraps the save",
    ),
    Internal(
        "verl.trainer.ppo.v1:PPOTrainerSync.fit",
        "`trainer.logger`, the Tracking that fit() builds: where our tracking backend is added",
        source_has=("self.logger = Tracking(",),
    ),
    Internal(
        "verl.utils.tracking:Tracking.__init__",
        "`Tracking.logger`, its backends by name: verl builds backends only from its own list of names",
        source_has=("self.logger = {}",),
    ),
    # runner.ToolRLTaskRunner: run_ppo takes a task_runner_class, which must be a Ray actor class
    Internal(
        "verl.trainer.main_ppo:TaskRunnerV1.__ray_actor_class__",
        "the task runner's plain class (Ray's ActorClass hides it), to subclass in our module",
    ),
    # hf_rollout.HFReplica: Ray's own methods on every actor
    Internal(
        "ray.actor:_modify_class",
        "`__ray_ready__` (waits for an actor to start) and `__ray_call__` (runs a closure in a training "
        "worker: its node id); Ray adds them to every actor, with no other name",
        source_has=("def __ray_ready__(self)", "def __ray_call__("),
    ),
    # hf_rollout.HFReplica: a RolloutReplica publishes its server only through these two attributes
    Internal(
        "verl.workers.rollout.replica:RolloutReplica.__init__",
        "`_server_handle` / `_server_address`: what `server_handle` / `server_address` return; "
        "launch_servers must set them and verl has no setter",
        source_has=("self._server_handle", "self._server_address"),
    ),
    # verl_plugin.register: the replica registry is public, the adapter (in-worker) registry is not
    Internal(
        ROLLOUT_REGISTRY,
        "registers the hf engine's in-worker adapter (HFServerAdapter); get_rollout_class reads only it",
    ),
    # breaker.BreakerReplayBuffer (ReplayBufferHooks): the custom_sampler extension point gives the
    # class; the sampling loop's poll of group states has no hook
    Internal(
        "verl.trainer.ppo.v1.replay_buffer:ReplayBufferAsync._terminal_eviction_reasons",
        "sees failed prompt groups on each poll of the sampling loop, before verl regenerates them, and "
        "the groups dynamic sampling drops: it returns (stale, dapo-filtered, failed, {score: groups})",
        params=("global_steps", "partition_id"),
        source_has=("return stale_uids, dapo_uids, set(self.failure_keys[partition_id]), dapo_counts",),
    ),

    Internal(
        "verl.trainer.ppo.v1.replay_buffer:ReplayBufferAsync.__init__",
        "`failure_keys` / `finished_keys` (group states per partition) and `refill_fn` (submits fresh "
        "prompts): the breaker counts failed groups and regenerates a discarded batch; "
        "`filter_groups_metric`: dynamic sampling in verl's buffer, which verl passes to its own buffers "
        "only (the job's sampler hands spec.algorithm.dynamicSampling.metric over)",
        source_has=(
            "self.failure_keys",
            "self.finished_keys",
            "self.refill_fn",
            "self.filter_groups_metric = filter_groups_metric",
        ),
    ),
    Internal(
        "verl.trainer.ppo.v1.replay_buffer:ReplayBuffer",
        "the TransferQueue key layout `{uid}_{session_id}_{index}`: the breaker counts sessions",
        source_has=("`{uid}_{session_id}_{index}`",),
    ),
    Internal(
        "verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ._run_prompt",
        f"its log line {RUN_PROMPT_ERROR_LOG!r}: our failing-groups message tells the user to look for it",
        source_has=(RUN_PROMPT_ERROR_LOG,),
    ),
    # agent_loop.HermesAgentLoop (ToolAgentLoopHooks): tool_agent's state machine has no hook
    Internal(
        "verl.experimental.agent_loop.tool_agent_loop:ToolAgentLoop._handle_processing_tools_state",
        "ends a hermes trajectory after a round of calls with an infrastructure failure",
        params=("agent_data",),
    ),
    # cpu_platform._patch_verl: accelerator assumptions no platform method reaches
    Internal(
        PROCESS_GROUP_INIT,
        "replaced on CPUs: the backend `cpu:gloo,cpu:gloo` verl builds for device cpu becomes `gloo`",
        params=("timeout_second", "backend"),
        when=CPU,
    ),
    Internal(
        FSDP_OFFLOAD_POLICY,
        "replaced on CPUs by an unpinned policy: verl builds it with pin_memory=True, which needs CUDA",
        params=("pin_memory",),
        when=CPU,
    ),
    Internal(
        VALUEHEAD_LOADER,
        "replaced where flash-attn is not importable (any platform; verl_plugin.use_sdpa_critic): it passes "
        "attn_implementation=flash_attention_2 itself, whatever the job's attention, and has no setting",
        params=("local_path", "torch_dtype", "model_config", "trust_remote_code"),
    ),
    # vllm_on_cpu: verl's vLLM server and replica on vLLM's CPU build
    Internal(
        "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMHttpServer._get_worker_extension_cls",
        "names our worker extension (keeps linear weights); the server takes no setting for it",
        when=VLLM_CPU,
    ),
    Internal(
        "verl.workers.rollout.vllm_rollout.vllm_async_server:vLLMReplica.__init__",
        "`server_class`, the Ray actor class the replica starts: replaced by our server's",
        source_has=("self.server_class",),
        when=VLLM_CPU,
    ),
    Internal(
        VLLM_LINEAR_METHOD,
        "replaced in vLLM's CPU worker so linear layers keep their weight after oneDNN repacking",
        params=("layer",),
        when=VLLM_CPU,
    ),
    # runner.ToolRLSeparateAsyncTrainer: a bug of verl 0.9.1 on the path separate-async takes
    Internal(
        "verl.trainer.ppo.v1.trainer_separate_async:PPOTrainerSeparateAsync._setup",
        "logs `logger.info(..., flush=True)` with hybrid_engine false, a TypeError in logging: our "
        "module logger (below) drops the keyword; gone from the source = fixed, remove our logger",
        source_has=(SEPARATE_ASYNC_FLUSH_LOG,),
        when=SEPARATE,
    ),
    Internal(
        SEPARATE_ASYNC_LOGGER,
        "replaced by a logger that drops print()'s `flush` keyword (the bug above); verl has no setting",
        when=SEPARATE,
    ),
    Internal(
        VLLM_CPU_GEMM,
        "the CPU build's repacking, called with remove_weight=False; no setting of vLLM does that",
        params=("layer", "remove_weight"),
        when=VLLM_CPU,
    ),
)
BY_PATH = {internal.path: internal for internal in INTERNALS}


class InternalsMoved(RuntimeError):
    """Internals trainer_entry relies on are missing or changed in the installed versions."""


def _lookup(path: str) -> Any:
    internal = BY_PATH[path]
    obj: Any = importlib.import_module(internal.module)
    for part in internal.qualname.split("."):
        obj = getattr(obj, part)
    return obj


def resolve(path: str) -> Any:
    """The object at `path` (a key of INTERNALS)."""
    return _lookup(path)


# verl's own objects that `replace` replaced in this process: the probe checks those, not ours
_ORIGINALS: dict[str, Any] = {}


def replace(path: str, value: Any) -> None:
    """Set the module attribute at `path` (a key of INTERNALS) to `value`: our replacement of it."""
    internal = BY_PATH[path]
    _ORIGINALS.setdefault(path, _lookup(path))
    owner_path, _, name = internal.qualname.rpartition(".")
    owner: Any = importlib.import_module(internal.module)
    for part in owner_path.split(".") if owner_path else ():
        owner = getattr(owner, part)
    setattr(owner, name, value)


def _parameters(obj: Any) -> list[str]:
    names = list(inspect.signature(obj).parameters)
    return names[1:] if names and names[0] == "self" else names


def problem(internal: Internal) -> str | None:
    """What moved of `internal` on the installed versions, or None when it is as we rely on it."""
    try:
        module: Any = importlib.import_module(internal.module)
    except Exception as exc:  # a module that moved, or one whose own imports fail
        return f"module {internal.module} does not import ({type(exc).__name__}: {exc})"
    obj = module
    for part in internal.qualname.split("."):
        if not hasattr(obj, part):
            return f"{internal.module} has no {internal.qualname} (no attribute {part!r})"
        obj = getattr(obj, part)
    obj = _ORIGINALS.get(internal.path, obj)
    if internal.params and obj is not None:  # CPUOffloadPolicy is None where torch lacks FSDP2
        try:
            have = _parameters(obj)
        except (TypeError, ValueError) as exc:
            return f"its signature cannot be read ({exc})"
        if have[: len(internal.params)] != list(internal.params):
            return f"parameters are ({', '.join(have)}), we rely on ({', '.join(internal.params)}, ...)"
    if internal.source_has:
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError) as exc:
            return f"its source cannot be read ({exc})"
        missing = [text for text in internal.source_has if text not in source]
        if missing:
            return f"its source no longer has {', '.join(repr(t) for t in missing)}"
    return None


def probe(contexts: Iterable[str] = (ALWAYS, CPU, VLLM_CPU, SEPARATE)) -> list[str]:
    """One line per internal (of the given `contexts`) that moved; empty when all is as we rely on."""
    wanted = set(contexts)
    moved = []
    for internal in INTERNALS:
        if internal.when in wanted:
            found = problem(internal)
            if found is not None:
                moved.append(f"{internal.path}: {found} (we use it: {internal.use})")
    return moved


def installed_versions() -> dict[str, str]:
    versions = {}
    for name in ("verl", "ray", "vllm"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def moved_message(moved: list[str], versions: dict[str, str] | None = None) -> str:
    versions = versions or installed_versions()
    have = ", ".join(f"{name} {version}" for name, version in versions.items())
    wrote = ", ".join(f"{name} {version}" for name, version in SUPPORTED.items())
    lines = [
        f"{len(moved)} internal(s) of verl/Ray/vLLM that trainer_entry relies on moved in the installed "
        f"versions ({have}); trainer_entry was written against {wrote}:",
        *(f"  - {line}" for line in moved),
        "Install the versions trainer_entry pins (trainer_entry/pyproject.toml), or adapt "
        "trainer_entry/verl_internals.py to the new version (trainer_entry/README.md, "
        "'Moving to a new verl version').",
    ]
    return "\n".join(lines)


def check(contexts: Iterable[str] = (ALWAYS, CPU, VLLM_CPU, SEPARATE)) -> None:
    """Raise InternalsMoved, naming each moved internal and the installed versions, if any moved."""
    moved = probe(contexts)
    if moved:
        raise InternalsMoved(moved_message(moved))


# --- accessors ----------------------------------------------------------------------------------


def add_tracking_backend(trainer: Any, name: str, backend: Any) -> None:
    """Add `backend` (log(data, step), finish()) to the trainer's Tracking, next to verl's own."""
    trainer.logger.logger[name] = backend


def actor_class(remote_class: Any) -> type:
    """The plain class behind a Ray ActorClass (`ray.remote(cls)`), to subclass."""
    return remote_class.__ray_actor_class__


def actor_ready(handle: Any) -> Any:
    """An ObjectRef that resolves once the actor has started."""
    return handle.__ray_ready__.remote()


def call_in_actor(handle: Any, fn: Callable[[Any], Any]) -> Any:
    """An ObjectRef of `fn(actor instance)`, run inside the actor."""
    return handle.__ray_call__.remote(fn)


def set_replica_server(replica: Any, handle: Any, address: str) -> None:
    """What a RolloutReplica's `server_handle` and `server_address` return (launch_servers sets them)."""
    replica._server_handle = handle
    replica._server_address = address


def register_rollout_adapter(engine: str, mode: str, class_path: str) -> None:
    """Register the in-worker rollout class (a BaseRollout, by dotted path) of `engine` in `mode`."""
    resolve(ROLLOUT_REGISTRY)[(engine, mode)] = class_path


class _FlushTolerantLogger(logging.LoggerAdapter):
    """verl's module logger, taking (and dropping) print()'s `flush` keyword."""

    def log(self, level: int, msg: object, *args: Any, flush: bool = False, **kwargs: Any) -> None:
        super().log(level, msg, *args, **kwargs)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return msg, kwargs


def tolerate_separate_async_flush_logs() -> None:
    """Make verl's separate_async trainer's `logger.info(..., flush=True)` log instead of raising."""
    logger = _ORIGINALS.get(SEPARATE_ASYNC_LOGGER) or resolve(SEPARATE_ASYNC_LOGGER)
    replace(SEPARATE_ASYNC_LOGGER, _FlushTolerantLogger(logger, {}))


def set_replica_server_class(replica: Any, server_class: Any) -> None:
    """The Ray actor class a vLLMReplica starts as its server."""
    replica.server_class = server_class


def session_of(key: str) -> tuple[str, str]:
    """The (uid, session) of a TransferQueue key `{uid}_{session_id}_{index}`: one trajectory."""
    uid, session = key.split("_")[:2]
    return uid, session


def prompt_groups(buffer: Any, partition_id: str) -> tuple[set, set]:
    """A replay buffer's (failed, finished) prompt groups of a partition, as its sampling loop sees them."""
    return buffer.failure_keys[partition_id], buffer.finished_keys[partition_id]


def refill(buffer: Any, prompts: int) -> Any:
    """Have a replay buffer submit `prompts` fresh prompts for generation."""
    return buffer.refill_fn(prompts)


# --- mixins: verl's private steps as named hooks (put them before the verl class they extend) -----


class TrainerStepHooks:
    """For verl's v1 trainers (PPOTrainerSync and PPOTrainerColocateAsync: both inherit these steps from
    PPOTrainer): `before_update()`, `on_update_batch(batch, metrics)` and `save_checkpoint
    (save)` around the private steps of an update and of a checkpoint, and `on_step_metrics(metrics)`
    once verl has computed a step's metrics (its timings among them), before it logs them."""

    def before_update(self) -> None: ...

    def on_update_batch(self, batch: Any, metrics: dict) -> None: ...

    def on_step_metrics(self, metrics: dict) -> None: ...

    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, *args: Any, **kwargs: Any) -> Any:
        result = super()._compute_metrics(batch, metrics, timing_raw, *args, **kwargs)  # type: ignore[misc]
        self.on_step_metrics(metrics)
        return result

    def save_checkpoint(self, save: Callable[[], Any]) -> Any:
        return save()

    def _balance_batch(self, *args: Any, **kwargs: Any) -> Any:
        self.before_update()
        return super()._balance_batch(*args, **kwargs)  # type: ignore[misc]

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        self.on_update_batch(batch, metrics)
        return super()._compute_advantage(batch, metrics)  # type: ignore[misc]

    def _save_checkpoint(self) -> Any:
        return self.save_checkpoint(super()._save_checkpoint)  # type: ignore[misc]


class ReplayBufferHooks:
    """For ReplayBufferAsync: `on_group_poll(global_steps, partition_id)` on each poll of the sampling
    loop's group states, before verl picks the groups it evicts (and regenerates); then
    `on_filtered_groups(partition_id, uids, scores)` with the groups it picked for dynamic sampling
    (each uid's rollouts all scored alike; {score: groups})."""

    def on_group_poll(self, global_steps: int, partition_id: str) -> None: ...

    def on_filtered_groups(self, partition_id: str, uids: set[str], scores: Counter[float]) -> None: ...

    def _terminal_eviction_reasons(self, global_steps: int, partition_id: str) -> Any:
        self.on_group_poll(global_steps, partition_id)
        reasons = super()._terminal_eviction_reasons(global_steps, partition_id)  # type: ignore[misc]
        _stale, filtered, _failed, scores = reasons
        if filtered:
            self.on_filtered_groups(partition_id, set(filtered), scores)
        return reasons


class ToolAgentLoopHooks:
    """For ToolAgentLoop: `after_tool_calls(agent_data, state)` returns the state after a round of
    tool calls (the one verl chose, or another)."""

    def after_tool_calls(self, agent_data: Any, state: Any) -> Any:
        return state

    async def _handle_processing_tools_state(self, agent_data: Any) -> Any:
        handled: Awaitable[Any] = super()._handle_processing_tools_state(agent_data)  # type: ignore[misc]
        return self.after_tool_calls(agent_data, await handled)


class WorkerExtensionHook:
    """For vLLMHttpServer: the vLLM worker extension is the class in `worker_extension`."""

    worker_extension: type

    def _get_worker_extension_cls(self) -> str:
        cls = self.worker_extension
        return f"{cls.__module__}.{cls.__qualname__}"


def main() -> int:
    moved = probe()
    if moved:
        print(moved_message(moved))
        return 1
    versions = ", ".join(f"{name} {version}" for name, version in installed_versions().items())
    print(f"all {len(INTERNALS)} internals trainer_entry relies on are in place ({versions})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
