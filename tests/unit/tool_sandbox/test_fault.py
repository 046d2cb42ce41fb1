"""The `fault` field of every pool answer (docs/contracts.md): a failure is the code's or the
infrastructure's. Pure rules first, then each API of a real server, then the http tool's upstream."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import pytest
import requests
from aiohttp import web
from harness.sandbox_process import SandboxProcess
from tool_sandbox.api import sandboxfusion
from tool_sandbox.config import ToolConfig
from tool_sandbox.sandbox import outcome
from tool_sandbox.sandbox.pool import lost_result
from tool_sandbox.tools.base import ToolResult
from tool_sandbox.tools.http import HttpTool
from tool_sandbox.tools.python import _result


@pytest.mark.parametrize(
    ("status", "sandbox_error", "fault"),
    [
        ("ok", False, None),
        ("error", False, "code"),
        ("timeout", False, "code"),
        ("killed", False, "code"),
        ("rejected", False, "infra"),
        ("error", True, "infra"),
    ],
)
def test_fault_of_each_status(status: str, sandbox_error: bool, fault: str | None) -> None:
    assert outcome.fault(status, sandbox_error) == fault
    assert ToolResult(status=status, sandboxError=sandbox_error).to_json()["fault"] == fault


def test_a_lost_worker_is_the_infrastructures_fault() -> None:
    assert _result(lost_result("worker 0 died")).to_json()["fault"] == "infra"


def test_a_tool_that_knows_says_so() -> None:
    assert ToolResult(status="timeout", fault="infra").to_json()["fault"] == "infra"
    rejected = sandboxfusion.to_response(ToolResult(status="rejected", message="at capacity"))
    assert (rejected["status"], rejected["fault"]) == ("SandboxError", "infra")
    assert sandboxfusion.unsupported_language("cpp")["fault"] == "infra"


def test_every_api_answers_with_the_fault(server: SandboxProcess) -> None:
    assert server.execute("print(1)")["fault"] is None
    assert server.execute("raise ValueError('model bug')")["fault"] == "code"
    assert server.execute("while True:\n    pass", timeoutSeconds=1)["fault"] == "code"
    run = server.post("/run_code", {"code": "1/0", "language": "python"}).json()
    assert (run["status"], run["fault"]) == ("Failed", "code")
    run = server.post("/run_code", {"code": "print(2)", "language": "python"}).json()
    assert (run["status"], run["fault"]) == ("Success", None)
    seen = server.post(
        "/get_observation",
        {
            "trajectory_ids": ["f1", "f2", "f3"],
            "actions": ["<python>print(3)</python>", "<python>1/0</python>", "no call here"],
        },
    ).json()
    assert seen["faults"] == [None, "code", None]


def test_a_rejected_call_is_the_infrastructures_fault(make_server: Any) -> None:
    tiny = make_server("--capacity", "1", "--queue-size", "1", "--workers", "1")

    def call(_: int) -> requests.Response:
        return tiny.post("/v1/execute", {"tool": "python", "input": "import time\ntime.sleep(1.5)"})

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(call, range(6)))
    rejected = [r for r in responses if r.status_code == 429]
    assert rejected and all(r.json()["fault"] == "infra" for r in rejected)
    assert all(r.json()["fault"] is None for r in responses if r.status_code == 200)


async def test_http_upstream_down_is_infra_its_4xx_is_the_calls(tmp_path: Path) -> None:
    async def down(request: web.Request) -> web.Response:
        return web.Response(status=503, text="busy")

    async def refused(request: web.Request) -> web.Response:
        return web.Response(status=400, text="bad arguments")

    app = web.Application()
    app.router.add_post("/down", down)
    app.router.add_post("/refused", refused)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        for path, fault in (("down", "infra"), ("refused", "code")):
            tool = HttpTool(
                ToolConfig(
                    name=path,
                    type="http",
                    url=f"http://127.0.0.1:{port}/{path}",
                    retry_delay_seconds=0.01,
                )
            )
            await tool.start()
            try:
                result = await tool.execute({}, None)
            finally:
                await tool.close()
            assert (result.status, result.to_json()["fault"]) == ("error", fault)
    finally:
        await runner.cleanup()
