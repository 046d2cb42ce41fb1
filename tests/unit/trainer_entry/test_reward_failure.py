"""A reward function that raises on a generated answer stops the run with a message naming the function,
the exception and the answer; nothing is scored 0 for it, and verl does not regenerate it forever. Dynamic
sampling (spec.algorithm.dynamicSampling) drops groups that all scored alike, within its bound.

The custom reward is called through the callable verl 0.9.1 builds from our translated config
(`get_custom_reward_fn`), and the trainer side runs verl's own sampling loop
(`ReplayBufferAsync.wait_for_sampleable`, through our BreakerReplayBuffer) on an in-memory stand-in
for TransferQueue's tag listing: the end-to-end run is tests/e2e/test_cpu_training.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
import transfer_queue as tq
from omegaconf import OmegaConf
from trainer_entry.breaker import Breaker, BreakerReplayBuffer, BreakerSettings, PoolNotRecovered
from trainer_entry.dynamic_sampling import DynamicSamplingExhausted, FilteredGroups
from trainer_entry.hub import Sink, use_sink
from trainer_entry.metrics import TrainerMetrics
from trainer_entry.rewards import RewardFunctionFailed, compute_score, failure_message
from trainer_entry.spec import parse_job
from trainer_entry.translate import CUSTOM_REWARD_FILE, translate
from verl.trainer.ppo.reward import get_custom_reward_fn

from trainer_entry import verl_config

SYNC_REWARD = (
    "def score_it(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    answer = int(solution_str.split('####')[-1])\n"
    "    return {'score': float(answer == int(ground_truth)), 'numeric': 1.0}\n"
)
ASYNC_REWARD = SYNC_REWARD.replace("def score_it", "async def score_it")
NON_NUMERIC = "Let me think.\nThe tool said <PYTHON-OUTPUT>seven</PYTHON-OUTPUT> so #### seven " + "x" * 300


@pytest.fixture
def sink() -> Sink:
    return use_sink(Sink(local=TrainerMetrics()))


def custom_job() -> Any:
    return parse_job(
        {
            "metadata": {"name": "j", "namespace": "rl"},
            "spec": {
                "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
                "data": {"trainFiles": ["/data/t.parquet"]},
                "algorithm": {"totalEpochs": 1},
                "rollout": {"protocol": "python-tags"},
                "tools": [{"name": "python", "type": "python"}],
                "reward": {"preset": "custom", "custom": {"configMap": "my-reward", "function": "score_it"}},
            },
        }
    )


@pytest.fixture(scope="module")
def verl_reward_config() -> Any:
    """verl's config composed from the translation of a job with a custom reward."""
    return verl_config.compose(translate(custom_job(), "http://pool:8080").overrides)


@pytest.mark.parametrize("source", [SYNC_REWARD, ASYNC_REWARD], ids=["plain", "coroutine"])
async def test_a_custom_reward_that_raises_on_an_answer_stops_with_what_to_do(
    source, verl_reward_config, sink, tmp_path, monkeypatch
) -> None:
    (tmp_path / CUSTOM_REWARD_FILE).write_text(source)
    monkeypatch.chdir(tmp_path)  # verl's reward worker runs in the Ray working_dir
    score = get_custom_reward_fn(verl_reward_config)  # what verl's reward manager calls

    assert await score(data_source="toy", solution_str="#### 7", ground_truth="7", extra_info={}) == {
        "score": 1.0,
        "numeric": 1.0,
    }
    assert sink.reward_failure() is None

    with pytest.raises(RewardFunctionFailed) as raised:
        await score(data_source="toy", solution_str=NON_NUMERIC, ground_truth="7", extra_info={})
    message = str(raised.value)
    assert message.startswith(
        "the reward function score_it() of spec.reward.custom (reward.py of ConfigMap 'my-reward') raised "
        "ValueError: invalid literal for int() with base 10: ' seven xxx"
    )
    assert "on the generated answer 'Let me think. The tool said <PYTHON-OUTPUT>seven" in message
    assert f"({len(NON_NUMERIC)} characters)" in message
    assert "\n" not in message and "x" * 200 not in message  # one line, excerpts cut
    assert message.endswith("fix the function and apply the job again")
    assert isinstance(raised.value.__cause__, ValueError)
    assert sink.reward_failure() == message  # where the trainer finds it


