"""What every tool type shares: the result shape and the interface the server calls."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tool_sandbox.config import ServerSettings, ToolConfig
from tool_sandbox.sandbox import outcome

if TYPE_CHECKING:
    from tool_sandbox.sandbox.pool import Pool


class ToolInputError(ValueError):
    """The call's input does not fit the tool; answered with 400 and this message."""


@dataclass
class ToolResult:
    """The answer of `POST /v1/execute` (keys in camelCase on the wire)."""

    status: str
    output: str = ""
    stdout: str = ""
    stderr: str = ""
    exitCode: int | None = None
    durationSeconds: float = 0.0
    truncated: bool = False
    message: str = ""
    files: dict[str, str] = field(default_factory=dict)
    sandboxError: bool = False
    fault: str | None = None
    """Whose failure this is (docs/contracts.md): None when ok, else `code` or `infra`; a tool that
    knows sets it, otherwise `to_json` derives it from the status (see `outcome.fault`)."""

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        if not body["files"]:
            del body["files"]
        body["fault"] = self.whose_fault()
        return body

    def observation(self) -> str:
        """What a model reads back: output, then errors, then why the call ended early."""
        parts = [self.output]
        if self.stderr:
            parts.append(self.stderr)
        if self.status in (outcome.TIMEOUT, outcome.KILLED, outcome.REJECTED) or self.sandboxError:
            parts.append(f"[{self.status}: {self.message}]")
        return "\n".join(p for p in parts if p)

    def whose_fault(self) -> str | None:
        return self.fault if self.fault is not None else outcome.fault(self.status, self.sandboxError)


class Tool:
    """A configured tool. A tool type is a subclass that declares, once, its `type` (the name in
    tools.yaml), a `description`, the JSON schema of its input object (`input_schema`, served at
    GET /v1/tools and MCP's tools/list) and its capabilities, and implements `execute`; stateful ones
    also sessions. These declarations are the one home of the type: `python -m tool_sandbox tool-types
    --write api/toolrl_api/tool_types.json` copies them into the API package, where the operator and the
    trainer read them (tool_sandbox/tool_types.py)."""

    type = ""
    description = ""  # what the tool does, for a model (an entry's own description replaces it)
    input_schema: dict[str, Any] = {"type": "object"}
    supports_sessions = False  # keeps state between calls: open_session, execute_in_session, close_session
    runs_code = False  # runs code in the sandbox workers (the pool starts them; a share of its disk)
    needs_egress = False  # its calls leave the pod (the operator opens egress to the address its entry names)
    takes_sample = False  # its calls may carry per-sample data from the trainer (execute_with_sample)

    def __init__(self, config: ToolConfig) -> None:
        self.config = config
        self.name = config.name

    @classmethod
    def create(cls, config: ToolConfig, pool: Pool | None, settings: ServerSettings) -> Tool:
        """The configured tool (a type that runs code gets the pool and the server settings)."""
        return cls(config)

    @classmethod
    def check_config(cls, values: dict[str, Any], where: str) -> None:
        """Raise ConfigError saying what a tools.yaml entry of this type lacks beyond the CRD's rules,
        which it has met (`values`: its fields by ToolConfig's names, config.entry_values)."""

    def schema(self) -> dict[str, Any]:
        """This tool as callers see it: name, type, description and the JSON schema of its input."""
        return {
            "name": self.name,
            "type": self.type,
            "description": self.config.description or self.description,
            "inputSchema": self.input_schema,
        }

    async def start(self) -> None:
        """Load what the tool needs before the pool reports ready."""

    def waiting(self) -> str:
        """While `start` waits on something outside the pool: what, for /readyz ("" otherwise)."""
        return ""

    def expand(self) -> dict[str, Tool]:
        """The tools this entry serves once started, by name: itself, or several (a remote MCP
        server's tools)."""
        return {self.name: self}

    async def close(self) -> None:
        """Release connections and files."""

    async def execute(self, payload: Any, timeout: float | None) -> ToolResult:
        raise NotImplementedError

    async def execute_with_sample(
        self, payload: Any, sample: dict[str, Any], timeout: float | None
    ) -> ToolResult:
        """A call with the row's data beside the model's input (tools that `takes_sample`)."""
        raise NotImplementedError

    async def open_session(self) -> Any:
        """A new session's handle, which only this tool reads, or a ToolResult saying why none could
        start (tools that `supports_sessions`)."""
        raise NotImplementedError

    async def execute_in_session(
        self, handle: Any, payload: Any, timeout: float | None
    ) -> tuple[ToolResult, bool]:
        """A call in the session; also whether the session is still alive afterwards."""
        raise NotImplementedError

    async def close_session(self, handle: Any) -> None:
        raise NotImplementedError

    def effective_timeout(self, timeout: float | None) -> float:
        """A caller may shorten the configured timeout, never extend it."""
        if timeout is None or not math.isfinite(timeout):  # min() with NaN would drop the limit
            return self.config.timeout_seconds
        return min(float(timeout), self.config.timeout_seconds)
