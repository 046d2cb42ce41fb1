"""DAPO's dynamic sampling (`spec.algorithm.dynamicSampling`), bounded.

verl 0.9.1's asynchronous replay buffer filters groups itself when given a metric (`filter_groups_metric`):
each finished prompt group whose rollouts all scored alike on it is evicted and a new prompt generated in
its place, until a batch of groups that differ is there. verl passes the metric only to its own buffers,
so the job's sampler (breaker.BreakerReplayBuffer) hands it over, and adds the bound verl's buffer lacks
(it ignores `max_num_gen_batches`): data the model now finds all too easy or all too hard would be
generated for ever, a run that trains nothing and never ends. Past `maxGenerationBatches` batches' worth of
groups dropped for one step, the run fails with the numbers and what to change.

No verl here: the bound is unit-tested alone (tests/unit/trainer_entry/test_dynamic_sampling.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


class DynamicSamplingExhausted(RuntimeError):
    """A step dropped more groups than its bound without filling its batch."""


@dataclass
class FilteredGroups:
    """The groups dynamic sampling dropped for the step being sampled."""

    metric: str
    max_batches: int
    step: int = 0
    prompts: int = 1
    dropped: set[str] = field(default_factory=set)  # prompt uids: verl gives each new prompt a new one
    latest: Counter[float] = field(default_factory=Counter)  # what the groups dropped last all scored

    @classmethod
    def from_kwargs(cls, kwargs: Any) -> FilteredGroups | None:
        """From `trainer.v1.sampler.sampler_kwargs` (translate.breaker_overrides); None when disabled."""
        metric = kwargs.get("filter_groups_metric")
        if not metric:
            return None
        return cls(metric=str(metric), max_batches=int(kwargs["max_generation_batches"]))

    def new_sample(self, step: int, prompts: int) -> None:
        """A batch of `prompts` prompts is sampled for `step`: nothing dropped yet."""
        self.step, self.prompts = step, max(1, prompts)
        self.dropped, self.latest = set(), Counter()

    def seen(self, uids: set[str], scores: Counter[float]) -> None:
        """verl is about to drop the groups `uids` ({score all their rollouts had: groups} in `scores`).
        Raises DynamicSamplingExhausted once more than max_batches x prompts groups were dropped for the
        step."""
        if uids - self.dropped:
            self.dropped |= uids
            self.latest = Counter(scores)
        bound = self.max_batches * self.prompts
        if len(self.dropped) > bound:
            raise DynamicSamplingExhausted(self.message(bound))

    def message(self, bound: int) -> str:
        """One line (run.py shows a worker's failure by its last line): what happened, the numbers, what
        to do."""
        values = ", ".join(f"{count} at {value:g}" for value, count in self.latest.most_common(4))
        return (
            f"step {self.step}: dynamic sampling (spec.algorithm.dynamicSampling) dropped"
            f" {len(self.dropped)} prompt groups whose rollouts all scored alike on {self.metric!r} (the"
            f" last: {values}), more than maxGenerationBatches x the batch's {self.prompts} prompts ="
            f" {bound}, without filling the batch: the model now finds the data all too easy or all too"
            " hard. Train on data of mixed difficulty, raise algorithm.rolloutsPerPrompt (more answers per"
            " prompt differ more often) or maxGenerationBatches, or turn dynamic sampling off; then resume"
            " from the last checkpoint"
        )
