"""The tool-pool client against a local HTTP server that misbehaves on purpose."""

import asyncio

import pytest
from aiohttp import web
from harness.localcluster import free_port
from trainer_entry.pool_client import CallResult, PoolClient, backoff_seconds, retry_after_seconds


class Pool:
    """A scripted /v1/execute: answers from a queue of (status, headers, body) per call."""

    def __init__(self):
        self.script = []
        self.bodies = []
        self.inflight = 0
        self.max_inflight = 0
        self.delay = 0.0

    async def execute(self, request):
        self.bodies.append(await request.json())
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            await asyncio.sleep(self.delay)
            status, headers, body = self.script.pop(0) if self.script else (200, {}, OK)
            if isinstance(body, str):
                return web.Response(text=body, status=status, headers=headers)
            return web.json_response(body, status=status, headers=headers)
        finally:
            self.inflight -= 1


OK = {
    "status": "ok",
    "output": "2\n",
    "stdout": "2\n",
    "stderr": "",
    "exitCode": 0,
    "durationSeconds": 0.01,
    "truncated": False,
}


async def ready(request):
    return web.Response(text="ok")


@pytest.fixture
async def pool():
    state = Pool()
    app = web.Application()
    app.router.add_post("/v1/execute", state.execute)
    app.router.add_get("/readyz", ready)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    yield state
    await runner.cleanup()


def client(url, **kw):
    waits = []

    async def sleep(seconds):
        waits.append(seconds)

    kw.setdefault("sleep", sleep)
    c = PoolClient(url, retry_delay_seconds=0.5, **kw)
    return c, waits


async def test_ok_call_sends_the_contract_body(pool):
    seen = []
    c, _ = client(pool.url, record=lambda *a: seen.append(a))
    result = await c.execute("python", {"code": "print(1+1)"}, timeout_seconds=5, session="s1")
    await c.close()
    assert pool.bodies == [
        {"tool": "python", "input": {"code": "print(1+1)"}, "timeoutSeconds": 5, "session": "s1"}
    ]
    assert result.ok and result.output == "2\n" and result.exit_code == 0 and result.attempts == 1
    assert result.observation() == "2\n"
    assert [(t, o) for t, o, _ in seen] == [("python", "ok")]


async def test_429_honours_retry_after_then_succeeds(pool):
    pool.script = [(429, {"Retry-After": "3"}, {"error": "busy"}), (429, {}, {"error": "busy"})]
    c, waits = client(pool.url, max_retries=3)
    result = await c.execute("python", {"code": "1"})
    await c.close()
    assert result.ok and result.attempts == 3
    assert waits == [3.0, 1.0]  # Retry-After first, then exponential backoff (0.5 * 2**1)


async def test_persistent_429_becomes_a_rejected_observation(pool):
    pool.script = [(429, {"Retry-After": "1"}, {})] * 3
    c, waits = client(pool.url, max_retries=2)
    result = await c.execute("python", {"code": "1"})
    await c.close()
    assert result.status == "rejected" and result.attempts == 3 and waits == [1.0, 1.0]
    assert result.observation().startswith("Error: the tool pool rejected the call")


async def test_5xx_is_retried_4xx_is_not(pool):
    pool.script = [(503, {}, {}), (200, {}, OK)]
    c, waits = client(pool.url)
    assert (await c.execute("python", {"code": "1"})).ok and waits == [0.5]
    pool.script = [(400, {}, {"error": "bad input"})]
    result = await c.execute("python", {"code": 1})
    await c.close()
    assert result.status == "error" and result.attempts == 1 and "HTTP 400" in result.observation()


@pytest.mark.parametrize(
    "body",
    ["<html>502</html>", "", "[1, 2]", '"ok"', "null", '{"status": "ok", "durationSeconds": "x"}'],
)
async def test_unexpected_200_answer_is_an_observation_not_an_exception(pool, body):
    pool.script = [(200, {}, body)]
    seen = []
    c, waits = client(pool.url, record=lambda *a: seen.append(a))
    result = await c.execute("python", {"code": "1"})
    await c.close()
    assert result.status == "error" and result.attempts == 1 and waits == []
    assert result.observation().startswith("Error: the tool pool answered something unexpected")
    assert [(t, o) for t, o, _ in seen] == [("python", "error")]


async def test_unreachable_pool_is_an_observation_not_an_exception():
    c, waits = client(f"http://127.0.0.1:{free_port()}", max_retries=2)
    result = await c.execute("python", {"code": "1"})
    await c.close()
    assert result.status == "unreachable" and result.attempts == 3 and waits == [0.5, 1.0]
    assert "could not be reached after 3 attempts" in result.observation()


async def test_client_side_timeout(pool, monkeypatch):
    monkeypatch.setattr("trainer_entry.pool_client.HTTP_GRACE_SECONDS", 0.0)
    pool.delay = 1.0
    c, _ = client(pool.url)
    result = await c.execute("python", {"code": "1"}, timeout_seconds=0.1)
    await c.close()
    assert result.status == "timeout" and "timed out" in result.observation()