async def test_only_the_first_failure_is_kept_and_presets_are_guarded_too(sink) -> None:
    with pytest.raises(RewardFunctionFailed, match=r"the reward preset 'bleu' raised ValueError"):
        await compute_score("x", "an answer", "7", {}, preset="bleu")
    first = sink.reward_failure()
    assert first is not None and first.endswith("report it with this message")
    with pytest.raises(RewardFunctionFailed):
        await compute_score("x", "", "", {}, preset="rouge")
    assert sink.reward_failure() == first


def test_the_message_is_one_line_however_the_error_and_answer_look() -> None:
    message = failure_message("f()", "do this", ValueError("a\n  b"), "line 1\n\tline 2")
    assert message == (
        "f() raised ValueError: a b on the generated answer 'line 1 line 2' (14 characters); the run stops "
        "rather than score the answer 0 (a made-up 0 would train the model on a wrong reward): do this"
    )


class Groups:
    """TransferQueue's tags as verl's replay buffer lists and clears them (one partition), and the refill
    verl's trainer injects: each refilled prompt ends as `refill_status` (a sampling loop that refills
    forever is stopped after `limit` refills)."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        refill_status: str,
        limit: int = 20,
        refill_scores: tuple[float, ...] = (1.0, 0.0),
    ) -> None:
        self.tags: dict[str, dict[str, Any]] = {}
        self.scores: dict[str, float] = {}  # each trajectory's reward (its rm_scores summed)
        self.refills = 0
        self.refill_status, self.limit, self.refill_scores = refill_status, limit, refill_scores
        monkeypatch.setattr(tq, "kv_list", lambda: {"train": dict(self.tags)})
        monkeypatch.setattr(tq, "kv_clear", self.clear)
        monkeypatch.setattr(tq, "kv_batch_get", self.rewards)

    def rewards(self, keys: list[str], partition_id: str, select_fields: list[str]) -> dict[str, Any]:
        assert select_fields == ["rm_scores"], select_fields  # dynamic sampling on the metric "reward"
        return {"rm_scores": [np.array([self.scores[key]]) for key in keys]}

    def clear(self, keys: list[str], partition_id: str) -> None:
        for key in keys:
            self.tags.pop(key, None)

    def group(self, uid: str, status: str, scores: tuple[float, ...] = (1.0, 0.0)) -> None:
        self.tags[uid] = {"is_prompt": True, "status": status, "global_steps": 1}
        if status == "finished":
            for session, score in enumerate(scores):
                self.tags[f"{uid}_{session}_0"] = {"status": "success"}
                self.scores[f"{uid}_{session}_0"] = score

    def refill(self, count: int) -> None:
        self.refills += 1
        if self.refills > self.limit:
            raise AssertionError(f"verl's sampling loop refilled {self.limit} times: the run would not end")
        for index in range(count):
            self.group(f"r{self.refills}x{index}", self.refill_status, self.refill_scores)


def replay_buffer(
    groups: Groups, recovery_seconds: float = 600.0, dynamic: dict[str, Any] | None = None
) -> BreakerReplayBuffer:
    settings = {
        "max_infra_failure_ratio": 0.2,
        "rollouts_per_prompt": 2,
        "pool_url": "http://127.0.0.1:1",
        "recovery_seconds": recovery_seconds,
        **(dynamic or {}),
    }
    return BreakerReplayBuffer(
        trainer_mode="toolrl-sync",
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create(settings),
        poll_interval=0.01,
        refill_fn=groups.refill,
    )


async def test_the_trainer_stops_at_the_first_group_a_raising_reward_failed(
    sink, tmp_path, monkeypatch
) -> None:
    """verl marks the group of an answer the reward raised on `failure` and would evict it and generate a
    new prompt in its place, for every answer the reward raises on (forever, for a reward that raises on
    every non-numeric answer): the trainer raises the recorded message at its first poll instead."""
    (tmp_path / CUSTOM_REWARD_FILE).write_text(SYNC_REWARD)
    custom = {
        "path": str(tmp_path / CUSTOM_REWARD_FILE),
        "function": "score_it",
        "configMap": "r",
        "key": "k",
    }
    with pytest.raises(RewardFunctionFailed):  # in the reward worker
        await compute_score("toy", "#### seven", "7", {}, preset="custom", custom=custom)

    groups = Groups(monkeypatch, refill_status="failure")
    groups.group("u1", "finished")
    groups.group("u2", "failure")
    with pytest.raises(RewardFunctionFailed, match=r"score_it\(\) .* on the generated answer '#### seven'"):
        replay_buffer(groups).sample(global_steps=1, partition_id="train", batch_size=2)
    assert groups.refills == 0
    assert "u2" in groups.tags, "the failed group was evicted before the failure was seen"


def test_a_group_that_failed_for_another_reason_is_still_regenerated_as_verl_does(sink, monkeypatch) -> None:
    """A code-execution reward whose pool call failed raises PoolUnavailable, recorded as no reward
    failure: verl evicts the group and samples a new prompt in its place, as before."""
    groups = Groups(monkeypatch, refill_status="finished")
    groups.group("u1", "finished")
    groups.group("u2", "failure")
    batch, _ = replay_buffer(groups).sample(global_steps=1, partition_id="train", batch_size=2)
    assert groups.refills == 1
    assert sorted(batch.keys) == ["r1x0_0_0", "r1x0_1_0", "u1_0_0", "u1_1_0"]


class Clock:
    """A clock that moves `step` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_groups_that_keep_failing_in_verls_sampling_loop_are_bounded(sink, monkeypatch) -> None:
    """The known gap of the code-execution reward: while its pool calls fail it raises PoolUnavailable on
    every answer with code, verl evicts the group and generates another in its place inside its sampling
    loop, before the breaker's guard sees a batch. Now the step fails once failed groups have kept coming
    for longer than the recovery bound with none finishing."""
    groups = Groups(monkeypatch, refill_status="failure")
    groups.group("u1", "finished")
    groups.group("u2", "failure")
    buffer = replay_buffer(groups, recovery_seconds=600.0)
    buffer.breaker.clock = Clock(step=100.0)
    with pytest.raises(PoolNotRecovered) as raised:
        buffer.sample(global_steps=3, partition_id="train", batch_size=2)
    message = str(raised.value)
    assert message.startswith(
        "step 3: prompt groups kept failing for 700s with none finishing (8 failed group(s) for a batch of 2 "
    )
    assert (
        "TOOLRL_POOL_WAIT_SECONDS 600s" in message and "check the tool pool at http://127.0.0.1:1" in message
    )
    assert groups.refills == 7


