"""10,000 mixed calls (5 % hostile) at concurrency 32 against one server: no crash, every call
answered (benign ones correctly, hostile ones contained), server memory (RSS) grows < 10 %."""

from __future__ import annotations

import asyncio
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


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def call_for(i: int) -> tuple[dict[str, Any], str, str | None]:
    """The i-th call: every 20th is hostile, the rest alternate two checked snippets."""
    if i % 20 == 0:
        code, status = HOSTILE[(i // 20) % len(HOSTILE)]
        return (
            {"tool": "python", "input": code, "timeoutSeconds": 5 if status == "killed" else 2},
            status,
            None,
        )
    if i % 2:
        return {"tool": "python", "input": f"print({i} + 1)"}, "ok", f"{i + 1}\n"
    return {"tool": "python", "input": "import numpy\nprint(numpy.arange(10).sum())"}, "ok", "45\n"


async def test_ten_thousand_mixed_calls(server: Any) -> None:
    failures: list[str] = []
    baseline = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(TOTAL):
        queue.put_nowait(i)
    answered = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal answered, baseline
        while not queue.empty():
            i = queue.get_nowait()
            body, status, stdout = call_for(i)
            async with session.post(server.url + "/v1/execute", json=body) as response:
                result = await response.json()
            answered += 1
            if answered == 1000:
                baseline = rss_kib(server.process.pid)
            # Every call, benign or hostile, gets its own specific status, every time.
            right = result["status"] == status and (stdout is None or result["stdout"] == stdout)
            if response.status != 200 or not right:
                failures.append(f"call {i}: HTTP {response.status} {result['status']} {result['message']}")

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(worker(session) for _ in range(CONCURRENCY)))
    assert server.process.poll() is None
    assert answered == TOTAL
    assert failures == []
    grown = rss_kib(server.process.pid) / baseline - 1
    assert grown < 0.10, f"server RSS grew {grown:.1%}"
