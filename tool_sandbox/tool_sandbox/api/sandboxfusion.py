"""SandboxFusion's `POST /run_code` dialect, so verl recipes that call SandboxFusion
(`call_sandbox_api`) run against the pool unchanged: pure translation both ways, and the route."""

from __future__ import annotations

import base64
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, NotRequired

from aiohttp import web
from pydantic import AfterValidator, BeforeValidator, Field, TypeAdapter, ValidationError

from tool_sandbox.api.requests import (
    FieldMessages,
    error_message,
    first_error,
    json_kind,
    or_empty,
    our_error,
    require_object,
    strict_typed_dict,
)
from tool_sandbox.api.web import json_response, read_json
from tool_sandbox.calls import RequestError, shown
from tool_sandbox.config import ServerSettings
from tool_sandbox.sandbox import outcome
from tool_sandbox.service import Service
from tool_sandbox.tools.base import ToolResult

PROTOCOL = "sandboxfusion"

PYTHON_LANGUAGES = ("python", "python3")
MAX_FETCH_FILES = 64
# `files` are written by the worker before the code starts, synchronously: their number is
# bounded (their bytes are bounded by the body size).
MAX_FILES = 256
MAX_PATH_CHARS = 1024
MAX_PATH_DEPTH = 32
MAX_NAME_BYTES = 255  # one path component (the kernel's NAME_MAX)
DEFAULT_RUN_TIMEOUT = 10.0  # SandboxFusion's RunCodeRequest.run_timeout


@dataclass(frozen=True)
class Limits:
    """What a /run_code call runs with."""

    seconds: float
    memory_mib: int
    max_output: int


def limits(call: RunCode, settings: ServerSettings) -> Limits:
    """SandboxFusion's defaults where the request is silent, the request's own values up to the
    pool's maxima (never silently lowered below what was asked unless the pool cannot give it)."""
    seconds = min(call.run_timeout or DEFAULT_RUN_TIMEOUT, settings.max_timeout_seconds)
    memory = min(call.memory_limit_mb or settings.max_memory_mib, settings.max_memory_mib)
    return Limits(seconds, memory, settings.max_output_bytes)


@dataclass(frozen=True)
class RunCode:
    code: str
    language: str
    run_timeout: float | None
    memory_limit_mb: int | None
    stdin: str
    files: dict[str, str] = field(default_factory=dict)
    fetch_files: list[str] = field(default_factory=list)


