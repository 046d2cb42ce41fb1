"""Validation of the pool's own API bodies (pure): a bad body becomes a RequestError whose
message names the field and what was expected."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

MAX_BATCH = 1024


class RequestError(ValueError):
    """Answered with 400 (or `status`) and this message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ExecuteRequest:
    tool: str
    input: Any
    timeout: float | None
    session: str | None


def parse_json(raw: bytes) -> Any:
    if not raw:
        raise RequestError("empty request body; send a JSON object")
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise RequestError("request body nests JSON too deeply; send a flatter body") from None
    except ValueError as exc:  # an integer of more digits than Python converts (int_max_str_digits)
        raise RequestError(f"request body holds a number too long to read ({exc}); send shorter") from None


def _reject_constant(name: str) -> Any:
    raise RequestError(f"request body contains {name}, which is not JSON; send finite numbers")


def require_object(body: Any, what: str = "request body") -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"{what} must be a JSON object, got {json_kind(body)}")
    return body


def parse_execute(body: Any, tools: dict[str, Any], where: str = "") -> ExecuteRequest:
    """`{tool, input, timeoutSeconds?, session?}` for a configured tool."""
    body = require_object(body, f"{where}body" if where else "request body")
    tool = body.get("tool")
    if not isinstance(tool, str):
        raise RequestError(f"{where}tool is required: a string naming one of {', '.join(tools)}")
    if tool not in tools:
        raise RequestError(f"{where}unknown tool {tool!r}; this pool serves {', '.join(tools)}")
    if "input" not in body:
        raise RequestError(
            f"{where}input is required (code for python, a query for search, a JSON body for http)"
        )
    timeout = body.get("timeoutSeconds")
    if timeout is not None and not (finite(timeout) and timeout > 0):
        raise RequestError(f"{where}timeoutSeconds must be a positive finite number, got {shown(timeout)}")
    session = body.get("session")
    if session is not None and not isinstance(session, str):
        raise RequestError(
            f"{where}session must be a string id from POST /v1/sessions, got {json_kind(session)}"
        )
    return ExecuteRequest(tool, body["input"], None if timeout is None else float(timeout), session)


def parse_batch(body: Any, tools: dict[str, Any]) -> list[ExecuteRequest]:
    """`{calls: [execute request, ...]}`."""
    calls = require_object(body).get("calls")
    if not isinstance(calls, list) or not calls:
        raise RequestError("calls is required: a non-empty list of {tool, input, timeoutSeconds?, session?}")
    if len(calls) > MAX_BATCH:
        raise RequestError(f"a batch holds at most {MAX_BATCH} calls, got {len(calls)}; split it")
    return [parse_execute(call, tools, f"calls[{i}].") for i, call in enumerate(calls)]


def parse_session_create(body: Any, session_tools: list[str]) -> str:
    tool = require_object(body).get("tool")
    if not isinstance(tool, str) or tool not in session_tools:
        raise RequestError(
            f"tool must name a tool with sessions: one of {', '.join(session_tools) or '(none)'}"
        )
    return tool


def json_kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def finite(value: Any) -> bool:
    """A JSON number a float can hold: not a bool, not NaN or infinite, and no integer past a
    float's range (10**400 is valid JSON)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def shown(value: Any, chars: int = 40) -> str:
    """A value for an error message, cut short (a number can have thousands of digits)."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 128 else str(value)[: chars + 1]
    return text if len(text) <= chars else text[:chars] + "..."
