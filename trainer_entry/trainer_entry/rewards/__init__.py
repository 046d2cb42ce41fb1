"""Reward presets and the custom reward, loaded by verl as `reward.custom_reward_function`
(`pkg://trainer_entry.rewards`, function `compute_score`).

verl calls `compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)`; the
preset and its settings come in `reward_kwargs` (see translate._reward). Each preset returns the
score and its components; verl logs the dict, and the components go to our metrics too. `custom`
calls the user's function from the ConfigMap (`toolrl_custom_reward.py` in the Ray working_dir).

A reward that raises must end the run, not hang it and not score 0. What verl 0.9.1 does with the
exception (read in its source; seen on the local cluster): `RewardLoopWorker.compute_score` ->
`NaiveRewardManager.run_single` lets it propagate to the agent-loop worker, whose
`AgentLoopWorkerTQ._run_prompt` logs "Error in _run_prompt" and marks the prompt's group `failure`;
the replay buffer of our trainer mode (`ReplayBufferAsync.wait_for_sampleable`) evicts the group and
submits a new prompt in its place, again and again: a reward that raises on every answer of some kind
keeps the step waiting forever (seen: RayJob Running 6+ min, no step), one that raises on a few
answers silently drops their groups. So `compute_score` catches any exception but `PoolUnavailable`,
records it at the hub (awaited, so it is there before verl marks the group failed) and raises
`RewardFunctionFailed`; the trainer's replay buffer (breaker.BreakerReplayBuffer), which polls
verl's group states every 2 s, asks the hub when it sees a failed group and raises the recorded
message, which ends `run_ppo` and makes `trainer_entry run` exit non-zero (run.explain_ray_failure).
A wrapper here rather than a watchdog in the driver: the exception, the function and the answer are
only known here, and the replay buffer is where verl would otherwise loop.

code-execution runs the answer in the pool itself. When that call fails for the infrastructure's reason
(pool_client.classify), the trajectory is not scored 0: `compute_score` raises `PoolUnavailable`, counted
in `toolrl_trajectories_excluded_total{reason}`. verl then marks the trajectory's prompt group failed, and
the replay buffer of our trainer mode evicts the whole group and generates a new prompt in its place
(verl 0.9.1 `ReplayBufferAsync._terminal_eviction_reasons`): no score of that group reaches an update.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer_entry.hub import sink
from trainer_entry.pool_client import CallResult, shared_client
from trainer_entry.rewards import code_execution, exact_match, math_answer, toolbench

RUN_TIMEOUT_SECONDS = 30.0
ANSWER_EXCERPT_CHARS = 120
ERROR_TEXT_CHARS = 200


class PoolUnavailable(RuntimeError):
    """The reward's own pool call failed for the infrastructure: there is no score to give."""


class RewardFunctionFailed(RuntimeError):
    """The reward function raised on a generated answer: the run stops (its message says why)."""


class RewardLoadError(RuntimeError):
    """The custom reward's file cannot be imported or does not define the function."""


def unavailable(result: CallResult) -> PoolUnavailable:
    return PoolUnavailable(
        f"code-execution reward not computed: the tool pool call failed for the infrastructure "
        f"({result.status}: {result.error or result.stderr or 'no detail'}); the trajectory's group is "
        "excluded and regenerated, not scored 0"
    )


def excerpt(text: str, limit: int) -> str:
    """`text` on one line (whitespace runs become one space), cut to `limit` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def failure_message(what: str, todo: str, exc: BaseException, answer: str) -> str:
    """One line (run.py shows a Ray worker's failure by its last line): the function, the exception, the
    answer it raised on, what was done and what to do."""
    return (
        f"{what} raised {type(exc).__name__}: {excerpt(str(exc), ERROR_TEXT_CHARS)} on the generated answer "
        f"{excerpt(answer, ANSWER_EXCERPT_CHARS)!r} ({len(answer)} characters); the run stops rather than "
        f"score the answer 0 (a made-up 0 would train the model on a wrong reward): {todo}"
    )


def custom_label(custom: dict[str, str]) -> str:
    """How messages name the custom reward: its function and where it comes from."""
    return (
        f"the reward function {custom['function']}() of spec.reward.custom "
        f"({custom['key']} of ConfigMap {custom['configMap']!r})"
    )


CUSTOM_TODO = "fix the function and apply the job again"
PRESET_TODO = "a bug in trainer_entry's reward preset: report it with this message"


def load_function(path: str, function: str) -> Callable[..., Any]:
    """The user's reward function from its file."""
    try:
        spec = importlib.util.spec_from_file_location("toolrl_custom_reward", Path(path))
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as exc:
        raise RewardLoadError(f"importing it raised {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, function, None)
    if not callable(fn):
        raise RewardLoadError(f"it defines no function {function!r}")
    return fn


loaded_function = functools.cache(load_function)  # the reward worker loads the file once


async def call_custom(
    custom: dict[str, str], data_source: str, solution_str: str, ground_truth: Any, extra_info: Any
) -> Any:
    """Call the user's function as verl 0.9.1 would (NaiveRewardManager.run_single): a coroutine function
    is awaited, a plain one runs in the event loop's executor so it does not block other scoring."""
    fn = loaded_function(custom["path"], custom["function"])
    kwargs = {
        "data_source": data_source,
        "solution_str": solution_str,
        "ground_truth": ground_truth,
        "extra_info": extra_info,
    }
    if inspect.iscoroutinefunction(fn):
        return await fn(**kwargs)
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, **kwargs))


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
    custom: dict[str, str] | None = None,
    **_: Any,
) -> Any:
    """Score one trajectory with the job's preset or custom function. Raises PoolUnavailable (the
    trajectory is excluded) or RewardFunctionFailed (the run stops), never scores a failure 0."""
    try:
        if preset == "custom":
            result = await call_custom(
                dict(custom or {}), data_source, solution_str, ground_truth, extra_info
            )
        elif preset == "exact-match":
            result = exact_match.score(solution_str, ground_truth)
        elif preset == "math":
            result = math_answer.score(solution_str, ground_truth)
        elif preset == "toolbench":
            result = toolbench.score(solution_str, weights)
        elif preset == "code-execution":
            result = await _code_execution(solution_str, ground_truth, pool_url, tool)
        else:
            raise ValueError(f"unknown reward preset {preset!r} (spec.reward.preset)")
    except PoolUnavailable:
        raise
    except Exception as exc:
        if preset == "custom":
            what, todo = custom_label(dict(custom or {})), CUSTOM_TODO
        else:
            what, todo = f"the reward preset {preset!r}", PRESET_TODO
        message = failure_message(what, todo, exc, solution_str)
        await sink().reward_failed(message)
        raise RewardFunctionFailed(message) from exc
    if isinstance(result, dict):
        sink().reward({k: v for k, v in result.items() if k != "score"})
    return result


def raise_recorded_failure() -> None:
    """Raise RewardFunctionFailed if a reward function has raised anywhere in this run (the hub keeps the
    first message); called by the trainer's replay buffer when verl reports a failed group."""
    message = sink().reward_failure()
    if message is not None:
        raise RewardFunctionFailed(message)


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
