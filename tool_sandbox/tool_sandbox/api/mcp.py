"""MCP (Model Context Protocol) over streamable HTTP at `/mcp`: `initialize`, `ping`, `tools/list`
(every tool of the pool with its input schema) and `tools/call` (runs the tool through the service).

Stateless and JSON-only: each POST carries one JSON-RPC message and gets its answer as one JSON
body (no `Mcp-Session-Id`, no server-to-client stream: GET and DELETE answer 405, as the transport
allows). Handshake-era protocol versions; a `server/discover` probe of a newer client is answered
"method not found", which makes the client fall back to `initialize`. Written over aiohttp rather
than with the SDK's server, which needs an ASGI app beside this one.

A call that ran and failed (the code's fault or the pool's) is a tool result with `isError: true`:
`structuredContent` is the pool's own result (`status`, `fault`, `stdout`, ...), and `_meta` names
the fault too. Arguments the tool cannot take are a tool result with `fault: "code"` (the model can
correct them); an unknown tool or a malformed request is a JSON-RPC error."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any, Literal, NotRequired

from aiohttp import web
from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from tool_sandbox.admission import Rejected
from tool_sandbox.api.requests import FieldMessages, error_message, first_error, json_kind, typed_dict
from tool_sandbox.api.web import json_response, read_json
from tool_sandbox.calls import RequestError, shown
from tool_sandbox.sandbox import outcome
from tool_sandbox.service import SERVER_NAME, Service, server_version
from tool_sandbox.tools.base import ToolInputError, ToolResult

PROTOCOL = "mcp"
PATH = "/mcp"
# Revisions with the initialize handshake, oldest first; the newest is offered when a client asks
# for one not listed.
VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
FAULT_META = "dev.toolrl/fault"  # _meta key of a failed call's fault (code or infra)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


SERVER_INFO = {"name": SERVER_NAME, "version": server_version()}


def _error(request_id: Any, code: int, message: str, status: int = 200) -> web.Response:
    return json_response(
        {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}, status
    )


def tool_result(result: ToolResult, text: str | None = None) -> dict[str, Any]:
    """A pool result as an MCP CallToolResult (its text: what a model reads back, unless given)."""
    body = result.to_json()
    failed = result.status != outcome.OK
    answer: dict[str, Any] = {
        "content": [{"type": "text", "text": result.observation() if text is None else text}],
        "structuredContent": body,
        "isError": failed,
    }
    if failed:
        answer["_meta"] = {FAULT_META: body["fault"]}
    return answer


def _refused(message: str, fault: str) -> dict[str, Any]:
    """A call that did not run, as a failed tool result."""
    status = outcome.REJECTED if fault == outcome.FAULT_INFRA else outcome.ERROR
    return tool_result(ToolResult(status=status, message=message, fault=fault), f"[{status}: {message}]")


@functools.cache
def request_body(methods: tuple[str, ...]) -> TypeAdapter[dict[str, Any]]:
    """A JSON-RPC request's fields, in the order checked: `id`, `method` (one served), `params`.
    What kind of message it is (a request, a notification, a response) is told before, by `post`."""
    return typed_dict(
        "JsonRpcRequest",
        {"id": str | int, "method": Literal[methods], "params": NotRequired[dict[str, Any]]},
    )


def request_messages(methods: Iterable[str]) -> FieldMessages:
    served = ", ".join(methods)

    def method(_: Any, got: Any) -> str:
        if isinstance(got, str):
            return f"method {shown(got)} is not served; this pool serves {served}"
        return "method must be a string"

    return {
        "id": lambda *_: "the request id must be a string or an integer",
        "method": method,
        "params": lambda _, got: f"params must be an object, got {json_kind(got)}",
    }


def _invalid(error: ErrorDetails, request_id: Any, methods: Iterable[str]) -> web.Response:
    """A request whose fields are wrong: which error answers it depends on the field (a bad id
    cannot be echoed back; an unknown method has a code of its own)."""
    message, field = error_message(error, request_messages(methods)), error["loc"][0]
    if field == "id":
        return _error(None, INVALID_REQUEST, message, 400)
    if field == "params":
        return _error(request_id, INVALID_PARAMS, message)
    return _error(
        request_id, METHOD_NOT_FOUND if isinstance(error["input"], str) else INVALID_REQUEST, message
    )


@functools.cache
def call_params(tools: tuple[str, ...]) -> TypeAdapter[dict[str, Any]]:
    """`tools/call`'s params: one of the pool's tools and its arguments (none: null or absent)."""
    return typed_dict(
        "CallToolParams", {"name": Literal[tools], "arguments": NotRequired[dict[str, Any] | None]}
    )


def call_messages(tools: Iterable[str]) -> FieldMessages:
    served = ", ".join(tools)
    return {
        "name": lambda _, got: f"unknown tool {shown(got)}; this pool serves {served}",
        "arguments": lambda _, got: f"arguments must be an object, got {json_kind(got)}",
    }


def routes(service: Service) -> web.RouteTableDef:
    routes = web.RouteTableDef()

    async def initialize(params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[-1],
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": SERVER_INFO,
            "instructions": "The tools of a ToolRL tool pool; code runs in its sandbox.",
        }

    async def ping(params: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def list_tools(params: dict[str, Any]) -> dict[str, Any]:
        tools = []
        for tool in service.tools.values():
            schema = tool.schema()
            tools.append(
                {
                    "name": schema["name"],
                    "description": schema["description"],
                    "inputSchema": schema["inputSchema"],
                }
            )
        return {"tools": tools}

    async def call_tool(params: dict[str, Any]) -> dict[str, Any]:
        try:
            call = call_params(tuple(service.tools)).validate_python(params)
        except ValidationError as exc:
            raise RpcError(
                INVALID_PARAMS, error_message(first_error(exc), call_messages(service.tools))
            ) from None
        name, arguments = call["name"], call.get("arguments") or {}
        try:
            result = await service.call(name, arguments, PROTOCOL)
        except ToolInputError as exc:
            return _refused(f"{exc}; see the tool's inputSchema in tools/list", outcome.FAULT_CODE)
        except Rejected as exc:
            answer = _refused(str(exc), outcome.FAULT_INFRA)
            answer["_meta"]["dev.toolrl/retryAfterSeconds"] = exc.retry_after
            return answer
        return tool_result(result)

    methods = {"initialize": initialize, "ping": ping, "tools/list": list_tools, "tools/call": call_tool}

    @routes.post(PATH)
    async def post(request: web.Request) -> web.StreamResponse:
        version = request.headers.get("MCP-Protocol-Version")
        if version is not None and version not in VERSIONS:
            supported = ", ".join(VERSIONS)
            return _error(
                None, INVALID_REQUEST, f"MCP-Protocol-Version {shown(version)} is not one of {supported}", 400
            )
        try:
            message = await read_json(request)
        except RequestError as exc:
            return _error(None, PARSE_ERROR, str(exc), exc.status)
        if isinstance(message, list):
            return _error(
                None, INVALID_REQUEST, "JSON-RPC batches are not supported; send one message per POST", 400
            )
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error(
                None, INVALID_REQUEST, 'send a JSON-RPC 2.0 message: {"jsonrpc": "2.0", "method": ...}', 400
            )
        if "method" not in message:  # a response to the server: it sends no requests, so nothing to do
            return web.Response(status=202)
        if "id" not in message:  # a notification (notifications/initialized, cancelled, ...)
            return web.Response(status=202)
        request_id = message["id"]
        try:
            call = request_body(tuple(methods)).validate_python(message)
        except ValidationError as exc:
            return _invalid(first_error(exc), request_id, methods)
        handler, params = methods[call["method"]], call.get("params", {})
        try:
            result = await handler(params)
        except RpcError as exc:
            return _error(request_id, exc.code, str(exc))
        return json_response({"jsonrpc": "2.0", "id": request_id, "result": result})

    @routes.get(PATH)
    async def no_stream(request: web.Request) -> web.Response:
        raise web.HTTPMethodNotAllowed(
            "GET", ["POST"], text="this MCP server sends no server-to-client stream"
        )

    @routes.delete(PATH)
    async def no_session(request: web.Request) -> web.Response:
        raise web.HTTPMethodNotAllowed("DELETE", ["POST"], text="this MCP server keeps no sessions")

    return routes
