"""The pool as a gateway: its tools' schemas (GET /v1/tools) from the tool registry, MCP at /mcp
with the official SDK client, OpenEnv with the openenv client, and the metrics of every protocol."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp
import pytest
import requests
from harness.sandbox_process import SandboxProcess
from mcp import Client
from mcp.shared.exceptions import MCPError
from openenv.core import GenericEnvClient
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


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_mcp_sdk_client_lists_and_calls_the_tools(server: SandboxProcess, mode: str) -> None:
    """The official MCP SDK client over streamable HTTP: `auto` first probes server/discover (a
    newer protocol era) and falls back to initialize; `legacy` goes straight to initialize."""
    async with Client(server.url + "/mcp", mode=mode) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert list(listed) == ["python", "search"]
        assert listed["python"].input_schema == TOOL_TYPES["python"].input_schema
        assert listed["search"].description

        ran = await client.call_tool("python", {"code": "print(6 * 7)"})
        assert not ran.is_error, ran
        assert ran.content[0].text == "42\n"
        assert ran.structured_content["status"] == "ok" and ran.structured_content["fault"] is None

        found = await client.call_tool("search", {"query": "capital of France", "topK": 1})
        assert not found.is_error and "Paris" in found.content[0].text

        failed = await client.call_tool("python", {"code": "1 / 0"})
        assert failed.is_error
        assert "ZeroDivisionError" in failed.content[0].text
        assert failed.structured_content["fault"] == "code"
        assert failed.meta == {"dev.toolrl/fault": "code"}

        bad_arguments = await client.call_tool("search", {"topK": 3})
        assert bad_arguments.is_error and bad_arguments.structured_content["fault"] == "code"
        assert "input of a search tool must be a query string" in bad_arguments.content[0].text

        with pytest.raises(MCPError, match="unknown tool 'ruby'; this pool serves python, search"):
            await client.call_tool("ruby", {"code": "puts 1"})


def test_mcp_timeouts_are_the_codes_fault_and_bad_requests_get_json_rpc_errors(
    server: SandboxProcess,
) -> None:
    def rpc(body: object, **headers: str) -> requests.Response:
        return requests.post(server.url + "/mcp", json=body, headers=headers, timeout=60)

    call = {"name": "python", "arguments": {"code": "while True: pass"}}
    answer = rpc({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}).json()["result"]
    assert answer["isError"] and answer["structuredContent"]["status"] == "timeout"
    assert answer["_meta"] == {"dev.toolrl/fault": "code"}

    for body, status, code, message in [
        ([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], 400, -32600, "batches are not supported"),
        ({"id": 1, "method": "ping"}, 400, -32600, "send a JSON-RPC 2.0 message"),
        ({"jsonrpc": "2.0", "id": 2, "method": "resources/list"}, 200, -32601, "method 'resources/list'"),
        (
            {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": []},
            200,
            -32602,
            "params must be an object",
        ),
        (
            {
                "jsonrpc": "2.0",
                "id": 4,
                "method": "tools/call",
                "params": {"name": "python", "arguments": "x"},
            },
            200,
            -32602,
            "arguments must be an object, got str",
        ),
    ]:
        reply = rpc(body)
        assert reply.status_code == status, reply.text
        assert reply.json()["error"]["code"] == code and message in reply.json()["error"]["message"], (
            reply.text
        )
    not_json = requests.post(server.url + "/mcp", data=b"{oops", timeout=10)
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == -32700
    old = rpc({"jsonrpc": "2.0", "id": 5, "method": "ping"}, **{"MCP-Protocol-Version": "1999-01-01"})
    assert old.status_code == 400 and "is not one of 2025-03-26" in old.json()["error"]["message"]
    assert rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
    assert requests.get(server.url + "/mcp", timeout=10).status_code == 405


def test_metrics_count_calls_by_protocol(server: SandboxProcess) -> None:
    server.execute("print(1)")
    server.post("/run_code", {"code": "print(1)", "language": "python"})
    server.post("/get_observation", {"trajectory_ids": ["m"], "actions": ["<python>print(1)</python>"]})
    server.post("/get_observation", {"trajectory_ids": ["m"], "actions": [""], "finish": [True]})
    rpc = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "python", "arguments": {"code": "1"}},
    }
    server.post("/mcp", rpc)
    server.post("/step", {"action": {"code": "1"}})
    text = requests.get(server.metrics_url, timeout=10).text
    for protocol in ("native", "sandboxfusion", "verltool", "mcp", "openenv"):
        assert f'toolrl_tool_calls_total{{outcome="ok",protocol="{protocol}",tool="python"}}' in text, (
            protocol
        )


def _live_sessions(server: SandboxProcess) -> float:
    text = requests.get(server.metrics_url, timeout=10).text
    return float(
        next(line for line in text.splitlines() if line.startswith("toolrl_sandbox_sessions ")).split()[1]
    )


async def test_openenv_client_runs_episodes_with_state_kept_across_steps(server: SandboxProcess) -> None:
    """OpenEnv's own client (WebSocket at /ws): an episode's Python state lives across its steps,
    a reset starts clean, two episodes at once are apart, and the session goes with the client."""
    async with GenericEnvClient(base_url=server.url) as env, GenericEnvClient(base_url=server.url) as other:
        first = await env.reset(episode_id="e1")
        assert first.observation["status"] == "ready" and not first.done and first.reward is None
        await other.reset()
        assert (await env.step({"code": "x = 20\nprint('set')"})).observation["stdout"] == "set\n"
        await other.step({"code": "x = 1"})
        step = await env.step({"code": "print(x + 22)"})
        assert step.observation["stdout"] == "42\n" and step.observation["fault"] is None and not step.done

        failed = await env.step({"code": "1 / 0"})
        assert failed.observation["status"] == "error" and failed.observation["fault"] == "code"
        assert "ZeroDivisionError" in failed.observation["stderr"]
        found = await env.step({"tool": "search", "arguments": {"query": "capital of France", "topK": 1}})
        assert "Paris" in found.observation["output"] and found.observation["tool"] == "search"
        bad = await env.step({"tool": "search", "arguments": {"topK": 1}})
        assert bad.observation["fault"] == "code" and "query" in bad.observation["message"]
        assert await env.state() == {"episode_id": "e1", "step_count": 5, "tools": ["python", "search"]}

        with pytest.raises(RuntimeError, match=r"neither code nor tool.*\(code: VALIDATION_ERROR\)"):
            await env.step({"cmd": "ls"})
        with pytest.raises(RuntimeError, match="unknown tool 'ruby'"):
            await env.step({"tool": "ruby"})

        await env.reset()
        fresh = await env.step({"code": "print(x)"})
        assert "NameError" in fresh.observation["stderr"] and (await env.state())["step_count"] == 1
        ended = await env.step({"code": "import os\nos._exit(3)"})
        assert ended.done, ended
        with pytest.raises(RuntimeError, match=r"has ended; reset.*SESSION_ERROR"):
            await env.step({"code": "print(1)"})
        assert (await other.step({"code": "print(x)"})).observation["stdout"] == "1\n"

    for _ in range(100):  # the server closes a session when its client goes
        if _live_sessions(server) == 0:
            break
        await asyncio.sleep(0.1)
    assert _live_sessions(server) == 0, "the episodes' sessions outlived their clients"


def test_openenv_http_routes(server: SandboxProcess) -> None:
    assert requests.get(server.url + "/health", timeout=10).json() == {"status": "healthy"}
    schema = requests.get(server.url + "/schema", timeout=10).json()
    assert set(schema) == {"action", "observation", "state"}
    assert schema["action"]["oneOf"][1]["properties"]["tool"]["enum"] == ["python", "search"]
    reset = requests.post(server.url + "/reset", json={}, timeout=10).json()
    assert reset["observation"]["status"] == "ready" and reset["done"] is False
    step = server.post("/step", {"action": {"code": "print(2 + 2)"}}).json()
    assert step["observation"]["stdout"] == "4\n" and step["reward"] is None and step["done"] is False
    assert requests.get(server.url + "/state", timeout=10).json()["step_count"] == 0
    for body, message in [
        ({}, 'the body is {"action": {...}}'),
        ({"action": {"code": 5}}, "code and stdin must be strings"),
        ({"action": {"code": "1"}, "timeout_s": -1}, "timeout_s must be a positive number"),
    ]:
        answer = server.post("/step", body)
        assert answer.status_code == 422 and message in answer.json()["error"], answer.text


def test_openenv_health_answers_as_readiness_does(make_server: Any) -> None:
    """OpenEnv clients poll /health before they start episodes: a pool that must not take calls (here
    its workers run without Landlock, not allowed) answers it 503 with /readyz's reason, not healthy."""
    unready = make_server("--no-landlock", wait_ready=False)
    deadline = time.monotonic() + 90
    while True:  # until the workers reported their layers (before: "starting")
        assert unready.process.poll() is None and time.monotonic() < deadline, unready.log_tail()
        with contextlib.suppress(requests.RequestException):
            readiness = requests.get(unready.url + "/readyz", timeout=10)
            if not readiness.json().get("problem", "starting").startswith("starting"):
                break
        time.sleep(0.2)
    assert readiness.status_code == 503 and "--allow-no-landlock" in readiness.json()["problem"], (
        readiness.text
    )
    health = requests.get(unready.url + "/health", timeout=10)
    assert health.status_code == 503, health.text
    problems = readiness.json()["problems"]
    assert health.json() == {"status": "unhealthy", "problem": problems[0], "problems": problems}


