"""Validation of the pool's own API bodies: pydantic models of the bodies (strict: no "5" for 5),
(typed dicts), whose errors become a RequestError whose message names the field and what to send (ours, not
pydantic's: `error_message` maps each)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal, NotRequired

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError
from typing_extensions import TypedDict  # pydantic reads typing's only from Python 3.12

from tool_sandbox.calls import ExecuteRequest, RequestError, shown

MAX_BATCH = 1024
# Values (objects, arrays and their elements) one body may hold. Parsed, each costs 30-100 bytes: a body
# within the size limit (32 MiB) of small objects (`[{},{},...]`) held ~800 MiB while parsed. 2^20 values
# are ~100 MiB at most; a code string, a file's base64 or a long answer is one value, whatever it holds.
MAX_JSON_VALUES = 1 << 20
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
# the error type of a check of ours whose message is already the user's (see `validation_error`)
OUR_MESSAGE = "request"


def parse_json(raw: bytes) -> Any:
    """The one JSON reader of every dialect (Python's json, not pydantic's: it rejects NaN and
    Infinity anywhere in a body, nests as deep as the interpreter allows and reads integers of any
    length a body may carry, as the pool always has)."""
    if not raw:
        raise RequestError("empty request body; send a JSON object")
    values = json_values(raw)
    if values > MAX_JSON_VALUES:
        raise RequestError(
            f"request body holds about {values} JSON values (objects, arrays and their elements), more"
            f" than the {MAX_JSON_VALUES} a body may hold; send fewer, or one string instead of many values",
            413,
        )
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise RequestError("request body nests JSON too deeply; send a flatter body") from None
    except ValueError as exc:  # an integer of more digits than Python converts (int_max_str_digits)
        raise RequestError(f"request body holds a number too long to read ({exc}); send shorter") from None


def json_values(raw: bytes) -> int:
    """An upper bound of the values in a JSON text, without parsing it: its objects, arrays and commas
    (+1). Counted over the whole text first (C, ~10 ms for 32 MiB); only where that passes the bound are
    the strings taken out before counting again (a regex, ~50 ns a byte: a body with more than 2^20 of
    these characters inside its strings). A text that is not JSON is counted as well as it goes and
    refused by the parser after."""

    def structural(text: bytes) -> int:
        return text.count(b"{") + text.count(b"[") + text.count(b",") + 1

    rough = structural(raw)
    return rough if rough <= MAX_JSON_VALUES else structural(_STRING.sub(b"", raw))


def _reject_constant(name: str) -> Any:
    raise RequestError(f"request body contains {name}, which is not JSON; send finite numbers")


def require_object(body: Any, what: str = "request body") -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(f"{what} must be a JSON object, got {json_kind(body)}")
    return body


def our_error(message: str) -> PydanticCustomError:
    """Raised in a validator: `message` reaches the user as it is."""
    return PydanticCustomError(OUR_MESSAGE, "{message}", {"message": message})


# What an error of a field says, by field name: (pydantic's error, the value sent) -> our message.
FieldMessages = Mapping[str, Callable[[ErrorDetails, Any], str]]


def error_message(error: ErrorDetails, messages: FieldMessages) -> str:
    """Our message for one of pydantic's errors: a check of ours says it already; else the
    field's entry in `messages` (what to send), given the value sent."""
    if error["type"] == OUR_MESSAGE:
        return error["ctx"]["message"]
    names = [part for part in error["loc"] if isinstance(part, str)]  # with a union's tags ("str")
    field = next((name for name in reversed(names) if name in messages), names[-1] if names else "")
    value = None if error["type"] == "missing" else error["input"]
    return messages[field](error, value) if field in messages else f"{field}: {error['msg']}"


def first_error(exc: ValidationError) -> ErrorDetails:
    """Fields are checked in the order they are declared, each model's in the order our messages
    always named them: the first error is the one to answer with."""
    return exc.errors(include_url=False, include_context=True)[0]


PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def strict_typed_dict(
    name: str, fields: dict[str, Any], extra: Literal["ignore", "allow"] = "ignore"
) -> type:
    """A body of `fields`, strict: no "5" for 5, no true for 1 (other keys: dropped, or kept
    unchecked with `extra="allow"`). The bodies are TypedDicts, not models: validated into a plain
    dict (a third of a model's cost, on every call's path)."""
    body = TypedDict(name, fields)  # type: ignore[operator]
    body.__pydantic_config__ = ConfigDict(strict=True, extra=extra)  # type: ignore[attr-defined]
    return body


def or_empty(value: Any) -> Any:
    """A falsy value (null, [], {}, "", 0, false) read as an empty list: none given."""
    return value or []


