"""Issue 35, class 6 (in-process): a schema's `$ref` to a URL is refused where the schema is loaded and
never fetched; uniqueItems keeps JSON's equality in one pass; shapes no client can send are named; a
function tool's schema takes only the keys it declares unless it says otherwise."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from mcp_types import Tool as Listed
from tool_sandbox.config import ConfigError, ToolConfig
from tool_sandbox.tools.arguments import (
    MAX_DEPTH,
    argument_problems,
    declared_only,
    shape_problem,
    validator,
)
from tool_sandbox.tools.function import check_parameters
from tool_sandbox.tools.remote_mcp import RemoteMcpTool

REMOTE = {"type": "object", "properties": {"x": {"$ref": "http://127.0.0.1:9/never.json"}}}


def test_a_function_schema_referring_to_a_url_is_refused_at_load() -> None:
    with pytest.raises(ConfigError, match=r"\$ref 'http://127.0.0.1:9/never.json' points outside the schema"):
        check_parameters(REMOTE, "tools[0]")
    local = {
        "type": "object",
        "$defs": {"n": {"type": "integer"}},
        "properties": {"x": {"$ref": "#/$defs/n"}},
    }
    check_parameters(local, "tools[0]")
    assert (
        asyncio.run(argument_problems(validator(local), {"x": "one"}, 5))
        == "x: 'one' is not of type 'integer'"
    )


def test_a_remote_tools_schema_referring_to_a_url_is_never_fetched() -> None:
    server = SimpleNamespace(config=ToolConfig(name="remote", type="mcp"), name="remote", url="http://x/mcp")
    tool = RemoteMcpTool(server, Listed(name="t", inputSchema=REMOTE))  # type: ignore[arg-type]
    assert tool.validator is None  # the remote server checks its own arguments
    started = time.monotonic()
    said = asyncio.run(argument_problems(validator(REMOTE), {"x": 1}, 5))
    assert "does not fetch" in said and time.monotonic() - started < 1, said


def test_unique_items_keeps_json_equality() -> None:
    unique = validator({"type": "array", "uniqueItems": True})
    for items, problem in [
        ([1, 1.0], "items 0 and 1 are equal"),
        ([{"a": [1, {"b": 2}]}, {"a": [1.0, {"b": 2}]}], "items 0 and 1 are equal"),
        ([1, True, 0, False, None, [0], [False], {"a": 0}, {"a": False}, "1"], ""),
    ]:
        said = asyncio.run(argument_problems(unique, items, 5))
        assert (problem in said) if problem else said == "", (items, said)


def test_shapes_no_client_can_send_are_named() -> None:
    deep: object = 1
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    assert "nest more than 100 levels" in shape_problem({"x": deep})
    assert shape_problem({"x": deep[0][0]}) == ""  # type: ignore[index]: 100 levels, the dict's included
    assert "lone surrogate (at /k/0)" in shape_problem({"k": ["\udc80"]}, surrogates=True)
    assert shape_problem({"k": ["\udc80"]}) == ""  # JSON can escape it: an http API may take it


def test_a_function_schema_takes_only_the_keys_it_declares_unless_it_says_otherwise() -> None:
    query = {"type": "object", "properties": {"q": {"type": "string"}}, "patternProperties": {"^x_": {}}}

    def said(schema: dict, arguments: dict) -> str:
        return asyncio.run(argument_problems(validator(declared_only(schema)), arguments, 5))

    assert said(query, {"q": "a", "x_extra": 1}) == ""
    assert said(query, {"q": "a", "_debug": True}) == (
        "unexpected argument '_debug'; this tool takes q, names matching '^x_'"
    )
    assert said({"type": "object"}, {"a": 1}) == "unexpected argument 'a'; this tool takes no arguments"
    for allowing in (
        {"additionalProperties": True},
        {"additionalProperties": {}},
        {"unevaluatedProperties": True},
    ):
        assert said({**query, **allowing}, {"q": "a", "_debug": True}) == "", allowing
    closed = said({**query, "additionalProperties": False}, {"q": "a", "_debug": True})
    assert closed == "'_debug' does not match any of the regexes: '^x_'", closed  # the schema's own words
