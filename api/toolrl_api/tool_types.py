"""The tool types the tool pool serves, as data: each one's description (for a model), the JSON schema
of a call's input and its capabilities. The data, tool_types.json beside this module, is GENERATED from
the pool's registry (tool_sandbox.tools.TOOL_TYPES, tool_sandbox/tools/) by
`python -m tool_sandbox tool-types --write api/toolrl_api/tool_types.json`: do not edit it; change the
tool's class and regenerate. tests/unit/test_tool_types.py fails while it is stale."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("tool_types.json")


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


def _load() -> dict[str, ToolType]:
    declared: dict[str, dict[str, Any]] = json.loads(DATA.read_text(encoding="utf-8"))
    return {name: ToolType(**fields) for name, fields in declared.items()}


TOOL_TYPES: dict[str, ToolType] = _load()
