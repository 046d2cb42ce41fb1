"""The pool as a gateway: its tools' schemas (GET /v1/tools), served from the tool registry."""

from __future__ import annotations

import requests
from sandbox_process import SandboxProcess
from tool_sandbox.tools import TOOL_TYPES


def test_tools_route_lists_every_tool_with_its_input_schema(server: SandboxProcess) -> None:
    answer = requests.get(server.url + "/v1/tools", timeout=10)
    assert answer.status_code == 200, answer.text
    tools = {tool["name"]: tool for tool in answer.json()["tools"]}
    assert list(tools) == ["python", "search"]
    assert tools["python"]["type"] == "python"
    assert tools["python"]["inputSchema"]["required"] == ["code"]
    assert tools["search"]["inputSchema"]["properties"]["topK"]["maximum"] == 100
    assert all(tool["description"] for tool in tools.values())
    assert tools["python"]["inputSchema"] == TOOL_TYPES["python"].input_schema
