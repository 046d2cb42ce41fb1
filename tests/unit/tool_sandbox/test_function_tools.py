"""`function` tools: a user's Python function (a file, as the operator mounts it from a ConfigMap) run
inside the sandbox per call with the model's JSON arguments; its schema served by /v1/tools and MCP,
bad sources stopping the pool's start, bad arguments and raising functions the code's fault, hostile
functions contained like any call."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from harness.sandbox_process import SandboxProcess
from harness.tiers import process_tier
from mcp import Client

SOURCE = """\
import os
import re


def add(a: int, b: int) -> int:
    print("adding", a, b)  # the function's own prints are not its answer
    return a + b


def greet(name: str) -> str:
    return f"hello {name}"


async def slow_echo(text: str) -> dict:
    return {"echo": text}


def divide(a: float, b: float) -> float:
    return a / b


def peek(path: str) -> str:
    return open(path).read()


def calc_gsm8k_reward(answer: str, *, ground_truth: str, strict: bool = False) -> str:
    # verl's GSM8K tool: the model's answer scored against the row's ground truth (per sample)
    found = re.findall(r"-?[0-9][0-9,]*(?:\\.[0-9]+)?", answer)
    value = found[-1].replace(",", "") if found and not strict else answer.strip()
    reward = 1.0 if value == ground_truth else 0.0
    return f"Current parsed answer={value!r} reward={reward}"


def lookup(q: str, _debug: bool = False) -> str:
    return f"internals of {q}" if _debug else f"found {q}"


def fork_bomb() -> str:
    while True:
        os.fork()


if __name__ == "__main__":
    raise SystemExit("the source is imported as a module, never run as __main__")
"""

NUMBERS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
QUERY = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def function_tool(name: str, source: Path, parameters: dict | None = None, **extra: object) -> dict:
    return {
        "name": name,
        "type": "function",
        "description": f"the user's {name}",
        "function": {"configMap": {"name": "my-tools", "key": "tools.py"}, **extra.pop("function", {})},
        "parameters": parameters or {"type": "object", "properties": {}},
        "source": str(source),
        **extra,
    }


def searchable_directory() -> Path:
    """A directory the children's own uids (as root) may pass through to their working directories,
    as /tmp in the pod (pytest's temporary directories are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="toolrl-functions-"))
    os.chmod(root, 0o711)
    return root


@pytest.fixture
def searchable() -> Iterator[Path]:
    root = searchable_directory()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
@process_tier
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    """The pool under pytest's directories (0700 as root): a child under a uid of its own cannot pass
    through them, so the runner must reach the source by its name in the working directory."""
    root = tmp_path_factory.mktemp("function-pool")
    try:
        source = root / "tools.py"
        source.write_text(SOURCE)
        text = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        tools = [
            function_tool("add", source, NUMBERS),
            function_tool("greet", source, {"type": "object", "properties": {"name": {"type": "string"}}}),
            function_tool("slow_echo", source, text),
            function_tool(
                "divide", source, {"type": "object", "properties": {}, "additionalProperties": True}
            ),
            function_tool("peek", source, {"type": "object", "properties": {"path": {"type": "string"}}}),
            function_tool("bomb", source, function={"name": "fork_bomb"}, timeoutSeconds=3),
            function_tool("calc_gsm8k_reward", source, ANSWER),
            function_tool("lookup", source, QUERY),
            function_tool(
                "lookup_any", source, {**QUERY, "additionalProperties": True}, function={"name": "lookup"}
            ),
            function_tool(
                "lookup_flags",
                source,
                {**QUERY, "additionalProperties": {"type": "boolean"}},
                function={"name": "lookup"},
            ),
            {"name": "python", "type": "python"},
        ]
        with SandboxProcess.start(root, tools=tools) as running:
            yield running
    finally:
        shutil.rmtree(root, ignore_errors=True)


def call(pool: SandboxProcess, tool: str, arguments: object, **body: object) -> dict:
    answer = pool.post("/v1/execute", {"tool": tool, "input": arguments, **body})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_call_returns_the_functions_value(pool: SandboxProcess) -> None:
    result = call(pool, "add", {"a": 2, "b": 40})
    assert (result["status"], result["fault"], result["output"]) == ("ok", None, "42"), result
    assert "adding 2 40" in result["stderr"]
    assert call(pool, "greet", {"name": "Ada"})["output"] == "hello Ada"
    assert call(pool, "slow_echo", {"text": "hi"})["output"] == '{"echo": "hi"}'


def test_a_raising_function_is_the_codes_fault_with_its_traceback(pool: SandboxProcess) -> None:
    result = call(pool, "divide", {"a": 1, "b": 0})
    assert (result["status"], result["fault"]) == ("error", "code"), result
    assert "ZeroDivisionError" in result["stderr"] and 'File "tools.py", line' in result["stderr"]


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        ({"a": 1}, "'b' is a required property"),
        ({"a": 1, "b": "two"}, "b: 'two' is not of type 'integer'"),
        ({"a": 1, "b": 2, "c": 3}, "Additional properties are not allowed ('c' was unexpected)"),
    ],
)
def test_arguments_that_do_not_match_the_schema_are_the_models_fault(
    pool: SandboxProcess, arguments: dict, said: str
) -> None:
    result = call(pool, "add", arguments)
    assert (result["status"], result["fault"]) == ("error", "code"), result
    assert f"invalid arguments for add: {said}" in result["stderr"]


