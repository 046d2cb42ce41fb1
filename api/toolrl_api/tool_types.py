# ruff: noqa: E501
"""The tool types the tool pool serves, as data: each one's description (for a model), the JSON
schema of a call's input and its capabilities.

GENERATED from the pool's registry (tool_sandbox.tools.TOOL_TYPES, tool_sandbox/tools/) by
`python -m tool_sandbox tool-types --write api/toolrl_api/tool_types.py`:
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


TOOL_TYPES: dict[str, ToolType] = {
    "python": ToolType(
        description="Run Python code in a sandbox and return what it prints.",
        input_schema={
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "Python source to execute",
                },
                "stdin": {
                    "type": "string",
                    "description": "Text the program reads from standard input",
                },
            },
            "required": ["code"],
        },
        runs_code=True,
        needs_egress=False,
        sessions=True,
        takes_sample=False,
    ),
    "search": ToolType(
        description="Search the corpus and return the best matching passages.",
        input_schema={
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "description": "What to search for",
                },
                "topK": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 100,
                    "description": "How many passages",
                },
            },
            "required": ["query"],
        },
        runs_code=False,
        needs_egress=False,
        sessions=False,
        takes_sample=False,
    ),
    "http": ToolType(
        description="Call the remote API behind this tool with JSON arguments.",
        input_schema={
            "type": "object",
            "description": "The JSON body POSTed as is to the tool's url: the API call's arguments under `arguments`; a caller may add keys beside it (the trainer adds the row's context)",
            "properties": {
                "arguments": {
                    "type": "object",
                    "description": "Arguments of the API call",
                },
            },
            "required": ["arguments"],
            "additionalProperties": True,
        },
        runs_code=False,
        needs_egress=True,
        sessions=False,
        takes_sample=False,
    ),
    "function": ToolType(
        description="Call the user's function with JSON arguments.",
        input_schema={
            "type": "object",
        },
        runs_code=True,
        needs_egress=False,
        sessions=False,
        takes_sample=True,
    ),
    "mcp": ToolType(
        description="A tool of a remote MCP server.",
        input_schema={
            "type": "object",
        },
        runs_code=False,
        needs_egress=True,
        sessions=False,
        takes_sample=False,
    ),
}
