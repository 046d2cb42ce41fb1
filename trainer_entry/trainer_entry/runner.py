"""Our hooks into verl's trainer: verl's extension points, and `verl_internals.TrainerStepHooks` for
the private steps of an update that no extension point reaches (no patching).

- `ToolRLHooks` are our hooks, applied to verl's synchronous v1 trainer (`ToolRLTrainer`) and to its
  colocated asynchronous one (`ToolRLColocateAsyncTrainer`: rollouts of the next steps go on while an
  update trains, partial rollouts resumed on the new weights), each registered under its own
  `trainer.v1.trainer_mode` (verl_entry_points.TRAINER_MODES). Every hook calls verl's own first or
  last, so verl's (the async trainer's abort, sleep and resume of the rollout replicas, its warm-up
  batches) still run. The `on_*` hooks mark the rollout phase and, once verl has built its `Tracking`, add our
  backend next to verl's own ones.
- `ToolRLHooks.on_update_batch` (before verl computes the advantage) counts the trajectories each
  update trains on and checks that none met an infrastructure failure (the agent loop returns those
  as no output, so verl never stores them: see agent_loop.py), and how many of them, and of their prompt
  groups, called a tool (`tool_use`); verl's console log shows `toolrl/trajectories_trained`,
  `toolrl/infra_failures_in_update`, `toolrl/trajectories_calling_tools` and `toolrl/groups_calling_tools`
  per step.
- `ToolRLHooks.on_step_metrics` adds the step's rollout and trainer idle fractions
  (`toolrl/rollout_idle_fraction`, `toolrl/trainer_idle_fraction`: metrics.idle_fractions, from verl's
  timings, per trainer mode) to the metrics verl logs, so its console and our gauges show them.
- `ToolRLHooks.save_checkpoint`: a checkpoint that cannot be written (a full or read-only volume)
  stops the run with `CheckpointWriteError`, which says so and what to do, not an OSError traceback
  from inside a Ray worker.
- `ToolRLTaskRunner` is verl's task runner (the `task_runner_class` argument of `run_ppo`) defined in
  this module, so Ray imports this module, and with it the trainer registration, wherever it runs.
"""

from __future__ import annotations

import logging

import ray
import transfer_queue as tq
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.v1 import (
    PPOTrainerColocateAsync,
    PPOTrainerSeparateAsync,
    PPOTrainerSync,
    register_trainer,
)

from trainer_entry.hub import TrackingBackend, sink
from trainer_entry.metrics import idle_fractions
from trainer_entry.pool_client import FAULT_INFRA
from trainer_entry.spec import COLOCATE_TRAINER_MODE, SEPARATE_TRAINER_MODE, SYNC_TRAINER_MODE
from trainer_entry.tools import TOOL_FAULTS, TOOL_OUTCOMES
from trainer_entry.verl_entry_points import (
    COLOCATE_ASYNC_TRAINER_MODE,
    SEPARATE_ASYNC_TRAINER_MODE,
    TRAINER_MODE,
)
from trainer_entry.verl_internals import (
    TrainerStepHooks,
    actor_class,
    add_tracking_backend,
    tolerate_separate_async_flush_logs,
)

log = logging.getLogger(__name__)

BACKEND_NAME = "toolrl"
TRAINED_METRIC = "toolrl/trajectories_trained"
TAINTED_METRIC = "toolrl/infra_failures_in_update"
CALLING_METRIC = "toolrl/trajectories_calling_tools"
GROUPS_CALLING_METRIC = "toolrl/groups_calling_tools"


def infra_tainted(extra_fields: list[dict]) -> int:
    """How many trajectories (their verl `extra_fields`) met an infrastructure failure."""
    return sum(
        FAULT_INFRA in ((extra if isinstance(extra, dict) else {}).get(TOOL_FAULTS) or [])
        for extra in extra_fields
    )


