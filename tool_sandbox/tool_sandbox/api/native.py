"""The pool's own API: /v1/execute (one call or a batch), /v1/sessions and /v1/tools."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from tool_sandbox.admission import Rejected
from tool_sandbox.api.requests import parse_batch, parse_execute, parse_session_create
from tool_sandbox.api.web import json_response, read_json
from tool_sandbox.calls import ExecuteRequest, RequestError
from tool_sandbox.sandbox import outcome
from tool_sandbox.service import NATIVE, Service
from tool_sandbox.sessions import API, SessionLimit
from tool_sandbox.tools.base import ToolInputError, ToolResult

PROTOCOL = NATIVE


def routes(service: Service) -> web.RouteTableDef:
    routes = web.RouteTableDef()

    @routes.post("/v1/execute")
    async def execute(request: web.Request) -> web.Response:
        call = parse_execute(await read_json(request), service.tools)
        return json_response((await service.execute(call)).to_json())

    @routes.post("/v1/execute/batch")
    async def execute_batch(request: web.Request) -> web.Response:
        calls = parse_batch(await read_json(request), service.tools)

        async def one(call: ExecuteRequest) -> dict[str, Any]:
            try:
                return (await service.execute(call)).to_json()
            except Rejected as exc:
                return ToolResult(status=outcome.REJECTED, message=str(exc)).to_json()
            except (RequestError, ToolInputError) as exc:
                return ToolResult(status=outcome.ERROR, message=str(exc)).to_json()

        return json_response({"results": await asyncio.gather(*(one(c) for c in calls))})

    @routes.post("/v1/sessions")
    async def open_session(request: web.Request) -> web.Response:
        tool = parse_session_create(await read_json(request), service.session_tools)
        try:
            session = await service.open_session(tool)
        except SessionLimit as exc:
            return json_response({"error": str(exc)}, 429, {"Retry-After": "5"})
        if isinstance(session, ToolResult):
            return json_response({"error": f"could not start the session: {session.message}"}, 503)
        return json_response({"session": session.id, "tool": tool}, 201)

    @routes.delete("/v1/sessions/{session_id}")
    async def close_session(request: web.Request) -> web.Response:
        if not await service.close_session(request.match_info["session_id"], API):
            raise RequestError(f"unknown session {request.match_info['session_id']!r}", 404)
        return json_response({"closed": True})

    @routes.get("/v1/tools")
    async def list_tools(request: web.Request) -> web.Response:
        """Every tool of this pool: name, type, description and the JSON schema of its input."""
        return json_response({"tools": [tool.schema() for tool in service.tools.values()]})

    return routes