async def test_concurrency_cap(pool):
    pool.delay = 0.05
    c, _ = client(pool.url, max_concurrency=3)
    results = await asyncio.gather(*(c.execute("python", {"code": str(i)}) for i in range(12)))
    await c.close()
    assert all(r.ok for r in results) and pool.max_inflight == 3


async def test_readiness(pool):
    c, _ = client(pool.url)
    assert await c.ready()
    await c.close()


@pytest.mark.parametrize(
    ("status", "text"),
    [
        ("timeout", "Error: the tool call timed out after 2.0s."),
        ("killed", "Error: the tool process was killed (it exceeded a resource limit)."),
        ("error", "Error: Traceback: boom"),
    ],
)
def test_observations_of_failures(status, text):
    assert CallResult(status=status, stderr="Traceback: boom", duration_seconds=2.0).observation() == text


def test_truncation_is_announced():
    assert CallResult(status="ok", output="abc", truncated=True).observation() == "abc\n[output truncated]"


def test_backoff_and_retry_after():
    assert [backoff_seconds(i, 1.0) for i in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_seconds(20, 1.0) == 30.0
    assert retry_after_seconds("7", 1.0) == 7.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", 1.5) == 1.5
    assert retry_after_seconds(None, 2.0) == 2.0


# ---- whose failure (issue 16): every answer and every transport failure gets a `fault` ----------

FAILED = {**OK, "status": "error", "exitCode": 1, "stderr": "ZeroDivisionError"}


@pytest.mark.parametrize(
    ("answer", "fault"),
    [
        (OK, None),
        ({**FAILED, "fault": "code"}, "code"),
        ({**OK, "status": "timeout", "exitCode": -9, "fault": "code"}, "code"),
        ({**OK, "status": "killed", "exitCode": -9, "fault": "code"}, "code"),
        ({**FAILED, "stderr": "", "sandboxError": True, "fault": "infra"}, "infra"),
        # an older pool without the field: the status decides
        (FAILED, "code"),
        ({**OK, "status": "rejected"}, "infra"),
        # a field the client does not know is not trusted
        ({**FAILED, "fault": "cosmic rays"}, "code"),
    ],
)
async def test_every_pool_status_is_classified(pool, answer, fault):
    pool.script = [(200, {}, answer)]
    c, _ = client(pool.url)
    result = await c.execute("python", {"code": "1"})
    await c.close()
    assert result.fault == fault and result.infra_failure == (fault == "infra")


@pytest.mark.parametrize(
    ("script", "status", "fault"),
    [
        ([(429, {"Retry-After": "0"}, {"status": "rejected", "fault": "infra"})] * 3, "rejected", "infra"),
        ([(503, {}, "unavailable")] * 3, "unreachable", "infra"),
        ([(502, {}, "bad gateway")] * 3, "unreachable", "infra"),
        ([(500, {}, "internal error")], "unreachable", "infra"),
        ([(200, {}, "<html>not json</html>")], "error", "infra"),
        ([(400, {}, {"error": "input of a python tool must be a string of code"})], "error", "code"),
        ([(413, {}, {"error": "request body too large"})], "error", "code"),
    ],
)
async def test_every_http_failure_is_classified(pool, script, status, fault):
    pool.script = list(script)
    c, _ = client(pool.url, max_retries=2)
    result = await c.execute("python", {"code": "1"})
    await c.close()
    assert (result.status, result.fault) == (status, fault)


async def test_refused_connection_is_infra():
    c, _ = client(f"http://127.0.0.1:{free_port()}", max_retries=1)
    result = await c.execute("python", {"code": "1"})
    await c.close()
    assert (result.status, result.fault) == ("unreachable", "infra")


async def test_connection_reset_is_infra():
    async def hang_up(reader, writer):
        await reader.read(100)
        writer.transport.abort()  # RST, no answer

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c, _ = client(f"http://127.0.0.1:{port}", max_retries=1)
    try:
        result = await c.execute("python", {"code": "1"})
    finally:
        await c.close()
        server.close()
        await server.wait_closed()
    assert (result.status, result.fault, result.attempts) == ("unreachable", "infra", 2)


async def test_deadline_spent_before_an_answer_is_infra(pool, monkeypatch):
    monkeypatch.setattr("trainer_entry.pool_client.HTTP_GRACE_SECONDS", 0.0)
    pool.delay = 1.0  # queued in the pool (or lost) past the caller's deadline
    c, _ = client(pool.url)
    result = await c.execute("python", {"code": "1"}, timeout_seconds=0.1)
    await c.close()
    assert (result.status, result.fault) == ("timeout", "infra")


def test_the_clients_own_results_are_classified():
    assert CallResult(status="ok").fault is None
    assert CallResult(status="invalid").fault == "code"  # the model's malformed call, never sent
    assert CallResult(status="unreachable").fault == "infra"


async def test_the_shared_client_keeps_each_callers_policy():
    """A reward's call made first must not give the tools its (default) retry policy."""
    from trainer_entry.pool_client import shared_client

    url = f"http://127.0.0.1:{free_port()}"
    reward = shared_client(url)
    tool = shared_client(url, max_retries=7, request_timeout_seconds=3.0)
    assert tool is not reward
    assert tool is shared_client(url, max_retries=7, request_timeout_seconds=3.0)
    assert reward is shared_client(url)
