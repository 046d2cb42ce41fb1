"""The HTTP server: the pool's own API, SandboxFusion's /run_code, VerlTool's /get_observation,
health, readiness and metrics, all on one port and one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import resource
import signal
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST

from tool_sandbox.admission import Admission, Rejected
from tool_sandbox.api import sandboxfusion, verltool
from tool_sandbox.api.requests import (
    ExecuteRequest,
    RequestError,
    parse_batch,
    parse_execute,
    parse_json,
    parse_session_create,
    shown,
)
from tool_sandbox.config import ServerSettings, ToolConfig
from tool_sandbox.metrics import Metrics
from tool_sandbox.sandbox import outcome
from tool_sandbox.sandbox.libc import PR_SET_DUMPABLE, prctl
from tool_sandbox.sandbox.pool import Pool
from tool_sandbox.sandbox.reaper import PR_SET_CHILD_SUBREAPER, reap_orphans
from tool_sandbox.sessions import API, VERLTOOL, SessionExists, SessionLimit, Sessions
from tool_sandbox.tools import Tool, ToolInputError, ToolResult, build_tools, needs_pool
from tool_sandbox.tools.python import PythonTool

log = logging.getLogger(__name__)
MAX_SESSION_WAITING = 64  # calls of one session queued behind its running cell; more get 429
# Finished VerlTool trajectories remembered (never reopened), oldest forgotten first; each by a
# fixed-size digest of its caller and id, so a few requests with huge ids cannot fill the memory.
FINISHED_TRAJECTORIES_KEPT = 100_000
READINESS_SECONDS = 1.0  # a readiness answer serves every probe for this long (one check per burst)
SHUTDOWN_SECONDS = 5.0  # after the drain, for handlers to write their answers before connections close
SHUTTING_DOWN = "the tool server is shutting down; retry the call"


class Service:
    """Tools, sessions, backpressure and metrics, independent of HTTP."""

    def __init__(self, settings: ServerSettings, tools: tuple[ToolConfig, ...]) -> None:
        self.settings = settings
        self.pool = Pool(settings) if needs_pool(tools) else None
        self.tools: dict[str, Tool] = build_tools(tools, self.pool, settings)
        self.admission = Admission(settings.capacity, settings.queue_size)
        self.sessions = Sessions(settings.max_sessions, settings.session_idle_seconds)
        self.metrics = Metrics()
        self.metrics.bind(
            lambda: self.admission.inflight,
            lambda: self.admission.waiting,
            settings.capacity,
            lambda: len(self.sessions.live),
        )
        self.tools_ready = False
        self.draining = False  # SIGTERM: no call starts any more (drain)
        self._reaper: asyncio.Task[None] | None = None
        self.finished: OrderedDict[str, None] = OrderedDict()  # VerlTool sessions that were finished
        self._readiness: asyncio.Future[list[str]] | None = None
        self._readiness_at = 0.0

    @property
    def python_tools(self) -> list[str]:
        return [name for name, tool in self.tools.items() if isinstance(tool, PythonTool)]

    async def start(self) -> None:
        if self.pool is not None:
            await self.pool.start()
        for tool in self.tools.values():
            await tool.start()
        self.tools_ready = True
        self._reaper = asyncio.create_task(
            self.sessions.reap_forever(min(30.0, self.settings.session_idle_seconds))
        )

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        await self.sessions.close_all()
        for tool in self.tools.values():
            await tool.close()
        if self.pool is not None:
            await self.pool.close()

    async def readiness(self) -> list[str]:
        """Why the pool must not take traffic now ([] when ready): starting, shutting down,
        Landlock missing, or a worker that cannot fork or run a program. The program runs in an
        execution slot, and only when one is free (a busy pool is evidently running code); one
        check serves every probe for READINESS_SECONDS."""
        if self.draining:
            return [SHUTTING_DOWN]
        if not self.tools_ready or (self.pool is not None and not self.pool.is_ready()):
            return ["starting: the sandbox workers are warming up"]
        if self.unready_reason():
            return [self.unready_reason()]
        if self.pool is None:
            return []
        now = asyncio.get_running_loop().time()
        if self._readiness is None or (
            self._readiness.done() and now - self._readiness_at > READINESS_SECONDS
        ):
            self._readiness, self._readiness_at = asyncio.ensure_future(self._check_workers()), now
        return await asyncio.shield(self._readiness)

    async def _check_workers(self) -> list[str]:
        assert self.pool is not None
        async with self.admission.free_slot() as free:
            return await self.pool.ready_problems(run_code=free)

    def unready_reason(self) -> str:
        """Why a started pool must not take traffic, or ""."""
        if self.pool is None or not self.pool.is_ready() or self.settings.allow_no_landlock:
            return ""
        if not self.pool.layers().get("landlockAbi"):
            return (
                "Landlock is unavailable (kernel without it, or --no-landlock): children could read"
                " files outside their directory; use a kernel with Landlock or start with --allow-no-landlock"
            )
        return ""

    async def admit(self, tool: str, job: Callable[[], Awaitable[ToolResult]]) -> ToolResult:
        """Run `job` under backpressure and record it; raises Rejected when the queue is full or
        the server is shutting down (a queued call then never starts)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            self.refuse_when_draining()
            async with self.admission.slot():
                self.refuse_when_draining()
                result = await job()
        except Rejected:
            self.metrics.observe(tool, outcome.REJECTED, loop.time() - started, False)
            raise
        self.metrics.observe(tool, result.status, loop.time() - started, result.truncated)
        return result

    def refuse_when_draining(self) -> None:
        if self.draining:
            raise Rejected(1, SHUTTING_DOWN, 503)

    async def drain(self, seconds: float) -> int:
        """Stop starting calls (they get 503, fault infra) and give those running up to `seconds`
        to end; then answer the rest as the pool's failure. Returns how many were failed."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self.admission.inflight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return self.pool.fail_pending(SHUTTING_DOWN) if self.pool is not None else 0

    async def execute(self, request: ExecuteRequest, kind: str = API) -> ToolResult:
        """A call; with a session, one of this kind (the pool's own sessions for /v1/execute:
        VerlTool's trajectories are reachable only through /get_observation)."""
        tool = self.tools[request.tool]
        if request.session is None:
            return await self.admit(tool.name, lambda: tool.execute(request.input, request.timeout))
        session = self.sessions.get(request.session, kind)
        if session is None:
            name = shown(request.session, 80)
            raise RequestError(f"unknown or expired session {name}; open one with POST /v1/sessions", 404)
        if session.tool is not tool:
            raise RequestError(f"session {request.session!r} belongs to tool {session.tool.name!r}")
        # A session runs one cell at a time: its queued calls wait here, for its lock, before they
        # take an execution slot, so they never hold slots that other callers' calls wait for.
        if session.waiting >= MAX_SESSION_WAITING:
            self.metrics.observe(tool.name, outcome.REJECTED, 0.0, False)
            raise Rejected(1)
        session.waiting += 1
        try:
            await session.lock.acquire()
        finally:
            session.waiting -= 1
        try:
            return await self.admit(
                tool.name, lambda: self._in_session(session.id, request.input, request.timeout)
            )
        finally:
            session.lock.release()

    async def _in_session(self, session_id: str, payload: Any, timeout: float | None) -> ToolResult:
        """A cell of a session whose lock the caller holds."""
        session = self.sessions.live.get(session_id)
        if session is None:
            return ToolResult(status=outcome.ERROR, message="session was closed")
        result, alive = await session.tool.execute_in_session(session.handle, payload, timeout)
        if not alive:
            self.sessions.live.pop(session_id, None)
            result.message = (result.message + "; " if result.message else "") + "the session has ended"
        return result

    def finish_trajectory(self, session_id: str) -> None:
        """Remember a finished trajectory (its session key: a fixed-size digest)."""
        self.finished[session_id] = None
        self.finished.move_to_end(session_id)
        while len(self.finished) > FINISHED_TRAJECTORIES_KEPT:
            self.finished.popitem(last=False)


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=json.dumps(body), status=status, content_type="application/json", headers=headers
    )


