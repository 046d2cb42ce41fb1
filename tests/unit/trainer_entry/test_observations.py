"""What the model reads back from a python tool's call in each observationFormat (trainer_entry.observations,
issue 38, item 4): the default format as it always was, sandbox-fusion as verl's SandboxFusionTool shows
SandboxFusion's answer (stdout then stderr of a finished run, whatever its exit code; `no stdout here` for
anything else), fenced code unwrapped, and the formats the CRD's enum."""

from __future__ import annotations

import time

import pytest
from toolrl_api.crd_schema import SPEC_SCHEMA
from trainer_entry.observations import (
    OBSERVATION_FORMATS,
    SANDBOX_FUSION_UNFINISHED,
    observation,
    unwrap_fenced_code,
)
from trainer_entry.pool_client import CallResult, _parse

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/tmp/w/main.py", line 2, in <module>\n'
    "    1/0\n"
    "ZeroDivisionError: division by zero\n"
)


def answer(status: str, **fields: object) -> dict:
    """A pool's /v1/execute answer of a python call (the shape tool_sandbox's ToolResult.to_json gives)."""
    stdout = str(fields.get("stdout", ""))
    body = {
        "status": status,
        "output": stdout,
        "stdout": stdout,
        "stderr": "",
        "exitCode": 0 if status == "ok" else 1,
        "durationSeconds": 0.02,
        "truncated": False,
        "message": "",
        "sandboxError": False,
        "fault": None if status == "ok" else "code",
    }
    body.update(fields)
    return body


def read_back(doc: dict, fmt: str) -> str:
    """The observation of a pool answer, as PoolTool hands it on: parsed, then worded in the tool's format."""
    result = _parse(doc, attempts=1)
    result.observation_format = fmt
    return result.observation()


def test_the_formats_are_the_crds_enum() -> None:
    item = SPEC_SCHEMA["properties"]["tools"]["items"]
    assert tuple(item["properties"]["observationFormat"]["enum"]) == OBSERVATION_FORMATS
    assert "observationFormat" not in item.get("required", [])  # unset means default
    assert "default" not in item["properties"]["observationFormat"]  # else every tool type would carry it


# ---- the default format: unchanged, now written down (tool_sandbox/README.md, "What the model reads back")


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        (answer("ok", stdout="42\n"), "42\n"),
        # a warning beside printed output is not shown; alone, it is
        (answer("ok", stdout="42\n", stderr="DeprecationWarning: x\n"), "42\n"),
        (answer("ok", stderr="DeprecationWarning: x\n"), "DeprecationWarning: x\n"),
        (answer("ok"), ""),
        # a failure: "Error: " and stderr; what the program printed first is dropped
        (answer("error", stdout="partial\n", stderr=TRACEBACK), "Error: " + TRACEBACK),
        (answer("error", stdout="exiting\n", exitCode=3), "Error: exiting\n"),
        (
            answer("timeout", stdout="partial\n", exitCode=-9, durationSeconds=1.004),
            "Error: the tool call timed out after 1.0s.",
        ),
        (
            answer("killed", exitCode=-11),
            "Error: the tool process was killed (it exceeded a resource limit).",
        ),
        (
            answer(
                "ok",
                stdout="x" * 8 + "\n[... output truncated: 9000 bytes, first 8 shown ...]",
                truncated=True,
            ),
            "x" * 8 + "\n[... output truncated: 9000 bytes, first 8 shown ...]\n[output truncated]",
        ),
    ],
)
def test_the_default_format(doc: dict, text: str) -> None:
    assert read_back(doc, "default") == text


# ---- sandbox-fusion: what verl's SandboxFusionTool (ReTool) shows ------------------------------------------


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        (answer("ok", stdout="42\n"), "42\n"),
        (answer("ok", stdout="42\n", stderr="DeprecationWarning: x\n"), "42\nDeprecationWarning: x\n"),
        (answer("ok"), ""),
        # a failure: stdout directly followed by stderr, no prefix, no separator
        (answer("error", stdout="partial\n", stderr=TRACEBACK), "partial\n" + TRACEBACK),
        (answer("error", stdout="no newline", stderr=TRACEBACK), "no newline" + TRACEBACK),
        (answer("error", stdout="exiting\n", exitCode=3), "exiting\n"),
        # a signal (a segfault, the output flood): SandboxFusion's run still "Finished", with what was written
        (answer("killed", stdout="before\n", exitCode=-11), "before\n"),
        # the stream's own marker is all a cut shows
        (
            answer(
                "ok",
                stdout="x" * 8 + "\n[... output truncated: 9000 bytes, first 8 shown ...]",
                truncated=True,
            ),
            "x" * 8 + "\n[... output truncated: 9000 bytes, first 8 shown ...]",
        ),
        # not finished: SandboxFusion's TimeLimitExceeded, its SandboxError
        (answer("timeout", stdout="partial\n", exitCode=-9), SANDBOX_FUSION_UNFINISHED),
        (answer("error", sandboxError=True, fault="infra", message="worker lost"), SANDBOX_FUSION_UNFINISHED),
    ],
)
def test_the_sandbox_fusion_format(doc: dict, text: str) -> None:
    assert read_back(doc, "sandbox-fusion") == text


def test_sandbox_fusion_without_a_pool_answer_and_a_refused_call() -> None:
    """No answer from the pool (unreachable, rejected, the trainer's own timeout) is a run that did not
    finish; a call refused before it was sent (no code argument) reads as in the default format."""
    for status in ("unreachable", "rejected", "timeout", "error"):
        result = CallResult(status=status, error="HTTP 503", observation_format="sandbox-fusion")
        assert observation(result) == SANDBOX_FUSION_UNFINISHED, status
    refused = CallResult(
        status="invalid",
        error="missing argument 'code'",
        stderr="invalid call of python: missing argument 'code'",
        observation_format="sandbox-fusion",
    )
    assert refused.observation() == "Error: invalid call of python: missing argument 'code'"


# ---- fenced code ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "runs"),
    [
        ("```python\nprint(1)\n```", "print(1)"),
        ("Let me compute it.\n```python\nx = 6 * 7\nprint(x)\n```\nThat should do.", "x = 6 * 7\nprint(x)"),
        ("```py\nprint(1)\n```", "print(1)"),
        ("```Python3  \nprint(1)\n```", "print(1)"),
        ("```\nprint(1)\n```", "print(1)"),
        ("```python print(1)```", "print(1)"),
        # a block indented as a whole (inside a list item) is dedented; its own indentation is kept
        ("```python\n    for i in range(2):\n        print(i)\n```", "for i in range(2):\n    print(i)"),
        # the first block that holds Python; a block of another language is not run
        ("```text\nhello\n```\n```python\nprint(2)\n```\n```python\nprint(3)\n```", "print(2)"),
        ("```text\nhello\n```", "```text\nhello\n```"),
        # no block: the code runs as it is, a ``` inside a string included
        ("print(1)", "print(1)"),
        ('print("```")', 'print("```")'),
        ('s = "```x```"\nprint(s)', 's = "```x```"\nprint(s)'),
        ("```python\nprint(1)", "```python\nprint(1)"),  # an unclosed fence is no block
    ],
)
def test_fenced_code_is_unwrapped(code: str, runs: str) -> None:
    assert unwrap_fenced_code(code) == runs


@pytest.mark.parametrize(
    "text", ["```" + " " * 200_000, "```python" * 50_000, "```x" * 50_000, "`" * 200_001]
)
def test_unwrapping_takes_linear_time(text: str) -> None:
    started = time.perf_counter()
    unwrap_fenced_code(text)
    assert time.perf_counter() - started < 1.0