def test_arguments_the_function_does_not_take_are_the_codes_fault(pool: SandboxProcess) -> None:
    result = call(pool, "divide", {"numerator": 1})  # the schema allows it, the function does not
    assert (result["status"], result["fault"]) == ("error", "code"), result
    assert "unexpected keyword argument" in result["stderr"]
    not_an_object = pool.post("/v1/execute", {"tool": "add", "input": [1, 2]})
    assert not_an_object.status_code == 400 and "JSON object" in not_an_object.text


def test_arguments_the_schema_does_not_declare_are_refused(pool: SandboxProcess) -> None:
    """A schema without additionalProperties no longer passes the function's hidden keyword arguments
    (`def lookup(q, _debug=False)`): an undeclared key is the model's fault, named with the declared ones."""
    hidden = call(pool, "lookup", {"q": "x", "_debug": True})
    assert (hidden["status"], hidden["fault"]) == ("error", "code"), hidden
    assert "internals" not in hidden["output"] + hidden["stderr"], hidden
    said = "invalid arguments for lookup: unexpected argument '_debug'; this tool takes q"
    assert said in hidden["message"] and said in hidden["stderr"], hidden
    several = call(pool, "lookup", {"q": "x", "b": 1, "a": 2})
    assert "unexpected arguments 'a', 'b'; this tool takes q" in several["message"], several
    assert call(pool, "lookup", {"q": "x"})["output"] == "found x"
    # the schema says what else may come: as it says
    assert call(pool, "lookup_any", {"q": "x", "_debug": True})["output"] == "internals of x"
    assert call(pool, "lookup_flags", {"q": "x", "_debug": True})["output"] == "internals of x"
    typed = call(pool, "lookup_flags", {"q": "x", "_debug": "yes"})
    assert (typed["status"], typed["fault"]) == ("error", "code"), typed
    assert "_debug: 'yes' is not of type 'boolean'" in typed["message"], typed


def test_a_hostile_function_is_contained(pool: SandboxProcess) -> None:
    peeked = call(pool, "peek", {"path": str(pool.log)})
    assert (peeked["status"], peeked["fault"]) == ("error", "code"), peeked
    assert "PermissionError" in peeked["stderr"] and "tool-sandbox listening" not in peeked["output"]
    bomb = call(pool, "bomb", {})
    assert bomb["status"] in ("error", "timeout", "killed") and bomb["fault"] == "code", bomb
    assert call(pool, "add", {"a": 1, "b": 1})["output"] == "2"  # still serving


def test_tools_route_and_mcp_serve_the_functions_schema(pool: SandboxProcess) -> None:
    listed = {t["name"]: t for t in requests.get(pool.url + "/v1/tools", timeout=10).json()["tools"]}
    assert listed["add"] == {
        "name": "add",
        "type": "function",
        "description": "the user's add",
        "inputSchema": NUMBERS,
    }


async def test_mcp_lists_and_calls_a_function_tool(pool: SandboxProcess) -> None:
    async with Client(pool.url + "/mcp") as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert tools["add"].input_schema == NUMBERS and tools["add"].description == "the user's add"
        ran = await client.call_tool("add", {"a": 20, "b": 22})
        assert not ran.is_error and ran.content[0].text == "42", ran
        bad = await client.call_tool("add", {"a": 20})
        assert bad.is_error and bad.structured_content["fault"] == "code"
        assert "'b' is a required property" in bad.content[0].text


def test_metrics_count_function_calls_per_tool(pool: SandboxProcess) -> None:
    call(pool, "greet", {"name": "metrics"})
    text = requests.get(pool.metrics_url, timeout=10).text
    assert any(
        line.startswith("toolrl_tool_calls_total{") and 'tool="greet"' in line and 'outcome="ok"' in line
        for line in text.splitlines()
    ), text


