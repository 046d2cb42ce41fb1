"""What bench/cpu_training reports of a run's steps for its trainer mode, from verl's console lines
(trainer_entry.metrics.console_steps): the idle fractions our hooks log with each step
(trainer_entry.metrics.idle_fractions says what they are made of in each mode), the off-policy lag and
the stale drops verl logs, and the learning curve."""

from __future__ import annotations

import statistics

from trainer_entry.metrics import (
    ROLLOUT_IDLE_METRIC,
    TRAINER_IDLE_METRIC,
    VERL_LAG_MAX,
    VERL_REWARD_MEAN,
    VERL_STALE_DROPPED,
    idle_fractions,
)


def mode_measures(steps: dict[int, dict[str, float]], mode: str) -> dict:
    """The idle fractions' means over the steps after the first (it also warms the engine up), the
    largest off-policy lag of a trained trajectory, the prompt groups dropped as stale, and the reward
    of every step."""
    if not steps:
        raise ValueError("no `step:N - ...` lines in the trainer's output: did verl's console logger run?")
    ordered = [steps[k] for k in sorted(steps)]
    steady = ordered[1:] or ordered
    # what the trainer logged; computed the same way where a step lacks it (a trainer without our hooks)
    fractions = [{**idle_fractions(s, mode), **s} for s in steady]

    def mean_of(key: str) -> float | None:
        values = [f[key] for f in fractions if key in f]
        return round(statistics.mean(values), 3) if values else None

    lags = [s[VERL_LAG_MAX] for s in ordered if VERL_LAG_MAX in s]
    return {
        "rollout_idle_fraction_mean": mean_of(ROLLOUT_IDLE_METRIC),
        "trainer_idle_fraction_mean": mean_of(TRAINER_IDLE_METRIC),
        "off_policy_lag_max": max(lags) if lags else None,
        "stale_groups_dropped": sum(s.get(VERL_STALE_DROPPED, 0.0) for s in ordered),
        "reward_per_step": [round(s.get(VERL_REWARD_MEAN, float("nan")), 3) for s in ordered],
    }