def tool_use(extra_fields: list[dict], groups: list[str]) -> dict[str, float]:
    """The shares of an update's trajectories, and of its prompt groups (GRPO's: one prompt's rollouts,
    by the prompt's uid), that called a tool at least once (tools.TOOL_OUTCOMES). A group without a call
    teaches nothing about the tools. What counts as a call: the text protocols' loop (TagAgentLoop)
    records every call it parsed, also an invalid one or one of an unknown tool; under hermes verl's
    tool agent loop answers those itself, so only calls that reached a tool (PoolTool) count."""
    called = [bool((extra if isinstance(extra, dict) else {}).get(TOOL_OUTCOMES)) for extra in extra_fields]
    by_group: dict[str, bool] = {}
    for group, calls in zip(groups, called, strict=True):
        by_group[group] = by_group.get(group, False) or calls
    return {
        CALLING_METRIC: sum(called) / max(len(called), 1),
        GROUPS_CALLING_METRIC: sum(by_group.values()) / max(len(by_group), 1),
    }


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (its volume full, read-only or not ours to write)."""


def _os_error(exc: BaseException) -> OSError | None:
    """The innermost OSError behind `exc`, also through Ray's task errors (a worker's save failed in
    it). What `ray.get` raises is itself an OSError (`RayTaskError(PermissionError)`, both classes)
    whose text is the worker's traceback and whose strerror is None: the worker's own error is its
    cause."""
    seen: BaseException | None = exc
    found = None
    for _ in range(16):  # causes may form a cycle
        if seen is None:
            break
        if isinstance(seen, OSError):
            found = seen
        seen = getattr(seen, "cause", None) or seen.__cause__
    return found


def checkpoint_write_message(step: int, directory: str, cause: OSError) -> str:
    return (
        f"the checkpoint of step {step} could not be written to {directory}: {cause.strerror or cause}; "
        "free space on the checkpoint volume (spec.checkpoint.volume) or make it writable by uid/gid "
        "1000. The newest complete checkpoint is still the one a retry resumes from (verl records a "
        "checkpoint as the latest only once all of it is written; runPolicy.backoffLimit retries)"
    )


class ToolRLHooks(TrainerStepHooks):
    """Rollout-phase signals, the Prometheus tracking backend, the check that no update trains on an
    infrastructure failure, the step's idle fractions, and a clear error for a checkpoint that cannot be
    written; mixed into a verl v1 trainer (before it, so `super()` is verl's)."""

    mode = SYNC_TRAINER_MODE  # spec.trainer.mode of the trainer class (its idle fractions depend on it)

    def on_train_begin(self) -> None:
        super().on_train_begin()
        add_tracking_backend(self, BACKEND_NAME, TrackingBackend())
        hub = sink().hub
        if hub is not None:
            hub.training_started.remote(int(self.total_training_steps))

    def on_step_begin(self) -> None:
        super().on_step_begin()
        sink().phase("generating")

    def on_sample_end(self) -> None:
        super().on_sample_end()
        sink().phase("scoring")

    def save_checkpoint(self, save):
        try:
            return save()
        except Exception as exc:
            cause = _os_error(exc)
            if cause is None:
                raise
            directory = self.config.trainer.default_local_dir
            raise CheckpointWriteError(
                checkpoint_write_message(self.global_steps, directory, cause)
            ) from None

    def on_step_metrics(self, metrics: dict) -> None:
        metrics.update(idle_fractions(metrics, self.mode))

    def before_update(self) -> None:
        sink().phase("training")

    def on_update_batch(self, batch, metrics: dict) -> None:
        keys = [k for k, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
        fields = ["extra_fields", "uid"]
        data = (
            tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields) if keys else {}
        )
        # a tensordict LinkedList (a list) of the trajectories' extra_fields dicts; uid: each one's prompt
        extras = list(data["extra_fields"]) if keys else []
        tainted = infra_tainted(extras)
        metrics[TRAINED_METRIC] = len(keys)
        metrics[TAINTED_METRIC] = tainted
        if keys:
            metrics.update(tool_use(extras, [str(uid) for uid in data["uid"]]))
        if tainted:
            log.error(
                "%d of %d trajectories in this update met an infrastructure failure (an agent loop that"
                " does not exclude them: a custom agent loop, or verl's own tool_agent set by extraArgs)",
                tainted,
                len(keys),
            )
        sink().trajectories([None] * len(keys))


@register_trainer(TRAINER_MODE)
class ToolRLTrainer(ToolRLHooks, PPOTrainerSync):
    """verl's sync trainer with our hooks (spec.trainer.mode sync)."""


@register_trainer(COLOCATE_ASYNC_TRAINER_MODE)
class ToolRLColocateAsyncTrainer(ToolRLHooks, PPOTrainerColocateAsync):
    """verl's colocated asynchronous trainer with our hooks (spec.trainer.mode colocate-async)."""

    mode = COLOCATE_TRAINER_MODE


@register_trainer(SEPARATE_ASYNC_TRAINER_MODE)
class ToolRLSeparateAsyncTrainer(ToolRLHooks, PPOTrainerSeparateAsync):
    """verl's asynchronous trainer with rollout on its own workers, with our hooks (spec.trainer.mode
    separate-async)."""

    mode = SEPARATE_TRAINER_MODE


# verl 0.9.1's separate_async trainer raises a TypeError from a log call on the path without rollout on the
# training workers (verl_internals.SEPARATE_ASYNC_FLUSH_LOG); the trainer runs in this module's process
tolerate_separate_async_flush_logs()


class _ToolRLTaskRunner(actor_class(TaskRunnerV1)):
    """verl's v1 task runner, defined here so this module is imported in the runner's process."""


ToolRLTaskRunner = ray.remote(_ToolRLTaskRunner)
