"""The circuit breaker of issue 16: a step does not train on what a degraded tool pool left of its batch.

Trajectories that met an infrastructure failure are returned by the agent loops as no output, so verl
never stores them (agent_loop.py): a batch of P prompts x n rollouts that comes back with fewer
trajectories lost the difference to the infrastructure. When that share passes
`spec.rollout.toolCall.maxInfraFailureRatio` (or nothing is left at all, which verl cannot train on),
`BreakerReplayBuffer.sample` throws the batch away, reports `ToolPoolDegraded` (hub -> condition, Event,
metrics), polls the pool's `/readyz` with exponential backoff, and generates a new batch from fresh
prompts; it reports the recovery when a batch passes. If no batch passes within the recovery bound
(counted from the first trip of the step: the pool never answers, or answers /readyz but keeps failing
calls), the run fails with `PoolNotRecovered`, whose message has the numbers and what to do.

It is verl's own extension point for sampling (`trainer.v1.sampler.custom_sampler`, see
translate.breaker_overrides), a subclass of the replay buffer our trainer mode uses. verl's sampling
loop runs in it, so it is also where a reward function that raised stops the run
(rewards.raise_recorded_failure) instead of verl regenerating the failed group forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import transfer_queue as tq
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync

from trainer_entry.dynamic_sampling import DynamicSamplingExhausted, FilteredGroups
from trainer_entry.hub import sink
from trainer_entry.pool_client import PoolClient, backoff_seconds
from trainer_entry.rewards import raise_recorded_failure
from trainer_entry.verl_internals import (
    RUN_PROMPT_ERROR_LOG,
    ReplayBufferHooks,
    prompt_groups,
    refill,
    session_of,
)

log = logging.getLogger(__name__)

TRAIN_PARTITION = "train"
FIRST_PROBE_DELAY_SECONDS = 1.0  # then 2, 4, ... capped at pool_client.MAX_BACKOFF_SECONDS
REGENERATIONS_METRIC = "toolrl/batches_regenerated"


class PoolNotRecovered(RuntimeError):
    """The breaker's bound passed without a batch the step may train on."""


@dataclass(frozen=True)
class BatchCount:
    """A sampled batch against what was asked of the rollouts."""

    expected: int  # prompts x rollouts per prompt
    kept: int  # trajectories the agent loops returned (the rest were excluded)

    @property
    def excluded(self) -> int:
        return self.expected - self.kept

    @property
    def fraction(self) -> float:
        return self.excluded / self.expected if self.expected else 0.0

    def describe(self) -> str:
        return f"{self.excluded} of {self.expected} trajectories excluded ({self.fraction:.0%})"


def count_batch(
    keys: list[str], tags: list[dict[str, Any]], prompts: int, rollouts_per_prompt: int
) -> BatchCount:
    """Count the sessions (trajectories: `verl_internals.session_of` their keys) in a batch."""
    sessions = {
        session_of(key) for key, tag in zip(keys, tags, strict=True) if not tag.get("is_padding", False)
    }
    return BatchCount(expected=prompts * rollouts_per_prompt, kept=len(sessions))


def trips(count: BatchCount, max_ratio: float) -> bool:
    """Whether the step must not train on this batch: nothing left, or more excluded than allowed."""
    return count.kept == 0 or count.excluded > max_ratio * count.expected


