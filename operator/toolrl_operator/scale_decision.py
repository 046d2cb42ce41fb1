"""The native tool-pool autoscaler's decision: how many replicas a job's tool pool needs, and why.

This module decides; scale_loop.py is the loop that observes each job's pool, calls `decide` and
writes the result (and keda.py is the KEDA alternative to both). Pure: no clock, no I/O. The caller
passes the time, the observed load and the trainer's phase, and keeps the returned ``State`` for
the next call. The reactive part follows Knative's KPA: desired = ceil(load / target) over a stable
window, a short panic window that only ever scales up during a burst, and scale-down only once
every recommendation of the last ``scaleDownDelaySeconds`` agrees (so the pool never flaps). The
rollout-aware part uses the trainer's phase: the expected burst is added as a recommendation
shortly before and at the start of generation, and during training the delay is dropped so the pool
returns to ``min`` (from the second training phase on: the first one is held, as its length is not
yet known). The burst is the peak load seen in the previous generation phase, scaled by how many
calls the trainer expects this time compared with then (before any history: the expected calls,
capped by how many the trainer can have in flight).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from toolrl_api.spec_types import Spec

PHASES = ("generating", "scoring", "training")

# Reasons are a bounded set: they label toolrl_autoscaler_decisions_total.
STABLE = "stable"
PANIC = "panic"
SCALE_DOWN_DELAY = "scale-down-delay"
ROLLOUT_PRESCALE = "rollout-prescale"
ROLLOUT_PREWARM = "rollout-prewarm"
ROLLOUT_TRAINING = "rollout-training"
ROLLOUT_AWARE = (ROLLOUT_PRESCALE, ROLLOUT_PREWARM, ROLLOUT_TRAINING)  # decisions from the trainer's phase
METRICS_UNAVAILABLE = "metrics-unavailable"
REASONS = (
    STABLE,
    PANIC,
    SCALE_DOWN_DELAY,
    ROLLOUT_PRESCALE,
    ROLLOUT_PREWARM,
    ROLLOUT_TRAINING,
    METRICS_UNAVAILABLE,
)


class PolicyError(ValueError):
    """The job's toolPool settings cannot drive the autoscaler."""


@dataclass(frozen=True)
class Policy:
    """What the job asks for (spec.toolPool) plus the window settings of the algorithm."""

    min_replicas: int
    max_replicas: int
    target_concurrency: float
    scale_down_delay_seconds: float
    rollout_aware: bool
    # The most tool calls the trainer can have in flight at once (spec.rollout.toolCall.maxConcurrency
    # and batch x rollouts x parallel calls); caps the expected burst. None: no cap known.
    burst_cap: int | None = None
    stable_window_seconds: float = 60.0
    panic_window_seconds: float = 6.0
    panic_threshold: float = 2.0
    # How long before the expected start of generation the pool is pre-scaled (about a pod's start-up).
    prewarm_seconds: float = 30.0
    # Margin on a burst estimated from the previous generation's peak.
    burst_headroom: float = 1.25

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < 1 or self.min_replicas > self.max_replicas:
            raise PolicyError(
                f"toolPool.replicas must satisfy 0 <= min <= max and max >= 1, got min={self.min_replicas} "
                f"max={self.max_replicas}; fix spec.toolPool.replicas"
            )
        if self.target_concurrency <= 0:
            raise PolicyError(
                f"toolPool.targetConcurrencyPerReplica must be > 0, got {self.target_concurrency}"
            )
        if self.scale_down_delay_seconds < 0:
            raise PolicyError(
                f"toolPool.scaleDownDelaySeconds must be >= 0, got {self.scale_down_delay_seconds}"
            )
        if not 0 < self.panic_window_seconds <= self.stable_window_seconds:
            raise PolicyError("the panic window must be positive and no longer than the stable window")

    @classmethod
    def from_job_spec(cls, spec: Spec, **tuning: float) -> Policy:
        """Reads a ToolRLJob's typed spec (its defaults are the CRD's) into a policy."""
        pool = spec.tool_pool
        return cls(
            min_replicas=pool.replicas.min,
            max_replicas=pool.replicas.max,
            target_concurrency=float(pool.target_concurrency_per_replica),
            scale_down_delay_seconds=float(pool.scale_down_delay_seconds),
            rollout_aware=pool.rollout_aware,
            burst_cap=burst_cap(spec),
            **tuning,
        )

    def replicas_for(self, load: float) -> int:
        """ceil(load / target), unclamped."""
        return math.ceil(max(load, 0.0) / self.target_concurrency - 1e-9)

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))


def burst_cap(spec: Spec) -> int:
    """The trainer can have at most this many tool calls in flight: its client's concurrency limit,
    and one call per parallel slot of every trajectory of the batch."""
    algo, rollout = spec.algorithm, spec.rollout
    slots = algo.train_batch_size * algo.rollouts_per_prompt * rollout.max_parallel_calls
    return min(rollout.tool_call.max_concurrency, slots)


@dataclass(frozen=True)
class Signals:
    """What was observed at one tick."""

    now: float
    current_replicas: int
    ready_replicas: int
    load: float | None  # in-flight + queued calls across the pool; None when unknown
    problem: str = ""  # why the load is unknown
    phase: str | None = None  # the trainer's rollout phase, None when it publishes none
    expected_calls: float | None = None  # calls the coming generation phase is expected to make


@dataclass(frozen=True)
class State:
    """What the autoscaler remembers between ticks (start with ``State()``)."""

    samples: tuple[tuple[float, float], ...] = ()  # (time, load) within the stable window
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, replicas) within the delay
    panic_since: float | None = None
    panic_peak: int = 0
    phase: str | None = None
    phase_since: float | None = None
    last_training_seconds: float | None = None  # length of the previous training phase
    prewarmed: bool = False
    peak: float = 0.0  # highest load of this generation phase
    expected: float | None = None  # calls expected for this generation phase
    last_peak: float | None = None  # the same two, of the previous generation
    last_expected: float | None = None


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    message: str  # the inputs, in words, for the Event
    state: State = field(repr=False)


