import json
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from tool_sandbox.api import mcp, openenv, sandboxfusion, verltool
from tool_sandbox.api.requests import (
    MAX_JSON_VALUES,
    RequestError,
    json_values,
    parse_batch,
    parse_execute,
    parse_json,
)
from tool_sandbox.api.web import SETTINGS
from tool_sandbox.tools.base import ToolResult

TOOLS = {"python": object(), "search": object()}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object, got list"),
        ({"input": "x"}, "tool is required"),
        ({"tool": "ruby", "input": "x"}, "unknown tool 'ruby'; this pool serves python, search"),
        ({"tool": "python"}, "input is required"),
        (
            {"tool": "python", "input": "x", "timeoutSeconds": "5"},
            "timeoutSeconds must be a positive finite number",
        ),
        (
            {"tool": "python", "input": "x", "timeoutSeconds": 0},
            "timeoutSeconds must be a positive finite number",
        ),
        ({"tool": "python", "input": "x", "session": 7}, "session must be a string"),
    ],
)
def test_execute_requests_are_validated(body: object, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_execute(body, TOOLS)


def test_bad_json_and_batches_name_the_problem() -> None:
    with pytest.raises(RequestError, match="not valid JSON"):
        parse_json(b"{nope")
    with pytest.raises(RequestError, match="empty request body"):
        parse_json(b"")
    with pytest.raises(RequestError, match=r"calls\[1\]\.unknown tool"):
        parse_batch({"calls": [{"tool": "python", "input": "1"}, {"tool": "x", "input": "1"}]}, TOOLS)
    assert parse_batch({"calls": [{"tool": "search", "input": "q"}]}, TOOLS)[0].tool == "search"


def test_the_values_a_body_may_hold_are_bounded_strings_whatever_they_hold_are_one() -> None:
    """A body's values are counted before it is parsed (a 31 MiB body of `{}` held ~800 MiB parsed)."""
    # an upper bound: {, [, {, 2 commas and + 1, and the comma inside "x,y" (strings are taken out only
    # where the bound would refuse the body)
    assert json_values(b'{"a": [1, 2, {"b": "x,y"}]}') == 7
    many = b"[" + b"{}," * MAX_JSON_VALUES + b"{}]"
    with pytest.raises(RequestError, match="more than the 1048576 a body may hold") as refused:
        parse_json(many)
    assert refused.value.status == 413
    # commas, brackets and escaped quotes inside a string are not values: counted again without strings
    text = json.dumps({"input": 'a, [b], {"c"}' * MAX_JSON_VALUES})
    assert json_values(text.encode()) == 2
    assert parse_json(text.encode())["input"].startswith('a, [b], {"c"}')


def test_run_code_request_as_verl_sends_it() -> None:
    call = sandboxfusion.parse_run_code(
        {
            "compile_timeout": 10,
            "run_timeout": 10,
            "code": "print(1)",
            "stdin": None,
            "memory_limit_MB": 1024,
            "language": "python",
            "files": {},
            "fetch_files": [],
        }
    )
    assert (call.code, call.run_timeout, call.memory_limit_mb, call.stdin) == ("print(1)", 10.0, 1024, "")
    with pytest.raises(RequestError, match="code is required"):
        sandboxfusion.parse_run_code({"language": "python"})
    with pytest.raises(RequestError, match="run_timeout must be a finite number"):
        sandboxfusion.parse_run_code({"code": "", "language": "python", "run_timeout": "10"})


def test_run_code_response_uses_sandboxfusion_statuses() -> None:
    ok = sandboxfusion.to_response(ToolResult(status="ok", stdout="1\n", exitCode=0, durationSeconds=0.01))
    assert ok["status"] == "Success" and ok["run_result"]["status"] == "Finished"
    assert ok["run_result"]["return_code"] == 0 and ok["compile_result"] is None
    failed = sandboxfusion.to_response(ToolResult(status="error", stderr="Traceback", exitCode=1))
    assert failed["status"] == "Failed" and failed["run_result"]["return_code"] == 1
    slow = sandboxfusion.to_response(ToolResult(status="timeout", exitCode=-9))
    assert slow["status"] == "Failed" and slow["run_result"]["status"] == "TimeLimitExceeded"
    assert slow["run_result"]["return_code"] is None
    broken = sandboxfusion.to_response(ToolResult(status="error", message="setup", sandboxError=True))
    assert broken["status"] == "SandboxError" and broken["run_result"] is None
    assert sandboxfusion.unsupported_language("cpp")["status"] == "SandboxError"


def test_verltool_requests_and_actions() -> None:
    steps = verltool.parse_request(
        {
            "trajectory_ids": ["a", "b"],
            "actions": ["x", "y"],
            "finish": [False, True],
            "is_last_step": [False, True],
        }
    )
    assert [s.finish for s in steps] == [False, True] and steps[1].extra["is_last_step"] is True
    with pytest.raises(RequestError, match="trajectory_ids has 2 entries but actions has 1"):
        verltool.parse_request({"trajectory_ids": ["a", "b"], "actions": ["x"]})
    with pytest.raises(RequestError, match="finish must be a list with one entry per trajectory"):
        verltool.parse_request({"trajectory_ids": ["a"], "actions": ["x"], "finish": True})
    assert verltool.extract("think <python>print(1)</python> then") == ("python", "print(1)")
    assert verltool.extract("```python\nx = 2\nprint(x)\n```") == ("python", "x = 2\nprint(x)")
    assert verltool.extract("<search> capital of France </search>") == ("search", "capital of France")
    assert verltool.extract("The answer is 4.") is None
    text = ToolResult(status="timeout", output="partial", message="wall-clock timeout").observation()
    assert text == "partial\n[timeout: wall-clock timeout]"


def test_a_tool_name_with_a_lone_surrogate_is_an_unknown_tool() -> None:
    """JSON may carry a lone surrogate ("\\ud800"); pydantic calls such a string not Unicode, but the
    client sent a string: it names no tool, it is not missing."""
    with pytest.raises(RequestError, match=r"unknown tool '\\ud800'; this pool serves python, search"):
        parse_execute({"tool": "\ud800", "input": "x"}, TOOLS)
    with pytest.raises(RequestError, match=r"calls\[0\]\.unknown tool '\\ud800'"):
        parse_batch({"calls": [{"tool": "\ud800", "input": "x"}]}, TOOLS)


def test_run_code_file_content_that_is_not_ascii_is_not_base64() -> None:
    with pytest.raises(
        RequestError, match=r"files\['a.txt'\] is not valid base64 \(.*ASCII.*\); base64-encode it"
    ):
        sandboxfusion.parse_run_code({"code": "", "language": "python", "files": {"a.txt": "é"}})


SERVICE = SimpleNamespace(tools=TOOLS)
HELP = "an action is"


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ([], "the action must be a JSON object, got list"),
        ({}, f"the action has neither code nor tool; {HELP}"),
        ({"tool": 5}, f"the action has neither code nor tool; {HELP}"),
        ({"tool": "ruby"}, "unknown tool 'ruby'; this pool serves python, search"),
        ({"tool": "\ud800"}, r"unknown tool '\\ud800'"),
        ({"tool": "x" * 100}, "unknown tool 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...; this pool"),
        ({"tool": "python", "arguments": None}, "arguments must be an object, got null"),
        ({"tool": "python", "arguments": [1]}, "arguments must be an object, got list"),
        ({"code": 5, "tool": "python"}, f"code and stdin must be strings; {HELP}"),
        ({"code": "1", "stdin": None}, f"code and stdin must be strings; {HELP}"),
        # the timeout is checked first, whichever kind the action is
        ({"code": 5, "timeout_s": True}, "timeout_s must be a positive number of seconds, got True"),
        ({"tool": 5, "timeout_s": 0}, "timeout_s must be a positive number of seconds, got 0"),
        ({"code": "1", "timeout_s": 10**400}, "timeout_s must be a positive number of seconds, got 1000"),
    ],
)
def test_openenv_actions_are_validated_in_order(action: object, message: str) -> None:
    with pytest.raises((openenv.ActionError, RequestError), match=message):
        openenv.parse_action(action, SERVICE)


