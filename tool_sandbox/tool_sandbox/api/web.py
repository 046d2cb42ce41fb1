"""What every protocol's HTTP routes share: JSON answers and request bodies read within the
server's limits."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from tool_sandbox.api.requests import parse_json
from tool_sandbox.calls import RequestError
from tool_sandbox.config import ServerSettings

SETTINGS: web.AppKey[ServerSettings] = web.AppKey("settings", ServerSettings)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=json.dumps(body), status=status, content_type="application/json", headers=headers
    )


async def read_json(request: web.Request) -> Any:
    """The request's JSON body, read within the server's body timeout (RequestError otherwise)."""
    seconds = request.app[SETTINGS].body_timeout_seconds
    try:
        raw = await asyncio.wait_for(request.read(), seconds)
    except TimeoutError:
        raise RequestError(
            f"the request body did not arrive within {seconds:g}s; send it at once", 408
        ) from None
    return parse_json(raw)
