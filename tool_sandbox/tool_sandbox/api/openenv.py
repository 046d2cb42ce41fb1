"""OpenEnv: the pool as an environment of its tool set, as the `openenv` package's clients
(`EnvClient`, `GenericEnvClient`) expect it at the server's root.

A WebSocket at `/ws` is one environment session: `{"type": "reset"|"step"|"state"|"close",
"data": ...}` in, `{"type": "observation"|"state"|"error", "data": ...}` out. An episode (from a
reset) keeps its Python state in a sandbox session of its own across steps, as a notebook does;
the session opens at the episode's first code step and closes at the next reset or when the
connection ends. An action is `{"code": "..."}` (OpenEnv's coding environment: runs in the
episode's session) or `{"tool": name, "arguments": {...}}` (any tool of the pool, one call).

The observation has the pool's result (`status`, `stdout`, `stderr`, `exit_code`, `fault`, ...);
`reward` is always null (the pool runs tools, the trainer scores) and `done` is true only when the
episode's Python process ended (its state is gone: reset for a new one). A call the pool refused
or lost is an observation with `fault: "infra"`, like every other protocol's.

The HTTP routes are OpenEnv's stateless ones: `POST /reset`, `POST /step` (one call, no session),
`GET /state`, `/health` (the pool's readiness: 503 with the reason while /readyz is), `/schema` and
`/metadata`."""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
from collections.abc import Iterable
from typing import Annotated, Any, Literal, NotRequired

from aiohttp import WSMsgType, web
from pydantic import AfterValidator, Discriminator, Tag, TypeAdapter, ValidationError

from tool_sandbox.admission import Rejected
from tool_sandbox.api.requests import (
    FieldMessages,
    PositiveFinite,
    error_message,
    first_error,
    json_kind,
    our_error,
    parse_json,
    require_object,
    strict_typed_dict,
    typed_dict,
)
from tool_sandbox.api.web import json_response, read_json
from tool_sandbox.calls import ExecuteRequest, RequestError, shown
from tool_sandbox.sandbox import outcome
from tool_sandbox.service import SERVER_NAME, Service, server_version
from tool_sandbox.sessions import OPENENV, SessionExists, SessionLimit
from tool_sandbox.tools.base import Tool, ToolInputError, ToolResult

PROTOCOL = "openenv"
DESCRIPTION = "The tools of a ToolRL tool pool: code runs in its sandbox, an episode's in a session."
MAX_EPISODE_ID_CHARS = 255  # as OpenEnv's ResetRequest
ACTION_HELP = (
    'an action is {"code": "..."} (runs in the episode\'s Python session) or '
    '{"tool": "<name>", "arguments": {...}} (one call of any tool, schemas at GET /v1/tools)'
)

OBSERVATION_SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ready", *outcome.STATUSES]},
        "output": {"type": "string"},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "exit_code": {"type": ["integer", "null"]},
        "fault": {"type": ["string", "null"], "enum": [outcome.FAULT_CODE, outcome.FAULT_INFRA, None]},
        "message": {"type": "string"},
        "truncated": {"type": "boolean"},
        "tool": {"type": "string"},
    },
}
STATE_SCHEMA = {
    "type": "object",
    "properties": {
        "episode_id": {"type": ["string", "null"]},
        "step_count": {"type": "integer"},
        "tools": {"type": "array", "items": {"type": "string"}},
    },
}


class ActionError(ValueError):
    """The message or action is malformed: an OpenEnv error answer (VALIDATION_ERROR)."""


