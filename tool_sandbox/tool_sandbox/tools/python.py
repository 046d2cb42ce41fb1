"""The `python` tool: code runs in a sandboxed child of a warm worker (see tool_sandbox.sandbox)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from tool_sandbox.config import ServerSettings, ToolConfig
from tool_sandbox.sandbox import outcome
from tool_sandbox.sandbox.layers import Limits
from tool_sandbox.sandbox.pool import CallTooLarge, Pool, WorkerLost, lost_result
from tool_sandbox.tools.base import Tool, ToolInputError, ToolResult


@dataclass(frozen=True)
class SessionHandle:
    """Where a session's process lives: worker index, worker generation, id inside the worker."""

    worker: int
    generation: int
    worker_session: int


def parse_code(payload: Any) -> tuple[str, str]:
    """A python call's input: the code as a string, or {"code": ..., "stdin"?: ...}."""
    if isinstance(payload, str):
        return payload, ""
    if isinstance(payload, dict) and isinstance(payload.get("code"), str):
        stdin = payload.get("stdin") or ""
        if not isinstance(stdin, str):
            raise ToolInputError("input.stdin must be a string")
        return payload["code"], stdin
    raise ToolInputError('input of a python tool must be a string of code or {"code": "...", "stdin": "..."}')


class PythonTool(Tool):
    type = "python"
    description = "Run Python code in a sandbox and return what it prints."
    input_schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "Python source to execute"},
            "stdin": {"type": "string", "description": "Text the program reads from standard input"},
        },
        "required": ["code"],
    }
    supports_sessions = True
    runs_code = True

    @classmethod
    def create(cls, config: ToolConfig, pool: Pool | None, settings: ServerSettings) -> Tool:
        assert pool is not None, "a python tool runs in the sandbox pool"
        return cls(config, pool, settings)

    def __init__(self, config: ToolConfig, pool: Pool, settings: ServerSettings) -> None:
        super().__init__(config)
        self.pool = pool
        self.settings = settings

    def limits(self, cpu_seconds: float, memory_mib: int | None = None) -> dict[str, Any]:
        """Per-call limits; `memory_mib` (already checked against the pool's maximum by the
        caller) replaces the tool's memoryLimitMiB."""
        return Limits(
            timeout_seconds=cpu_seconds,
            memory_mib=memory_mib or self.config.memory_limit_mib,
            file_size_mib=self.config.file_size_limit_mib,
            open_files=self.config.max_open_files,
            processes=self.config.max_processes,
        ).__dict__

    async def execute(self, payload: Any, timeout: float | None) -> ToolResult:
        """A call of the pool's own API: the tool's limits, a timeout the caller may shorten."""
        return await self.run(payload, self.effective_timeout(timeout))

    async def run(
        self,
        payload: Any,
        seconds: float,
        *,
        memory_mib: int | None = None,
        max_output: int | None = None,
        files: dict[str, str] | None = None,
        fetch: list[str] | None = None,
    ) -> ToolResult:
        """Run a program with exactly these limits (the tool's where None)."""
        code, stdin = parse_code(payload)
        message = {
            "op": "run",
            "code": code,
            "stdin": stdin,
            "timeout": seconds,
            "limits": self.limits(seconds, memory_mib),
            "maxOutputBytes": max_output or self.config.max_output_bytes,
            "diskBytes": self.config.disk_limit_mib << 20,
            "files": files or {},
            "fetch": fetch or [],
        }
        try:
            reply, _, _ = await self.pool.call(message)
        except WorkerLost as exc:
            reply = lost_result(str(exc))
        except CallTooLarge as exc:
            return _too_large(exc)
        return _result(reply)

    async def open_session(self) -> SessionHandle | ToolResult:
        message = {
            "op": "open",
            "code": "",
            "timeout": self.config.timeout_seconds,
            "limits": self.limits(self.settings.session_cpu_seconds),
            "maxOutputBytes": self.config.max_output_bytes,
            "diskBytes": self.config.disk_limit_mib << 20,
        }
        try:
            reply, worker, generation = await self.pool.call(message)
        except WorkerLost as exc:
            return _result(lost_result(str(exc)))
        if "session" not in reply:
            return _result(reply)
        return SessionHandle(worker, generation, int(reply["session"]))

    async def execute_in_session(
        self, handle: SessionHandle, payload: Any, timeout: float | None
    ) -> tuple[ToolResult, bool]:
        """Run a cell (with its own stdin, if any); also says whether the session's process is
        still alive afterwards."""
        code, stdin = parse_code(payload)
        message = {
            "op": "exec",
            "session": handle.worker_session,
            "code": code,
            "stdin": stdin,
            "timeout": self.effective_timeout(timeout),
            "maxOutputBytes": self.config.max_output_bytes,
        }
        try:
            reply, _, _ = await self.pool.call(message, handle.worker, handle.generation)
        except WorkerLost as exc:
            reply = lost_result(str(exc))
        except CallTooLarge as exc:  # nothing was sent: the session goes on
            return _too_large(exc), True
        return _result(reply), bool(reply.get("sessionAlive", False))

    async def close_session(self, handle: SessionHandle) -> None:
        with contextlib.suppress(WorkerLost):  # else the process went with its worker
            await self.pool.call(
                {"op": "close", "session": handle.worker_session}, handle.worker, handle.generation
            )


def _too_large(exc: CallTooLarge) -> ToolResult:
    return ToolResult(status=outcome.ERROR, stderr=str(exc), message=str(exc), fault=outcome.FAULT_CODE)


def _result(reply: dict[str, Any]) -> ToolResult:
    return ToolResult(
        status=reply["status"],
        output=reply.get("stdout", ""),
        stdout=reply.get("stdout", ""),
        stderr=reply.get("stderr", ""),
        exitCode=reply.get("exitCode"),
        durationSeconds=float(reply.get("durationSeconds", 0.0)),
        truncated=bool(reply.get("truncated", False)),
        message=reply.get("message", ""),
        files=reply.get("files") or {},
        sandboxError=bool(reply.get("sandboxError", False)),
    )
