"""Reading the load and the phase: queries, parsers, and scraping real HTTP endpoints."""

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from toolrl_operator import signals as s


def pool_metrics(inflight: float, queued: float) -> str:
    """The exposition text a tool_sandbox serves (the real client library writes it)."""
    registry = CollectorRegistry()
    Gauge(s.INFLIGHT, "executing", registry=registry).set(inflight)
    Gauge(s.QUEUE_DEPTH, "waiting", registry=registry).set(queued)
    Gauge("toolrl_tool_capacity", "slots", registry=registry).set(8)
    return generate_latest(registry).decode()


def trainer_metrics(phase: str, expected: float) -> str:
    registry = CollectorRegistry()
    g = Gauge(s.PHASE, "phase", ["phase"], registry=registry)
    for p in ("generating", "scoring", "training"):
        g.labels(p).set(1 if p == phase else 0)
    Gauge(s.EXPECTED_CALLS, "expected", registry=registry).set(expected)
    return generate_latest(registry).decode()


def test_queries_select_the_pool_pods_of_one_job():
    q = s.pool_load_query("rl", "gsm8k")
    sel = 'namespace="rl",toolrl_job="gsm8k",toolrl_component="tool-pool"'
    assert q == f"sum(toolrl_tool_inflight{{{sel}}}) + sum(toolrl_tool_queue_depth{{{sel}}})"
    assert s.pool_up_query("rl", "gsm8k") == f"up{{{sel}}}"
    assert "pod=" not in q, "a name prefix would also match the pool of a job named gsm8k-tools-x"
    phase, expected = s.trainer_queries("rl", "gsm8k")
    assert 'toolrl_job="gsm8k"' in phase and phase.endswith("== 1") and expected.startswith("max(")


def test_parsers_read_real_exposition_text():
    assert s.parse_pool_metrics(pool_metrics(5, 12)) == 17
    assert s.parse_trainer_metrics(trainer_metrics("training", 2048)) == ("training", 2048)
    assert s.parse_trainer_metrics("") == (None, None)
    with pytest.raises(ValueError, match="toolrl_tool_queue_depth"):
        s.parse_pool_metrics(
            "# HELP toolrl_tool_inflight x\n# TYPE toolrl_tool_inflight gauge\ntoolrl_tool_inflight 3\n"
        )


def answer(*series):
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [0, str(v)]} for m, v in series]},
    }


def test_prometheus_vectors():
    up = s.vector(answer(({"pod": "j-tools-a"}, 1), ({"pod": "j-tools-b"}, 1)))
    load = s.vector(answer(({}, 42)))
    assert s.pool_from_vectors(up, load, 2) == s.Reading(42.0, pods=2)
    down = s.pool_from_vectors(
        s.vector(answer(({"pod": "j-tools-a"}, 1), ({"pod": "j-tools-b"}, 0))), load, 2
    )
    assert down.load is None and "j-tools-b" in down.problem
    assert s.pool_from_vectors([], [], 3).load is None
    assert s.pool_from_vectors([], [], 0) == s.Reading(0.0)
    assert s.pool_from_vectors(up, [], 2).load is None
    phase = s.vector(answer(({"phase": "generating"}, 1)))
    assert s.trainer_from_vectors(phase, s.vector(answer(({}, 900)))) == ("generating", 900)
    assert s.trainer_from_vectors([], []) == (None, None)
    with pytest.raises(ValueError, match="bad_data"):
        s.vector({"status": "error", "errorType": "bad_data", "error": "parse error"})


async def serve(routes: dict[str, str | int]) -> tuple[web.AppRunner, str]:
    """A real HTTP server on a free port: path -> exposition text (or an error status)."""

    async def handler(request: web.Request) -> web.Response:
        body = routes[request.path]
        if isinstance(body, int):
            return web.Response(status=body)
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def test_scrape_pool_sums_pods_and_spoils_on_any_failure():
    runner, base = await serve({"/a": pool_metrics(3, 4), "/b": pool_metrics(8, 20), "/bad": 503})
    try:
        async with aiohttp.ClientSession() as session:
            ok = await s.scrape_pool(session, [("a", f"{base}/a"), ("b", f"{base}/b")])
            assert ok == s.Reading(35.0, pods=2)
            bad = await s.scrape_pool(session, [("a", f"{base}/a"), ("b", f"{base}/bad")])
            assert bad.load is None and "b (" in bad.problem
            closed = await s.scrape_pool(session, [("a", "http://127.0.0.1:9/metrics")])
            assert closed.load is None and "a (" in closed.problem
    finally:
        await runner.cleanup()


async def test_read_direct_reads_the_ready_pods_and_the_trainer():
    runner, base = await serve({"/metrics": pool_metrics(2, 5)})
    port = int(base.rsplit(":", 1)[1])
    trainer_runner, trainer_base = await serve({"/metrics": trainer_metrics("generating", 640)})
    trainer_port = int(trainer_base.rsplit(":", 1)[1])
    pods, heads = [("j-tools-x", "127.0.0.1")], [("j-head", "127.0.0.1")]  # ready, as the pod watch saw them
    try:
        async with aiohttp.ClientSession() as session:
            r = await s.read_direct(session, pods, heads, 1, pool_port=port, trainer_port=trainer_port)
            assert r == s.Reading(7.0, pods=1, phase="generating", expected_calls=640)
            no_phase = await s.read_direct(session, pods, [], 1, pool_port=port)
            assert no_phase == s.Reading(7.0, pods=1)
            held = await s.read_direct(session, [], [], 3)
            assert held.load is None and "3 pods" in held.problem
            assert (await s.read_direct(session, [], [], 0)).load == 0
    finally:
        await runner.cleanup()
        await trainer_runner.cleanup()


async def test_read_prometheus_reports_an_unreachable_server():
    async with aiohttp.ClientSession() as session:
        r = await s.read_prometheus(session, "http://127.0.0.1:9", "rl", "j", 2)
    assert r.load is None and "http://127.0.0.1:9" in r.problem
