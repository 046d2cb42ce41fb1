"""The pool's service, independent of any transport: tools, sessions, admission (backpressure,
draining) and metrics. Each protocol (api/native.py, api/sandboxfusion.py, api/verltool.py,
api/mcp.py, ...) is a module of its own that translates its wire format to calls of this service,
naming itself in `protocol` so the metrics count calls per tool and per protocol. A protocol uses
its public methods, `tools` and `settings`; the pool, the metrics and the lifecycle (`start`,
`drain`, `close`) are the server's (api/app.py)."""

from __future__ import annotations

import asyncio
import importlib.metadata
from collections.abc import Awaitable, Callable
from typing import Any

from tool_sandbox.admission import Admission, Rejected
from tool_sandbox.calls import ExecuteRequest, RequestError, shown
from tool_sandbox.config import ServerSettings, ToolConfig
from tool_sandbox.metrics import Metrics
from tool_sandbox.sandbox import outcome
from tool_sandbox.sandbox.pool import Pool
from tool_sandbox.sessions import API, Session, Sessions
from tool_sandbox.tools import Tool, ToolResult, build_tools, expand_tools, needs_pool

SERVER_NAME = "toolrl-tool-pool"  # how the pool names itself to protocols that ask (MCP, OpenEnv)
NATIVE = "native"  # the pool's own API (/v1/execute): the protocol of a call that names none
MAX_SESSION_WAITING = 64  # calls of one session queued behind its running cell; more get 429
READINESS_SECONDS = 1.0  # a readiness answer serves every probe for this long (one check per burst)
SHUTTING_DOWN = "the tool server is shutting down; retry the call"


