"""Training metrics in Prometheus form (names from docs/contracts.md).

`TrainerMetrics` owns one registry; everything that reports (verl's tracking, our tools, our reward
functions, the trainer hooks) calls its methods, locally or through the Ray actor in `hub.py`.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter as Tally
from collections import defaultdict
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from trainer_entry.spec import SEPARATE_TRAINER_MODE, TRAINER_MODES

PHASES = ("generating", "scoring", "training")
TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# verl's metric keys (trainer_base._compute_metrics / metric_utils) → what we read them for.
VERL_REWARD_MEAN = "critic/score/mean"
VERL_RESPONSE_LENGTH = "response_length/mean"
VERL_STEP_SECONDS = "timing_s/step"
VERL_TOOL_CALL_COUNTS = "tool_call_counts/mean"
VERL_GENERATION_SECONDS = "timing_s/gen"  # the trainer's wait for a sampled batch (replay_buffer.sample)
VERL_WEIGHT_SYNC_SECONDS = "timing_s/update_weights"  # on_step_end: the new weights to the rollout
# prompt groups (of rolloutsPerPrompt trajectories) the replay buffer dropped this step as past
# max_off_policy_threshold (the `drop` strategy; summed over separate-async's mini-batches)
VERL_STALE_DROPPED = "training/off_policy/evicted_samples"
# model versions between the policy an update trains and the OLDEST weights a trained trajectory was
# generated with (a partial rollout spans several; verl's `trajectory_staleness` is the freshest ones)
VERL_LAG_MEAN = "training/off_policy/trajectory_staleness_worst/mean"
VERL_LAG_MAX = "training/off_policy/trajectory_staleness_worst/max"

# what our hooks add to verl's metrics of each step (runner.ToolRLHooks.on_step_metrics)
ROLLOUT_IDLE_METRIC = "toolrl/rollout_idle_fraction"
TRAINER_IDLE_METRIC = "toolrl/trainer_idle_fraction"


def idle_fractions(data: dict[str, Any], mode: str) -> dict[str, float]:
    """The rollout's and the trainer's idle fractions of one verl step, from verl's own timings of it;
    {} for a log without them (validation). `mode` is spec.trainer.mode. The denominator is
    `timing_s/step` (verl's step: sampling, scoring, update, checkpoint, weight sync; not validation
    nor verl's own logging between steps, which count as neither idle nor busy).

    - trainer idle = `timing_s/gen` / step, in every mode: the time the update side waits for a batch to
      train on. sync: the whole batch's generation, long tail included. colocate-async: until enough
      prompt groups are sampleable (unfinished ones are aborted and resumed after the update).
      separate-async: until the replay buffer holds each mini-batch (summed over parameter_sync_step of
      them); where the trainer's workers are lent to rollout (hybrid), that wait (`switch_wait`) is
      generation, not idleness, and is not counted.
    - rollout idle, sync and colocate-async = (step - gen) / step: rollout and training share the
      workers, and verl puts the rollout replicas to sleep at the end of sampling and wakes them with
      the new weights at the end of the step, so they generate only during `gen`; the two fractions
      add up to 1, and colocate-async gains by a shorter `gen` (no waiting for the tail), not by overlap.
    - rollout idle, separate-async = `timing_s/update_weights` / step: the rollout workers generate
      through the whole step but for the weight sync, which aborts their requests and resumes them after.
      A lower bound: verl does not time a rollout with nothing to do (every prompt in flight at the
      staleness bound under the `wait` strategy, or the data exhausted), so that is not counted.
    """
    if mode not in TRAINER_MODES:
        raise ValueError(f"unknown trainer mode {mode!r}; use one of {TRAINER_MODES} (spec.trainer.mode)")
    step = _number(data.get(VERL_STEP_SECONDS))
    gen = _number(data.get(VERL_GENERATION_SECONDS))
    if step is None or gen is None or step <= 0:
        return {}
    trainer_idle = min(max(gen / step, 0.0), 1.0)
    if mode == SEPARATE_TRAINER_MODE:  # rollout on workers of its own
        rollout_idle = min(max((_number(data.get(VERL_WEIGHT_SYNC_SECONDS)) or 0.0) / step, 0.0), 1.0)
    else:
        rollout_idle = 1.0 - trainer_idle
    return {ROLLOUT_IDLE_METRIC: rollout_idle, TRAINER_IDLE_METRIC: trainer_idle}


STEP_LINE = re.compile(r"\bstep:(\d+) - (.*)")
NUMPY_SCALAR = re.compile(r"np\.\w+\((.*)\)")  # verl's console prints numpy scalars as np.float64(0.5)


def console_steps(output: str) -> dict[int, dict[str, float]]:
    """Each step's numeric metrics from verl's console logger (one `step:N - key:value - ...` line per
    step), by step."""
    steps: dict[int, dict[str, float]] = {}
    for match in STEP_LINE.finditer(output):
        values = {}
        for item in match.group(2).split(" - "):
            key, _, text = item.partition(":")
            text = text.strip()
            scalar = NUMPY_SCALAR.fullmatch(text)
            number = _number(scalar.group(1) if scalar else text)
            if number is not None:
                values[key.strip()] = number
        steps[int(match.group(1))] = values
    return steps


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class TrainerMetrics:
    """The trainer's gauges, counters and histograms, plus the per-step aggregation they need."""

    def __init__(self, trajectories_per_step: int = 0, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.step = Gauge("toolrl_trainer_step", "Last completed training step", registry=r)
        self.total_steps = Gauge("toolrl_trainer_total_steps", "Training steps of the whole run", registry=r)
        self.reward_mean = Gauge(
            "toolrl_trainer_reward_mean", "Mean sequence reward of the last step", registry=r
        )
        self.reward_component = Gauge(
            "toolrl_trainer_reward_component", "Mean of one reward component", ["component"], registry=r
        )
        self.step_duration = Gauge(
            "toolrl_trainer_step_duration_seconds", "Wall time of the last step", registry=r
        )
        self.response_length = Gauge(
            "toolrl_trainer_response_length_mean", "Mean response length in tokens", registry=r
        )
        self.tool_calls_per_trajectory = Gauge(
            "toolrl_trainer_tool_calls_per_trajectory",
            "Mean tool calls per trajectory in the last step",
            registry=r,
        )
        self.tool_duration = Histogram(
            "toolrl_trainer_tool_call_duration_seconds",
            "Tool call latency seen by the trainer (with retries)",
            ["tool", "outcome"],
            buckets=TOOL_BUCKETS,
            registry=r,
        )
        self.tool_failures = Counter(
            "toolrl_trainer_tool_failures_total",
            "Tool calls that did not succeed",
            ["tool", "reason"],
            registry=r,
        )
        self.trajectories = Counter(
            "toolrl_trajectories_total",
            "Rollout trajectories finished (trained on, excluded, or discarded by the circuit breaker)",
            registry=r,
        )
        self.trajectories_excluded = Counter(
            "toolrl_trajectories_excluded_total",
            "Trajectories kept out of scoring and the update: a tool call met an infrastructure failure",
            ["reason"],
            registry=r,
        )
        self.trajectories_discarded = Counter(
            "toolrl_trajectories_discarded_total",
            "Trajectories without a failure thrown away with a batch the circuit breaker stopped",
            registry=r,
        )
        self.tool_pool_degraded = Gauge(
            "toolrl_trainer_tool_pool_degraded",
            "1 while the circuit breaker holds a step (too many infrastructure failures), else 0",
            registry=r,
        )
        self.excluded_fraction = Gauge(
            "toolrl_trainer_excluded_fraction",
            "Share of the last step's trajectories excluded for infrastructure failures",
            registry=r,
        )
        self.rollout_idle = Gauge(
            "toolrl_trainer_rollout_idle_fraction",
            "Share of the last step the rollout did not generate (metrics.idle_fractions)",
            registry=r,
        )
        self.trainer_idle = Gauge(
            "toolrl_trainer_idle_fraction",
            "Share of the last step the update waited for a batch to train on (metrics.idle_fractions)",
            registry=r,
        )
        self.off_policy_lag_mean = Gauge(
            "toolrl_trainer_off_policy_lag_mean",
            "Mean model versions between the last update's policy and the oldest weights its trajectories"
            " were generated with (0 in sync mode)",
            registry=r,
        )
        self.off_policy_lag_max = Gauge(
            "toolrl_trainer_off_policy_lag_max",
            "The most model versions between the last update's policy and the oldest weights one of its"
            " trajectories was generated with",
            registry=r,
        )
        self.stale_groups_dropped = Counter(
            "toolrl_trainer_stale_groups_dropped_total",
            "Prompt groups the async replay buffer dropped past the staleness bound (maxPolicyVersions)",
            registry=r,
        )
        self.current_phase = PHASES[0]
        r.register(_PhaseCollector(self))
        self.expected_tool_calls = Gauge(
            "toolrl_trainer_expected_tool_calls",
            "Tool calls the coming generation phase is expected to make",
            registry=r,
        )
        self.trajectories_per_step = trajectories_per_step
        self._lock = threading.Lock()
        self._calls_this_step = 0
        self._trajectories_this_step = 0
        self._excluded_this_step = 0
        self._reasons_this_step: Tally[str] = Tally()
        self.excluded_by_reason: Tally[str] = Tally()
        self.total_trajectories = 0
        self.total_tool_calls = 0  # calls the rollouts made (any outcome), in the run
        self.total_discarded = 0
        self.degraded = False
        self._component_sums: dict[str, float] = defaultdict(float)
        self._component_counts: dict[str, int] = defaultdict(int)
        self._last_calls_per_trajectory: float | None = None
        self.last_reward_mean = 0.0
        self.last_step = 0
        self.set_phase("generating")

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Expose `/metrics` on `port`."""
        start_http_server(port, addr=addr, registry=self.registry)

    def set_total_steps(self, total: int) -> None:
        self.total_steps.set(total)

    def set_phase(self, phase: str) -> None:
        if phase not in PHASES:
            raise ValueError(f"unknown rollout phase {phase!r}; use one of {PHASES}")
        self.current_phase = phase  # one assignment: a scrape sees the old phase or the new, never both
        if phase == "generating":
            self.expected_tool_calls.set(self.expected_calls())

    def expected_calls(self) -> float:
        """Calls of the coming generation: trajectories per step x calls per trajectory last step."""
        per_trajectory = self._last_calls_per_trajectory or 0.0
        return self.trajectories_per_step * per_trajectory

    def set_expected_calls_per_trajectory(self, calls: float) -> None:
        """Seed the estimate before the first step (e.g. with maxToolTurns)."""
        if self._last_calls_per_trajectory is None:
            self._last_calls_per_trajectory = calls

    def observe_tool_call(self, tool: str, outcome: str, seconds: float) -> None:
        self.tool_duration.labels(tool=tool, outcome=outcome).observe(seconds)
        if outcome != "ok":
            self.tool_failures.labels(tool=tool, reason=outcome).inc()
        with self._lock:
            self._calls_this_step += 1
            self.total_tool_calls += 1

    def observe_tool_calls(self, batch: list[tuple[str, str, float]]) -> None:
        for tool, outcome, seconds in batch:
            self.observe_tool_call(tool, outcome, seconds)

    def observe_trajectory(self, excluded: str | None) -> None:
        """A finished trajectory; `excluded` is the status of the infrastructure failure that kept it
        out of the update, or None when it was trained on."""
        self.trajectories.inc()
        if excluded is not None:
            self.trajectories_excluded.labels(reason=excluded).inc()
        with self._lock:
            self.total_trajectories += 1
            self._trajectories_this_step += 1
            if excluded is not None:
                self._excluded_this_step += 1
                self._reasons_this_step[excluded] += 1
                self.excluded_by_reason[excluded] += 1

    def observe_trajectories(self, batch: list[str | None]) -> None:
        for excluded in batch:
            self.observe_trajectory(excluded)

    def breaker_open(self, discarded: int) -> bool:
        """The circuit breaker threw away a batch (`discarded` trajectories that met no failure themselves)
        and holds the step; returns whether it was not already holding it."""
        self.trajectories.inc(discarded)
        self.trajectories_discarded.inc(discarded)
        with self._lock:
            self.total_trajectories += discarded
            self.total_discarded += discarded
            self._trajectories_this_step += discarded
            first, self.degraded = not self.degraded, True
        self.tool_pool_degraded.set(1)
        return first

    def breaker_closed(self) -> None:
        with self._lock:
            self.degraded = False
        self.tool_pool_degraded.set(0)

    def step_exclusions(self) -> dict[str, int]:
        """Exclusions of the current step so far, by reason."""
        with self._lock:
            return dict(self._reasons_this_step)

    def trajectory_counts(self) -> dict[str, int | dict[str, int]]:
        """The run's trajectory counts as `status.progress` shows them (docs/contracts.md)."""
        with self._lock:
            return {
                "trajectories": self.total_trajectories,
                "trajectoriesExcluded": dict(self.excluded_by_reason),
                "trajectoriesDiscarded": self.total_discarded,
            }

    def observe_reward(self, components: dict[str, float]) -> None:
        """One scored trajectory's reward components (averaged per step)."""
        with self._lock:
            for name, value in components.items():
                number = _number(value)
                if number is not None:
                    self._component_sums[name] += number
                    self._component_counts[name] += 1

    def record_step(self, data: dict[str, Any], step: int) -> None:
        """verl's metrics of one step (as given to its tracking backends)."""
        if step <= 0 or VERL_STEP_SECONDS not in data:
            return  # validation-only logs carry no training step
        self.step.set(step)
        self.last_step = step
        reward = _number(data.get(VERL_REWARD_MEAN))
        if reward is not None:
            self.reward_mean.set(reward)
            self.last_reward_mean = reward
        for key, gauge in (
            (VERL_RESPONSE_LENGTH, self.response_length),
            (VERL_STEP_SECONDS, self.step_duration),
            (ROLLOUT_IDLE_METRIC, self.rollout_idle),
            (TRAINER_IDLE_METRIC, self.trainer_idle),
            (VERL_LAG_MEAN, self.off_policy_lag_mean),
            (VERL_LAG_MAX, self.off_policy_lag_max),
        ):
            value = _number(data.get(key))
            if value is not None:
                gauge.set(value)
        dropped = _number(data.get(VERL_STALE_DROPPED))
        if dropped:
            self.stale_groups_dropped.inc(dropped)
        with self._lock:
            calls, self._calls_this_step = self._calls_this_step, 0
            finished, self._trajectories_this_step = self._trajectories_this_step, 0
            excluded, self._excluded_this_step = self._excluded_this_step, 0
            self._reasons_this_step.clear()
            sums, counts = dict(self._component_sums), dict(self._component_counts)
            self._component_sums.clear()
            self._component_counts.clear()
        per_trajectory = _number(data.get(VERL_TOOL_CALL_COUNTS))
        if per_trajectory is None and self.trajectories_per_step:
            per_trajectory = calls / self.trajectories_per_step
        if per_trajectory is not None:
            self.tool_calls_per_trajectory.set(per_trajectory)
            self._last_calls_per_trajectory = per_trajectory
        for name, total in sums.items():
            self.reward_component.labels(component=name).set(total / counts[name])
        if finished:
            self.excluded_fraction.set(excluded / finished)


class _PhaseCollector:
    """`toolrl_trainer_rollout_phase{phase}`: 1 for the current phase, 0 for the others, built from
    one read of the phase at scrape time (labelled gauges set one by one could be scraped between
    two sets, showing two phases or none to the autoscaler)."""

    def __init__(self, metrics: TrainerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> list[GaugeMetricFamily]:
        current = self.metrics.current_phase
        name, help_text = "toolrl_trainer_rollout_phase", "1 for the current phase"
        family = GaugeMetricFamily(name, help_text, labels=["phase"])
        for phase in PHASES:
            family.add_metric([phase], 1.0 if phase == current else 0.0)
        return [family]