class EpisodeError(Exception):
    """The episode cannot go on (no session could be opened, or it ended): an error answer."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def action_schema(service: Service) -> dict[str, Any]:
    return {
        "type": "object",
        "description": ACTION_HELP,
        "oneOf": [
            {
                "properties": {"code": {"type": "string"}, "stdin": {"type": "string"}},
                "required": ["code"],
            },
            {
                "properties": {
                    "tool": {"type": "string", "enum": list(service.tools)},
                    "arguments": {"type": "object"},
                },
                "required": ["tool"],
            },
        ],
    }


def observation(result: ToolResult, tool: str, done: bool = False) -> dict[str, Any]:
    """A pool result as OpenEnv's `{observation, reward, done}`."""
    body = result.to_json()
    seen = {
        "status": body["status"],
        "output": body["output"],
        "stdout": body["stdout"],
        "stderr": body["stderr"],
        "exit_code": body["exitCode"],
        "fault": body["fault"],
        "message": body["message"],
        "truncated": body["truncated"],
        "tool": tool,
    }
    return {"observation": seen, "reward": None, "done": done}


def _refused(tool: str, message: str, fault: str) -> dict[str, Any]:
    status = outcome.REJECTED if fault == outcome.FAULT_INFRA else outcome.ERROR
    return observation(ToolResult(status=status, message=message, fault=fault), tool)


_TIMEOUT = NotRequired[PositiveFinite | None]  # checked first: declared first in each kind


def _action_kind(action: Any) -> str:
    return "code" if "code" in action else "tool"


@functools.cache
def action_body(tools: tuple[str, ...]) -> TypeAdapter[dict[str, Any]]:
    """An action of either kind: code (when it has `code`, whatever else it holds) or a tool call."""
    code = strict_typed_dict("CodeAction", {"timeout_s": _TIMEOUT, "code": str, "stdin": NotRequired[str]})
    tool = strict_typed_dict(
        "ToolAction",
        {"timeout_s": _TIMEOUT, "tool": Literal[tools], "arguments": NotRequired[dict[str, Any]]},
    )
    return TypeAdapter(
        Annotated[
            Annotated[code, Tag("code")] | Annotated[tool, Tag("tool")],  # type: ignore[valid-type]
            Discriminator(_action_kind),
        ]
    )


def action_messages(tools: Iterable[str]) -> FieldMessages:
    served = ", ".join(tools)

    def tool(_: Any, name: Any) -> str:
        if isinstance(name, str):
            return f"unknown tool {shown(name)}; this pool serves {served}"
        return f"the action has neither code nor tool; {ACTION_HELP}"

    return {
        "timeout_s": lambda _, got: f"timeout_s must be a positive number of seconds, got {shown(got)}",
        "code": lambda *_: f"code and stdin must be strings; {ACTION_HELP}",
        "stdin": lambda *_: f"code and stdin must be strings; {ACTION_HELP}",
        "tool": tool,
        "arguments": lambda _, got: f"arguments must be an object, got {json_kind(got)}",
    }


def parse_action(action: Any, service: Service) -> tuple[str, Any, float | None]:
    """(tool name, its input, timeout) of an action; "" as the tool name for code run in the
    episode's session."""
    action = require_object(action, "the action")
    try:
        parsed = action_body(tuple(service.tools)).validate_python(action)
    except ValidationError as exc:
        raise ActionError(error_message(first_error(exc), action_messages(service.tools))) from None
    timeout = parsed.get("timeout_s")
    if "code" in parsed:
        return "", {"code": parsed["code"], "stdin": parsed.get("stdin", "")}, timeout
    return parsed["tool"], parsed.get("arguments", {}), timeout


EPISODE_ID_HELP = f"episode_id must be a string of at most {MAX_EPISODE_ID_CHARS} characters"


def _episode_id(episode_id: str) -> str:
    if len(episode_id) > MAX_EPISODE_ID_CHARS:
        raise our_error(EPISODE_ID_HELP)
    return episode_id


# `reset`'s data: an episode id of OpenEnv's ResetRequest, or none (a fresh one is made). Its length
# is a check of ours: pydantic's max_length refuses a lone surrogate, which JSON allows and the
# pool takes.
RESET_DATA = typed_dict(
    "ResetData", {"episode_id": NotRequired[Annotated[str, AfterValidator(_episode_id)] | None]}
)
RESET_MESSAGES: FieldMessages = {"episode_id": lambda *_: EPISODE_ID_HELP}