async def test_a_full_pool_is_the_infrastructures_fault_in_mcp_and_openenv(make_server: Any) -> None:
    """A call the pool refuses (at capacity) is a failed result with fault infra, never the code's;
    OpenEnv sessions beyond the session cap are refused at connect."""
    tiny = make_server("--capacity", "1", "--queue-size", "1", "--workers", "1", "--max-sessions", "1")
    slow = {"name": "python", "arguments": {"code": "import time\ntime.sleep(2)"}}

    async with Client(tiny.url + "/mcp", mode="legacy") as client:
        results = await asyncio.gather(*(client.call_tool(**slow) for _ in range(4)))
    refused = [r for r in results if r.is_error]
    assert refused and len(refused) < 4, results
    for result in refused:
        assert (
            result.structured_content["status"] == "rejected"
            and result.structured_content["fault"] == "infra"
        )
        assert result.meta["dev.toolrl/fault"] == "infra" and result.meta["dev.toolrl/retryAfterSeconds"] >= 1

    async with GenericEnvClient(base_url=tiny.url) as env:
        await env.reset()
        assert (await env.step({"code": "print(1)"})).observation["stdout"] == "1\n"
        with pytest.raises(ConnectionError, match="429"):
            await GenericEnvClient(base_url=tiny.url).connect()


async def test_openenv_websocket_answers_bad_messages_with_error_codes(server: SandboxProcess) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(server.url + "/ws") as socket:
        for raw, code, message in [
            ("{oops", "INVALID_JSON", "request body is not valid JSON"),
            ("[" * 100_000 + "]" * 100_000, "INVALID_JSON", "nests JSON too deeply"),
            ("[1]", "INVALID_JSON", "a message is a JSON object, got list"),
            ('{"type": "dance"}', "UNKNOWN_TYPE", "send reset, step, state or close"),
            ('{"type": "step", "data": {"code": 1}}', "VALIDATION_ERROR", "code and stdin must be strings"),
            (
                '{"type": "reset", "data": {"episode_id": 7}}',
                "VALIDATION_ERROR",
                "episode_id must be a string",
            ),
        ]:
            await socket.send_str(raw)
            answer = await socket.receive_json(timeout=30)
            assert answer["type"] == "error" and answer["data"]["code"] == code, (raw[:20], answer)
            assert message in answer["data"]["message"], answer
        await socket.send_str('{"type": "state"}')  # the connection survived every bad message
        assert (await socket.receive_json(timeout=30))["data"]["step_count"] == 0
