"""The tool types as the registry declares them (tools.TOOL_TYPES: each Tool subclass's description,
input schema and capabilities), as data for the other images: `python -m tool_sandbox tool-types`
prints them as JSON; with `--write api/toolrl_api/tool_types.py` it writes the API package's copy,
which the operator (a tool's sandbox share and egress) and the trainer (the schemas its model is
offered before the pool is asked, a call's required argument) read. The registry stays the one home:
tests/unit/test_tool_types.py fails while the copy differs from what this writes."""

from __future__ import annotations

import json
from typing import Any

from tool_sandbox.tools import TOOL_TYPES

COMMAND = "python -m tool_sandbox tool-types --write api/toolrl_api/tool_types.py"
LINE_LENGTH = 110  # the repository's (pyproject.toml [tool.ruff]): the copy is written as ruff formats it


def declared() -> dict[str, dict[str, Any]]:
    """Each registered type's declarations, by name, in the registry's order."""
    return {
        name: {
            "description": kind.description,
            "input_schema": kind.input_schema,
            "runs_code": kind.runs_code,
            "needs_egress": kind.needs_egress,
            "sessions": kind.supports_sessions,
            "takes_sample": kind.takes_sample,
        }
        for name, kind in TOOL_TYPES.items()
    }


HEADER = f'''# ruff: noqa: E501
"""The tool types the tool pool serves, as data: each one's description (for a model), the JSON
schema of a call's input and its capabilities.

GENERATED from the pool's registry (tool_sandbox.tools.TOOL_TYPES, tool_sandbox/tools/) by
`{COMMAND}`:
do not edit; change the tool's class and regenerate. tests/unit/test_tool_types.py fails while this file
is stale.
"""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolType:
    """A tool type as its Tool subclass declares it (tool_sandbox/tools/base.py)."""

    description: str
    """What a tool of the type does, for a model; an entry's own `description` replaces it."""
    input_schema: dict[str, Any]
    """The JSON schema of a call's input, as GET /v1/tools serves it (`inputSchema`); a function tool's
    is its entry's `parameters`, an mcp entry's tools have their server's."""
    runs_code: bool
    """Its calls run code in the pool's sandbox (the pool's workers, a share of its disk)."""
    needs_egress: bool
    """Its calls leave the pool's pod, to the address its entry names (the NetworkPolicy opens it)."""
    sessions: bool
    """It keeps state between the calls of a session."""
    takes_sample: bool
    """Its calls may carry the row's per-sample values beside the model's arguments."""

'''


def render_module(types: dict[str, dict[str, Any]]) -> str:
    """The API package's copy (toolrl_api/tool_types.py) of `types` (declared()), as ruff formats it."""
    lines = ["TOOL_TYPES: dict[str, ToolType] = {"]
    for name, fields in types.items():
        lines.append(f"    {_string(name)}: ToolType(")
        lines += [f"        {key}={_literal(value, 8, len(key) + 2)}," for key, value in fields.items()]
        lines.append("    ),")
    lines.append("}")
    return HEADER + "\n" + "\n".join(lines) + "\n"


def _literal(value: Any, indent: int, prefix: int) -> str:
    """`value` (JSON data) as Python source at `indent`, after `prefix` characters on its first line: a
    non-empty dict with one key a line and a trailing comma (which ruff keeps so), a list on one line
    when it fits."""
    pad = " " * (indent + 4)
    if isinstance(value, dict) and value:
        items = [
            f"{pad}{_string(k)}: {_literal(v, indent + 4, len(_string(k)) + 2)}," for k, v in value.items()
        ]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list) and value:
        flat = "[" + ", ".join(_literal(v, indent, 0) for v in value) + "]"
        if "\n" not in flat and indent + prefix + len(flat) + 1 <= LINE_LENGTH:
            return flat
        items = [f"{pad}{_literal(v, indent + 4, 0)}," for v in value]
        return "[\n" + "\n".join(items) + "\n" + " " * indent + "]"
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    if isinstance(value, str):
        return _string(value)
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    raise TypeError(f"a tool type declares {value!r} ({type(value).__name__}), which is not JSON data")


def _string(text: str) -> str:
    """A string literal as ruff writes it: double quotes, unless single ones need fewer escapes."""
    if '"' in text and "'" not in text and "\\" not in text and text.isprintable():
        return "'" + text + "'"
    return json.dumps(text)


def main(write: str | None) -> int:
    """`tool-types`: print the declarations as JSON, or write the API package's copy to `write`."""
    types = declared()
    if write is None:
        print(json.dumps(types, indent=2))
        return 0
    with open(write, "w", encoding="utf-8") as handle:
        handle.write(render_module(types))
    print(f"tool_sandbox: wrote {write} ({len(types)} tool types)")
    return 0
