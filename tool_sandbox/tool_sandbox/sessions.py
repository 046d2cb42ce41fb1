"""Stateful sessions: a sandboxed process per session whose variables survive between calls,
with a cap on live sessions and an idle time-to-live."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass, field

from tool_sandbox.tools.base import ToolResult
from tool_sandbox.tools.python import PythonTool, SessionHandle


class SessionLimit(Exception):
    """Too many live sessions; close one or retry later."""


@dataclass
class Session:
    id: str
    tool: PythonTool
    handle: SessionHandle
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Sessions:
    def __init__(self, max_sessions: int, idle_seconds: float) -> None:
        self.max_sessions = max_sessions
        self.idle_seconds = idle_seconds
        self.live: dict[str, Session] = {}
        self._opening = 0

    def __len__(self) -> int:
        return len(self.live) + self._opening

    async def open(self, tool: PythonTool, session_id: str | None = None) -> Session | ToolResult:
        """Start a session process; a ToolResult explains a failure to start."""
        if len(self) >= self.max_sessions:
            raise SessionLimit(f"{self.max_sessions} sessions are live; close one or retry later")
        self._opening += 1
        try:
            handle = await tool.open_session()
        finally:
            self._opening -= 1
        if isinstance(handle, ToolResult):
            return handle
        session = Session(session_id or secrets.token_hex(12), tool, handle)
        self.live[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        session = self.live.get(session_id)
        if session is not None:
            session.last_used = time.monotonic()
        return session

    async def close(self, session_id: str) -> bool:
        session = self.live.pop(session_id, None)
        if session is None:
            return False
        await session.tool.close_session(session.handle)
        return True

    async def close_idle(self) -> int:
        cutoff = time.monotonic() - self.idle_seconds
        idle = [s.id for s in self.live.values() if s.last_used < cutoff and not s.lock.locked()]
        for session_id in idle:
            await self.close(session_id)
        return len(idle)

    async def reap_forever(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            with contextlib.suppress(Exception):
                await self.close_idle()

    async def close_all(self) -> None:
        for session_id in list(self.live):
            with contextlib.suppress(Exception):
                await self.close(session_id)