def _ours(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A check of ours as a pydantic validator: its RequestError's message reaches the user."""

    def validator(value: Any) -> Any:
        try:
            return check(value)
        except RequestError as exc:
            raise our_error(str(exc)) from None

    return validator


def _fetch_count(fetch: list[str]) -> list[str]:
    if len(fetch) > MAX_FETCH_FILES:
        raise RequestError(f"fetch_files names {len(fetch)} files; at most {MAX_FETCH_FILES} per call")
    for i, name in enumerate(fetch):
        relative_path(name, f"fetch_files[{i}]")
    return fetch


_fetched = _ours(_fetch_count)
_files = _ours(lambda files: parse_files(files or {}))


def _finite_message(key: str) -> Callable[[Any, Any], str]:
    return lambda _, got: f"{key} must be a finite number, got {shown(got)}"


Finite = NotRequired[Annotated[float, Field(allow_inf_nan=False)] | None]
# SandboxFusion's RunCodeRequest, as verl's call_sandbox_api sends it; checked in this order (a
# falsy files or fetch_files, e.g. [], means none, as the pool has always read it).
RUN_CODE = TypeAdapter(
    strict_typed_dict(
        "RunCodeBody",
        {
            "code": str,
            "language": str,
            "run_timeout": Finite,
            "memory_limit_MB": Finite,
            "compile_timeout": Finite,
            "stdin": NotRequired[str | None],
            "files": NotRequired[Annotated[Any, BeforeValidator(_files)]],
            "fetch_files": NotRequired[
                Annotated[list[str], BeforeValidator(or_empty), AfterValidator(_fetched)]
            ],
        },
    )
)
RUN_CODE_MESSAGES: FieldMessages = {
    "code": lambda *_: "code is required: the program text as a string",
    "language": lambda *_: 'language is required: a string such as "python"',
    **{key: _finite_message(key) for key in ("run_timeout", "memory_limit_MB", "compile_timeout")},
    "stdin": lambda *_: "stdin must be a string or null",
    "fetch_files": lambda *_: "fetch_files must be a list of file paths",
}


def parse_run_code(body: Any) -> RunCode:
    body = require_object(body)
    try:
        call = RUN_CODE.validate_python(body)
    except ValidationError as exc:
        raise RequestError(error_message(first_error(exc), RUN_CODE_MESSAGES)) from None
    run_timeout, memory = call.get("run_timeout"), call.get("memory_limit_MB")
    return RunCode(
        call["code"],
        call["language"],
        run_timeout if run_timeout and run_timeout > 0 else None,
        int(memory) if memory and memory > 0 else None,
        call.get("stdin") or "",
        call.get("files") or {},
        call.get("fetch_files") or [],
    )


def parse_files(files: Any) -> dict[str, str]:
    """`files`: relative paths inside the working directory to base64 contents (null entries are
    dropped, as in SandboxFusion); no path may be a directory of another."""
    if not isinstance(files, dict):
        raise RequestError(f"files must map file paths to base64 strings, got {json_kind(files)}")
    if len(files) > MAX_FILES:
        raise RequestError(f"files holds {len(files)} files; at most {MAX_FILES} per call (zip them)")
    kept: dict[str, str] = {}
    directories: set[str] = set()
    for name, content in files.items():
        if content is None:
            continue
        if not isinstance(content, str):
            raise RequestError(f"files[{name!r}] must be a base64 string, got {json_kind(content)}")
        try:
            base64.b64decode(content, validate=True)
        except ValueError as exc:  # binascii.Error, or a character base64 has not (not ASCII)
            raise RequestError(f"files[{name!r}] is not valid base64 ({exc}); base64-encode it") from exc
        path = relative_path(name, "files key")
        kept[path] = content
        parts = path.split("/")
        directories.update("/".join(parts[:i]) for i in range(1, len(parts)))
    for name in kept:
        if name in directories:
            raise RequestError(f"files {name!r} cannot be a file and a directory (of another file) at once")
    return kept


def relative_path(name: str, what: str) -> str:
    """A file path inside the working directory, normalised; RequestError saying what is wrong
    (checked here, in the server, so the worker never meets a name it cannot write)."""

    def bad(why: str) -> RequestError:
        shown = name if len(name) <= 80 else name[:80] + "..."
        return RequestError(f"{what} {shown!r} {why}; send a relative file path inside the working directory")

    if not name or "\x00" in name:
        raise bad("is empty or contains a NUL character")
    if len(name) > MAX_PATH_CHARS:
        raise bad(f"is longer than {MAX_PATH_CHARS} characters")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise bad("is not valid Unicode (a lone surrogate)") from None
    if name.startswith("/") or name.endswith("/"):
        raise bad("starts or ends with '/'")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        raise bad("leaves the working directory (no '..')")
    if len(parts) > MAX_PATH_DEPTH:
        raise bad(f"is more than {MAX_PATH_DEPTH} directories deep")
    if any(len(part.encode()) > MAX_NAME_BYTES for part in parts):
        raise bad(f"has a name longer than {MAX_NAME_BYTES} bytes")
    return posixpath.join(*parts)


def unsupported_language(language: str) -> dict[str, Any]:
    return _response(
        "SandboxError", f"language {language!r} is not supported by this tool pool; it runs python only", None
    )


def no_python_tool() -> dict[str, Any]:
    return _response("SandboxError", "this tool pool has no tool of type python configured", None)


def to_response(result: ToolResult) -> dict[str, Any]:
    """A pool result in SandboxFusion's RunCodeResponse shape."""
    fault = result.whose_fault()
    if result.sandboxError or result.status == outcome.REJECTED:
        return _response("SandboxError", result.message or "sandbox error", None, fault)
    run_status = "TimeLimitExceeded" if result.status == outcome.TIMEOUT else "Finished"
    run_result = {
        "status": run_status,
        "execution_time": result.durationSeconds,
        "return_code": None if run_status == "TimeLimitExceeded" else result.exitCode,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }
    status = "Success" if result.status == outcome.OK else "Failed"
    response = _response(status, "", run_result, fault)
    response["files"] = result.files
    return response


def _response(
    status: str, message: str, run_result: dict[str, Any] | None, fault: str | None = outcome.FAULT_INFRA
) -> dict[str, Any]:
    """`fault` (docs/contracts.md): a SandboxError without a result (an unsupported language, no
    python tool) is the pool's, never the code's."""
    return {
        "status": status,
        "fault": fault,
        "message": message,
        "compile_result": None,
        "run_result": run_result,
        "executor_pod_name": os.environ.get("POD_NAME"),
        "files": {},
    }


def routes(service: Service) -> web.RouteTableDef:
    routes = web.RouteTableDef()

    @routes.post("/run_code")
    async def run_code(request: web.Request) -> web.Response:
        call = parse_run_code(await read_json(request))
        if call.language not in PYTHON_LANGUAGES:
            return json_response(unsupported_language(call.language))
        tool = service.tool_of_type("python")
        if tool is None:
            return json_response(no_python_tool())
        payload = {"code": call.code, "stdin": call.stdin}
        granted = limits(call, service.settings)
        result = await service.admit(
            tool.name,
            lambda: tool.run(  # a python tool runs a program under the limits it is given (PythonTool.run)
                payload,
                granted.seconds,
                memory_mib=granted.memory_mib,
                max_output=granted.max_output,
                files=call.files,
                fetch=call.fetch_files,
            ),
            PROTOCOL,
        )
        return json_response(to_response(result))

    return routes
