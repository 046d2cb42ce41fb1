"""The circuit breaker (issue 16): a step does not train on what a degraded pool left of its batch; it
waits for the pool (bounded, with backoff) and regenerates, or fails the run saying why. verl's replay
buffer is replaced by batches of keys as verl's TransferQueue names them; the clock is simulated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from trainer_entry.breaker import (
    REGENERATIONS_METRIC,
    Breaker,
    BreakerSettings,
    PoolNotRecovered,
    count_batch,
    pool_ready,
    trips,
    wait_for_recovery,
)
from trainer_entry.hub import Sink, use_sink
from trainer_entry.metrics import TrainerMetrics

N = 4  # rollouts per prompt
PROMPTS = 2


@dataclass
class Batch:
    """verl's KVBatchMeta as the breaker reads it."""

    keys: list[str]
    tags: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tags = self.tags or [{"status": "success"} for _ in self.keys]


def batch(kept_per_prompt: list[int]) -> Batch:
    """A sampled batch: prompt i kept `kept_per_prompt[i]` of its N sessions (the rest were excluded)."""
    return Batch([f"uid{p}_{s}_0" for p, kept in enumerate(kept_per_prompt) for s in range(kept)])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def settings(ratio: float = 0.2, recovery: float = 600.0) -> BreakerSettings:
    return BreakerSettings(
        max_infra_failure_ratio=ratio,
        rollouts_per_prompt=N,
        pool_url="http://pool",
        recovery_seconds=recovery,
    )


@pytest.fixture
def metrics() -> TrainerMetrics:
    m = TrainerMetrics()
    use_sink(Sink(local=m))
    return m


def test_a_batch_is_counted_by_sessions_against_prompts_times_rollouts() -> None:
    full = count_batch(batch([N, N]).keys, batch([N, N]).tags, PROMPTS, N)
    assert (full.expected, full.kept, full.excluded) == (8, 8, 0)
    padded = Batch(["a_0_0", "a_0_1", "a_1_0", "pad_0_0"], [{}, {}, {}, {"is_padding": True}])
    assert count_batch(padded.keys, padded.tags, 1, N).kept == 2  # sessions, not outputs or padding
    part = count_batch(batch([3, 2]).keys, batch([3, 2]).tags, PROMPTS, N)
    assert part.excluded == 3 and part.fraction == pytest.approx(3 / 8)


def test_the_breaker_trips_above_the_ratio_and_whenever_nothing_is_left() -> None:
    def count(kept: list[int]):
        b = batch(kept)
        return count_batch(b.keys, b.tags, PROMPTS, N)

    assert not trips(count([N, N]), 0.0)
    assert not trips(count([N, 3]), 0.2)  # 1/8 = 12.5 % <= 20 %
    assert not trips(count([3, 3]), 0.25)  # exactly the ratio passes
    assert trips(count([3, 3]), 0.2)  # 25 % > 20 %
    assert trips(count([0, 0]), 1.0)  # verl cannot train on an empty batch, whatever the ratio
    assert trips(count([N, 3]), 0.0)


def test_wait_for_recovery_backs_off_and_is_bounded() -> None:
    clock = Clock()
    answers = iter([False, False, False, True])
    assert wait_for_recovery(lambda: next(answers), 600, clock.sleep, clock)
    assert clock.sleeps == [1.0, 2.0, 4.0]
    clock = Clock()
    assert not wait_for_recovery(lambda: False, 100, clock.sleep, clock)
    assert clock.now == 100 and clock.sleeps[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]


def test_a_healthy_batch_is_trained_on_at_once(metrics: TrainerMetrics) -> None:
    clock = Clock()
    breaker = Breaker(
        settings(), ready=lambda: pytest.fail("no wait for a healthy batch"), clock=clock, sleep=clock.sleep
    )
    healthy = batch([N, 3])
    got, extra = breaker.guard(1, PROMPTS, lambda: (healthy, {}), pytest.fail, pytest.fail)
    assert got is healthy and extra[REGENERATIONS_METRIC] == 0


