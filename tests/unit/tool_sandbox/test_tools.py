"""The search and http tools in-process (a real BM25 index, a real local HTTP upstream), and the http
tool's one deadline across retries through a real server."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiohttp import web
from tool_sandbox.config import ConfigError, ToolConfig
from tool_sandbox.tools.http import HttpTool, RateLimiter, backoff
from tool_sandbox.tools.search import SearchTool, parse_corpus, parse_query


async def test_search_ranks_with_bm25(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "\n".join(
            json.dumps(d)
            for d in [
                {"id": "a", "title": "Rivers", "text": "The Nile is the longest river in Africa."},
                {"id": "b", "title": "Mountains", "text": "Everest is the highest mountain on Earth."},
            ]
        )
    )
    tool = SearchTool(ToolConfig(name="search", type="search", corpus=str(corpus), top_k=1))
    await tool.start()
    result = await tool.execute("highest mountain", None)
    assert (
        result.status == "ok"
        and result.output == "Doc 1(Title: Mountains) Everest is the highest mountain on Earth."
    )
    assert (await tool.execute("zzzz unknownword", None)).output == "No results."


def test_corpus_and_query_errors_are_clear() -> None:
    with pytest.raises(ConfigError, match=r"c\.jsonl:2: not JSON"):
        parse_corpus(['{"text": "x"}', "{oops"], "c.jsonl")
    with pytest.raises(ConfigError, match="no text field"):
        parse_corpus(['{"title": "x"}'], "c.jsonl")
    assert parse_query({"query": "q", "topK": 5}, 3) == ("q", 5)
    with pytest.raises(ValueError, match="topK must be a whole number"):
        parse_query({"query": "q", "topK": 0}, 3)


def test_rate_limiter_and_backoff() -> None:
    now = [0.0]
    limiter = RateLimiter(2.0, clock=lambda: now[0])
    assert [limiter.delay(), limiter.delay()] == [0.0, 0.0]
    assert limiter.delay() == pytest.approx(0.5)
    now[0] = 10.0
    assert limiter.delay() == 0.0
    assert [backoff(n, 0.5) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]


async def test_http_tool_retries_server_errors_then_answers(tmp_path: Path) -> None:
    attempts: list[dict] = []

    async def virtual(request: web.Request) -> web.Response:
        attempts.append(await request.json())
        if len(attempts) < 3:
            return web.Response(status=503, text="busy")
        return web.json_response({"error": "", "response": "sunny"})

    async def bad(request: web.Request) -> web.Response:
        attempts.append({})
        return web.Response(status=404, text="no such api")

    app = web.Application()
    app.router.add_post("/virtual", virtual)
    app.router.add_post("/bad", bad)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        tool = HttpTool(
            ToolConfig(
                name="toolbench",
                type="http",
                url=f"http://127.0.0.1:{port}/virtual",
                retry_delay_seconds=0.01,
            )
        )
        await tool.start()
        result = await tool.execute({"tool_name": "weather", "tool_input": "{}"}, None)
        assert result.status == "ok" and json.loads(result.output) == {"error": "", "response": "sunny"}
        assert len(attempts) == 3 and attempts[-1]["tool_name"] == "weather"
        await tool.close()
        attempts.clear()
        bad_tool = HttpTool(ToolConfig(name="b", type="http", url=f"http://127.0.0.1:{port}/bad"))
        await bad_tool.start()
        failed = await bad_tool.execute({}, None)
        assert (failed.status, failed.exitCode, failed.message, len(attempts)) == (
            "error",
            404,
            "HTTP 404",
            1,
        )
        with pytest.raises(ValueError, match="must be a JSON object"):
            await bad_tool.execute("text", None)
        await bad_tool.close()
    finally:
        await runner.cleanup()


def test_http_tool_keeps_one_deadline_across_retries(make_server: object) -> None:
    attempts: list[str] = []

    class SlowBusy(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            attempts.append(self.path)
            time.sleep(0.6)
            self.send_response(503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), SlowBusy)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{upstream.server_address[1]}/api"
        tool = {"name": "api", "type": "http", "url": url, "timeoutSeconds": 1, "retryDelaySeconds": 0.5}
        server = make_server(tools=[tool])
        result = server.post("/v1/execute", {"tool": "api", "input": {"q": 1}}).json()
    finally:
        upstream.shutdown()
    # 0.6 s answer + 0.5 s pause would pass the 1 s deadline: no retry (4 attempts before the fix)
    assert result["status"] == "timeout", result
    assert "no time left for a retry within 1.0s" in result["message"]
    assert attempts == ["/api"]
