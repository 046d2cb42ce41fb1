"""verl agent loop for the text protocols (tool-tags, python-tags, react).

One assistant turn grows in place: generation stops at the protocol's closing marker, the call runs in
the tool pool, and the observation is appended with response mask 0, until the model answers without
a call or the turn limit (`multi_turn.max_user_turns` = spec.rollout.maxToolTurns) is reached.

A trajectory whose call met an infrastructure failure (`CallResult.fault == "infra"`: the pool
rejected it, was unreachable, lost the worker...) stops there and is returned as no output at all:
verl's agent-loop worker then neither scores it nor stores it, so it is in no GRPO group and no
update (verl 0.9.1, `AgentLoopWorkerTQ._agent_loop_postprocess` returns early on an empty list;
`compute_advantage_for_multi_trajectories`: "sessions whose AgentLoop returns None simply do not
appear in batch_keys"). It is counted in `toolrl_trajectories_excluded_total{reason}`.
`HermesAgentLoop` does the same for the hermes protocol, around verl's own `tool_agent` loop.
Registered with verl through the agent-loop YAML (`agent_loop_config_path`, see translate.agent_loops).
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.utils.profiler import simple_timer

from trainer_entry.hub import sink
from trainer_entry.pool_client import FAULT_INFRA, CallResult
from trainer_entry.protocols import Call, get_protocol
from trainer_entry.tools import TOOL_FAULTS, TOOL_OUTCOMES, PoolTool


def truncate_middle(text: str, limit: int) -> str:
    """Keep the head and tail of a long observation (errors tend to be at the end)."""
    if limit <= 0 or len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "\n...(truncated)...\n" + text[-half:]


class TagAgentLoop(AgentLoopBase):
    """Multi-turn tool use inside one assistant message, driven by a `protocols.Protocol`."""

    def __init__(self, *args: Any, protocol: str, tools: ToolListWrap | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.protocol = get_protocol(protocol)
        multi_turn = self.rollout_config.multi_turn
        self.max_tool_turns = int(multi_turn.max_user_turns or 0)
        self.max_generations = int(multi_turn.max_assistant_turns or self.max_tool_turns + 1)
        self.max_observation_chars = int(multi_turn.max_tool_response_length or 0)
        self.response_length = self.rollout_config.response_length
        self.tools: dict[str, Any] = {t.name: t for t in (tools.tools if tools else [])}
        self.code_tool = next(
            (n for n, t in self.tools.items() if getattr(t, "tool_type", "") == "python"), None
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list:
        messages = list(kwargs["raw_prompt"])
        tools_kwargs = kwargs.get("tools_kwargs") or {}
        metrics: dict[str, Any] = {}
        prompt_ids = await self.ct_build_initial_tokens(messages)
        params = {
            **sampling_params,
            "stop": list(self.protocol.stop),
            "include_stop_str_in_output": self.protocol.include_stop,
        }
        request_id = uuid4().hex
        response_ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        generations = tool_turns = 0
        outcomes: list[str] = []
        faults: list[str | None] = []
        # the policy versions the trajectory was sampled from, which verl's trainer reports (staleness)
        versions: dict[str, Any] = {}
        while True:
            with simple_timer("generate_sequences", metrics):
                out = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=prompt_ids + response_ids, sampling_params=params
                )
            versions.setdefault("min_global_steps", out.extra_fields.get("min_global_steps"))
            versions["max_global_steps"] = out.extra_fields.get("max_global_steps")
            generations += 1
            response_ids += out.token_ids
            mask += [1] * len(out.token_ids)
            logprobs += list(out.log_probs) if out.log_probs else [0.0] * len(out.token_ids)
            if len(response_ids) >= self.response_length:
                break
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            call = self.protocol.parse(text, self.code_tool)
            if call is None or self.protocol.is_final(call):
                break
            if tool_turns >= self.max_tool_turns or generations >= self.max_generations:
                break
            with simple_timer("tool_calls", metrics):
                result = await self._run_call(call, tools_kwargs)
            tool_turns += 1
            outcomes.append(result.status)
            faults.append(result.fault)
            if result.fault == FAULT_INFRA:
                # not the model's doing: this trajectory must neither be scored nor trained on
                sink().trajectories([result.status])
                return []
            observation = result.observation()
            obs_text = self.protocol.observation(truncate_middle(observation, self.max_observation_chars))
            obs_ids = self.tokenizer.encode(obs_text, add_special_tokens=False)
            response_ids += obs_ids
            mask += [0] * len(obs_ids)
            logprobs += [0.0] * len(obs_ids)
            if len(response_ids) >= self.response_length:
                break
        n = self.response_length
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[:n],
            response_mask=mask[:n],
            response_logprobs=logprobs[:n] if sampling_params.get("logprobs") else None,
            num_turns=generations + tool_turns + 1,
            metrics=metrics,
            extra_fields={
                "tool_call_counts": tool_turns,
                TOOL_OUTCOMES: outcomes,
                TOOL_FAULTS: faults,
                **versions,
            },
        )

    async def _run_call(self, call: Call, tools_kwargs: dict[str, Any]) -> CallResult:
        """One call's result; unknown tools and bad input are the model's failures, shown to it."""
        if call.error:
            return CallResult(status="invalid", error=call.error)
        tool = self.tools.get(call.name)
        if isinstance(tool, PoolTool):
            context = (tools_kwargs.get(call.name) or {}).get("create_kwargs", {}).get("context")
            return await tool.run(call.arguments, context)
        for name, candidate in self.tools.items():
            route = _route((tools_kwargs.get(name) or {}).get("create_kwargs", {}), call.name)
            if isinstance(candidate, PoolTool) and route is not None:
                return await candidate.run({"arguments": call.arguments}, route)
        known = sorted(self.tools)
        return CallResult(
            status="invalid",
            error=f"unknown tool '{call.name}'. Available tools: {', '.join(known) or 'none'}",
        )


def infra_failure(extra_fields: dict[str, Any]) -> str | None:
    """The status of the first call of a trajectory that failed for the infrastructure, or None."""
    outcomes = extra_fields.get(TOOL_OUTCOMES) or []
    for i, fault in enumerate(extra_fields.get(TOOL_FAULTS) or []):
        if fault == FAULT_INFRA:
            return outcomes[i] if i < len(outcomes) else FAULT_INFRA
    return None


class HermesAgentLoop(ToolAgentLoop):
    """verl's `tool_agent` (the hermes protocol), whose trajectories are excluded as TagAgentLoop's are:
    our PoolTool records each call's fault in the trajectory (tools.PoolTool.execute); after a round of
    calls with an infrastructure failure the loop stops, and the trajectory is returned as no output."""

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        state = await super()._handle_processing_tools_state(agent_data)
        return AgentState.TERMINATED if infra_failure(agent_data.extra_fields) else state

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list:
        output = await super().run(sampling_params, **kwargs)
        status = infra_failure(output.extra_fields)
        if status is not None:
            sink().trajectories([status])
            return []
        return output


def _route(create_kwargs: dict[str, Any], function: str) -> dict[str, Any] | None:
    """The API behind a function name of the sample (data.toolbench_row writes the routes)."""
    for route in create_kwargs.get("routes") or []:
        if route.get("function") == function:
            return {k: v for k, v in route.items() if k != "function"}
    return None
