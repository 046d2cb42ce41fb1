"""Text protocols of tool calls inside one assistant turn: parse the call, format the observation.

Pure string functions; `agent_loop.TagAgentLoop` drives them. hermes is not here: verl's own
ToolAgentLoop and ToolParser handle it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Call:
    """A parsed call: `name` is a tool name (tag protocols: the python tool) or a ReAct action."""

    name: str
    arguments: dict[str, Any]
    error: str = ""


@dataclass(frozen=True)
class Protocol:
    name: str
    stop: tuple[str, ...]
    include_stop: bool

    def parse(self, text: str, code_tool: str | None) -> Call | None:
        raise NotImplementedError

    def observation(self, text: str) -> str:
        raise NotImplementedError

    def observation_start(self) -> str:
        """What every observation begins with, whatever the tool returned."""
        raise NotImplementedError

    def is_final(self, call: Call) -> bool:
        """A call that ends the episode instead of running a tool (ReAct's Finish)."""
        return False


@dataclass(frozen=True)
class TagProtocol(Protocol):
    """`<open>code</close>` runs the python tool; its output comes back inside `<out_open>…</out_close>`."""

    open_tag: str = ""
    close_tag: str = ""
    out_open: str = ""
    out_close: str = ""

    def parse(self, text: str, code_tool: str | None) -> Call | None:
        end = text.rfind(self.close_tag)
        if end < 0:
            return None
        start = text.rfind(self.open_tag, 0, end)
        if start < 0:
            return None
        code = text[start + len(self.open_tag) : end].strip("\n")
        if code_tool is None:
            return Call(name="", arguments={}, error="no python tool is configured for this job")
        return Call(name=code_tool, arguments={"code": code})

    def observation(self, text: str) -> str:
        return f"{self.observation_start()}{text}\n{self.out_close}\n"

    def observation_start(self) -> str:
        return f"\n{self.out_open}\n"


ACTION = re.compile(r"Action:\s*(?P<name>[^\n]+?)\s*\n\s*Action Input:\s*(?P<input>.*)", re.DOTALL)
FINISH_ACTION = "Finish"


def is_finish(name: str) -> bool:
    """ReAct's episode-ending action, in any letter case (models write `finish` as often as `Finish`)."""
    return name.strip().lower() == FINISH_ACTION.lower()


@dataclass(frozen=True)
class ReactProtocol(Protocol):
    """`Action: name` / `Action Input: {json}` answered by `Observation: …`."""

    def parse(self, text: str, code_tool: str | None) -> Call | None:
        matches = list(ACTION.finditer(text))
        if not matches:
            return None
        match = matches[-1]
        name = match["name"].strip().strip("`")
        raw = match["input"].split("\nObservation:")[0].strip()
        raw = raw.removeprefix("```json").removeprefix("```").removesuffix("```").strip()
        try:
            arguments = json.loads(raw) if raw else {}
        except json.JSONDecodeError as exc:
            if name == code_tool:
                return Call(name=name, arguments={"code": raw})
            return Call(name=name, arguments={}, error=f"Action Input is not valid JSON ({exc.msg})")
        if not isinstance(arguments, dict):
            return Call(name=name, arguments={}, error="Action Input must be a JSON object")
        return Call(name=name, arguments=arguments)

    def observation(self, text: str) -> str:
        return f"{self.observation_start()}{text}\n"

    def observation_start(self) -> str:
        return "\nObservation: "

    def is_final(self, call: Call) -> bool:
        return is_finish(call.name)


PROTOCOLS: dict[str, Protocol] = {
    "tool-tags": TagProtocol(
        name="tool-tags",
        stop=("</tool>",),
        include_stop=True,
        open_tag="<tool>",
        close_tag="</tool>",
        out_open="<tool_output>",
        out_close="</tool_output>",
    ),
    "python-tags": TagProtocol(
        name="python-tags",
        stop=("</PYTHON>",),
        include_stop=True,
        open_tag="<PYTHON>",
        close_tag="</PYTHON>",
        out_open="<PYTHON-OUTPUT>",
        out_close="</PYTHON-OUTPUT>",
    ),
    "react": ReactProtocol(name="react", stop=("\nObservation:", "Observation:"), include_stop=False),
}


def get_protocol(name: str) -> Protocol:
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call protocol {name!r}; use one of {sorted(PROTOCOLS)}") from None
