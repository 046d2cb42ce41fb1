"""The `mcp` tool: a remote MCP server (streamable HTTP) whose tools the pool proxies.

An `mcp` entry of tools.yaml names a server (`mcp.url`) and, optionally, which of its tools to
serve (`mcp.tools`). At start the pool lists the server's tools with the official `mcp` client and
serves each as a tool of its own, named `<entry name>__<remote tool name>`, with the remote input
schema (GET /v1/tools, the pool's own MCP tools/list). Until the listing succeeds the pool is not
ready and /readyz says why (the server may start after the pool); it retries with backoff.

A call is checked against the remote tool's input schema (arguments that do not fit: the model's
fault, no round trip), then sent with the entry's timeout (one deadline across attempts) and
retries. Whose fault a failure is, from what this process observed: the server unreachable, timing
out, answering 5xx (or 408, 429) or not speaking MCP is `infra`; a tool result with `isError` (the
remote tool failed on the model's input) is `code`, and so is a JSON-RPC error the server wrote in answer
to the call (`mcp_http.Bound.written_error`: invalid params, an internal error of a handler that crashed
on these arguments, a code of its own; not retried), except the codes that blame the pool's own client or
configuration (CLIENT_ERRORS: `infra`, retried). An upstream broken for every call then shows as `code`
failures of its tools (`toolrl_tool_calls_total{tool, outcome="error"}` with no `ok`), not as the pool's.
An answer is read up to
`answer_limit` (16 x maxOutputBytes, at least 1 MiB; `mcp_http`): a longer one is refused unread, the
call's own (`code`, no retry), as a program printing past 16 x its limit is killed: what a remote tool
answers is what its arguments asked for.

Each call opens an MCP client of its own (no session outlives a call) over one HTTP client per
server that keeps its connections: on a modern (2026-07-28+) server a call is one stateless request;
on a handshake-era one it adds the initialize round trip and the session's end."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

import jsonschema

from tool_sandbox.config import ConfigError, ServerSettings, ToolConfig
from tool_sandbox.sandbox import outcome
from tool_sandbox.sandbox.pool import Pool
from tool_sandbox.tools.arguments import argument_problems, remote_references, validator
from tool_sandbox.tools.base import Tool, ToolInputError, ToolResult
from tool_sandbox.tools.http import answer_limit, backoff

# The MCP SDK and its HTTP client are imported where an `mcp` tool uses them, not with this module: every
# pool imports it, most serve no MCP server (the server's import alone: 169 -> 141 MiB without them).
if TYPE_CHECKING:
    import httpx2
    from mcp import Client
    from mcp.shared.exceptions import MCPError

SEPARATOR = "__"  # `<entry>__<remote tool>`: a name OpenAI-style function names allow
# an entry's `mcp` (the CRD's); podSelector and targetPort are the operator's (the NetworkPolicy)
MCP_FIELDS = ("url", "tools", "podSelector", "targetPort")
# Pauses between listings of a server that is down: the entry's backoff within these bounds (a
# retryDelaySeconds of 0 must not spin on a refused connection).
LIST_RETRY_MIN_SECONDS = 0.5
LIST_RETRY_MAX_SECONDS = 10.0
# The HTTP client's own limits (seconds), beyond any call's deadline (each call has its own, asyncio.timeout).
HTTP_TIMEOUT, HTTP_READ_TIMEOUT = 30.0, 300.0
# JSON-RPC errors answering a call that blame the pool's client or configuration, not the arguments: parse
# error, invalid request, method not found (JSON-RPC's), and MCP's header mismatch, missing client
# capability and unsupported protocol version.
CLIENT_ERRORS = frozenset({-32700, -32600, -32601, -32020, -32021, -32022})


def list_pause(attempt: int, delay: float) -> float:
    """Seconds to wait after failed listing `attempt` (1-based)."""
    return min(LIST_RETRY_MAX_SECONDS, max(LIST_RETRY_MIN_SECONDS, backoff(attempt, delay)))


def served_name(entry: str, remote: str) -> str:
    return f"{entry}{SEPARATOR}{remote}"


def describe(exc: BaseException) -> str:
    """An exception for a message: the first leaf of an exception group, by type and text."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or "no detail"
    return f"{type(exc).__name__}: {text}"


