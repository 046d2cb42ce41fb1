"""A remote MCP server for the pool's `mcp` tools to proxy (run as a script: `python
remote_mcp_server.py PORT`): the official SDK's MCPServer over streamable HTTP on loopback."""

from __future__ import annotations

import asyncio
import sys

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

server = MCPServer("remote-test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(reason: str, code: int | None = None) -> str:
    """Always raises, with the reason given: as the JSON-RPC error `code` when one is given (a server's
    own handler may answer a call so), else as the tool's error (isError)."""
    if code is not None:
        raise MCPError(code, f"refused: {reason}")
    raise ValueError(f"refused: {reason}")


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after sleeping this long."""
    await asyncio.sleep(seconds)
    return "done"


if __name__ == "__main__":
    server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
