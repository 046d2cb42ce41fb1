"""The tool types have one home, the pool's registry (tool_sandbox.tools.TOOL_TYPES: each Tool subclass
declares its description, input schema and capabilities). The API package holds a generated copy
(toolrl_api.tool_types, `python -m tool_sandbox tool-types --write ...`) that the operator and the
trainer read: the copy is the registry's, the trainer offers its model the same schemas from the copy
as from the pool's listing, and a new type's declarations reach them with no other edit."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from tool_sandbox.__main__ import main as pool_main
from tool_sandbox.config import ServerSettings, ToolConfig
from tool_sandbox.tools import TOOL_TYPES as REGISTRY
from tool_sandbox.tools import Tool, needs_pool
from toolrl_api.tool_types import TOOL_TYPES as COPY
from toolrl_api.tool_types import ToolType
from trainer_entry.spec import parse_job
from trainer_entry.tools import pool_input, pool_sample
from trainer_entry.translate import tool_config, tool_schema

from tool_sandbox import tool_types as generator

REPO = Path(__file__).resolve().parents[2]
COPY_FILE = REPO / "api" / "toolrl_api" / "tool_types.json"
POOL = "http://pool:8080"


def _written(tmp_path: Path) -> str:
    target = tmp_path / "tool_types.json"
    with pytest.raises(SystemExit) as ended:
        pool_main(["tool-types", "--write", str(target)])
    assert ended.value.code == 0
    return target.read_text()


def _printed(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with pytest.raises(SystemExit) as ended:
        pool_main(["tool-types"])
    assert ended.value.code == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_the_apis_copy_is_the_registrys(tmp_path: Path) -> None:
    """Regenerate it: the API package's copy must be what `tool-types --write` writes today."""
    assert _written(tmp_path) == COPY_FILE.read_text(), (
        "api/toolrl_api/tool_types.json differs from the pool's registry: run "
        f"`{generator.COMMAND}` (with PYTHONPATH naming the worktree's packages)"
    )


def test_tool_types_prints_the_registrys_declarations(capsys: pytest.CaptureFixture[str]) -> None:
    printed = _printed(capsys)
    assert list(printed) == list(REGISTRY) == list(COPY)
    assert printed == {name: dataclasses.asdict(kind) for name, kind in COPY.items()}
    python = printed["python"]
    assert (python["runs_code"], python["needs_egress"], python["sessions"]) == (True, False, True)
    assert {name for name, kind in printed.items() if kind["needs_egress"]} == {"http", "mcp"}
    assert {name for name, kind in printed.items() if kind["runs_code"]} == {"python", "function"}
    http = printed["http"]["input_schema"]
    assert http["required"] == ["arguments"] and http["additionalProperties"] is True
    assert http["properties"]["arguments"] == {"type": "object", "description": "Arguments of the API call"}