def _mcp_error(exc: BaseException) -> MCPError | None:
    """The JSON-RPC error the server answered with, if that is what `exc` is (or wraps)."""
    from mcp.shared.exceptions import MCPError

    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, MCPError) else None


def _checked(schema: dict[str, Any]) -> Any:
    """A bounded validator of a remote tool's schema, or None: a schema that is not valid, or refers
    to others by URL (never fetched), is the server's to check."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return None if remote_references(schema) else validator(schema)


def _tool_result(result: dict[str, Any] | None) -> Any:
    """The JSON-RPC result the server wrote as the SDK's CallToolResult, or None if it is not one."""
    from mcp.types import CallToolResult
    from pydantic import ValidationError

    if result is None:
        return None
    try:
        return CallToolResult.model_validate(result)
    except ValidationError:
        return None


def observation(result: Any) -> str:
    """A CallToolResult as text for the model: its text blocks; other blocks (images, resources)
    as their JSON; the structured content when there is no text."""
    parts: list[str] = []
    for block in result.content:
        if getattr(block, "type", "") == "text":
            parts.append(block.text)
        else:
            parts.append(json.dumps(block.model_dump(mode="json", exclude_none=True), ensure_ascii=False))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class McpServerTool(Tool):
    """The entry of a remote MCP server: lists the server's tools at start and serves each as a
    RemoteMcpTool (see `expand`). Never called itself."""

    type = "mcp"
    description = "A tool of a remote MCP server."  # each served tool has its own, from the server
    needs_egress = True

    @classmethod
    def check_config(cls, values: dict[str, Any], where: str) -> None:
        # the CRD's rules held (tools.parse_tools): an mcp entry has its server, url and tool names
        unknown = sorted(set(values["mcp"]) - set(MCP_FIELDS))
        if unknown:
            allowed = ", ".join(MCP_FIELDS)
            raise ConfigError(f"{where}.mcp: unknown field(s) {', '.join(unknown)}; allowed: {allowed}")

    @classmethod
    def create(cls, config: ToolConfig, pool: Pool | None, settings: ServerSettings) -> Tool:
        return cls(config)

    def __init__(self, config: ToolConfig) -> None:
        super().__init__(config)
        self.url: str = config.mcp["url"]
        self.wanted: list[str] = list(config.mcp.get("tools", []))
        self.remote: list[Any] = []  # the server's tools (mcp_types.Tool), as listed at start
        self.mode = "legacy"  # how calls connect: the version the server spoke at start
        self.problem = ""  # why the listing has not succeeded yet, for /readyz
        self.http: httpx2.AsyncClient | None = None  # shared by every call: its connections are kept

    def connect(self, mode: str) -> Client:
        """An MCP client of the server for one use (`async with`)."""
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client

        from tool_sandbox.tools import mcp_http

        if self.http is None:
            self.http = mcp_http.client(httpx2.Timeout(HTTP_TIMEOUT, read=HTTP_READ_TIMEOUT))
        # every answer's body, an SSE stream's too, is bounded by the client (mcp_http), not per event
        transport = streamable_http_client(self.url, http_client=self.http, max_sse_event_size=None)
        return Client(transport, mode=mode, cache=None)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    def waiting(self) -> str:
        return self.problem

    async def start(self) -> None:
        """List the server's tools, retrying until it answers; a tool named in mcp.tools that the
        server lacks stops the pool's start with what to fix."""
        # the SDK's import (seconds on a loaded machine) is not the server's time to answer: done before
        # the first attempt's clock starts (it once made "no answer within 3s" of a server that was down)
        import mcp.client.streamable_http  # noqa: F401

        attempt = 0
        while True:
            attempt += 1
            try:
                async with asyncio.timeout(self.config.timeout_seconds):
                    listed, version = await self._list()
                break
            except TimeoutError:
                reason = f"no answer within {self.config.timeout_seconds}s"
            except Exception as exc:
                reason = describe(exc)
            pause = list_pause(attempt, self.config.retry_delay_seconds)
            self.problem = (
                f"mcp tool {self.name!r}: cannot list the tools of {self.url} ({reason}; attempt"
                f" {attempt}, retrying in {pause:g}s); check that the server runs and mcp.url is its"
                " streamable-HTTP endpoint"
            )
            await asyncio.sleep(pause)
        self.problem = ""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        self.mode = version if version in MODERN_PROTOCOL_VERSIONS else "legacy"
        by_name = {tool.name: tool for tool in listed}
        missing = [name for name in self.wanted if name not in by_name]
        if missing:
            raise ConfigError(
                f"mcp tool {self.name!r}: the server at {self.url} has no tool(s) {', '.join(missing)};"
                f" it serves {', '.join(by_name) or 'none'}; fix mcp.tools"
            )
        self.remote = [by_name[name] for name in self.wanted] if self.wanted else listed
        if not self.remote:
            raise ConfigError(f"mcp tool {self.name!r}: the server at {self.url} lists no tools")

    async def _list(self) -> tuple[list[Any], str | None]:
        tools: list[Any] = []
        async with self.connect("auto") as client:
            cursor = None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools, client.protocol_version

    def expand(self) -> dict[str, Tool]:
        tools = [RemoteMcpTool(self, remote) for remote in self.remote]
        return {tool.name: tool for tool in tools}

    async def execute(self, payload: Any, timeout: float | None) -> ToolResult:
        raise ToolInputError(f"{self.name!r} is an MCP server; call its tools ({self.name}{SEPARATOR}...)")


