"""Our hooks into verl's trainer, through the extension points verl offers (no patching).

- `ToolRLTrainer` is verl's synchronous v1 trainer registered under its own `trainer.v1.trainer_mode`;
  its `on_*` hooks mark the rollout phase and, once verl has built its `Tracking`, add our backend
  next to verl's own ones.
- `ToolRLTaskRunner` is verl's task runner (the `task_runner_class` argument of `run_ppo`) defined in
  this module, so Ray imports this module, and with it the trainer registration, wherever it runs.
"""

from __future__ import annotations

import ray
from verl.trainer.main_ppo import TaskRunnerV1
from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer

from trainer_entry.hub import TrackingBackend, sink
from trainer_entry.translate import TRAINER_MODE

BACKEND_NAME = "toolrl"


@register_trainer(TRAINER_MODE)
class ToolRLTrainer(PPOTrainerSync):
    """verl's sync trainer plus rollout-phase signals and the Prometheus tracking backend."""

    def on_train_begin(self) -> None:
        super().on_train_begin()
        self.logger.logger[BACKEND_NAME] = TrackingBackend()
        hub = sink().hub
        if hub is not None:
            hub.set_total_steps.remote(int(self.total_training_steps))

    def on_step_begin(self) -> None:
        super().on_step_begin()
        sink().phase("generating")

    def on_sample_end(self) -> None:
        super().on_sample_end()
        sink().phase("scoring")

    def _balance_batch(self, *args, **kwargs):
        sink().phase("training")
        return super()._balance_batch(*args, **kwargs)


class _ToolRLTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's v1 task runner, defined here so this module is imported in the runner's process."""


ToolRLTaskRunner = ray.remote(_ToolRLTaskRunner)