class Service:
    """Tools, sessions, backpressure and metrics, independent of HTTP."""

    def __init__(self, settings: ServerSettings, tools: tuple[ToolConfig, ...]) -> None:
        self.settings = settings
        self.pool = Pool(settings) if needs_pool(tools) else None
        self.entries: dict[str, Tool] = build_tools(tools, self.pool, settings)  # tools.yaml's
        self.tools: dict[str, Tool] = dict(self.entries)  # what it serves: the entries' tools once started
        self.admission = Admission(settings.capacity, settings.queue_size)
        self._sessions = Sessions(settings.max_sessions, settings.session_idle_seconds)
        self.metrics = Metrics()
        self.metrics.bind(
            lambda: self.admission.inflight,
            lambda: self.admission.waiting,
            settings.capacity,
            lambda: len(self._sessions.live),
        )
        self.tools_ready = False
        self.draining = False  # SIGTERM: no call starts any more (drain)
        self._reaper: asyncio.Task[None] | None = None
        self._readiness: asyncio.Future[list[str]] | None = None
        self._readiness_at = 0.0

    @property
    def session_tools(self) -> list[str]:
        """The tools that keep sessions, by name."""
        return [name for name, tool in self.tools.items() if tool.supports_sessions]

    def tool_of_type(self, kind: str) -> Tool | None:
        """The first tool of this type (tools.yaml's `type`), for calls that name a kind of tool rather
        than a tool (VerlTool's tags, OpenEnv's code, SandboxFusion's /run_code)."""
        return next((tool for tool in self.tools.values() if tool.type == kind), None)

    async def start(self) -> None:
        if self.pool is not None:
            await self.pool.start()
        for tool in self.entries.values():
            await tool.start()
        self.tools = expand_tools(self.entries)
        self.tools_ready = True
        self._reaper = asyncio.create_task(
            self._sessions.reap_forever(min(30.0, self.settings.session_idle_seconds))
        )

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        await self._sessions.close_all()
        for tool in self.entries.values():
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
            waiting = [tool.waiting() for tool in self.tools.values() if tool.waiting()]
            return waiting or ["starting: the sandbox workers are warming up"]
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

    async def admit(self, tool: str, job: Callable[[], Awaitable[ToolResult]], protocol: str) -> ToolResult:
        """Run `job` under backpressure and record it (by tool and by the protocol it came in by);
        raises Rejected when the queue is full or the server is shutting down (a queued call then
        never starts)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            self._refuse_when_draining()
            async with self.admission.slot():
                self._refuse_when_draining()
                result = await job()
        except Rejected:
            self.metrics.observe(tool, outcome.REJECTED, loop.time() - started, False, protocol)
            raise
        self.metrics.observe(tool, result.status, loop.time() - started, result.truncated, protocol)
        return result

    def _refuse_when_draining(self) -> None:
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

    async def call(
        self, name: str, arguments: Any, protocol: str, timeout: float | None = None
    ) -> ToolResult:
        """Run the tool `name` with these arguments (its input), outside any session. Raises
        RequestError for a tool this pool does not serve, ToolInputError for arguments the tool
        cannot take, Rejected when the pool is full or shutting down."""
        if name not in self.tools:
            raise RequestError(f"unknown tool {shown(name)}; this pool serves {', '.join(self.tools)}", 404)
        return await self.execute(ExecuteRequest(name, arguments, timeout, None), protocol=protocol)

    async def execute(self, request: ExecuteRequest, kind: str = API, protocol: str = NATIVE) -> ToolResult:
        """A call; with a session, one of this kind (the pool's own sessions for /v1/execute:
        VerlTool's trajectories are reachable only through /get_observation)."""
        tool = self.tools[request.tool]
        if request.sample is not None:
            if not tool.takes_sample or request.session is not None:
                where = f"{tool.type} tool {tool.name!r}" if request.session is None else "a session's call"
                raise RequestError(
                    f"sample is not taken by {where}: only function tools, outside sessions, take "
                    "per-sample values (their keyword-only parameters); drop it"
                )
            sample = request.sample
            return await self.admit(
                tool.name, lambda: tool.execute_with_sample(request.input, sample, request.timeout), protocol
            )
        if request.session is None:
            return await self.admit(tool.name, lambda: tool.execute(request.input, request.timeout), protocol)
        session = self._sessions.get(request.session, kind)
        if session is None:
            name = shown(request.session, 80)
            raise RequestError(f"unknown or expired session {name}; open one with POST /v1/sessions", 404)
        if session.tool is not tool:
            raise RequestError(f"session {request.session!r} belongs to tool {session.tool.name!r}")
        # A session runs one cell at a time: its queued calls wait here, for its lock, before they
        # take an execution slot, so they never hold slots that other callers' calls wait for.
        if session.waiting >= MAX_SESSION_WAITING:
            self.metrics.observe(tool.name, outcome.REJECTED, 0.0, False, protocol)
            raise Rejected(1)
        session.waiting += 1
        try:
            await session.lock.acquire()
        finally:
            session.waiting -= 1
        try:
            return await self.admit(
                tool.name, lambda: self._in_session(session.id, request.input, request.timeout), protocol
            )
        finally:
            session.lock.release()

    async def _in_session(self, session_id: str, payload: Any, timeout: float | None) -> ToolResult:
        """A cell of a session whose lock the caller holds."""
        session = self._sessions.live.get(session_id)
        if session is None:
            return ToolResult(status=outcome.ERROR, message="session was closed")
        result, alive = await session.tool.execute_in_session(session.handle, payload, timeout)
        if not alive:
            self._sessions.live.pop(session_id, None)
            result.message = (result.message + "; " if result.message else "") + "the session has ended"
        return result

    async def open_session(self, tool: str, kind: str = API) -> Session | ToolResult:
        """A new session of the tool `tool` (a ToolResult says why it could not start). Raises
        SessionLimit when as many are live as the pool keeps, Rejected when it is shutting down."""
        self._refuse_when_draining()
        return await self._sessions.open(self._with_sessions(tool), kind=kind)

    async def ensure_session(self, tool: str, session_id: str, kind: str) -> Session | ToolResult:
        """The live session `session_id` of this kind, opened on the tool `tool` if there is none
        (once, however many callers ask at once); raises as `open_session`."""
        self._refuse_when_draining()
        return await self._sessions.ensure(self._with_sessions(tool), session_id, kind)

    def session_is_live(self, session_id: str) -> bool:
        """False once the session's process ended (exit, crash, worker lost) or it was closed."""
        return session_id in self._sessions.live

    async def close_session(self, session_id: str, kind: str) -> bool:
        """Close a live session of this kind; False when there is none."""
        return await self._sessions.close(session_id, kind)

    def _with_sessions(self, name: str) -> Tool:
        tool = self.tools[name]
        if not tool.supports_sessions:
            raise RequestError(f"tool {name!r} keeps no sessions; these do: {', '.join(self.session_tools)}")
        return tool


def server_version() -> str:
    try:
        return importlib.metadata.version("toolrl-tool-sandbox")
    except importlib.metadata.PackageNotFoundError:
        return "0"
