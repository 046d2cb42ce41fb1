"""`mcp` tools: a remote MCP server (the official SDK's MCPServer over streamable HTTP on loopback,
remote_mcp_server.py) whose tools the pool lists at start and proxies, each as a tool of its own,
with the pool's timeouts, retries, fault classification and metrics."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from aiohttp import web
from harness.sandbox_process import SandboxProcess
from harness.tiers import process_tier
from mcp import Client
from mcp_types import Tool as Listed
from tool_sandbox.config import ConfigError, ToolConfig
from tool_sandbox.tools import Tool, expand_tools, parse_tools
from tool_sandbox.tools.remote_mcp import McpServerTool, RemoteMcpTool, list_pause

REMOTE_SERVER = Path(__file__).with_name("remote_mcp_server.py")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(check: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} within {seconds}s")


class RemoteServer:
    """remote_mcp_server.py on a port of its own (tools add, fail, slow)."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RemoteServer:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(REMOTE_SERVER), str(self.port)], stdout=out, stderr=subprocess.STDOUT
            )
        wait_until(self.listening, 60, f"the remote MCP server did not listen; its log:\n{self.log_tail()}")
        return self

    def listening(self) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, f"the remote MCP server exited:\n{self.log_tail()}"
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(15)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else "(no log)"


# A call's budget: generous, as a loaded machine (the training tests beside these) slowed the remote
# server's answer to a raising tool past 3 s; the timeout itself is tested with its own short one.
CALL_SECONDS = 30
SHORT_SECONDS = 3


def mcp_entry(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "remote",
        "type": "mcp",
        "mcp": {"url": url},
        "timeoutSeconds": CALL_SECONDS,
        "maxRetries": 1,
        "retryDelaySeconds": 0.1,
        **extra,
    }