# Entries of every type whose served tool is the entry itself (an mcp entry's are its server's), as a
# job's spec and the pool's tools.yaml give them; each also with a description of its own.
ENTRIES: list[dict[str, Any]] = [
    {"name": "python", "type": "python"},
    {"name": "find", "type": "search", "corpus": "/data/corpus.jsonl"},
    {"name": "api", "type": "http", "url": "http://api.example:8080/call"},
    {
        "name": "weather",
        "type": "function",
        "function": {"configMap": {"name": "fns", "key": "tools.py"}},
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
]
ENTRIES += [{**entry, "name": entry["name"] + "_own", "description": "My own words."} for entry in ENTRIES]


def _job(tools: list[dict[str, Any]]) -> Any:
    spec = {
        "model": {"path": "Qwen/Qwen2.5-3B-Instruct"},
        "data": {"trainFiles": ["/data/t.parquet"]},
        "algorithm": {"totalEpochs": 1},
        "rollout": {"protocol": "hermes"},
        "tools": tools,
        "reward": {"preset": "exact-match"},
    }
    return parse_job({"metadata": {"name": "j", "namespace": "rl"}, "spec": spec})


def _listing(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GET /v1/tools of a pool configured with `entries`: each configured tool's Tool.schema()."""
    configs = [
        ToolConfig(
            name=e["name"],
            type=e["type"],
            description=e.get("description", ""),
            corpus=e.get("corpus", ""),
            url=e.get("url", ""),
            function=e.get("function", {}),
            parameters=e.get("parameters", {}),
        )
        for e in entries
    ]
    pool: Any = object()  # a stand-in: listing a tool starts nothing
    return [REGISTRY[c.type].create(c, pool, ServerSettings()).schema() for c in configs]


def test_the_schemas_offered_from_the_pools_listing_are_the_ones_from_the_copy() -> None:
    """At run time the trainer offers its model the schemas the pool lists; in a dry run, and before
    the pool is asked, those of the copy: for every type they are the same."""
    listing = {tool["name"]: tool for tool in _listing(ENTRIES)}
    assert {entry["type"] for entry in ENTRIES} == set(COPY) - {"mcp"}
    for entry in ENTRIES:
        assert tool_schema(entry, listing[entry["name"]]) == tool_schema(entry), entry["name"]
    job = _job(ENTRIES)
    assert tool_config(job, POOL, list(listing.values())) == tool_config(job, POOL)


def test_the_model_is_offered_a_types_required_arguments() -> None:
    python = tool_schema({"name": "python", "type": "python"})
    # byte for byte what the trainer offered before the copy (the tiny test model's tokenizer learnt it)
    assert json.dumps(python) == (
        '{"type": "function", "function": {"name": "python", "description": "Run Python code in a sandbox'
        ' and return what it prints.", "parameters": {"type": "object", "properties": {"code": {"type":'
        ' "string", "description": "Python source to execute"}}, "required": ["code"]}}}'
    )
    search = tool_schema({"name": "find", "type": "search", "description": "Find it."})["function"]
    assert search["description"] == "Find it."
    assert search["parameters"] == {
        "type": "object",
        "properties": {"query": {"type": "string", "minLength": 1, "description": "What to search for"}},
        "required": ["query"],
    }
    http = tool_schema({"name": "api", "type": "http"})["function"]["parameters"]
    assert http == {
        "type": "object",
        "properties": {"arguments": {"type": "object", "description": "Arguments of the API call"}},
        "required": ["arguments"],
    }


def test_a_calls_input_is_checked_on_its_types_schema() -> None:
    assert pool_input("python", {"code": "print(1)", "stdin": "x"}, {"route": 1}) == {"code": "print(1)"}
    assert pool_input("search", {"query": "q", "topK": 3}, {}) == {"query": "q"}
    sent = pool_input("http", {"arguments": {"a": 1}}, {"route": "r"})  # the row's context beside them
    assert sent == {"route": "r", "arguments": {"a": 1}}
    for kind, arguments, said in [
        ("python", {}, "missing argument 'code'"),
        ("python", {"code": 1}, "'code' must be a string"),
        ("search", {"query": None}, "'query' must be a string"),
        ("http", {"arguments": "a=1"}, "'arguments' must be a JSON object"),
    ]:
        with pytest.raises(ValueError) as raised:
            pool_input(kind, arguments, {})
        assert str(raised.value) == said


EXPRESSION = {"type": "string", "description": "Like 2 * (3 + 4)"}  # required: offered to the model
DIGITS = {"type": "integer", "minimum": 0, "description": "Digits after the point"}  # optional: not offered


class CalcTool(Tool):
    """A new tool type, declared as every type is: its own module's Tool subclass."""

    type = "calc"
    description = "Evaluate an arithmetic expression."
    input_schema = {"type": "object", "properties": {"expression": EXPRESSION, "digits": DIGITS}}
    input_schema["required"] = ["expression"]
    runs_code = True
    takes_sample = True


def test_a_new_types_declarations_reach_the_copy_the_trainer_and_the_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new type is its module, its line in the registry and the CRD's enum (the spec's types):
    its description, schema and capabilities need no other edit."""
    monkeypatch.setitem(REGISTRY, "calc", CalcTool)  # its line in the registry
    printed = _printed(capsys)["calc"]
    assert printed == {
        "description": "Evaluate an arithmetic expression.",
        "input_schema": CalcTool.input_schema,
        "runs_code": True,
        "needs_egress": False,
        "sessions": False,
        "takes_sample": True,
    }
    generated = ToolType(**json.loads(_written(tmp_path))["calc"])  # as toolrl_api.tool_types loads it
    assert dataclasses.asdict(generated) == printed
    monkeypatch.setitem(COPY, "calc", ToolType(**dataclasses.asdict(generated)))  # the regenerated copy
    calc = {"name": "calc", "type": "calc"}
    assert tool_schema(calc)["function"] == {
        "name": "calc",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": EXPRESSION},
            "required": ["expression"],
        },
    }
    (listed,) = _listing([calc])
    assert tool_schema(calc, listed) == tool_schema(calc)
    assert pool_input("calc", {"expression": "1 + 1", "digits": 2}, {"route": 1}) == {"expression": "1 + 1"}
    with pytest.raises(ValueError, match=r"^'expression' must be a string$"):
        pool_input("calc", {"expression": 2}, {})
    assert pool_sample("calc", {"answer": 2, "context": {}}) == {"answer": 2}
    assert needs_pool((ToolConfig(name="calc", type="calc"),))  # the pool starts its sandbox workers