def test_failed_groups_with_progress_between_them_or_few_of_them_are_not_a_stuck_step() -> None:
    settings = BreakerSettings(0.2, 2, "http://pool", recovery_seconds=600.0)
    breaker = Breaker(settings, ready=lambda: True, clock=Clock(step=400.0))
    breaker.new_sample(prompts=2)
    breaker.failed_groups(step=1, failed=1, finished=0)  # t=400: the window opens
    breaker.failed_groups(step=1, failed=1, finished=1)  # t=800: a group finished since: a new window
    breaker.failed_groups(step=1, failed=1, finished=2)  # t=1200: again
    breaker.failed_groups(step=1, failed=1, finished=2)  # t=1600: 400 s without progress, within the bound

    breaker.new_sample(prompts=4)  # the next step (or the breaker's regenerated batch) starts afresh
    breaker.failed_groups(step=2, failed=1, finished=0)
    breaker.failed_groups(step=2, failed=1, finished=0)
    # 800 s without progress, but 3 failed groups for 4 prompts: transient failures in a long generation
    breaker.failed_groups(step=2, failed=1, finished=0)
    with pytest.raises(
        PoolNotRecovered, match=r"^step 2: .* for 1200s .* \(4 failed group\(s\) for a batch of 4"
    ):
        breaker.failed_groups(step=2, failed=1, finished=0)