@pytest.fixture(scope="module")
@process_tier
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteServer]:
    server = RemoteServer(free_port(), tmp_path_factory.mktemp("remote-mcp") / "remote.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
@process_tier
def pool(remote: RemoteServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    """A pool with a python tool and the remote server's tools (no sandbox needed for those)."""
    tools = [{"name": "python", "type": "python", "timeoutSeconds": 3}, mcp_entry(remote.url)]
    running = SandboxProcess.start(tmp_path_factory.mktemp("pool"), tools=tools)
    yield running
    running.stop()


def call(pool: SandboxProcess, tool: str, arguments: Any) -> dict[str, Any]:
    answer = pool.post("/v1/execute", {"tool": tool, "input": arguments})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_pool_serves_each_remote_tool_under_the_entry_name(pool: SandboxProcess) -> None:
    listed = {t["name"]: t for t in requests.get(pool.url + "/v1/tools", timeout=10).json()["tools"]}
    assert list(listed) == ["python", "remote__add", "remote__fail", "remote__slow"]
    add = listed["remote__add"]
    assert add["type"] == "mcp" and add["description"] == "Add two integers."
    assert add["inputSchema"]["required"] == ["a", "b"]
    assert add["inputSchema"]["properties"]["a"]["type"] == "integer"


def test_calls_are_proxied_with_whose_fault_a_failure_is(pool: SandboxProcess) -> None:
    ok = call(pool, "remote__add", {"a": 2, "b": 40})
    assert (ok["status"], ok["output"], ok["fault"]) == ("ok", "42", None), ok

    raised = call(pool, "remote__fail", {"reason": "no"})  # the remote tool raises: isError
    assert (raised["status"], raised["fault"]) == ("error", "code"), raised
    assert "reported an error" in raised["message"] and "Error executing tool fail" in raised["stderr"]

    wrong = call(pool, "remote__add", {"a": "two"})  # checked on the remote schema, no round trip
    assert (wrong["status"], wrong["fault"]) == ("error", "code"), wrong
    assert "invalid arguments for remote__add" in wrong["message"] and "'b' is a required" in wrong["message"]

    not_object = pool.post("/v1/execute", {"tool": "remote__add", "input": "2+2"})
    assert not_object.status_code == 400 and "must be a JSON object" in not_object.json()["error"]


def test_a_remote_slower_than_the_timeout_is_the_infrastructures_fault(
    remote: RemoteServer, make_server: Callable[..., SandboxProcess]
) -> None:
    pool = make_server(tools=[mcp_entry(remote.url, timeoutSeconds=SHORT_SECONDS)])
    started = time.monotonic()
    slow = call(pool, "remote__slow", {"seconds": 120})
    assert (slow["status"], slow["fault"]) == ("timeout", "infra"), slow
    assert f"gave no answer within {SHORT_SECONDS:.1f}s" in slow["message"]
    assert time.monotonic() - started < 60  # the entry's timeout (with its retry), not the remote's 120 s


async def test_the_pools_own_mcp_endpoint_offers_the_remote_tools(pool: SandboxProcess) -> None:
    async with Client(pool.url + "/mcp", mode="legacy") as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert {"remote__add", "remote__fail", "remote__slow"} <= set(listed)
        assert listed["remote__add"].input_schema["required"] == ["a", "b"]
        added = await client.call_tool("remote__add", {"a": 1, "b": 1})
        assert not added.is_error and added.content[0].text == "2"
        failed = await client.call_tool("remote__fail", {"reason": "x"})
        assert failed.is_error and failed.meta == {"dev.toolrl/fault": "code"}


def test_metrics_count_the_remote_tools_calls_per_tool(pool: SandboxProcess) -> None:
    for _ in range(3):
        call(pool, "remote__add", {"a": 1, "b": 2})
    call(pool, "remote__fail", {"reason": "x"})
    text = requests.get(pool.metrics_url, timeout=10).text

    def count(tool: str, outcome: str) -> float:
        prefix = f'toolrl_tool_calls_total{{outcome="{outcome}",protocol="native",tool="{tool}"}} '
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        return float(lines[0].split()[-1]) if lines else 0.0

    assert count("remote__add", "ok") >= 3
    assert count("remote__fail", "error") >= 1


def test_a_server_down_at_start_keeps_the_pool_unready_until_it_answers_then_failures_are_infra(
    tmp_path: Path, make_server: Callable[..., SandboxProcess]
) -> None:
    """The pool starts before its MCP server: /readyz says which server it waits for and why;
    once the server answers the pool is ready; a server that goes away later is the
    infrastructure's fault."""
    remote = RemoteServer(free_port(), tmp_path / "remote.log")
    tools = [mcp_entry(remote.url, mcp={"url": remote.url, "tools": ["add"]})]
    pool = make_server(tools=tools, wait_ready=False)
    try:

        def unready() -> dict[str, Any] | None:
            assert pool.process.poll() is None, f"the pool exited:\n{pool.log_tail()}"
            try:
                answer = requests.get(pool.url + "/readyz", timeout=5)
            except requests.RequestException:
                return None
            return answer.json() if answer.status_code == 503 and "mcp tool" in answer.text else None

        body = wait_until(unready, 60, "the pool did not say it waits for its MCP server")
        assert f"cannot list the tools of {remote.url}" in body["problem"], body
        assert "ConnectError" in body["problem"] and "retrying" in body["problem"]

        remote.start()
        wait_until(pool.ready, 60, f"the pool did not become ready once the server ran:\n{pool.log_tail()}")
        listed = [t["name"] for t in requests.get(pool.url + "/v1/tools", timeout=10).json()["tools"]]
        assert listed == ["remote__add"]  # mcp.tools chose one
        assert call(pool, "remote__add", {"a": 3, "b": 4})["output"] == "7"

        remote.stop()
        down = call(pool, "remote__add", {"a": 3, "b": 4})
        assert (down["status"], down["fault"]) == ("error", "infra"), down
        assert "ConnectError" in down["message"] and "after 2 attempt(s)" in down["message"]
    finally:
        pool.stop()
        remote.stop()


def test_a_tool_named_in_mcp_tools_that_the_server_lacks_stops_the_pool(
    remote: RemoteServer, make_server: Callable[..., SandboxProcess]
) -> None:
    tools = [mcp_entry(remote.url, mcp={"url": remote.url, "tools": ["add", "multiply"]})]
    with pytest.raises(RuntimeError) as failed:
        make_server(tools=tools)
    assert "has no tool(s) multiply; it serves add, fail, slow; fix mcp.tools" in str(failed.value)


async def test_a_server_answering_5xx_is_the_infrastructures_fault() -> None:
    """A proxy or a crashed server answering 500: retried, then a failure of the infrastructure."""
    hits = []

    async def broken(request: web.Request) -> web.Response:
        hits.append(request.method)
        return web.Response(status=500, text="upstream crashed")

    app = web.Application()
    app.router.add_route("*", "/mcp", broken)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        entry = mcp_entry(url, maxRetries=2, retryDelaySeconds=0.05)
        (config,) = parse_tools(json.dumps({"tools": [entry]}))
        listed = Listed(name="add", description="", input_schema={"type": "object"})
        entry = McpServerTool(config)
        result = await RemoteMcpTool(entry, listed).execute({"a": 1}, None)
        await entry.close()
    finally:
        await runner.cleanup()
    assert (result.status, result.whose_fault()) == ("error", "infra"), result
    assert "after 3 attempt(s)" in result.message and "Server returned an error response" in result.message
    assert len([m for m in hits if m == "POST"]) >= 3


@pytest.mark.parametrize("code", [-32603, -32000, -32001, -32602, 4711])
def test_an_error_the_remote_server_answers_to_the_call_is_the_calls_own(
    pool: SandboxProcess, code: int
) -> None:
    """The remote handler fails on these arguments and its server answers the call with a JSON-RPC
    error (an internal error, a code of its own): the model's doing, never masked as `infra`."""
    answer = call(pool, "remote__fail", {"reason": "crash", "code": code})
    assert (answer["status"], answer["fault"]) == ("error", "code"), answer
    assert f"JSON-RPC error {code}" in answer["message"] and "refused: crash" in answer["message"], answer
    assert "attempt" not in answer["message"], answer  # not retried


@pytest.mark.parametrize("code", [-32601, -32600, -32700])
def test_an_error_about_the_pools_own_client_is_the_infrastructures(pool: SandboxProcess, code: int) -> None:
    """Method not found, invalid request, parse error: the pool's configuration or its client, retried."""
    answer = call(pool, "remote__fail", {"reason": "crash", "code": code})
    assert (answer["status"], answer["fault"]) == ("error", "infra"), answer
    assert "after 2 attempt(s)" in answer["message"], answer


# The output schema of the scripted server's tool `answer` where a test gives it one.
COUNT_SCHEMA = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}


async def _call_scripted_server(
    arguments: dict[str, Any], output_schema: dict[str, Any] | None = None
) -> tuple[Any, list[dict[str, Any]]]:
    """One call of the tool `answer` of a handshake-era MCP server (aiohttp, on loopback) that answers
    tools/call as its arguments say: with the JSON-RPC error `error` (as `body` "json" or "sse"), with
    a plain `text` body, a body that is not JSON (`garbage`) or an SSE stream that ends without an
    answer (`cut`), at HTTP `status`; or with a tool result whose structured content is `result`. It
    lists `answer` with `output_schema` (tools/list fails with HTTP 500 after a call that says
    `"listing": "fails"`). Returns (the result, the arguments of every tools/call)."""
    calls: list[dict[str, Any]] = []

    async def serve(request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=200 if request.method == "DELETE" else 405)
        message = await request.json()
        ident, method = message.get("id"), message.get("method")
        if ident is None:  # a notification
            return web.Response(status=202)
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "scripted", "version": "1"},
            }
            answer = {"jsonrpc": "2.0", "id": ident, "result": result}
            return web.json_response(answer, headers={"Mcp-Session-Id": "s1"})
        if method == "tools/list":  # the SDK's, to check a result's structured content
            if calls and calls[-1].get("listing") == "fails":
                return web.Response(status=500, text="listing broken")
            tool = {"name": "answer", "inputSchema": {"type": "object"}, "outputSchema": output_schema}
            return web.json_response({"jsonrpc": "2.0", "id": ident, "result": {"tools": [tool]}})
        how = message["params"]["arguments"]
        calls.append(how)
        if "result" in how:
            text = json.dumps(how["result"])
            result = {"content": [{"type": "text", "text": text}], "structuredContent": how["result"]}
            return web.json_response({"jsonrpc": "2.0", "id": ident, "result": result})
        error = {"code": how.get("error", -32603), "message": "the handler crashed"}
        text = json.dumps({"jsonrpc": "2.0", "id": ident, "error": error})
        body, kind = {
            "json": (text, "application/json"),
            "sse": (f"event: message\ndata: {text}\n\n", "text/event-stream"),
            "cut": (": no answer follows\n\n", "text/event-stream"),
            "text": ("the handler crashed", "text/plain"),
            "garbage": ('{"jsonrpc": "2.0", "id": ', "application/json"),
        }[how.get("body", "json")]
        return web.Response(status=how.get("status", 200), text=body, content_type=kind)

    app = web.Application()
    app.router.add_route("*", "/mcp", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        (config,) = parse_tools(json.dumps({"tools": [mcp_entry(f"http://127.0.0.1:{port}/mcp")]}))
        entry = McpServerTool(config)
        listed = Listed(
            name="answer", description="", input_schema={"type": "object"}, output_schema=output_schema
        )
        result = await RemoteMcpTool(entry, listed).execute(arguments, None)
        await entry.close()
    finally:
        await runner.cleanup()
    return result, calls


@pytest.mark.parametrize(
    "arguments",
    [
        {"error": -32603},
        {"error": -32603, "body": "sse"},
        {"error": -32000, "body": "sse"},
        {"error": -32001},
        {"error": -32099, "status": 400},
        {"error": 12},
    ],
    ids=["internal", "internal-sse", "server-defined-sse", "server-defined", "at-http-400", "any-code"],
)
async def test_a_json_rpc_error_the_server_wrote_is_the_calls_own_at_once(arguments: dict[str, Any]) -> None:
    """Whatever its code (but the pool's own, below), as JSON or as an SSE event, at HTTP 200 or 4xx."""
    result, calls = await _call_scripted_server(arguments)
    assert (result.status, result.whose_fault()) == ("error", "code"), result
    assert f"JSON-RPC error {arguments['error']}: the handler crashed" in result.message, result
    assert len(calls) == 1, "the call's own error was retried"


@pytest.mark.parametrize(
    "arguments",
    [
        {"error": -32601},
        {"error": -32600, "body": "sse"},
        {"error": -32700},
        {"error": -32603, "status": 500},
        {"error": -32000, "status": 503, "body": "sse"},
        {"error": -32603, "status": 429},
        {"body": "text", "status": 400},
        {"body": "garbage"},
        {"body": "cut"},
    ],
    ids=[
        "method-not-found",
        "invalid-request",
        "parse-error",
        "at-http-500",
        "at-http-503-sse",
        "at-http-429",
        "plain-http-400",
        "not-json",
        "no-answer-in-the-stream",
    ],
)
async def test_json_rpc_errors_the_client_made_up_or_about_the_pool_are_the_infrastructures(
    arguments: dict[str, Any],
) -> None:
    """The pool's client or configuration (method not found, invalid request, parse error), an HTTP
    5xx or 429 whatever its body, and the errors the MCP SDK makes up itself for what was no JSON-RPC
    answer (-32603 for a plain HTTP error, -32700 for a body it could not read, -32000 for a stream
    that ended without an answer): retried, then the infrastructure's failure."""
    result, calls = await _call_scripted_server(arguments)
    assert (result.status, result.whose_fault()) == ("error", "infra"), result
    assert "after 2 attempt(s)" in result.message, result
    assert len(calls) == 2


async def test_structured_content_that_does_not_fit_the_output_schema_is_the_calls_own_at_once() -> None:
    """The server wrote a tool result for these arguments; the MCP SDK refuses it afterwards (its
    output-schema check raises RuntimeError, which was retried and answered infra): a model whose
    arguments make a tool answer outside its schema must not hide that failure from training."""
    result, calls = await _call_scripted_server({"result": {"count": "many"}}, COUNT_SCHEMA)
    assert (result.status, result.whose_fault()) == ("error", "code"), result
    assert "does not fit its output schema: count: 'many' is not of type 'integer'" in result.message, result
    assert '{"count": "many"}' in result.stderr, "the answer is shown to the model"
    assert len(calls) == 1, "the call's own answer was retried"
    result, _ = await _call_scripted_server({"result": {"other": 1}}, COUNT_SCHEMA)
    assert (result.status, result.whose_fault()) == ("error", "code"), result
    assert "'count' is a required property" in result.message, result


async def test_a_result_that_fits_stands_whatever_the_sdks_listing_after_it_does() -> None:
    """A tool result the server wrote that fits its schema is the call's answer, ok, also when the
    listing the SDK fetches after the call to check it fails; with no output schema, too."""
    for arguments, schema in [
        ({"result": {"count": 3}}, COUNT_SCHEMA),
        ({"result": {"count": 3}, "listing": "fails"}, COUNT_SCHEMA),
        ({"result": {"count": "any"}, "listing": "fails"}, None),
    ]:
        result, calls = await _call_scripted_server(arguments, schema)
        assert (result.status, result.whose_fault()) == ("ok", None), (arguments, result)
        assert json.loads(result.output) == arguments["result"], result
        assert len(calls) == 1


def test_a_remote_tool_whose_name_another_tool_has_stops_the_start() -> None:
    class Fixed(Tool):
        def __init__(self, name: str, serves: list[str]) -> None:
            super().__init__(ToolConfig(name=name, type="python"))
            self.serves = serves

        def expand(self) -> dict[str, Tool]:
            return {name: self for name in self.serves}

    entries = {name: Fixed(name, ["remote__add"]) for name in ("remote", "remote__add")}
    with pytest.raises(ConfigError, match="'remote__add' is served by both 'remote' and 'remote__add'"):
        expand_tools(entries)


def test_a_pool_waiting_for_its_mcp_server_stops_at_once_on_sigterm(
    make_server: Callable[..., SandboxProcess],
) -> None:
    """The pod's stop is not held up by a server that never answered (the kubelet would kill it)."""
    url = f"http://127.0.0.1:{free_port()}/mcp"
    pool = make_server(tools=[mcp_entry(url)], wait_ready=False)

    def waiting() -> bool:
        assert pool.process.poll() is None, f"the pool exited:\n{pool.log_tail()}"
        try:
            return "mcp tool" in requests.get(pool.url + "/readyz", timeout=5).text
        except requests.RequestException:
            return False

    wait_until(waiting, 60, "the pool did not say it waits for its MCP server")
    pool.process.terminate()
    try:
        code = pool.process.wait(20)
    except subprocess.TimeoutExpired:
        message = f"SIGTERM did not stop a pool waiting for its server:\n{pool.log_tail()}"
        raise AssertionError(message) from None
    assert code == 0, pool.log_tail()


def test_a_handshake_era_server_is_proxied_too(
    pool: SandboxProcess, make_server: Callable[..., SandboxProcess]
) -> None:
    """The pool's own /mcp speaks the handshake-era protocol (initialize first): a second pool
    proxies the first one's tools through it."""
    chained = make_server(tools=[mcp_entry(pool.url + "/mcp", name="up", mcp={"url": pool.url + "/mcp"})])
    listed = [t["name"] for t in requests.get(chained.url + "/v1/tools", timeout=10).json()["tools"]]
    assert listed == ["up__python", "up__remote__add", "up__remote__fail", "up__remote__slow"]
    ran = call(chained, "up__python", {"code": "print(6 * 7)"})
    assert (ran["status"], ran["output"], ran["fault"]) == ("ok", "42\n", None), ran
    failed = call(chained, "up__python", {"code": "1 / 0"})
    assert (failed["status"], failed["fault"]) == ("error", "code"), failed
    assert "ZeroDivisionError" in failed["stderr"]


def test_concurrent_calls_share_the_servers_connections(pool: SandboxProcess) -> None:
    calls = [{"tool": "remote__add", "input": {"a": i, "b": 1}} for i in range(40)]
    answer = pool.post("/v1/execute/batch", {"calls": calls})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [(r["status"], r["output"]) for r in results] == [("ok", str(i + 1)) for i in range(40)]


def test_listings_of_a_server_that_is_down_back_off_within_bounds() -> None:
    assert list_pause(1, 0.0) == 0.5, "a retryDelaySeconds of 0 must not spin on a refused connection"
    assert [list_pause(n, 0.5) for n in (1, 2, 3, 4, 5, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
