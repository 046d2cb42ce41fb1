"""Stateful sessions: a sandboxed process per session whose variables survive between calls,
with a cap on live sessions and an idle time-to-live.

Sessions come in kinds that never reach each other's routes: the pool's own (`api`, opened by
POST /v1/sessions, named by an unguessable id), VerlTool's trajectories (`verltool`, named by
the caller's address and its trajectory id, which others could guess) and OpenEnv's episodes
(`openenv`, one per WebSocket connection, named by an unguessable id)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from tool_sandbox.tools.base import Tool, ToolResult


class SessionLimit(Exception):
    """Too many live sessions; close one or retry later."""


class SessionExists(Exception):
    """A live session already has this id."""


API = "api"
VERLTOOL = "verltool"
OPENENV = "openenv"


@dataclass
class Session:
    id: str
    tool: Tool  # one that supports_sessions
    handle: Any  # what the tool's open_session gave
    kind: str
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one cell at a time
    waiting: int = 0  # calls queued behind the one running (they hold no execution slot)


class Sessions:
    def __init__(self, max_sessions: int, idle_seconds: float) -> None:
        self.max_sessions = max_sessions
        self.idle_seconds = idle_seconds
        self.live: dict[str, Session] = {}
        self._opening = 0
        self._id_locks: dict[str, tuple[asyncio.Lock, int]] = {}  # lock and how many callers hold or await it

    def __len__(self) -> int:
        return len(self.live) + self._opening

    async def open(self, tool: Tool, session_id: str | None = None, kind: str = API) -> Session | ToolResult:
        """Start a session process; a ToolResult explains a failure to start."""
        if session_id is not None and session_id in self.live:
            raise SessionExists(f"session {session_id!r} is already live; use it or close it first")
        if len(self) >= self.max_sessions:
            raise SessionLimit(f"{self.max_sessions} sessions are live; close one or retry later")
        self._opening += 1
        try:
            handle = await tool.open_session()
        finally:
            self._opening -= 1
        if isinstance(handle, ToolResult):
            return handle
        session = Session(session_id or secrets.token_hex(12), tool, handle, kind)
        if session.id in self.live:  # opened meanwhile by someone else: keep theirs, close ours
            await tool.close_session(handle)
            raise SessionExists(f"session {session.id!r} is already live; use it or close it first")
        self.live[session.id] = session
        return session

    async def ensure(self, tool: Tool, session_id: str, kind: str) -> Session | ToolResult:
        """The live session `session_id`, opened once however many callers ask for it at once."""
        lock, users = self._id_locks.get(session_id, (asyncio.Lock(), 0))
        self._id_locks[session_id] = (lock, users + 1)
        try:
            async with lock:
                return self.get(session_id, kind) or await self.open(tool, session_id, kind)
        finally:
            lock, users = self._id_locks[session_id]
            if users == 1:
                del self._id_locks[session_id]
            else:
                self._id_locks[session_id] = (lock, users - 1)

    def get(self, session_id: str, kind: str) -> Session | None:
        """The live session of this kind with this id (None for another kind's)."""
        session = self.live.get(session_id)
        if session is None or session.kind != kind:
            return None
        session.last_used = time.monotonic()
        return session

    async def close(self, session_id: str, kind: str) -> bool:
        session = self.live.get(session_id)
        if session is None or session.kind != kind:
            return False
        del self.live[session_id]
        await session.tool.close_session(session.handle)
        return True

    async def close_idle(self) -> int:
        cutoff = time.monotonic() - self.idle_seconds
        idle = [s for s in self.live.values() if s.last_used < cutoff and not s.lock.locked()]
        for session in idle:
            await self.close(session.id, session.kind)
        return len(idle)

    async def reap_forever(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            with contextlib.suppress(Exception):
                await self.close_idle()

    async def close_all(self) -> None:
        for session in list(self.live.values()):
            with contextlib.suppress(Exception):
                await self.close(session.id, session.kind)
