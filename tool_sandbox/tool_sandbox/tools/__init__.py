"""Tool types as a registry: a `type` in tools.yaml names a Tool subclass here, which declares once
its name, description, input schema, capabilities, the check of its entry and its handler (see
tools/base.py); `parse_tools` reads tools.yaml into configs, each entry checked by its type's class."""

from __future__ import annotations

from typing import Any

import yaml
from toolrl_api.validation import tools_validator

from tool_sandbox.config import ConfigError, ServerSettings, ToolConfig, entry_values
from tool_sandbox.sandbox.pool import Pool
from tool_sandbox.tools.base import Tool, ToolInputError, ToolResult
from tool_sandbox.tools.function import FunctionTool
from tool_sandbox.tools.http import HttpTool
from tool_sandbox.tools.python import PythonTool
from tool_sandbox.tools.remote_mcp import McpServerTool
from tool_sandbox.tools.search import SearchTool

__all__ = [
    "TOOL_TYPES",
    "Tool",
    "ToolInputError",
    "ToolResult",
    "build_tools",
    "expand_tools",
    "load_tools",
    "needs_pool",
    "parse_tools",
]

# The one list of tool types; adding one is a Tool subclass and an entry here.
TOOL_TYPES: dict[str, type[Tool]] = {
    kind.type: kind for kind in (PythonTool, SearchTool, HttpTool, FunctionTool, McpServerTool)
}


def parse_tools(text: str, source: str = "tools.yaml") -> tuple[ToolConfig, ...]:
    """Parse `{"tools": [...]}` (YAML or JSON) into validated tool configs."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML/JSON ({exc}); fix the syntax") from exc
    if not isinstance(document, dict) or not isinstance(document.get("tools"), list):
        raise ConfigError(f'{source}: expected a mapping with a list under "tools", like {{"tools": [...]}}')
    if not document["tools"]:
        raise ConfigError(f"{source}: tools is empty; list at least one tool")
    errors = tools_validator().errors(document["tools"])
    if errors:
        raise ConfigError(
            f"{source}: its tools break the ToolRLJob CRD's schema and rules (those of a job's spec.tools):\n"
            + "\n".join(f"  {error}" for error in errors)
        )
    return tuple(_parse_tool(entry, f"{source}: tools[{i}]") for i, entry in enumerate(document["tools"]))


def load_tools(path: str) -> tuple[ToolConfig, ...]:
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_tools(handle.read(), path)
    except OSError as exc:
        raise ConfigError(f"cannot read tool config {path}: {exc.strerror}; pass --config PATH") from exc


def _parse_tool(entry: dict[str, Any], where: str) -> ToolConfig:
    values = entry_values(entry, where)
    TOOL_TYPES[values["type"]].check_config(values, where)  # the CRD's enum is TOOL_TYPES (a test)
    return ToolConfig(**values)


def needs_pool(configs: tuple[ToolConfig, ...]) -> bool:
    return any(TOOL_TYPES[config.type].runs_code for config in configs)


def build_tools(
    configs: tuple[ToolConfig, ...], pool: Pool | None, settings: ServerSettings
) -> dict[str, Tool]:
    """Instantiate each configured tool by its type (checked when the config was parsed)."""
    return {config.name: TOOL_TYPES[config.type].create(config, pool, settings) for config in configs}


def expand_tools(entries: dict[str, Tool]) -> dict[str, Tool]:
    """The tools the started entries serve, in their order; a name served twice (a remote MCP
    tool's name equal to another tool's) is a ConfigError."""
    served: dict[str, Tool] = {}
    for entry in entries.values():
        for name, tool in entry.expand().items():
            if name in served:
                raise ConfigError(
                    f"tool name {name!r} is served by both {served[name].config.name!r} and"
                    f" {entry.name!r}; rename one of the entries"
                )
            served[name] = tool
    return served
