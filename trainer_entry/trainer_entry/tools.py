"""A verl tool per `spec.tools` entry, executed in the tool pool.

verl loads `PoolTool` from the generated tool-config YAML (see translate.tool_config) once per agent-loop
worker; every rollout of that worker then shares one `PoolClient`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from uuid import uuid4

from toolrl_api import tool_types
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from trainer_entry.hub import sink
from trainer_entry.observations import OBSERVATION_DEFAULT, OBSERVATION_SANDBOX_FUSION, unwrap_fenced_code
from trainer_entry.pool_client import CallResult, PoolClient, shared_client
from trainer_entry.translate import model_parameters

# What a trajectory's verl `extra_fields` record of its calls: each call's status and whose failure it
# was (pool_client.classify). runner.infra_tainted and the agent loops read them.
TOOL_OUTCOMES = "tool_outcomes"
TOOL_FAULTS = "tool_faults"

# What an argument of a JSON schema type must be (a bool is no number), and how the model is told.
JSON_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "string": (lambda value: isinstance(value, str), "a string"),
    "object": (lambda value: isinstance(value, dict), "a JSON object"),
    "array": (lambda value: isinstance(value, list), "a JSON array"),
    "boolean": (lambda value: isinstance(value, bool), "true or false"),
    "integer": (lambda value: isinstance(value, int) and not isinstance(value, bool), "an integer"),
    "number": (lambda value: isinstance(value, int | float) and not isinstance(value, bool), "a number"),
}


# create_kwargs keys that are ours (data.py's search routes, an http tool's context), never a function's
OWN_CREATE_KWARGS = ("context", "routes")


def pool_sample(tool_type: str, create_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """A function tool's per-sample values: the row's `create_kwargs` for it (verl's `tools_kwargs`, e.g.
    the ground truth), sent beside the model's arguments as the call's `sample`; the pool passes them to
    the function's keyword-only parameters, which the model can neither see nor give."""
    if not tool_types.TOOL_TYPES[tool_type].takes_sample:
        return None
    values = {key: value for key, value in create_kwargs.items() if key not in OWN_CREATE_KWARGS}
    return values or None


def pool_input(tool_type: str, parameters: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """The `input` of `/v1/execute` for one call; raises ValueError with a message for the model.
    A function's or an mcp tool's arguments go as they are (the pool checks them on the tool's schema);
    another tool's are the required arguments of its type's input schema (the copy of the pool's
    registry, toolrl_api.tool_types: what the model is offered, translate.model_parameters), each of its
    JSON type, beside the row's `context` when the schema lets a caller add keys (an http tool's)."""
    if tool_type in ("function", "mcp"):
        if not isinstance(parameters, dict):
            raise ValueError("the arguments must be a JSON object of the tool's parameters")
        return parameters
    schema = tool_types.TOOL_TYPES[tool_type].input_schema
    offered = model_parameters(schema)
    values = {}
    for key in offered["required"]:
        if key not in parameters:
            raise ValueError(f"missing argument '{key}'")
        value = parameters[key]
        fits, said = JSON_TYPES.get(offered["properties"][key].get("type"), (lambda _: True, ""))
        if not fits(value):
            raise ValueError(f"'{key}' must be {said}")
        values[key] = value
    if schema.get("additionalProperties") is True:
        return {**context, **values}
    return values


class PoolTool(BaseTool):
    """Runs its calls in the tool pool; failures come back as observations, never as exceptions."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema) -> None:
        super().__init__(config, tool_schema)
        self.tool_type = config["tool_type"]
        self.timeout = float(config["timeout_seconds"])
        self._client_options = {
            "max_retries": int(config["max_retries"]),
            "retry_delay_seconds": float(config["retry_delay_seconds"]),
            "max_concurrency": int(config["max_concurrency"]),
            "request_timeout_seconds": float(config["request_timeout_seconds"]),
        }
        self.pool_url = config["pool_url"]
        # spec.tools[].observationFormat (translate.tool_config): what the model reads back, and for
        # sandbox-fusion that a python call's fenced code is unwrapped before it runs
        self.observation_format = str(config.get("observation_format") or OBSERVATION_DEFAULT)
        self._instances: dict[str, dict[str, Any]] = {}

    def client(self) -> PoolClient:
        return shared_client(self.pool_url, record=sink().tool_call, **self._client_options)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        instance_id = instance_id or uuid4().hex
        self._instances[instance_id] = dict(kwargs.get("create_kwargs") or {})
        return instance_id, ToolResponse()

    async def run(
        self, parameters: dict[str, Any], create_kwargs: dict[str, Any] | None = None
    ) -> CallResult:
        """One call, with the row's `create_kwargs` for this tool; bad arguments are answered without a
        round trip."""
        create_kwargs = create_kwargs or {}
        try:
            payload = pool_input(self.tool_type, parameters, create_kwargs.get("context") or {})
        except ValueError as exc:
            sink().tool_call(self.name, "invalid", 0.0)
            return CallResult(
                status="invalid",
                error=str(exc),
                stderr=f"invalid call of {self.name}: {exc}",
                observation_format=self.observation_format,
            )
        if self.tool_type == "python" and self.observation_format == OBSERVATION_SANDBOX_FUSION:
            payload = {**payload, "code": unwrap_fenced_code(payload["code"])}
        result = await self.client().execute(
            self.name,
            payload,
            timeout_seconds=self.timeout,
            sample=pool_sample(self.tool_type, create_kwargs),
        )
        result.observation_format = self.observation_format
        return result

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        """verl's tool_agent (hermes) calls this; the call's outcome and fault go into the trajectory's
        `extra_fields` (verl passes its AgentData), where agent_loop.HermesAgentLoop looks for them."""
        start = time.perf_counter()
        result = await self.run(parameters, self._instances.get(instance_id))
        agent_data = kwargs.get("agent_data")
        if agent_data is not None:
            agent_data.extra_fields.setdefault(TOOL_OUTCOMES, []).append(result.status)
            agent_data.extra_fields.setdefault(TOOL_FAULTS, []).append(result.fault)
        metrics = {
            "status": result.status,
            "latency_seconds": time.perf_counter() - start,
            "attempts": result.attempts,
        }
        return ToolResponse(text=result.observation()), 0.0, metrics

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)