def expected_burst(policy: Policy, state: State, expected_calls: float | None) -> float | None:
    """Peak concurrent calls of the coming generation phase, None when the trainer expects none."""
    if expected_calls is None or expected_calls <= 0:
        return None
    burst = float(expected_calls)
    if state.last_peak and state.last_expected:
        burst = state.last_peak * expected_calls / state.last_expected * policy.burst_headroom
    return min(burst, policy.burst_cap) if policy.burst_cap else burst


def decide(policy: Policy, state: State, sig: Signals) -> Decision:
    """One autoscaling decision: desired replicas, the reason, and the state to keep."""
    now = sig.now
    if sig.load is None:
        # the size holds: the Deployment's is the last decision (the loop writes it there directly)
        held = policy.clamp(sig.current_replicas)
        return Decision(
            held, METRICS_UNAVAILABLE, f"holding {held} replicas: {sig.problem or 'no load metrics'}", state
        )

    state = _track_phase(state, sig.phase, now)
    if state.phase == "generating":
        state = replace(state, peak=max(state.peak, sig.load), expected=sig.expected_calls or state.expected)
    samples = (*_since(state.samples, now - policy.stable_window_seconds), (now, sig.load))
    stable_load = _mean(samples)
    panic_load = _mean(_since(samples, now - policy.panic_window_seconds))
    want_stable = policy.replicas_for(stable_load)
    want_panic = policy.replicas_for(panic_load)

    # Panic: the short window asks for at least panic_threshold x the ready pods.
    panic_since, panic_peak = state.panic_since, state.panic_peak
    over = want_panic / max(sig.ready_replicas, 1) >= policy.panic_threshold
    if over and want_panic > sig.current_replicas:
        panic_since = now
    elif panic_since is not None and now - panic_since >= policy.stable_window_seconds:
        panic_since, panic_peak = None, 0
    if panic_since is not None:
        panic_peak = max(panic_peak, want_panic, sig.current_replicas)
        want, reason = panic_peak, PANIC
    else:
        want, reason = want_stable, STABLE

    # Rollout awareness: a floor for the expected burst shortly before and at the start of
    # generation; no delay during training, when no calls are coming.
    burst = expected_burst(policy, state, sig.expected_calls) if policy.rollout_aware else None
    prewarmed = state.prewarmed
    recs = state.recommendations or ((now, sig.current_replicas),)  # after a restart, hold a delay first
    if policy.rollout_aware and state.phase == "training":
        prewarmed = prewarmed or (burst is not None and _generation_due(policy, state, now))
        recs, panic_since, panic_peak = (), None, 0
        # Until one training phase has been timed there is no telling when generation resumes: hold.
        known = state.last_training_seconds is not None
        want, reason = (want_panic if known else max(want_panic, sig.current_replicas)), ROLLOUT_TRAINING
    if burst is not None and policy.replicas_for(burst) > want:
        if state.phase == "generating" and now - (state.phase_since or now) < policy.stable_window_seconds:
            want, reason = policy.replicas_for(burst), ROLLOUT_PRESCALE
        elif state.phase == "training" and prewarmed:
            want, reason = policy.replicas_for(burst), ROLLOUT_PREWARM

    # Scale down only when every recommendation of the last scaleDownDelaySeconds agrees.
    recs = (*_since(recs, now - policy.scale_down_delay_seconds), (now, want))
    if max(r for _, r in recs) > want:
        want, reason = max(r for _, r in recs), SCALE_DOWN_DELAY

    replicas = policy.clamp(want)
    message = (
        f"{sig.current_replicas} -> {replicas} ({reason}): load now {sig.load:g}, "
        f"stable avg {stable_load:.1f}, panic avg {panic_load:.1f}, "
        f"target {policy.target_concurrency:g}/replica, ready {sig.ready_replicas}, "
        f"phase {state.phase or 'unknown'}" + (f", expected burst {burst:g}" if burst is not None else "")
    )
    new_state = replace(
        state,
        samples=samples,
        recommendations=recs,
        panic_since=panic_since,
        panic_peak=panic_peak,
        prewarmed=prewarmed,
    )
    return Decision(replicas, reason, message, new_state)


def _track_phase(state: State, phase: str | None, now: float) -> State:
    """Notes phase changes, how long the last training phase lasted and the peak of the last
    generation. An unknown phase (the trainer's metrics missing for a moment) keeps the last one."""
    if phase not in PHASES or phase == state.phase:
        return state
    changed = replace(state, phase=phase, phase_since=now, prewarmed=False)
    if state.phase == "training" and state.phase_since is not None:
        changed = replace(changed, last_training_seconds=now - state.phase_since)
    if state.phase == "generating":
        changed = replace(
            changed, last_peak=state.peak, last_expected=state.expected, peak=0.0, expected=None
        )
    return changed


def _generation_due(policy: Policy, state: State, now: float) -> bool:
    """True once generation is expected within prewarm_seconds (training lasts about as long as last time)."""
    if state.last_training_seconds is None or state.phase_since is None:
        return False
    return now >= state.phase_since + state.last_training_seconds - policy.prewarm_seconds


def _since(items: tuple[tuple[float, Any], ...], start: float) -> tuple[tuple[float, Any], ...]:
    return tuple(item for item in items if item[0] > start)


def _mean(samples: tuple[tuple[float, float], ...]) -> float:
    return sum(load for _, load in samples) / len(samples)
