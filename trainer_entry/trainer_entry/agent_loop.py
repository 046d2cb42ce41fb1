"""verl agent loop for the text protocols (tool-tags, python-tags, react).

One assistant turn grows in place: generation stops at the protocol's closing marker, the call runs in
the tool pool, and the observation is appended with response mask 0, until the model answers without
a call or the turn limit (`multi_turn.max_user_turns` = spec.rollout.maxToolTurns) is reached.

Stop strings end a generation at the text level only: vLLM trims a stop string from the *text* it
returns (`include_stop_str_in_output` false, as ReAct's `Observation:` is) but returns every sampled
token, the stop string's included, and verl's server passes those token ids on unchanged (verl 0.9.1,
`vLLMHttpServer.generate`: `token_ids = final_res.outputs[0].token_ids`); the hf engine does the same.
`cut_at_stop` makes the token ids agree with the text: the tokens of the stop string are dropped, so
they are neither trained (mask 1) nor left in the context in front of the observation (which would
then read `Observation:` twice).

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

from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.utils.profiler import simple_timer

from trainer_entry.hub import sink
from trainer_entry.pool_client import FAULT_INFRA, CallResult
from trainer_entry.protocols import Call, get_protocol
from trainer_entry.tools import TOOL_FAULTS, TOOL_OUTCOMES, PoolTool
from trainer_entry.verl_internals import ToolAgentLoopHooks


def truncate_middle(text: str, limit: int) -> str:
    """Keep the head and tail of a long observation (errors tend to be at the end)."""
    if limit <= 0 or len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + "\n...(truncated)...\n" + text[-half:]


@dataclass(frozen=True)
class Cut:
    """A generation cut where its text ends (`cut_at_stop`)."""

    token_ids: list[int]
    """The sampled tokens kept (trained with mask 1)."""
    log_probs: list[float]
    gap_ids: list[int]
    """Text before the cut that shared a token with the stop string, encoded again: context, mask 0
    (the model wrote this text, but not as these tokens)."""
    carried: str
    """Text past the cut inside the last kept token; the observation that follows leaves it out."""


def cut_at_stop(
    tokenizer: Any,
    token_ids: list[int],
    log_probs: list[float],
    stops: tuple[str, ...],
    include_stop: bool,
    continuation: str,
) -> Cut:
    """The generation up to its first stop string (through it with `include_stop`), as token ids.

    Sampled tokens lying wholly before the cut are kept. A token across the cut is kept when the text
    of it past the cut is where `continuation` (what the loop appends next) begins, so the context
    reads the same; otherwise it is dropped and its part before the cut encoded again with mask 0."""
    text = tokenizer.decode(token_ids, skip_special_tokens=False)
    hits = sorted((text.find(stop), -len(stop), stop) for stop in stops if stop and stop in text)
    if not hits:
        return Cut(list(token_ids), list(log_probs), [], "")
    position, _, stop = hits[0]
    cut = position + len(stop) if include_stop else position
    kept, kept_text = len(token_ids), text
    while kept > 0 and (len(kept_text) > cut or not text.startswith(kept_text)):
        kept -= 1
        kept_text = tokenizer.decode(token_ids[:kept], skip_special_tokens=False)
    if len(kept_text) == cut:
        return Cut(list(token_ids[:kept]), list(log_probs[:kept]), [], "")
    across = tokenizer.decode(token_ids[: kept + 1], skip_special_tokens=False)
    if text.startswith(across) and continuation.startswith(across[cut:]):
        return Cut(list(token_ids[: kept + 1]), list(log_probs[: kept + 1]), [], across[cut:])
    gap = tokenizer.encode(text[len(kept_text) : cut], add_special_tokens=False)
    return Cut(list(token_ids[:kept]), list(log_probs[:kept]), gap, "")


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
            sampled = list(out.log_probs) if out.log_probs else [0.0] * len(out.token_ids)
            cut = cut_at_stop(
                self.tokenizer,
                list(out.token_ids),
                sampled,
                self.protocol.stop,
                self.protocol.include_stop,
                self.protocol.observation_start(),
            )
            response_ids += cut.token_ids + cut.gap_ids
            mask += [1] * len(cut.token_ids) + [0] * len(cut.gap_ids)
            logprobs += cut.log_probs + [0.0] * len(cut.gap_ids)
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
            obs_text = obs_text[len(cut.carried) :]  # the generation's last token holds its start
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
            return await tool.run(call.arguments, (tools_kwargs.get(call.name) or {}).get("create_kwargs"))
        for name, candidate in self.tools.items():
            route = _route((tools_kwargs.get(name) or {}).get("create_kwargs", {}), call.name)
            if isinstance(candidate, PoolTool) and route is not None:
                return await candidate.run({"arguments": call.arguments}, {"context": route})
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


class HermesAgentLoop(ToolAgentLoopHooks, ToolAgentLoop):
    """verl's `tool_agent` (the hermes protocol), whose trajectories are excluded as TagAgentLoop's are:
    our PoolTool records each call's fault in the trajectory (tools.PoolTool.execute); after a round of
    calls with an infrastructure failure the loop stops, and the trajectory is returned as no output."""

    def after_tool_calls(self, agent_data: AgentData, state: AgentState) -> AgentState:
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