class Episode:
    """One OpenEnv session's episode: its id, its step count and its Python session."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.episode_id: str | None = None
        self.step_count = 0
        self.session: str | None = None
        self.ended = False  # its Python process ended: reset for a new episode

    def python_tool(self) -> Tool | None:
        return self.service.tool_of_type("python")

    async def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        try:
            episode_id = RESET_DATA.validate_python(data).get("episode_id")
        except ValidationError as exc:
            raise ActionError(error_message(first_error(exc), RESET_MESSAGES)) from None
        await self.close()
        self.episode_id = episode_id or secrets.token_hex(8)
        self.step_count, self.ended = 0, False
        ready = ToolResult(
            status=outcome.OK, message=f"episode {self.episode_id}; tools: {', '.join(self.service.tools)}"
        )
        answer = observation(ready, "")
        answer["observation"]["status"] = "ready"
        return answer

    async def step(self, action: Any) -> dict[str, Any]:
        name, arguments, timeout = parse_action(action, self.service)
        if self.ended:
            raise EpisodeError(
                "SESSION_ERROR", "this episode's Python process has ended; reset for a new episode"
            )
        self.step_count += 1
        python = self.python_tool()
        tool = name or (python.name if python else "")
        try:
            if name:
                return observation(await self.service.call(name, arguments, PROTOCOL, timeout), name)
            return await self._run_code(arguments, timeout)
        except ToolInputError as exc:
            return _refused(tool, str(exc), outcome.FAULT_CODE)
        except (Rejected, SessionLimit, SessionExists) as exc:
            return _refused(tool, str(exc), outcome.FAULT_INFRA)

    async def _run_code(self, payload: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        tool = self.python_tool()
        if tool is None:
            raise ActionError(
                f"this pool has no python tool to run code; it serves {', '.join(self.service.tools)}"
            )
        if self.session is None:
            opened = await self.service.open_session(tool.name, OPENENV)
            if isinstance(opened, ToolResult):
                return observation(opened, tool.name)
            self.session = opened.id
        call = ExecuteRequest(tool.name, payload, timeout, self.session)
        try:
            result = await self.service.execute(call, OPENENV, PROTOCOL)
        except RequestError:  # closed while idle for longer than the pool keeps sessions
            self.session, self.ended = None, True
            raise EpisodeError("SESSION_ERROR", "this episode's session expired while idle; reset") from None
        if not self.service.session_is_live(self.session):  # the process ended (exit, crash, worker lost)
            self.session, self.ended = None, True
        return observation(result, tool.name, done=self.ended)

    def state(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "step_count": self.step_count,
            "tools": list(self.service.tools),
        }

    async def close(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            await self.service.close_session(session, OPENENV)


def _error(code: str, message: str) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code}})


async def _answer(episode: Episode, raw: str) -> str | None:
    """The answer to one WebSocket message (None after `close`)."""
    try:
        message = parse_json(raw.encode())
    except RequestError as exc:
        return _error("INVALID_JSON", f'{exc}; send {{"type": ..., "data": ...}}')
    if not isinstance(message, dict):
        return _error("INVALID_JSON", f"a message is a JSON object, got {json_kind(message)}")
    kind, data = message.get("type"), message.get("data", {})
    try:
        if kind == "reset":
            return json.dumps(
                {"type": "observation", "data": await episode.reset(require_object(data, "data"))}
            )
        if kind == "step":
            return json.dumps({"type": "observation", "data": await episode.step(data)})
        if kind == "state":
            return json.dumps({"type": "state", "data": episode.state()})
        if kind == "close":
            return None
    except (ActionError, RequestError) as exc:
        return _error("VALIDATION_ERROR", str(exc))
    except EpisodeError as exc:
        return _error(exc.code, str(exc))
    return _error("UNKNOWN_TYPE", f"unknown message type {shown(kind)}; send reset, step, state or close")


def routes(service: Service) -> web.RouteTableDef:
    routes = web.RouteTableDef()

    sockets = 0  # open environment sessions: each may hold a sandbox session, so as many as those

    @routes.get("/ws")
    async def websocket(request: web.Request) -> web.StreamResponse:
        nonlocal sockets
        if sockets >= service.settings.max_sessions:
            limit = service.settings.max_sessions
            answer = {
                "error": f"{limit} OpenEnv sessions are open (one per sandbox session); close one or retry"
            }
            return json_response(answer, 429, {"Retry-After": "5"})
        settings = service.settings
        socket = web.WebSocketResponse(
            max_msg_size=settings.max_body_bytes,
            # no permessage-deflate: a compressed frame is a protocol error (a 30 KiB frame inflated to
            # ~850 MiB of parsed JSON), as compressed HTTP bodies get 415
            compress=False,
            # a client that stops answering pings (its pod gone without closing) is closed, and one
            # silent for as long as an idle session lives too: neither keeps an OpenEnv slot
            heartbeat=settings.ws_heartbeat_seconds,
            receive_timeout=settings.session_idle_seconds,
        )
        await socket.prepare(request)
        episode = Episode(service)
        sockets += 1
        try:
            async for message in socket:
                if message.type == WSMsgType.BINARY:
                    await socket.send_str(_error("INVALID_JSON", "send JSON text messages"))
                    continue
                if message.type != WSMsgType.TEXT:
                    break
                answer = await _answer(episode, message.data)
                if answer is None:
                    break
                await socket.send_str(answer)
        except TimeoutError:  # nothing received for session_idle_seconds
            pass
        finally:
            sockets -= 1
            await asyncio.shield(episode.close())
            await socket.close()
        return socket

    @routes.post("/reset")
    async def reset(request: web.Request) -> web.Response:
        body = await read_json(request) if request.can_read_body else {}
        try:
            return json_response(await Episode(service).reset(require_object(body)))
        except ActionError as exc:
            raise RequestError(str(exc), 422) from None

    @routes.post("/step")
    async def step(request: web.Request) -> web.Response:
        """One call outside any episode (OpenEnv's HTTP step is stateless): code runs in a fresh process."""
        body = require_object(await read_json(request))
        if "action" not in body:
            raise RequestError(f'the body is {{"action": {{...}}}}; {ACTION_HELP}', 422)
        try:
            name, arguments, timeout = parse_action(
                {**require_object(body["action"], "action"), "timeout_s": body.get("timeout_s")}, service
            )
        except ActionError as exc:
            raise RequestError(str(exc), 422) from None
        episode = Episode(service)
        python = episode.python_tool()
        if not name and python is None:
            raise RequestError(
                f"this pool has no python tool to run code; it serves {', '.join(service.tools)}", 422
            )
        tool = name or (python.name if python else "")
        try:
            return json_response(observation(await service.call(tool, arguments, PROTOCOL, timeout), tool))
        except ToolInputError as exc:
            return json_response(_refused(tool, str(exc), outcome.FAULT_CODE))

    @routes.get("/state")
    async def state(request: web.Request) -> web.Response:
        return json_response(Episode(service).state())

    @routes.get("/health")
    async def health(request: web.Request) -> web.Response:
        """OpenEnv clients poll this before they start episodes: it answers as /readyz decides (its
        check, shared by every probe), healthy only when a call would run, else 503 with why."""
        problems = await service.readiness()
        if problems:
            return json_response({"status": "unhealthy", "problem": problems[0], "problems": problems}, 503)
        return json_response({"status": "healthy"})

    @routes.get("/schema")
    async def schema(request: web.Request) -> web.Response:
        return json_response(
            {"action": action_schema(service), "observation": OBSERVATION_SCHEMA, "state": STATE_SCHEMA}
        )

    @routes.get("/metadata")
    async def metadata(request: web.Request) -> web.Response:
        return json_response(
            {
                "name": SERVER_NAME,
                "description": DESCRIPTION,
                "version": server_version(),
            }
        )

    return routes
