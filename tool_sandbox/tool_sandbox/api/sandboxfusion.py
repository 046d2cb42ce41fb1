"""SandboxFusion's `POST /run_code` dialect (pure translation both ways), so verl recipes that call
SandboxFusion (`call_sandbox_api`) run against the pool unchanged."""

from __future__ import annotations

import base64
import binascii
import math
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from tool_sandbox.api.requests import RequestError, json_kind, require_object
from tool_sandbox.sandbox import outcome
from tool_sandbox.tools.base import ToolResult

PYTHON_LANGUAGES = ("python", "python3")
MAX_FETCH_FILES = 64


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
    files = parse_files(body.get("files") or {})
    fetch = body.get("fetch_files") or []
    if not isinstance(fetch, list) or not all(isinstance(f, str) for f in fetch):
        raise RequestError("fetch_files must be a list of file paths")
    if len(fetch) > MAX_FETCH_FILES:
        raise RequestError(f"fetch_files names {len(fetch)} files; at most {MAX_FETCH_FILES} per call")
    return RunCode(
        code,
        language,
        run_timeout if run_timeout and run_timeout > 0 else None,
        int(memory) if memory and memory > 0 else None,
        stdin or "",
        files,
        fetch,
    )


def parse_files(files: Any) -> dict[str, str]:
    """`files`: relative paths inside the working directory to base64 contents (null entries are
    dropped, as in SandboxFusion); no path may be a directory of another."""
    if not isinstance(files, dict):
        raise RequestError(f"files must map file paths to base64 strings, got {json_kind(files)}")
    kept: dict[str, str] = {}
    for name, content in files.items():
        if content is None:
            continue
        if not isinstance(content, str):
            raise RequestError(f"files[{name!r}] must be a base64 string, got {json_kind(content)}")
        try:
            base64.b64decode(content, validate=True)
        except binascii.Error as exc:
            raise RequestError(f"files[{name!r}] is not valid base64 ({exc}); base64-encode it") from exc
        parts = PurePosixPath(name).parts
        bad = not name or name.startswith("/") or name.endswith("/") or "\x00" in name
        if bad or ".." in parts or posixpath.normpath(name) == ".":
            raise RequestError(
                f"files key {name!r} must be a relative file path inside the working directory"
                " (no '..', no leading '/')"
            )
        kept[posixpath.normpath(name)] = content
    for name in kept:
        parent = posixpath.dirname(name)
        while parent:
            if parent in kept:
                raise RequestError(
                    f"files {parent!r} and {name!r} conflict: {parent!r} cannot be a file and a directory"
                )
            parent = posixpath.dirname(parent)
    return kept


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


def _number(body: dict[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(f"{key} must be a finite number, got {value!r}")
    return float(value)
