"""SandboxFusion's `POST /run_code` dialect (pure translation both ways), so verl recipes that call
SandboxFusion (`call_sandbox_api`) run against the pool unchanged."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tool_sandbox.api.requests import RequestError, require_object
from tool_sandbox.sandbox import outcome
from tool_sandbox.tools.base import ToolResult

PYTHON_LANGUAGES = ("python", "python3")


@dataclass(frozen=True)
class RunCode:
    code: str
    language: str
    run_timeout: float | None
    memory_limit_mb: int | None
    stdin: str
    files: dict[str, str] = field(default_factory=dict)
    fetch_files: list[str] = field(default_factory=list)


def parse_run_code(body: Any) -> RunCode:
    body = require_object(body)
    code, language = body.get("code"), body.get("language")
    if not isinstance(code, str):
        raise RequestError("code is required: the program text as a string")
    if not isinstance(language, str):
        raise RequestError('language is required: a string such as "python"')
    run_timeout = _number(body, "run_timeout")
    memory = _number(body, "memory_limit_MB")
    _number(body, "compile_timeout")
    stdin = body.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise RequestError("stdin must be a string or null")
    files = body.get("files") or {}
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in files.items()
    ):
        raise RequestError("files must map file paths to base64 strings")
    fetch = body.get("fetch_files") or []
    if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch):
        raise RequestError("fetch_files must be a list of file paths")
    return RunCode(
        code,
        language,
        run_timeout if run_timeout and run_timeout > 0 else None,
        int(memory) if memory and memory > 0 else None,
        stdin or "",
        {k: v for k, v in files.items() if v is not None},
        fetch,
    )


def unsupported_language(language: str) -> dict[str, Any]:
    return _response(
        "SandboxError", f"language {language!r} is not supported by this tool pool; it runs python only", None
    )


def no_python_tool() -> dict[str, Any]:
    return _response("SandboxError", "this tool pool has no tool of type python configured", None)


def to_response(result: ToolResult) -> dict[str, Any]:
    """A pool result in SandboxFusion's RunCodeResponse shape."""
    if result.sandboxError or result.status == outcome.REJECTED:
        return _response("SandboxError", result.message or "sandbox error", None)
    run_status = "TimeLimitExceeded" if result.status == outcome.TIMEOUT else "Finished"
    run_result = {
        "status": run_status,
        "execution_time": result.durationSeconds,
        "return_code": None if run_status == "TimeLimitExceeded" else result.exitCode,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }
    status = "Success" if result.status == outcome.OK else "Failed"
    response = _response(status, "", run_result)
    response["files"] = result.files
    return response


def _response(status: str, message: str, run_result: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "status": status,
        "message": message,
        "compile_result": None,
        "run_result": run_result,
        "executor_pod_name": os.environ.get("POD_NAME"),
        "files": {},
    }


def _number(body: dict[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"{key} must be a number, got {value!r}")
    return float(value)
