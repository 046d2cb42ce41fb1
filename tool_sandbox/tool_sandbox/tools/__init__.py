"""Tool types as a registry: a `type` in tools.yaml names a module here."""

from __future__ import annotations

from tool_sandbox.config import ServerSettings, ToolConfig
from tool_sandbox.sandbox.pool import Pool
from tool_sandbox.tools.base import Tool, ToolInputError, ToolResult
from tool_sandbox.tools.http import HttpTool
from tool_sandbox.tools.python import PythonTool
from tool_sandbox.tools.search import SearchTool

__all__ = ["Tool", "ToolInputError", "ToolResult", "build_tools", "needs_pool"]


def needs_pool(configs: tuple[ToolConfig, ...]) -> bool:
    return any(config.type == PythonTool.type for config in configs)


def build_tools(
    configs: tuple[ToolConfig, ...], pool: Pool | None, settings: ServerSettings
) -> dict[str, Tool]:
    """Instantiate each configured tool by its type."""
    tools: dict[str, Tool] = {}
    for config in configs:
        if config.type == PythonTool.type:
            assert pool is not None
            tools[config.name] = PythonTool(config, pool, settings)
        elif config.type == SearchTool.type:
            tools[config.name] = SearchTool(config)
        elif config.type == HttpTool.type:
            tools[config.name] = HttpTool(config)
        else:
            raise ValueError(f"tool {config.name}: unknown type {config.type!r}")
    return tools
