"""bench/tool_sandbox/run.py's paired rounds of the pool against the ceiling: the summary takes each
workload's median and range of the rounds' ratios, and says issue 35's target held only where the
median calls/s ratio is at least 0.90 and the median p99 ratio at most 1.10; and its light HTTP client."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "tool_sandbox"


def _load(name: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script at `path` as module `name`, in sys.modules for the test (its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    _load("humaneval", BENCH / "humaneval.py", monkeypatch)  # run.py, a script, imports it by name
    return _load("tool_sandbox_bench_run", BENCH / "run.py", monkeypatch)


def rounds(label: str, pairs: list[tuple[float, float]]) -> list[dict]:
    """One row a round: (pool's calls/s, pool's p99 ms) against a ceiling of 100 calls/s and 50 ms."""
    return [
        {
            "snippet": label,
            "pool": {"calls_per_second": rate, "p99_ms": p99, "errors": 0},
            "ceiling": {"calls_per_second": 100.0, "p99_ms": 50.0, "errors": 0},
            "calls_ratio": rate / 100.0,
            "p99_ratio": p99 / 50.0,
        }
        for rate, p99 in pairs
    ]


def test_the_median_round_decides_and_the_range_is_shown(run) -> None:
    # one round far off each way (a stray load): the median is the middle round, not the mean
    held = rounds("held", [(92.0, 52.0), (60.0, 90.0), (95.0, 50.0), (130.0, 40.0), (91.0, 54.0)])
    missed = rounds("missed", [(88.0, 50.0), (89.0, 50.0), (95.0, 50.0)])
    slow_tail = rounds("slow tail", [(95.0, 56.0), (96.0, 57.0), (97.0, 40.0)])
    lines = run.paired_summary(held + missed + slow_tail).splitlines()
    assert lines[2] == "| held | 5 | 0.92 (0.60-1.30) | 1.04 (0.80-1.80) | 0 | yes |"
    assert lines[3] == "| missed | 3 | 0.89 (0.88-0.95) | 1.00 (1.00-1.00) | 0 | no |"
    assert lines[4] == "| slow tail | 3 | 0.96 (0.95-0.97) | 1.12 (0.80-1.14) | 0 | no |"


async def test_the_light_client_posts_json_over_one_kept_alive_connection(run: ModuleType) -> None:
    """The benchmark's HTTP client (the same for the pool and the baseline server): a caller's calls
    reuse its connection, the JSON answer comes back whatever the status, and an answer it cannot
    frame (no Content-Length) is an error, not a hang."""
    from aiohttp import web

    peers: set[int] = set()

    async def echo(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.add(request.transport.get_extra_info("peername")[1])
        body = await request.json()
        if body.get("chunked"):
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(b"{}")
            return response
        return web.json_response({"got": body}, status=429 if body.get("busy") else 200)

    app = web.Application()
    app.router.add_post("/v1/execute", echo)
    runner = web.AppRunner(app, keepalive_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = run.LightHttp(f"http://127.0.0.1:{port}")
    try:
        for i in range(3):
            assert await client.post("/v1/execute", b'{"n": %d}' % i) == {"got": {"n": i}}
        assert await client.post("/v1/execute", b'{"busy": true}') == {"got": {"busy": True}}
        assert len(peers) == 1, "each call opened a connection of its own"
        await asyncio.sleep(2.5)  # the server closes the idle connection (its keep-alive timeout)
        assert await client.post("/v1/execute", b'{"n": 9}') == {"got": {"n": 9}}
        assert len(peers) == 2, "sent again on a new connection"
        with pytest.raises(RuntimeError, match="without Content-Length"):
            await client.post("/v1/execute", b'{"chunked": true}')
    finally:
        await client.close()
        await runner.cleanup()