class RemoteMcpTool(Tool):
    """One tool of a remote MCP server, served under `<entry>__<remote name>`."""

    type = "mcp"

    def __init__(self, server: McpServerTool, remote: Any) -> None:
        super().__init__(server.config)
        self.server = server
        self.remote_name: str = remote.name
        self.name = served_name(server.name, remote.name)
        self.description = remote.description or f"The tool {remote.name} of the MCP server {server.url}."
        self.input_schema = dict(remote.input_schema or {"type": "object"})
        self.validator = _checked(self.input_schema)
        # the structured content an answer must have (the SDK checks it too, against a listing of its own)
        self.output_validator = _checked(remote.output_schema) if remote.output_schema is not None else None

    def schema(self) -> dict[str, Any]:
        return {**super().schema(), "description": self.description}

    async def execute(self, payload: Any, timeout: float | None) -> ToolResult:
        if not isinstance(payload, dict):
            raise ToolInputError(f"input of {self.name} must be a JSON object of the tool's arguments")
        started = time.monotonic()
        # what the MCP client cannot send (a lone surrogate, deep nesting) is the caller's too
        said = await argument_problems(
            self.validator, payload, self.effective_timeout(timeout), surrogates=True
        )
        if said:
            message = f"invalid arguments for {self.name}: {said}"
            return self._result(outcome.ERROR, "", started, message, outcome.FAULT_CODE)
        from tool_sandbox.tools.mcp_http import reading_at_most

        seconds = self.effective_timeout(timeout)
        deadline = started + seconds  # one deadline for all attempts and the pauses between them
        last, limit = "", answer_limit(self.config.max_output_bytes)
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                pause = backoff(attempt, self.config.retry_delay_seconds)
                if time.monotonic() + pause >= deadline:
                    message = f"{last}; no time left for a retry within {seconds}s"
                    return self._result(outcome.TIMEOUT, "", started, message, outcome.FAULT_INFRA)
                await asyncio.sleep(pause)
            try:
                with reading_at_most(limit) as bound:
                    async with asyncio.timeout(deadline - time.monotonic()):
                        async with self.server.connect(self.server.mode) as client:
                            answer = await client.call_tool(self.remote_name, payload)
            except TimeoutError:
                message = f"the MCP server {self.server.url} gave no answer within {seconds}s"
                return self._result(outcome.TIMEOUT, "", started, message, outcome.FAULT_INFRA)
            except Exception as exc:
                if bound.exceeded:  # the server answered, past what the pool reads: the call asked for it
                    return self._too_large(started, limit)
                error = _mcp_error(exc)
                code = error.code if error is not None else None
                written = bound.written_error("tools/call") if code is not None else None
                if written is not None and written[0] == code and code not in CLIENT_ERRORS:
                    # the server answered these arguments with an error: the call's own, as an exception
                    message = (
                        f"{self.remote_name}: the MCP server answered the call with JSON-RPC error"
                        f" {written[0]}: {written[1]}"
                    )
                    return self._result(outcome.ERROR, "", started, message, outcome.FAULT_CODE)
                answered = _tool_result(bound.written_result("tools/call"))
                if answered is not None:
                    # the server wrote a tool result and the SDK refused it afterwards (its check of the
                    # structured content against a listing it fetches after the call, or that listing
                    # failing): the verdict is the written result's
                    return await self._answered(answered, started, seconds, check_output=True)
                last = f"MCP server {self.server.url}: {describe(exc)} after {attempt + 1} attempt(s)"
                continue
            return await self._answered(answer, started, seconds, check_output=False)  # the SDK checked it
        # unreachable, 5xx or no MCP on every attempt: the server's failure, not the model's
        return self._result(outcome.ERROR, "", started, last, outcome.FAULT_INFRA)

    async def _answered(self, answer: Any, started: float, seconds: float, check_output: bool) -> ToolResult:
        """The verdict of a tool result the server wrote (a CallToolResult): what it answers is what
        these arguments asked for, so a failure in it is the call's own (`code`). `check_output`: check
        its structured content against the output schema listed at start."""
        text = observation(answer)
        if answer.is_error:  # the remote tool ran and failed on these arguments
            message = f"the remote tool {self.remote_name} reported an error"
            return self._result(outcome.ERROR, text, started, message, outcome.FAULT_CODE)
        if check_output and self.output_validator is not None:
            if answer.structured_content is None:
                said = "it has none"
            else:
                said = await argument_problems(self.output_validator, answer.structured_content, seconds)
            if said:
                message = (
                    f"the remote tool {self.remote_name} answered with structured content that does not fit"
                    f" its output schema: {said}"
                )
                return self._result(outcome.ERROR, text, started, message, outcome.FAULT_CODE)
        return self._result(outcome.OK, text, started, "")

    def _too_large(self, started: float, limit: int) -> ToolResult:
        message = (
            f"the answer of {self.remote_name} was more than {limit} bytes, all the pool reads of an"
            f" answer of this tool (16 x maxOutputBytes {self.config.max_output_bytes}, at least 1 MiB);"
            " ask for less"
        )
        return self._result(outcome.ERROR, "", started, message, outcome.FAULT_CODE, truncated=True)

    def _result(
        self,
        status: str,
        text: str,
        started: float,
        message: str,
        fault: str | None = None,
        truncated: bool = False,
    ) -> ToolResult:
        """The answer: an ok call's text is its output; a failed one's, with why, its stderr."""
        raw = text.encode("utf-8", "surrogatepass")  # a server may quote a lone surrogate back
        limit = self.config.max_output_bytes
        text, cut = outcome.cap_output(raw[:limit], len(raw), limit)
        if status == outcome.OK:
            output, stderr = text, ""
        else:
            # observation() adds the message of a timeout itself
            said = message if status == outcome.ERROR else ""
            output, stderr = "", "\n".join(part for part in (text, said) if part)
        return ToolResult(
            status=status,
            output=output,
            stdout=output,
            stderr=stderr,
            truncated=truncated or cut,
            durationSeconds=round(time.monotonic() - started, 6),
            message=message,
            fault=fault,
        )
