"""A remote MCP server for the pool's `mcp` tools to proxy (run as a script: `python
remote_mcp_server.py PORT`): the official SDK's MCPServer over streamable HTTP on loopback."""

from __future__ import annotations

import asyncio
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("remote-test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Always raises, with the reason given."""
    raise ValueError(f"refused: {reason}")


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after sleeping this long."""
    await asyncio.sleep(seconds)
    return "done"


if __name__ == "__main__":
    server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
