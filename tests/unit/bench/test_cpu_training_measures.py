"""bench/cpu_training's per-mode measures from verl's console lines of real runs' first steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_entry.metrics import console_steps

from bench.cpu_training.measures import mode_measures

RECORDED = Path(__file__).parents[1] / "trainer_entry" / "recorded"


def steps(name: str) -> dict[int, dict[str, float]]:
    return console_steps((RECORDED / name).read_text())


def test_sync_run_measures_the_steps_after_the_first():
    measures = mode_measures(steps("verl_steps_sync_hf.log"), "sync")
    recorded = steps("verl_steps_sync_hf.log")
    trainer_idle = [recorded[n]["timing_s/gen"] / recorded[n]["timing_s/step"] for n in (2, 3)]
    assert measures["trainer_idle_fraction_mean"] == pytest.approx(sum(trainer_idle) / 2, abs=0.001)
    assert measures["rollout_idle_fraction_mean"] == pytest.approx(1 - sum(trainer_idle) / 2, abs=0.001)
    assert measures["off_policy_lag_max"] == 0.0  # sync: every trajectory from the policy it trains
    assert measures["stale_groups_dropped"] == 0
    assert measures["reward_per_step"] == [round(recorded[n]["critic/score/mean"], 3) for n in (1, 2, 3)]


def test_colocate_async_run_shows_its_lag():
    measures = mode_measures(steps("verl_steps_colocate_async.log"), "colocate-async")
    assert measures["off_policy_lag_max"] == 1.0
    # step 2 found its batch waiting in the buffer (gen 0.011 s of 0.327 s), step 3 waited 2.0 s of 2.3 s
    assert measures["trainer_idle_fraction_mean"] == pytest.approx((0.0329 + 0.8656) / 2, abs=0.001)
    assert len(measures["reward_per_step"]) == 3


def test_a_run_without_step_lines_is_an_error():
    with pytest.raises(ValueError, match=r"no `step:N - \.\.\.` lines"):
        mode_measures({}, "sync")
