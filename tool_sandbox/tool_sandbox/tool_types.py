"""The tool types as the registry declares them (tools.TOOL_TYPES: each Tool subclass's description,
input schema and capabilities), as data for the other images: `python -m tool_sandbox tool-types`
prints them as JSON; with `--write api/toolrl_api/tool_types.json` it writes the API package's copy,
which the operator (a tool's sandbox share and egress) and the trainer (the schemas its model is
offered before the pool is asked, a call's required argument) read. The registry stays the one home:
tests/unit/test_tool_types.py fails while the copy differs from what this writes."""

from __future__ import annotations

import json
from typing import Any

from tool_sandbox.tools import TOOL_TYPES

COMMAND = "python -m tool_sandbox tool-types --write api/toolrl_api/tool_types.json"


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


def render(types: dict[str, dict[str, Any]]) -> str:
    """The declarations (declared()) as the JSON text the command prints and writes."""
    return json.dumps(types, indent=2, ensure_ascii=False) + "\n"


def main(write: str | None) -> int:
    """`tool-types`: print the declarations as JSON, or write the API package's copy to `write`."""
    types = declared()
    if write is None:
        print(render(types), end="")
        return 0
    with open(write, "w", encoding="utf-8") as handle:
        handle.write(render(types))
    print(f"tool_sandbox: wrote {write} ({len(types)} tool types)")
    return 0