@pytest.mark.parametrize(
    ("source", "function", "said"),
    [
        ("def add(a, b:\n    return a + b\n", "add", "SyntaxError"),
        ("import no_such_module_here\n\ndef add(a, b):\n    return a + b\n", "add", "No module named"),
        ("def plus(a, b):\n    return a + b\n", "add", "defines no function 'add'"),
        (None, "add", "cannot read its source"),
    ],
    ids=["does not compile", "does not import", "lacks the function", "missing file"],
)
def test_a_bad_source_stops_the_pools_start_with_what_to_fix(
    searchable: Path, source: str | None, function: str, said: str
) -> None:
    path = searchable / "tools.py"
    if source is not None:
        path.write_text(source)
    with pytest.raises(RuntimeError) as failed:
        SandboxProcess.start(
            searchable, tools=[function_tool("add", path, NUMBERS, function={"name": function})]
        )
    log = str(failed.value)
    assert f"function tool 'add' ({path})" in log and said in log, log


# ----- per-sample values: a function's keyword-only parameters come from the row, never the model -----


def test_keyword_only_parameters_take_the_rows_values_as_verls_gsm8k_tool_does(pool: SandboxProcess) -> None:
    row = {"ground_truth": "72", "unused": "the row's other create_kwargs are not passed"}
    right = call(pool, "calc_gsm8k_reward", {"answer": "48 + 24 = 72"}, sample=row)
    assert (right["status"], right["output"]) == ("ok", "Current parsed answer='72' reward=1.0"), right
    wrong = call(pool, "calc_gsm8k_reward", {"answer": "70"}, sample={"ground_truth": "72"})
    assert wrong["output"] == "Current parsed answer='70' reward=0.0", wrong
    # a keyword-only parameter with a default may come from the row too
    exact = call(pool, "calc_gsm8k_reward", {"answer": "72"}, sample={"ground_truth": "72", "strict": True})
    assert exact["output"] == "Current parsed answer='72' reward=1.0", exact
    # the model sees only its own argument
    listed = {t["name"]: t for t in requests.get(pool.url + "/v1/tools", timeout=10).json()["tools"]}
    assert listed["calc_gsm8k_reward"]["inputSchema"] == ANSWER


def test_the_model_cannot_give_a_per_sample_value(pool: SandboxProcess) -> None:
    forged = call(
        pool, "calc_gsm8k_reward", {"answer": "1", "ground_truth": "1"}, sample={"ground_truth": "72"}
    )
    assert (forged["status"], forged["fault"]) == ("error", "code"), forged
    assert "invalid arguments for calc_gsm8k_reward: ground_truth is not an argument" in forged["stderr"]
    assert "reward=1.0" not in forged["output"]


def test_a_call_without_the_rows_value_is_the_datas_fault_not_the_models(pool: SandboxProcess) -> None:
    for body in ({}, {"sample": {"answer": "72"}}):
        lacking = call(pool, "calc_gsm8k_reward", {"answer": "72"}, **body)
        assert (lacking["status"], lacking["fault"]) == ("error", "infra"), lacking
        assert "extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs must hold it" in lacking["stderr"]
    # a function without keyword-only parameters ignores the row's values
    assert call(pool, "add", {"a": 2, "b": 40}, sample={"ground_truth": "72"})["output"] == "42"


def test_a_sample_that_is_not_an_object_is_refused(pool: SandboxProcess) -> None:
    refused = pool.post("/v1/execute", {"tool": "add", "input": {"a": 1, "b": 2}, "sample": ["72"]})
    assert refused.status_code == 400 and "sample must be a JSON object" in refused.text, refused.text
    to_python = pool.post(
        "/v1/execute", {"tool": "python", "input": {"code": "print(1)"}, "sample": {"a": 1}}
    )
    assert to_python.status_code == 400, to_python.text
    assert "sample is not taken by python tool 'python': only function tools" in to_python.text


def test_a_schema_that_offers_a_keyword_only_parameter_to_the_model_stops_the_start(searchable: Path) -> None:
    path = searchable / "tools.py"
    path.write_text(SOURCE)
    offered = {
        "type": "object",
        "properties": {"answer": {"type": "string"}, "ground_truth": {"type": "string"}},
    }
    with pytest.raises(RuntimeError) as failed:
        SandboxProcess.start(searchable, tools=[function_tool("calc_gsm8k_reward", path, offered)])
    log = str(failed.value)
    assert (
        "ground_truth of calc_gsm8k_reward() is keyword-only" in log and "remove it from parameters" in log
    ), log