def test_a_degraded_batch_waits_for_the_pool_and_is_regenerated(metrics: TrainerMetrics) -> None:
    clock = Clock()
    answers = iter([False, False, True])
    batches = iter([batch([1, 0]), batch([N, N])])
    discarded: list[Batch] = []
    refills: list[int] = []
    degraded_while_waiting: list[float] = []

    def ready() -> bool:
        degraded_while_waiting.append(metrics.tool_pool_degraded._value.get())
        return next(answers)

    breaker = Breaker(settings(), ready=ready, clock=clock, sleep=clock.sleep)
    got, extra = breaker.guard(3, PROMPTS, lambda: (next(batches), {}), discarded.append, refills.append)
    assert got.keys == batch([N, N]).keys, "the step trains on the regenerated batch"
    assert [b.keys for b in discarded] == [batch([1, 0]).keys], "the degraded batch was dropped"
    assert refills == [PROMPTS] and extra[REGENERATIONS_METRIC] == 1
    assert clock.sleeps == [1.0, 2.0]
    assert degraded_while_waiting == [1.0, 1.0, 1.0]  # toolrl_trainer_tool_pool_degraded while it waits
    assert metrics.tool_pool_degraded._value.get() == 0
    assert metrics.total_discarded == 1  # the one trajectory the degraded batch had kept


def test_an_empty_batch_never_reaches_verl(metrics: TrainerMetrics) -> None:
    clock = Clock()
    batches = iter([batch([0, 0]), batch([N, N])])
    breaker = Breaker(settings(ratio=1.0), ready=lambda: True, clock=clock, sleep=clock.sleep)
    got, _ = breaker.guard(1, PROMPTS, lambda: (next(batches), {}), lambda b: None, lambda n: None)
    assert len(got.keys) == 2 * N


def test_a_pool_that_does_not_recover_fails_the_run_with_the_numbers(metrics: TrainerMetrics) -> None:
    clock = Clock()
    breaker = Breaker(settings(recovery=120), ready=lambda: False, clock=clock, sleep=clock.sleep)
    with pytest.raises(PoolNotRecovered) as err:
        breaker.guard(5, PROMPTS, lambda: (batch([2, 1]), {}), lambda b: None, pytest.fail)
    message = str(err.value)
    assert "\n" not in message
    assert "did not recover within 120s" in message and "step 5" in message
    assert "5 of 8 trajectories excluded (62%)" in message
    assert "rollout.toolCall.maxInfraFailureRatio 0.2" in message and "http://pool" in message
    assert "resume from the last checkpoint" in message
    assert clock.now == 120


def test_a_pool_that_is_ready_but_keeps_failing_calls_is_bounded_too(metrics: TrainerMetrics) -> None:
    clock = Clock()
    refills: list[int] = []

    def sample() -> tuple[Batch, dict]:
        clock.now += 40  # a rollout takes time
        return batch([1, 1]), {}

    breaker = Breaker(settings(recovery=100), ready=lambda: True, clock=clock, sleep=clock.sleep)
    # held at t=40; regenerations start 0, 40 and 80 s into the hold (< 100 s); the 4th batch fails at t=160
    with pytest.raises(
        PoolNotRecovered, match=r"held 120s ago .* 3 batch\(es\) generated since, the last with 6"
    ):
        breaker.guard(2, PROMPTS, sample, lambda b: None, refills.append)
    assert refills == [PROMPTS] * 3
    assert metrics.total_discarded == 2 * 4  # two kept trajectories in each of the 4 batches thrown away


def test_pool_ready_probes_the_real_readyz(sandbox: str) -> None:
    from harness.localcluster import free_port

    assert pool_ready(sandbox)
    assert not pool_ready(f"http://127.0.0.1:{free_port()}")
