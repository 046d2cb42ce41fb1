"""10,000 mixed calls (5 % hostile) at concurrency 32 against one server, through four of its protocols
in turn (the native /v1/execute, SandboxFusion's /run_code, MCP's tools/call, OpenEnv's /step): no crash,
every call answered with its own verdict (benign ones correctly and `ok`, hostile ones contained and the
code's fault, never the pool's), server memory (RSS) grows < 10 % and its open files stay put."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import aiohttp

# (code, expected status); timeouts are generous because 32 calls share two cores.
HOSTILE = [
    ("import os\nwhile True:\n    os.fork()", "error"),
    ("x = bytearray(1 << 34)", "error"),
    ("while True:\n    pass", "timeout"),
    ("import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))", "killed"),
    ("import ctypes\nctypes.string_at(0)", "killed"),
    ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "error"),
    ("import socket\nsocket.socket().connect(('127.0.0.1', 80))", "error"),
    ("import os\nos._exit(9)", "error"),
]
TOTAL = 10_000
CONCURRENCY = 32
# the server's open files may differ by a few between two moments (a worker being replaced)
FD_SLACK = 8


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# A protocol: its path, the body of a call of `code` (with a timeout where it takes one), and the
# (status, stdout, fault) read back from its answer in the pool's own terms.
Verdict = tuple[str, str, "str | None"]


def _native(code: str, timeout: float | None) -> dict[str, Any]:
    return {"tool": "python", "input": code, **({"timeoutSeconds": timeout} if timeout else {})}


def _native_verdict(answer: dict[str, Any]) -> Verdict:
    return answer["status"], answer["stdout"], answer["fault"]


def _sandboxfusion(code: str, timeout: float | None) -> dict[str, Any]:
    return {"code": code, "language": "python", **({"run_timeout": timeout} if timeout else {})}


def _sandboxfusion_verdict(answer: dict[str, Any]) -> Verdict:
    """SandboxFusion says Success or Failed, and TimeLimitExceeded in its run result: the pool's
    `error` and `killed` are both Failed/Finished there."""
    run = answer["run_result"] or {}
    if answer["status"] == "Success":
        status = "ok"
    elif run.get("status") == "TimeLimitExceeded":
        status = "timeout"
    else:
        status = "error|killed" if answer["status"] == "Failed" else answer["status"]
    return status, run.get("stdout", ""), answer["fault"]


def _mcp(code: str, timeout: float | None) -> dict[str, Any]:
    """tools/call takes the tool's arguments only: the tool's own timeout (3 s) applies."""
    params = {"name": "python", "arguments": {"code": code}}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def _mcp_verdict(answer: dict[str, Any]) -> Verdict:
    result = answer["result"]
    content = result["structuredContent"]
    assert result["isError"] == (content["status"] != "ok"), result
    return content["status"], content["stdout"], content["fault"]


def _openenv(code: str, timeout: float | None) -> dict[str, Any]:
    return {"action": {"code": code}, **({"timeout_s": timeout} if timeout else {})}


def _openenv_verdict(answer: dict[str, Any]) -> Verdict:
    seen = answer["observation"]
    return seen["status"], seen["stdout"], seen["fault"]


Body = Callable[[str, float | None], dict[str, Any]]
PROTOCOLS: list[tuple[str, Body, Callable[[dict[str, Any]], Verdict]]] = [
    ("/v1/execute", _native, _native_verdict),
    ("/run_code", _sandboxfusion, _sandboxfusion_verdict),
    ("/mcp", _mcp, _mcp_verdict),
    ("/step", _openenv, _openenv_verdict),
]


def call_for(i: int) -> tuple[str, str | None, str, str | None, float | None]:
    """The i-th call's (code, expected stdout, expected status, expected fault, timeout): every 20th
    is hostile, the rest alternate two checked snippets."""
    if i % 20 == 0:
        code, status = HOSTILE[(i // 20) % len(HOSTILE)]
        return code, None, status, "code", 5 if status == "killed" else 2
    if i % 2:
        return f"print({i} + 1)", f"{i + 1}\n", "ok", None, None
    return "import numpy\nprint(numpy.arange(10).sum())", "45\n", "ok", None, None


def protocol_for(i: int) -> int:
    """Each protocol takes a quarter of the benign calls and of each hostile program."""
    return (i // 20 + i) % len(PROTOCOLS)


async def test_ten_thousand_mixed_calls_through_four_protocols(server: Any) -> None:
    failures: list[str] = []
    baseline_rss = baseline_fds = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(TOTAL):
        queue.put_nowait(i)
    answered = 0
    by_protocol = [0] * len(PROTOCOLS)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal answered, baseline_rss, baseline_fds
        while not queue.empty():
            i = queue.get_nowait()
            code, stdout, status, fault, timeout = call_for(i)
            which = protocol_for(i)
            path, body, verdict = PROTOCOLS[which]
            async with session.post(server.url + path, json=body(code, timeout)) as response:
                answer = await response.json()
            answered += 1
            by_protocol[which] += 1
            if answered == 1000:
                baseline_rss, baseline_fds = rss_kib(server.process.pid), open_files(server.process.pid)
            # Every call, benign or hostile, gets its own specific verdict, every time, whatever the protocol.
            got = verdict(answer) if response.status == 200 else ("HTTP", str(response.status), None)
            expected = "error|killed" if path == "/run_code" and status in ("error", "killed") else status
            right = got[0] == expected and got[2] == fault and (stdout is None or got[1] == stdout)
            if not right:
                failures.append(f"call {i} via {path}: {got}, expected {(expected, stdout, fault)}")

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(worker(session) for _ in range(CONCURRENCY)))
        fds = open_files(server.process.pid)  # the callers' connections still open, as at the baseline
    assert server.process.poll() is None
    assert answered == TOTAL and min(by_protocol) >= TOTAL // len(PROTOCOLS) - 1, by_protocol
    assert failures == [], f"{len(failures)} wrong: {failures[:10]}"
    grown = rss_kib(server.process.pid) / baseline_rss - 1
    assert grown < 0.10, f"server RSS grew {grown:.1%}"
    assert fds <= baseline_fds + FD_SLACK, f"the server's open files grew from {baseline_fds} to {fds}"
