"""Where every process's training signals meet: a named Ray actor on the head node.

Tools run in agent-loop workers, rewards in reward workers and verl's tracking in the task runner,
possibly on other nodes; they all report to the hub, which serves `/metrics` on the head (port 9400)
and patches `status.progress`. Without Ray (tests, benchmarks) the same calls land in a local
`TrainerMetrics`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from trainer_entry import job_status
from trainer_entry.job_status import JobStatusWriter
from trainer_entry.metrics import TrainerMetrics
from trainer_entry.progress import SA_DIR, ApiTarget, ProgressReporter

log = logging.getLogger(__name__)

HUB_NAME = "toolrl-metrics-hub"
FLUSH_SECONDS = 1.0
FLUSH_BATCH = 512


@dataclass(frozen=True)
class HubSettings:
    port: int
    trajectories_per_step: int
    expected_calls_per_trajectory: float
    job_name: str
    namespace: str
    report_progress: bool
    service_account_dir: str = SA_DIR
    """Where the pod's ServiceAccount token and CA are mounted (TOOLRL_SERVICE_ACCOUNT_DIR)."""
    job_uid: str = ""
    """metadata.uid of the job (job.json), for its Events."""


class MetricsHub:
    """The trainer's metrics registry and progress reporter (runs as a Ray actor on the head)."""

    def __init__(self, settings: HubSettings) -> None:
        self.metrics = TrainerMetrics(trajectories_per_step=settings.trajectories_per_step)
        self.metrics.set_expected_calls_per_trajectory(settings.expected_calls_per_trajectory)
        self.metrics.serve(settings.port)
        self.total_steps = 0
        self.reward_failure: str | None = None
        self.progress: ProgressReporter | None = None
        self.job: JobStatusWriter | None = None
        if settings.report_progress:
            try:
                target = ApiTarget.in_cluster(settings.service_account_dir)
            except (RuntimeError, OSError) as exc:
                log.warning("progress reporting is off, the run goes on: %s", exc)
            else:
                self.progress = ProgressReporter(target, settings.namespace, settings.job_name)
                self.job = JobStatusWriter(target, settings.namespace, settings.job_name, settings.job_uid)

    def set_total_steps(self, total: int) -> None:
        self.total_steps = total
        self.metrics.set_total_steps(total)

    def training_started(self, total_steps: int) -> None:
        """verl's loop begins, in this attempt: the pool answered /readyz (run.wait_for_pool), so a
        ToolPoolDegraded an earlier attempt left True (PoolNotRecovered) is no longer what holds."""
        self.set_total_steps(total_steps)
        if self.job is not None:
            message = "the tool pool answered /readyz when training started"
            self.job.set_degraded(False, job_status.POOL_READY, message)

    def record_step(self, data: dict[str, Any], step: int) -> None:
        reasons = self.metrics.step_exclusions()
        self.metrics.record_step(data, step)
        if self.metrics.last_step != step:
            return  # not a training step (validation)
        counts = self.metrics.trajectory_counts()
        if self.progress is not None:
            self.progress.update(step, self.total_steps, self.metrics.last_reward_mean, trajectories=counts)
        if self.job is not None and reasons:
            message = job_status.excluded_message(step, reasons, counts)
            self.job.event(job_status.WARNING, job_status.TRAJECTORIES_EXCLUDED, message)

    def breaker_open(self, step: int, excluded: int, expected: int, ratio: float, discarded: int) -> None:
        """The circuit breaker threw away a batch of `step` (`discarded` trajectories without a failure of
        their own) and waits for the pool; the first time in a step, the job says so."""
        reasons = self.metrics.step_exclusions()
        first = self.metrics.breaker_open(discarded)  # else a regenerated batch of the held step failed too
        by_reason = (
            ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items())) or "no reason seen"
        )
        message = (
            f"step {step}: {excluded} of {expected} trajectories excluded for infrastructure failures"
            f" ({by_reason}), above rollout.toolCall.maxInfraFailureRatio {ratio:g}: training waits for the"
            " tool pool and then generates the batch again"
        )
        if self.job is not None:
            self.job.set_degraded(True, job_status.INFRA_FAILURE_RATIO_EXCEEDED, message)
            if first:
                self.job.event(job_status.WARNING, job_status.TOOL_POOL_DEGRADED, message)

    def breaker_closed(self, step: int, excluded: int, expected: int, waited: float) -> None:
        """A batch of `step` passed after the breaker held it for `waited` seconds."""
        self.metrics.breaker_closed()
        message = (
            f"step {step} resumed after {waited:.0f}s on a new batch with {excluded} of {expected}"
            " trajectories excluded"
        )
        if self.job is not None:
            self.job.set_degraded(False, job_status.RECOVERED, message)
            self.job.event(job_status.NORMAL, job_status.TOOL_POOL_RECOVERED, message)

    def breaker_failed(self, message: str) -> None:
        """The pool did not recover in time: the run fails with `message`."""
        if self.job is not None:
            self.job.set_degraded(True, job_status.POOL_NOT_RECOVERED, message)
            self.job.event(job_status.WARNING, job_status.POOL_NOT_RECOVERED, message)

    def reward_failed(self, message: str) -> None:
        """A reward function raised (rewards.compute_score): the first message is kept for the trainer,
        which ends the run with it, and posted as an Event on the job."""
        if self.reward_failure is not None:
            return
        self.reward_failure = message
        if self.job is not None:
            self.job.event(job_status.WARNING, job_status.REWARD_FUNCTION_FAILED, message)

    def node_lost(self, message: str) -> None:
        """A Ray node died mid-run (node_watch.py): posted as an Event before the attempt ends."""
        if self.job is not None:
            self.job.event(job_status.WARNING, job_status.RAY_NODE_LOST, message)

    def placement_pending(self, message: str) -> None:
        """verl's placement stayed pending past its bound (node_watch.PlacementWatch): posted as an Event
        before the attempt ends."""
        if self.job is not None:
            self.job.event(job_status.WARNING, job_status.PLACEMENT_PENDING, message)

    def recorded_reward_failure(self) -> str | None:
        return self.reward_failure

    def observe_tool_calls(self, batch: list[tuple[str, str, float]]) -> None:
        self.metrics.observe_tool_calls(batch)

    def observe_trajectories(self, batch: list[str | None]) -> None:
        self.metrics.observe_trajectories(batch)

    def observe_rewards(self, batch: list[dict[str, float]]) -> None:
        for components in batch:
            self.metrics.observe_reward(components)

    def set_phase(self, phase: str) -> None:
        self.metrics.set_phase(phase)

    def finish(self) -> None:
        trajectories = self.metrics.total_trajectories
        if trajectories and not self.metrics.total_tool_calls:
            message = job_status.no_tool_calls_message(trajectories)
            log.warning("%s", message)
            if self.job is not None:
                self.job.event(job_status.WARNING, job_status.NO_TOOL_CALLS, message)
        if self.progress is not None:
            if self.metrics.last_step > 0:  # the trajectory counts as they are now, after every report
                counts = self.metrics.trajectory_counts()
                last = (self.metrics.last_step, self.total_steps, self.metrics.last_reward_mean)
                self.progress.update(*last, trajectories=counts)
            self.progress.finish()