def typed_dict(name: str, fields: dict[str, Any]) -> TypeAdapter[dict[str, Any]]:
    return TypeAdapter(strict_typed_dict(name, fields))


@functools.cache
def execute_body(tools: tuple[str, ...]) -> TypeAdapter[dict[str, Any]]:
    """`{tool, input, timeoutSeconds?, session?, sample?}` for one of `tools` (one per tool set, so a
    tool's name is checked by pydantic itself, without a validator of ours on the hot path)."""
    return typed_dict("ExecuteBody", execute_fields(tools))


def execute_fields(tools: tuple[str, ...]) -> dict[str, Any]:
    return {
        "tool": Literal[tools],
        "input": Any,  # required, null allowed: what it must be is the tool's to say
        "timeoutSeconds": NotRequired[PositiveFinite | None],
        "session": NotRequired[str | None],
        "sample": NotRequired[dict[str, Any] | None],
    }


def execute_messages(tools: Iterable[str]) -> FieldMessages:
    served = ", ".join(tools)

    def tool(error: ErrorDetails, value: Any) -> str:
        if isinstance(value, str):  # not one served (or, to pydantic, not Unicode: a lone surrogate)
            return f"unknown tool {value!r}; this pool serves {served}"
        return f"tool is required: a string naming one of {served}"

    return {
        "tool": tool,
        "input": lambda *_: "input is required (code for python, a query for search, a JSON body for http)",
        "timeoutSeconds": lambda _, got: f"timeoutSeconds must be a positive finite number, got {shown(got)}",
        "session": lambda _, got: f"session must be a string id from POST /v1/sessions, got {json_kind(got)}",
        "sample": lambda _, got: (
            "sample must be a JSON object of the row's values for a function tool's keyword-only "
            f"parameters, got {json_kind(got)}"
        ),
    }


def _request(body: dict[str, Any]) -> ExecuteRequest:
    return ExecuteRequest(
        body["tool"], body["input"], body.get("timeoutSeconds"), body.get("session"), body.get("sample")
    )


def parse_execute(body: Any, tools: Mapping[str, Any], where: str = "") -> ExecuteRequest:
    """`POST /v1/execute`'s body (`where` prefixes each message: a batch entry's place)."""
    body = require_object(body, f"{where}body" if where else "request body")
    try:
        return _request(execute_body(tuple(tools)).validate_python(body))
    except ValidationError as exc:
        raise RequestError(where + error_message(first_error(exc), execute_messages(tools))) from None


CALLS_REQUIRED = "calls is required: a non-empty list of {tool, input, timeoutSeconds?, session?}"


@functools.cache
def batch_body(tools: tuple[str, ...]) -> TypeAdapter[dict[str, Any]]:
    """`{calls: [execute body, ...]}`, 1 to MAX_BATCH of them."""
    call = strict_typed_dict("ExecuteBody", execute_fields(tools))
    return typed_dict(
        "BatchBody", {"calls": Annotated[list[call], Field(min_length=1, max_length=MAX_BATCH)]}
    )


def parse_batch(body: Any, tools: Mapping[str, Any]) -> list[ExecuteRequest]:
    """`POST /v1/execute/batch`'s body."""
    body = require_object(body)
    try:
        return [_request(call) for call in batch_body(tuple(tools)).validate_python(body)["calls"]]
    except ValidationError as exc:
        error = first_error(exc)
    if error["loc"] == ("calls",):  # the list itself
        if error["type"] == "too_long":
            raise RequestError(f"a batch holds at most {MAX_BATCH} calls, got {len(body['calls'])}; split it")
        raise RequestError(CALLS_REQUIRED)
    where = f"calls[{error['loc'][1]}]."
    if len(error["loc"]) == 2:  # the entry is not an object
        raise RequestError(f"{where}body must be a JSON object, got {json_kind(error['input'])}")
    raise RequestError(where + error_message(error, execute_messages(tools)))


@functools.cache
def session_body(session_tools: tuple[str, ...]) -> TypeAdapter[dict[str, Any]]:
    """`POST /v1/sessions`: `{tool}`, a tool with sessions."""
    return typed_dict("SessionBody", {"tool": Literal[session_tools]})


def parse_session_create(body: Any, session_tools: list[str]) -> str:
    body = require_object(body)
    try:
        if session_tools:
            return session_body(tuple(session_tools)).validate_python(body)["tool"]
    except ValidationError:
        pass
    raise RequestError(f"tool must name a tool with sessions: one of {', '.join(session_tools) or '(none)'}")


def json_kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