def dynamic_sampling(job_spec: dict[str, Any]) -> dict[str, Any]:
    """The sampler kwargs a job with `job_spec`'s algorithm.dynamicSampling gives its sampler."""
    job = parse_job(
        {
            "metadata": {"name": "j", "namespace": "rl"},
            "spec": {
                "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
                "data": {"trainFiles": ["/data/t.parquet"]},
                "algorithm": {"totalEpochs": 1, "dynamicSampling": job_spec},
                "tools": [{"name": "python", "type": "python"}],
            },
        }
    )
    config, _ = verl_config.compose_job(job, translate(job, "http://127.0.0.1:1"))
    assert config.algorithm.filter_groups.enable is bool(job_spec.get("enabled"))
    kwargs = config.trainer.v1.sampler.sampler_kwargs
    return {k: kwargs[k] for k in ("filter_groups_metric", "max_generation_batches") if k in kwargs}


def test_dynamic_sampling_drops_groups_that_all_scored_alike_in_verls_own_loop(sink, monkeypatch) -> None:
    """verl's buffer filters groups only when its trainer hands it the metric, which it does for its own
    buffers alone: the job's sampler hands it over, and verl's loop drops the group whose rollouts both
    scored 1 and samples a new prompt in its place."""
    kwargs = dynamic_sampling({"enabled": True})
    assert kwargs == {"filter_groups_metric": "reward", "max_generation_batches": 10}
    assert dynamic_sampling({}) == {}  # off by default: the sampler filters nothing
    groups = Groups(monkeypatch, refill_status="finished")
    groups.group("u1", "finished", scores=(1.0, 0.0))
    groups.group("u2", "finished", scores=(1.0, 1.0))  # no signal for a group-relative advantage
    buffer = replay_buffer(groups, dynamic=kwargs)
    batch, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert sorted(batch.keys) == ["r1x0_0_0", "r1x0_1_0", "u1_0_0", "u1_1_0"], batch.keys
    assert metrics["training/filter_groups/evicted_samples"] == 1, metrics
    # off, the same groups are sampled as they are
    off = Groups(monkeypatch, refill_status="finished")
    off.group("u1", "finished", scores=(1.0, 0.0))
    off.group("u2", "finished", scores=(1.0, 1.0))
    batch, _ = replay_buffer(off).sample(global_steps=1, partition_id="train", batch_size=2)
    assert sorted(batch.keys) == ["u1_0_0", "u1_1_0", "u2_0_0", "u2_1_0"], batch.keys


def test_dynamic_sampling_fails_a_step_that_keeps_dropping_past_its_bound(sink, monkeypatch) -> None:
    """Data the model finds all too easy: every new prompt's rollouts score 1 alike. verl's buffer would
    drop and regenerate for ever (it ignores max_num_gen_batches); past maxGenerationBatches batches' worth
    of dropped groups the step fails with the numbers and what to change."""
    kwargs = dynamic_sampling({"enabled": True, "maxGenerationBatches": 2})
    groups = Groups(monkeypatch, refill_status="finished", refill_scores=(1.0, 1.0))
    groups.group("u1", "finished", scores=(1.0, 1.0))
    groups.group("u2", "finished", scores=(0.0, 1.0))
    with pytest.raises(DynamicSamplingExhausted) as raised:
        replay_buffer(groups, dynamic=kwargs).sample(global_steps=4, partition_id="train", batch_size=2)
    message = str(raised.value)
    assert message.startswith("step 4: dynamic sampling (spec.algorithm.dynamicSampling) dropped 5 prompt ")
    assert "scored alike on 'reward' (the last: 1 at 1)" in message, message
    assert "maxGenerationBatches x the batch's 2 prompts = 4, without filling the batch" in message, message
    assert groups.refills == 4  # one group at a time, each dropped: the fifth drop ends the step


def test_the_bound_counts_each_group_once_and_starts_afresh_with_each_step() -> None:
    filtered = FilteredGroups.from_kwargs({"filter_groups_metric": "acc", "max_generation_batches": 1})
    assert filtered is not None and FilteredGroups.from_kwargs({}) is None
    filtered.new_sample(step=1, prompts=2)
    filtered.seen({"a", "b"}, Counter({0.0: 2}))
    filtered.seen({"a", "b"}, Counter({0.0: 2}))  # polled again before verl dropped them: the same two
    filtered.new_sample(step=2, prompts=2)
    filtered.seen({"c", "d"}, Counter({1.0: 2}))
    with pytest.raises(DynamicSamplingExhausted, match=r"^step 2: .* dropped 3 .* 'acc' \(the last: 1 at"):
        filtered.seen({"e"}, Counter({1.0: 1}))