def start_hub(settings: HubSettings) -> Any:
    """Create the hub actor on this (the head) node; returns its handle."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    actor = (
        ray.remote(MetricsHub)
        .options(
            name=HUB_NAME,
            num_cpus=0,
            max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
        )
        .remote(settings)
    )
    ray.get(actor.set_phase.remote("generating"))
    return actor


class Sink:
    """What a process reports through: batched calls to the hub, or a local TrainerMetrics."""

    def __init__(self, hub: Any = None, local: TrainerMetrics | None = None) -> None:
        self.hub = hub
        self.local = local if hub is None else None
        self._lock = threading.Lock()
        self._tool_calls: list[tuple[str, str, float]] = []
        self._rewards: list[dict[str, float]] = []
        self._last_flush = time.monotonic()
        self._timer: threading.Timer | None = None  # the flush of what waits, due FLUSH_SECONDS after it came
        self._reward_failure: str | None = None

    def tool_call(self, tool: str, outcome: str, seconds: float) -> None:
        if self.local is not None:
            self.local.observe_tool_call(tool, outcome, seconds)
            return
        with self._lock:
            self._tool_calls.append((tool, outcome, seconds))
        self._maybe_flush()

    def trajectories(self, excluded: list[str | None]) -> None:
        """Finished rollout trajectories, each with why it was kept out of the update or None. Sent at
        once: the agent loops report their exclusions as they happen, the trainer the trajectories
        it trains on at each update, so a step's counts are complete when its metrics are recorded."""
        if self.local is not None:
            self.local.observe_trajectories(excluded)
        else:
            self.hub.observe_trajectories.remote(list(excluded))

    def reward(self, components: dict[str, float]) -> None:
        if self.local is not None:
            self.local.observe_reward(components)
            return
        with self._lock:
            self._rewards.append(components)
        self._maybe_flush()

    def breaker_open(self, step: int, excluded: int, expected: int, ratio: float, discarded: int) -> None:
        """The circuit breaker holds `step` (breaker.py); the hub sets the condition and posts the Event."""
        if self.local is not None:
            self.local.breaker_open(discarded)
        else:
            self.hub.breaker_open.remote(step, excluded, expected, ratio, discarded)

    def breaker_closed(self, step: int, excluded: int, expected: int, waited: float) -> None:
        if self.local is not None:
            self.local.breaker_closed()
        else:
            self.hub.breaker_closed.remote(step, excluded, expected, waited)

    def breaker_failed(self, message: str) -> None:
        """Waits for the hub: the run fails right after, and the job must say why first."""
        if self.hub is not None:
            import ray

            ray.get(self.hub.breaker_failed.remote(message))

    async def reward_failed(self, message: str) -> None:
        """A reward function raised. Awaits the hub, so the record is there before the exception reaches
        verl and the trainer sees the prompt's group failed (rewards.raise_recorded_failure)."""
        if self.hub is not None:
            await self.hub.reward_failed.remote(message)
        elif self._reward_failure is None:
            self._reward_failure = message

    def reward_failure(self) -> str | None:
        """The first reward failure of the run, or None."""
        if self.hub is not None:
            import ray

            return ray.get(self.hub.recorded_reward_failure.remote())
        return self._reward_failure

    def phase(self, phase: str) -> None:
        if self.local is not None:
            self.local.set_phase(phase)
        else:
            self.hub.set_phase.remote(phase)

    def step(self, data: dict[str, Any], step: int) -> None:
        if self.local is not None:
            self.local.record_step(data, step)
        else:
            self.flush()
            self.hub.record_step.remote(_plain(data), step)

    def _maybe_flush(self) -> None:
        """Send now if a second has passed or a batch is full; else within a second, by a timer: an
        agent-loop worker may record its last call and then none for minutes (its trajectory waits
        on an update), and what it holds would reach /metrics only with its next call."""
        due = time.monotonic() - self._last_flush >= FLUSH_SECONDS
        if due or len(self._tool_calls) + len(self._rewards) >= FLUSH_BATCH:
            self.flush()
            return
        with self._lock:
            if self._timer is None:
                self._timer = threading.Timer(FLUSH_SECONDS, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        if self.hub is None:
            return
        with self._lock:
            calls, self._tool_calls = self._tool_calls, []
            rewards, self._rewards = self._rewards, []
            self._last_flush = time.monotonic()
            if self._timer is not None:
                self._timer.cancel()  # a no-op when this flush is the timer's own
                self._timer = None
        if calls:
            self.hub.observe_tool_calls.remote(calls)
        if rewards:
            self.hub.observe_rewards.remote(rewards)


def _plain(data: dict[str, Any]) -> dict[str, Any]:
    """Numbers only: verl's metric dicts hold numpy scalars and sometimes arrays."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


_SINK: Sink | None = None


def sink() -> Sink:
    """This process's sink: the hub if this process is in a Ray job that started one, else local."""
    global _SINK
    if _SINK is None:
        hub = None
        try:
            import ray

            if ray.is_initialized():
                hub = ray.get_actor(HUB_NAME)
        except (ImportError, ValueError):
            hub = None
        _SINK = Sink(hub=hub, local=None if hub is not None else TrainerMetrics())
    return _SINK


def use_sink(new: Sink) -> Sink:
    """Replace this process's sink (tests and benchmarks inspect a local one)."""
    global _SINK
    _SINK = new
    return new


class TrackingBackend:
    """A verl tracking backend (`log(data, step)` / `finish()`) that feeds the hub."""

    def log(self, data: dict[str, Any], step: int) -> None:
        sink().step(data, step)

    def finish(self, *args: Any, **kwargs: Any) -> None:
        s = sink()
        s.flush()
        if s.hub is not None:
            s.hub.finish.remote()