def test_openenv_actions_of_each_kind() -> None:
    assert openenv.parse_action({"code": "1", "tool": "ruby", "timeout_s": 2}, SERVICE) == (
        "",
        {"code": "1", "stdin": ""},
        2,
    )
    assert openenv.parse_action({"tool": "search", "arguments": {"query": "q"}}, SERVICE) == (
        "search",
        {"query": "q"},
        None,
    )


async def test_openenv_episode_ids_up_to_255_characters_any_string() -> None:
    episode = openenv.Episode(SimpleNamespace(tools=TOOLS))
    await episode.reset({"episode_id": "\ud800" * 255})  # a lone surrogate is a string JSON allows
    assert episode.episode_id == "\ud800" * 255
    for bad in ["x" * 256, 7, ["e"]]:
        with pytest.raises(
            openenv.ActionError, match="episode_id must be a string of at most 255 characters"
        ):
            await episode.reset({"episode_id": bad})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # the lengths first, then the actions' type, then extra_fields, other lists, the ids' type
        ({"trajectory_ids": [], "actions": []}, "trajectory_ids and actions are required"),
        ({"trajectory_ids": [1.5], "actions": "x"}, "trajectory_ids and actions are required"),
        ({"trajectory_ids": [1.5, 2], "actions": [1]}, "trajectory_ids has 2 entries but actions has 1"),
        ({"trajectory_ids": [1.5], "actions": [1], "extra_fields": 5}, "actions must be strings"),
        (
            {"trajectory_ids": [1.5], "actions": ["x"], "extra_fields": [{}, {}]},
            "extra_fields must be a list",
        ),
        (
            {"trajectory_ids": [1.5], "actions": ["x"], "extra_fields": [5], "finish": 1},
            "extra_fields must be",
        ),
        ({"trajectory_ids": [1.5], "actions": ["x"], "finish": [1, 2]}, r"finish must be a list .* \(1\)"),
        (
            {"trajectory_ids": ["a", True], "actions": ["x", "y"]},
            r"trajectory_ids\[1\] must be a string or an",
        ),
    ],
)
def test_verltool_requests_are_checked_in_order(body: object, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        verltool.parse_request(body)


def test_verltool_falsy_extra_fields_are_none_and_strings_keep_lone_surrogates() -> None:
    for none in [None, [], {}, 0, "", False]:
        steps = verltool.parse_request({"trajectory_ids": [1], "actions": ["x\ud800"], "extra_fields": none})
        assert [(s.trajectory_id, s.action, s.extra) for s in steps] == [("i:1", "x\ud800", {})]


class _McpTool:
    def __init__(self, name: str) -> None:
        self.name = name

    def schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": "", "inputSchema": {"type": "object"}}


class _McpService:
    tools = {name: _McpTool(name) for name in TOOLS}

    async def call(self, name: str, arguments: Any, protocol: str) -> ToolResult:
        return ToolResult(status="ok", stdout=f"{name} {arguments}")


async def test_mcp_messages_are_classified_then_checked_in_order() -> None:
    """A message without a method or an id needs no answer, whatever else is wrong in it; then
    the id (not echoed when bad), the method, the params, and tools/call's own params."""
    app = web.Application()
    app[SETTINGS] = SimpleNamespace(body_timeout_seconds=10)
    app.add_routes(mcp.routes(_McpService()))  # type: ignore[arg-type]
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    async with TestClient(TestServer(app)) as client:
        for body, status, answer in [
            ({"jsonrpc": "2.0", "id": True}, 202, None),
            ({"jsonrpc": "2.0", "method": 5, "params": 5}, 202, None),
            (
                {"jsonrpc": "2.0", "id": True, "method": 5},
                400,
                (None, -32600, "the request id must be a string or"),
            ),
            ({"jsonrpc": "2.0", "id": 1.0, "method": "ping"}, 400, (None, -32600, "the request id must be")),
            (
                {"jsonrpc": "2.0", "id": "a", "method": 5, "params": 5},
                200,
                ("a", -32600, "method must be a string"),
            ),
            ({**call, "method": "\ud800", "params": 5}, 200, (1, -32601, r"method '\ud800' is not served")),
            ({**call, "params": None}, 200, (1, -32602, "params must be an object, got null")),
            (
                {**call, "params": {"arguments": 5}},
                200,
                (1, -32602, "unknown tool None; this pool serves python"),
            ),
            (
                {**call, "params": {"name": "python", "arguments": 5}},
                200,
                (1, -32602, "arguments must be an object"),
            ),
        ]:
            reply = await client.post("/mcp", json=body)
            assert reply.status == status, (body, await reply.text())
            if answer is not None:
                got = await reply.json()
                assert (got["id"], got["error"]["code"]) == answer[:2] and answer[2] in got["error"][
                    "message"
                ], got
        done = await (
            await client.post("/mcp", json={**call, "params": {"name": "search", "arguments": None}})
        ).json()
        assert done["result"]["structuredContent"]["stdout"] == "search {}", done