def wait_for_recovery(
    ready: Callable[[], bool],
    seconds: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Probe `ready` with exponential backoff (1 s, 2 s, ... 30 s) until it says True (returns True) or
    `seconds` have passed (returns False)."""
    deadline = clock() + seconds
    attempt = 0
    while True:
        if ready():
            return True
        left = deadline - clock()
        if left <= 0:
            return False
        sleep(min(left, backoff_seconds(attempt, FIRST_PROBE_DELAY_SECONDS)))
        attempt += 1


def pool_ready(url: str) -> bool:
    """One probe of the pool's `/readyz` (from the trainer's thread, which runs no event loop)."""

    async def probe() -> bool:
        client = PoolClient(url)
        try:
            return await client.ready()
        finally:
            await client.close()

    return asyncio.run(probe())


@dataclass(frozen=True)
class BreakerSettings:
    """`trainer.v1.sampler.sampler_kwargs` as translate.breaker_overrides writes them."""

    max_infra_failure_ratio: float
    rollouts_per_prompt: int
    pool_url: str
    recovery_seconds: float

    @classmethod
    def from_kwargs(cls, kwargs: Any) -> BreakerSettings:
        return cls(
            max_infra_failure_ratio=float(kwargs["max_infra_failure_ratio"]),
            rollouts_per_prompt=int(kwargs["rollouts_per_prompt"]),
            pool_url=str(kwargs["pool_url"]),
            recovery_seconds=float(kwargs["recovery_seconds"]),
        )


def not_recovered_message(
    settings: BreakerSettings, first: BatchCount, last: BatchCount, step: int, waited: float, batches: int
) -> str:
    """One line (run.py shows a worker's failure by its last line): what happened, the numbers, what to do."""
    ratio = settings.max_infra_failure_ratio
    return (
        f"the tool pool did not recover within {settings.recovery_seconds:.0f}s: step {step} was held "
        f"{waited:.0f}s ago because {first.describe()} for infrastructure failures, above "
        f"rollout.toolCall.maxInfraFailureRatio {ratio:g}; {batches} batch(es) generated since, the last "
        f"with {last.describe()}. Check the tool pool at {settings.pool_url} (its pods and /readyz, and "
        "its 429s: raise spec.toolPool.replicas.max or lower rollout.toolCall.maxConcurrency), then "
        "resume from the last checkpoint"
    )


def failing_groups_message(
    settings: BreakerSettings, step: int, waited: float, groups: int, prompts: int
) -> str:
    """One line: prompt groups kept failing inside verl's sampling loop with none finishing."""
    return (
        f"step {step}: prompt groups kept failing for {waited:.0f}s with none finishing ({groups} failed "
        f"group(s) for a batch of {prompts} prompt(s), each evicted and generated again by verl; their "
        f"errors are in the log as '{RUN_PROMPT_ERROR_LOG}'), over the bound of TOOLRL_POOL_WAIT_SECONDS "
        f"{settings.recovery_seconds:.0f}s. The usual cause is the code-execution reward's own pool calls "
        f"(PoolUnavailable): check the tool pool at {settings.pool_url} (its pods and /readyz), then resume "
        "from the last checkpoint; otherwise an agent loop raises (see the errors)"
    )


@dataclass
class FailingGroups:
    """Failed prompt groups seen since a group last finished: verl 0.9.1's sampling loop evicts each and
    generates a new prompt in its place at once, before any batch reaches the breaker's guard."""

    since: float
    finished: int  # finished groups when the window opened: more since means the step makes progress
    groups: int


class Breaker:
    """The decision and the wait, apart from verl's storage (BreakerReplayBuffer plugs it in)."""

    def __init__(
        self,
        settings: BreakerSettings,
        ready: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.ready = ready or (lambda: pool_ready(settings.pool_url))
        self.clock, self.sleep = clock, sleep
        self.failing: FailingGroups | None = None
        self.prompts = 1

    def failed_groups(self, step: int, failed: int, finished: int) -> None:
        """verl reports `failed` failed groups (and `finished` finished ones) on a poll of its sampling
        loop. Raises PoolNotRecovered when failed groups have kept coming for longer than the recovery
        bound with no group finishing, at least as many as the batch has prompts: verl would go on
        regenerating them for ever (a code-execution reward whose pool calls fail raises PoolUnavailable
        on every answer with code). The count keeps a few transient failures in a long generation (a
        GPU step can take longer than the bound before its groups finish) from failing the run."""
        window = self.failing
        if window is None or finished > window.finished:
            self.failing = FailingGroups(since=self.clock(), finished=finished, groups=failed)
            return
        window.groups += failed
        waited = self.clock() - window.since
        if waited > self.settings.recovery_seconds and window.groups >= self.prompts:
            message = failing_groups_message(self.settings, step, waited, window.groups, self.prompts)
            log.error("%s", message)
            raise PoolNotRecovered(message)

    def new_sample(self, prompts: int) -> None:
        """A batch of `prompts` prompts is sampled (a step's, or the breaker's regenerated one): failed
        groups seen before do not count."""
        self.failing, self.prompts = None, max(1, prompts)

    def guard(
        self,
        step: int,
        prompts: int,
        sample: Callable[[], tuple[Any, dict]],
        discard: Callable[[Any], None],
        refill: Callable[[int], Any],
    ) -> tuple[Any, dict]:
        """A batch of `prompts` prompts from `sample()` that the step may train on. A batch that trips the
        breaker is `discard`ed; once the pool is ready, `refill(prompts)` submits fresh prompts and the
        next batch is sampled. Raises PoolNotRecovered when none passes within the recovery bound."""
        settings = self.settings
        batch, metrics = sample()
        count = count_batch(batch.keys, batch.tags, prompts, settings.rollouts_per_prompt)
        first, held_at, regenerations = count, self.clock(), 0
        while trips(count, settings.max_infra_failure_ratio):
            if regenerations == 0:
                log.warning(
                    "step %d: %s > maxInfraFailureRatio %g: not training on it; waiting for the tool pool",
                    step,
                    count.describe(),
                    settings.max_infra_failure_ratio,
                )
            sink().breaker_open(
                step, count.excluded, count.expected, settings.max_infra_failure_ratio, count.kept
            )
            discard(batch)
            left = settings.recovery_seconds - (self.clock() - held_at)
            if left <= 0 or not wait_for_recovery(self.ready, left, self.sleep, self.clock):
                waited = self.clock() - held_at
                message = not_recovered_message(settings, first, count, step, waited, regenerations)
                sink().breaker_failed(message)
                raise PoolNotRecovered(message)
            regenerations += 1
            self.new_sample(prompts)
            refill(prompts)
            batch, more = sample()
            metrics.update(more)
            count = count_batch(batch.keys, batch.tags, prompts, settings.rollouts_per_prompt)
        if regenerations:
            waited = self.clock() - held_at
            log.warning(
                "step %d: the tool pool recovered after %.0fs; training on a new batch (%s)",
                step,
                waited,
                count.describe(),
            )
            sink().breaker_closed(step, count.excluded, count.expected, waited)
        metrics[REGENERATIONS_METRIC] = regenerations
        return batch, metrics


class BreakerReplayBuffer(ReplayBufferHooks, ReplayBufferAsync):
    """verl's replay buffer for our trainer mode, which will not hand a degraded batch to the update."""

    def __init__(self, *args: Any, sampler_kwargs: Any, **kwargs: Any) -> None:
        self.filtered = FilteredGroups.from_kwargs(sampler_kwargs)  # dynamic sampling, when enabled
        if self.filtered is not None:  # verl passes the metric to its own buffers only
            kwargs["filter_groups_metric"] = self.filtered.metric
        super().__init__(*args, sampler_kwargs=sampler_kwargs, **kwargs)
        self.breaker = Breaker(BreakerSettings.from_kwargs(sampler_kwargs))
        if self.filtered is not None:
            log.warning(
                "dynamic sampling: groups whose rollouts all scored alike on %r are dropped, at most %d"
                " batches' worth a step",
                self.filtered.metric,
                self.filtered.max_batches,
            )

    def on_filtered_groups(self, partition_id: str, uids: set[str], scores: Counter[float]) -> None:
        """verl is about to drop `uids` for dynamic sampling: the step's bound (dynamic_sampling.py)."""
        if self.filtered is not None and partition_id == TRAIN_PARTITION:
            try:
                self.filtered.seen(uids, scores)
            except DynamicSamplingExhausted as exc:  # the run fails with it (its last line: run.py)
                log.error("%s", exc)
                raise

    def on_group_poll(self, global_steps: int, partition_id: str) -> None:
        """Before verl's choice of the finished groups to evict, on each poll of its sampling loop (every
        2 s, and after each refill). A failed group (verl marks one whose trajectory raised) is first
        checked against the reward failures the hub recorded: verl would evict it and generate a new
        prompt in its place, and a reward that raises on every answer of some kind would do so forever."""
        failed, finished = prompt_groups(self, partition_id)
        if failed:
            raise_recorded_failure()
            if partition_id == TRAIN_PARTITION:  # verl evicts and regenerates failed groups only there
                self.breaker.failed_groups(global_steps, len(failed), len(finished))

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        if partition_id != TRAIN_PARTITION:
            return super().sample(global_steps, partition_id, batch_size)  # validation is not trained on
        self.breaker.new_sample(batch_size)
        if self.filtered is not None:
            self.filtered.new_sample(global_steps, batch_size)

        def discard(batch: Any) -> None:
            if batch.keys:
                tq.kv_clear(keys=batch.keys, partition_id=partition_id)

        return self.breaker.guard(
            global_steps,
            batch_size,
            lambda: super(BreakerReplayBuffer, self).sample(global_steps, partition_id, batch_size),
            discard,
            lambda prompts: refill(self, prompts),
        )
