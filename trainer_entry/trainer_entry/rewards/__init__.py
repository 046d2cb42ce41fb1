"""Reward presets, loaded by verl as `reward.custom_reward_function` (`pkg://trainer_entry.rewards`).

verl calls `compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)`; the
preset and its settings come in `reward_kwargs` (see translate._reward). Each preset returns the
score and its components; verl logs the dict, and the components go to our metrics too.
(`custom` never comes here: verl loads the user's function from the ConfigMap directly.)

code-execution runs the answer in the pool itself. When that call fails for the infrastructure's reason
(pool_client.classify), the trajectory is not scored 0: `compute_score` raises `PoolUnavailable`, counted
in `toolrl_trajectories_excluded_total{reason}`. verl then marks the trajectory's prompt group failed, and
the replay buffer of our trainer mode evicts the whole group and generates a new prompt in its place
(verl 0.9.1 `ReplayBufferAsync._terminal_eviction_reasons`): no score of that group reaches an update.
"""

from __future__ import annotations

from typing import Any

from trainer_entry.hub import sink
from trainer_entry.pool_client import CallResult, shared_client
from trainer_entry.rewards import code_execution, exact_match, toolbench

RUN_TIMEOUT_SECONDS = 30.0


class PoolUnavailable(RuntimeError):
    """The reward's own pool call failed for the infrastructure: there is no score to give."""


def unavailable(result: CallResult) -> PoolUnavailable:
    return PoolUnavailable(
        f"code-execution reward not computed: the tool pool call failed for the infrastructure "
        f"({result.status}: {result.error or result.stderr or 'no detail'}); the trajectory's group is "
        "excluded and regenerated, not scored 0"
    )


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    preset: str,
    pool_url: str = "",
    tool: str = "python",
    weights: dict[str, float] | None = None,
    **_: Any,
) -> dict[str, float]:
    """Score one trajectory with the job's preset."""
    if preset == "exact-match":
        result = exact_match.score(solution_str, ground_truth)
    elif preset == "toolbench":
        result = toolbench.score(solution_str, weights)
    elif preset == "code-execution":
        result = await _code_execution(solution_str, ground_truth, pool_url, tool)
    else:
        raise ValueError(f"unknown reward preset {preset!r} (spec.reward.preset)")
    sink().reward({k: v for k, v in result.items() if k != "score"})
    return result


async def _code_execution(solution: str, ground_truth: Any, pool_url: str, tool: str) -> dict[str, float]:
    code = code_execution.extract_code(solution)
    if code is None:
        return dict(code_execution.NO_CODE)
    nonce = code_execution.new_nonce()
    source, expected = code_execution.program(code, ground_truth, nonce)
    client = shared_client(pool_url, record=sink().tool_call)
    result = await client.execute(tool, {"code": source}, timeout_seconds=RUN_TIMEOUT_SECONDS)
    if result.infra_failure:
        sink().trajectories([result.status])
        raise unavailable(result)
    return code_execution.judge(result, expected, nonce)
