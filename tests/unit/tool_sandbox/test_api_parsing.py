import pytest
from tool_sandbox.api import sandboxfusion, verltool
from tool_sandbox.api.requests import RequestError, parse_batch, parse_execute, parse_json
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
