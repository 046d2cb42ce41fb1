"""The HTTP server: every protocol's routes (each a module over the transport-free service in
tool_sandbox/service.py), health and readiness on one port, /metrics alone on another, one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST

from tool_sandbox.admission import Rejected
from tool_sandbox.api import mcp, native, openenv, sandboxfusion, verltool
from tool_sandbox.api.web import SETTINGS, json_response
from tool_sandbox.calls import RequestError, shown
from tool_sandbox.config import ServerSettings, ToolConfig
from tool_sandbox.sandbox import outcome
from tool_sandbox.sandbox.libc import PR_SET_DUMPABLE, prctl
from tool_sandbox.sandbox.reaper import PR_SET_CHILD_SUBREAPER, reap_orphans
from tool_sandbox.service import Service
from tool_sandbox.tools.base import ToolInputError, ToolResult

log = logging.getLogger(__name__)
SHUTDOWN_SECONDS = 5.0  # after the drain, for handlers to write their answers before connections close
# The protocols the pool speaks: each a module with `routes(service)`; a new one is a module here.
PROTOCOLS = (native, sandboxfusion, verltool, mcp, openenv)


def _rejected(exc: Rejected) -> web.Response:
    body = ToolResult(status=outcome.REJECTED, message=str(exc)).to_json()
    return json_response(body, exc.status, {"Retry-After": str(exc.retry_after)})


async def _refuse_compressed(request: web.Request, encoding: str) -> web.StreamResponse:
    """415 for a compressed body, and the connection closed without reading the rest: aiohttp
    would inflate what it reads, and a small body can inflate to gigabytes."""
    response = json_response(
        {
            "error": f"request bodies with Content-Encoding {shown(encoding)} are refused (they can inflate"
            " far past the body limit); send the body uncompressed"
        },
        415,
    )
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every error answer is JSON `{"error": ...}`, a crash in a handler included."""
    busy = request.app[BUSY]
    busy.add(request.protocol)
    try:
        encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
        if encoding not in ("", "identity"):
            return await _refuse_compressed(request, encoding)
        return await handler(request)
    except RequestError as exc:
        return json_response({"error": str(exc)}, exc.status)
    except ToolInputError as exc:
        return json_response({"error": str(exc)}, 400)
    except Rejected as exc:
        return _rejected(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_response(
            {"error": exc.text or exc.reason},
            exc.status,
            {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")},
        )
    except Exception:
        log.exception("unhandled error answering %s %s", request.method, request.path)
        internal = "internal error in the tool server; it is logged, retry the call"
        return json_response({"error": internal}, 500)
    finally:
        busy.discard(request.protocol)


BUSY: web.AppKey[set[Any]] = web.AppKey("busy", set)  # connections answering a request now


def build_app(service: Service) -> web.Application:
    app = web.Application(client_max_size=service.settings.max_body_bytes, middlewares=[_errors])
    app[BUSY] = set()
    app[SETTINGS] = service.settings
    for protocol in PROTOCOLS:
        app.add_routes(protocol.routes(service))
    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(request: web.Request) -> web.Response:
        """Liveness: runs no code and takes no execution slot (a burst of probes costs each
        worker one ping); 503 only for what a restart mends."""
        problems = await service.pool.alive() if service.pool is not None else []
        if problems:
            return json_response({"status": "unhealthy", "problems": problems}, 503)
        return json_response({"status": "ok"})

    @routes.get("/readyz")
    async def readyz(request: web.Request) -> web.Response:
        layers = service.pool.layers() if service.pool is not None else {}
        problems = await service.readiness()
        body: dict[str, Any] = {"ready": not problems, "tools": list(service.tools), "sandbox": layers}
        if problems:
            body.update(problem=problems[0], problems=problems)
        return json_response(body, 503 if problems else 200)

    app.add_routes(routes)
    return app


def build_metrics_app(service: Service) -> web.Application:
    """`/metrics` alone, served on its own port (ServerSettings.metrics_port): a reader admitted to it
    reaches no tool."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=service.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(client_max_size=1024, middlewares=[_errors])
    app[BUSY] = set()
    app[SETTINGS] = service.settings
    app.router.add_get("/metrics", metrics)
    return app


def _raise_open_files() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (connections are fds); returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def close_idle_connections(connections: list[Any], busy: set[Any], since: dict[Any, float], cap: int) -> int:
    """Close the longest-connected connections that are not answering a request, down to `cap`
    (slow clients holding a connection each cannot exhaust the server's descriptors)."""
    now = time.monotonic()
    for handler in connections:
        since.setdefault(handler, now)
    for gone in set(since) - set(connections):
        del since[gone]
    excess = len(connections) - cap
    if excess <= 0:
        return 0
    idle = sorted((h for h in connections if h not in busy), key=since.__getitem__)[:excess]
    for handler in idle:
        handler.force_close()
    return len(idle)


ORPHAN_WATCH_SECONDS = 10.0  # scanned every second for this long after a worker died
ORPHAN_SCAN_SECONDS = 30.0  # besides right after a worker died; a /proc scan took 80 ms on the loaded machine


METRICS_CONNECTIONS = 16  # the metrics port's connections (Prometheus and the autoscaler keep one each)


async def _housekeeping(sites: list[tuple[web.AppRunner, int]], service: Service) -> None:
    """Once a second: each site's connections above its cap closed; orphaned zombies reaped (in a
    thread, as the scan reads /proc) right after a worker died, when they appear, and every 30 s anyway."""
    since: list[dict[Any, float]] = [{} for _ in sites]
    restarts, scan_until, last_scan = 0, 0.0, 0.0
    while True:
        await asyncio.sleep(1.0)
        try:
            for (runner, cap), seen in zip(sites, since, strict=True):
                if runner.server is not None:
                    busy = runner.app[BUSY]
                    closed = close_idle_connections(runner.server.connections, busy, seen, cap)
                    if closed:
                        log.warning("closed %d idle connections above the cap of %d", closed, cap)
            pool, now = service.pool, time.monotonic()
            if pool is None:
                continue
            if pool.restarts != restarts:  # a worker died: its forker and children follow it
                restarts, scan_until = pool.restarts, now + ORPHAN_WATCH_SECONDS
            if now < scan_until or now - last_scan > ORPHAN_SCAN_SECONDS:
                last_scan = now
                await asyncio.to_thread(reap_orphans, pool.own_pids())
        except Exception:
            log.exception("housekeeping failed")


async def serve(settings: ServerSettings, tools: tuple[ToolConfig, ...]) -> None:
    """Run until SIGTERM/SIGINT."""
    # Not dumpable: processes of the same uid (children, when not root) cannot ptrace this one or
    # read its memory through /proc.
    prctl(PR_SET_DUMPABLE, 0)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    open_files = _raise_open_files()
    cap = max(16, min(settings.max_connections, open_files - 256))
    service = Service(settings, tools)
    app = build_app(service)
    # keepalive_timeout also bounds how long a connection may take to send a request's headers
    # (aiohttp closes a connection still waiting for a whole request head when it expires).
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=settings.header_timeout_seconds,
        shutdown_timeout=SHUTDOWN_SECONDS,
    )
    metrics_runner = web.AppRunner(
        build_metrics_app(service),
        access_log=None,
        handle_signals=False,
        keepalive_timeout=settings.header_timeout_seconds,
    )
    await runner.setup()
    await metrics_runner.setup()
    await web.TCPSite(runner, settings.host, settings.port, backlog=1024).start()
    await web.TCPSite(metrics_runner, settings.host, settings.metrics_port).start()
    log.info(
        "tool-sandbox listening on %s:%d (/metrics on %d), tools: %s",
        settings.host,
        settings.port,
        settings.metrics_port,
        ", ".join(service.tools),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    housekeeping = asyncio.create_task(
        _housekeeping([(runner, cap), (metrics_runner, METRICS_CONNECTIONS)], service)
    )
    starting = asyncio.create_task(service.start())
    stopping = asyncio.create_task(stop.wait())
    try:
        # a SIGTERM while tools start (an MCP server that has not answered yet) stops the pool at once
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()  # a tool that could not start (ConfigError) ends the pool with its message
            await stopping
        log.info("shutting down: no call starts now; those running have %gs", settings.drain_seconds)
        failed = await service.drain(settings.drain_seconds)
        log.info("drained: %d call(s) still running were answered as the pool's failure", failed)
    finally:
        housekeeping.cancel()
        starting.cancel()
        stopping.cancel()
        await runner.cleanup()  # handlers write their answers first
        await metrics_runner.cleanup()
        with contextlib.suppress(Exception):
            await service.close()
