"""Tool types as a registry: a `type` in tools.yaml names a Tool subclass here, which declares
its name, description, input schema and handler once (see tools/base.py); what an entry of each
type must hold is config's (config.ENTRY_RULES, which checks it before any tool is made)."""

from __future__ import annotations

from tool_sandbox.config import ConfigError, ServerSettings, ToolConfig
from tool_sandbox.sandbox.pool import Pool
from tool_sandbox.tools.base import Tool, ToolInputError, ToolResult
from tool_sandbox.tools.function import FunctionTool
from tool_sandbox.tools.http import HttpTool
from tool_sandbox.tools.python import PythonTool
from tool_sandbox.tools.remote_mcp import McpServerTool
from tool_sandbox.tools.search import SearchTool

__all__ = ["TOOL_TYPES", "Tool", "ToolInputError", "ToolResult", "build_tools", "expand_tools", "needs_pool"]

# The class of each type config.ENTRY_RULES takes, in its order; adding a type is a Tool subclass, an
# entry here and the rules of its entry there.
TOOL_TYPES: dict[str, type[Tool]] = {
    kind.type: kind for kind in (PythonTool, SearchTool, HttpTool, FunctionTool, McpServerTool)
}


def needs_pool(configs: tuple[ToolConfig, ...]) -> bool:
    return any(TOOL_TYPES[config.type].needs_pool for config in configs)


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