def _rejected(exc: Rejected) -> web.Response:
    body = ToolResult(status=outcome.REJECTED, message=str(exc)).to_json()
    return _json(body, exc.status, {"Retry-After": str(exc.retry_after)})


async def _refuse_compressed(request: web.Request, encoding: str) -> web.StreamResponse:
    """415 for a compressed body, and the connection closed without reading the rest: aiohttp
    would inflate what it reads, and a small body can inflate to gigabytes."""
    response = _json(
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
        return _json({"error": str(exc)}, exc.status)
    except ToolInputError as exc:
        return _json({"error": str(exc)}, 400)
    except Rejected as exc:
        return _rejected(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _json(
            {"error": exc.text or exc.reason},
            exc.status,
            {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")},
        )
    except Exception:
        log.exception("unhandled error answering %s %s", request.method, request.path)
        return _json({"error": "internal error in the tool server; it is logged, retry the call"}, 500)
    finally:
        busy.discard(request.protocol)


BUSY: web.AppKey[set[Any]] = web.AppKey("busy", set)  # connections answering a request now


async def _body(request: web.Request) -> Any:
    seconds = request.app[SETTINGS].body_timeout_seconds
    try:
        raw = await asyncio.wait_for(request.read(), seconds)
    except TimeoutError:
        raise RequestError(
            f"the request body did not arrive within {seconds:g}s; send it at once", 408
        ) from None
    return parse_json(raw)


SETTINGS: web.AppKey[ServerSettings] = web.AppKey("settings", ServerSettings)


def build_app(service: Service) -> web.Application:
    app = web.Application(client_max_size=service.settings.max_body_bytes, middlewares=[_errors])
    app[BUSY] = set()
    app[SETTINGS] = service.settings
    routes = web.RouteTableDef()

    @routes.post("/v1/execute")
    async def execute(request: web.Request) -> web.Response:
        call = parse_execute(await _body(request), service.tools)
        return _json((await service.execute(call)).to_json())

    @routes.post("/v1/execute/batch")
    async def execute_batch(request: web.Request) -> web.Response:
        calls = parse_batch(await _body(request), service.tools)

        async def one(call: ExecuteRequest) -> dict[str, Any]:
            try:
                return (await service.execute(call)).to_json()
            except Rejected as exc:
                return ToolResult(status=outcome.REJECTED, message=str(exc)).to_json()
            except (RequestError, ToolInputError) as exc:
                return ToolResult(status=outcome.ERROR, message=str(exc)).to_json()

        return _json({"results": await asyncio.gather(*(one(c) for c in calls))})

    @routes.post("/v1/sessions")
    async def open_session(request: web.Request) -> web.Response:
        tool = service.tools[parse_session_create(await _body(request), service.python_tools)]
        assert isinstance(tool, PythonTool)
        service.refuse_when_draining()
        try:
            session = await service.sessions.open(tool)
        except SessionLimit as exc:
            return _json({"error": str(exc)}, 429, {"Retry-After": "5"})
        if isinstance(session, ToolResult):
            return _json({"error": f"could not start the session: {session.message}"}, 503)
        return _json({"session": session.id, "tool": tool.name}, 201)

    @routes.delete("/v1/sessions/{session_id}")
    async def close_session(request: web.Request) -> web.Response:
        if not await service.sessions.close(request.match_info["session_id"], API):
            raise RequestError(f"unknown session {request.match_info['session_id']!r}", 404)
        return _json({"closed": True})

    @routes.post("/run_code")
    async def run_code(request: web.Request) -> web.Response:
        call = sandboxfusion.parse_run_code(await _body(request))
        if call.language not in sandboxfusion.PYTHON_LANGUAGES:
            return _json(sandboxfusion.unsupported_language(call.language))
        if not service.python_tools:
            return _json(sandboxfusion.no_python_tool())
        tool = service.tools[service.python_tools[0]]
        assert isinstance(tool, PythonTool)
        payload = {"code": call.code, "stdin": call.stdin}
        limits = sandboxfusion.limits(call, service.settings)
        result = await service.admit(
            tool.name,
            lambda: tool.run(
                payload,
                limits.seconds,
                memory_mib=limits.memory_mib,
                max_output=limits.max_output,
                files=call.files,
                fetch=call.fetch_files,
            ),
        )
        return _json(sandboxfusion.to_response(result))

    @routes.post("/get_observation")
    async def get_observation(request: web.Request) -> web.Response:
        steps = verltool.parse_request(await _body(request))
        caller = request.remote or "unknown"
        answers: list[tuple[str, bool, bool, str | None]] = [("", False, False, None)] * len(steps)
        trajectories: dict[str, list[int]] = {}
        for index, step in enumerate(steps):
            trajectories.setdefault(step.trajectory_id, []).append(index)

        async def in_order(indices: list[int]) -> None:  # one trajectory's steps one after another
            for index in indices:
                answers[index] = await _observe(service, steps[index], caller)

        await asyncio.gather(*(in_order(indices) for indices in trajectories.values()))
        return _json(
            {
                "observations": [a[0] for a in answers],
                "dones": [a[1] for a in answers],
                "valids": [a[2] for a in answers],
                "faults": [a[3] for a in answers],
            }
        )

    @routes.get("/v1/tools")
    async def list_tools(request: web.Request) -> web.Response:
        """Every tool of this pool: name, type, description and the JSON schema of its input."""
        return _json({"tools": [tool.schema() for tool in service.tools.values()]})

    @routes.get("/healthz")
    async def healthz(request: web.Request) -> web.Response:
        """Liveness: runs no code and takes no execution slot (a burst of probes costs each
        worker one ping); 503 only for what a restart mends."""
        problems = await service.pool.alive() if service.pool is not None else []
        if problems:
            return _json({"status": "unhealthy", "problems": problems}, 503)
        return _json({"status": "ok"})

    @routes.get("/readyz")
    async def readyz(request: web.Request) -> web.Response:
        layers = service.pool.layers() if service.pool is not None else {}
        problems = await service.readiness()
        body: dict[str, Any] = {"ready": not problems, "tools": list(service.tools), "sandbox": layers}
        if problems:
            body.update(problem=problems[0], problems=problems)
        return _json(body, 503 if problems else 200)

    @routes.get("/metrics")
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=service.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.add_routes(routes)
    return app


async def _observe(service: Service, step: verltool.Step, caller: str) -> tuple[str, bool, bool, str | None]:
    """One trajectory's step: (observation, done, valid, fault). Python state lives in a session per
    trajectory, scoped to the caller's address: a trajectory id names a session only for the
    client that made it, and a finished one is never opened again."""
    key = f"{caller}\0{step.trajectory_id}".encode("utf-8", "surrogatepass")
    session_id = "verltool:" + hashlib.blake2b(key, digest_size=16).hexdigest()
    if step.finish:
        service.finish_trajectory(session_id)
        await service.sessions.close(session_id, VERLTOOL)
        return "", True, True, None
    if session_id in service.finished:
        name = shown(step.trajectory_id.split(":", 1)[1], 80)
        why = f"[{outcome.ERROR}: trajectory {name} was finished; use a new trajectory id]"
        return why, True, False, outcome.FAULT_CODE
    call = verltool.extract(step.action)
    if call is None:
        return "", False, False, None
    kind, text = call
    names = [n for n, t in service.tools.items() if t.type == kind]
    if not names:
        return f"[no {kind} tool in this pool]", False, False, outcome.FAULT_INFRA
    try:
        if kind == "python":
            tool = service.tools[names[0]]
            assert isinstance(tool, PythonTool)
            service.refuse_when_draining()
            opened = await service.sessions.ensure(tool, session_id, VERLTOOL)
            if isinstance(opened, ToolResult):
                return verltool.observation(opened), False, False, opened.whose_fault()
            payload = {"code": text, "stdin": step.stdin}
            result = await service.execute(ExecuteRequest(tool.name, payload, None, session_id), VERLTOOL)
        else:
            result = await service.execute(ExecuteRequest(names[0], text, None, None))
    except (Rejected, SessionLimit, SessionExists) as exc:
        return f"[{outcome.REJECTED}: {exc}]", False, False, outcome.FAULT_INFRA
    except ToolInputError as exc:
        return f"[{outcome.ERROR}: {exc}]", False, False, outcome.FAULT_CODE
    return verltool.observation(result), False, True, result.whose_fault()


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


async def _housekeeping(runner: web.AppRunner, app: web.Application, service: Service, cap: int) -> None:
    """Once a second: connections above the cap closed; orphaned zombies reaped (in a thread, as
    the scan reads /proc) right after a worker died, when they appear, and every 30 s anyway."""
    since: dict[Any, float] = {}
    restarts, scan_until, last_scan = 0, 0.0, 0.0
    while True:
        await asyncio.sleep(1.0)
        try:
            if runner.server is not None:
                closed = close_idle_connections(runner.server.connections, app[BUSY], since, cap)
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
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
    await site.start()
    log.info(
        "tool-sandbox listening on %s:%d, tools: %s", settings.host, settings.port, ", ".join(service.tools)
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    housekeeping = asyncio.create_task(_housekeeping(runner, app, service, cap))
    try:
        await service.start()
        await stop.wait()
        log.info("shutting down: no call starts now; those running have %gs", settings.drain_seconds)
        failed = await service.drain(settings.drain_seconds)
        log.info("drained: %d call(s) still running were answered as the pool's failure", failed)
    finally:
        housekeeping.cancel()
        await runner.cleanup()  # handlers write their answers first
        with contextlib.suppress(Exception):
            await service.close()
