"""VerlTool's `POST /get_observation` dialect (pure parsing and rendering): a batch of
trajectories' latest actions in, one observation per trajectory out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tool_sandbox.api.requests import RequestError, json_kind, require_object
from tool_sandbox.sandbox import outcome
from tool_sandbox.tools.base import ToolResult

_FENCE = "```"
PYTHON_FENCES = (
    "python",
    "py",
    "python3",
)  # a fence's info string (VerlTool: ```python; models also write ```py)
_RESERVED = ("trajectory_ids", "actions", "extra_fields")


@dataclass(frozen=True)
class Step:
    trajectory_id: str  # typed: "s:<id>" for a string, "i:<id>" for an integer, so 1 and "1" differ
    action: str
    finish: bool
    extra: dict[str, Any]

    @property
    def stdin(self) -> str:
        """VerlTool's `extra_fields.stdin` (a string, else none)."""
        value = self.extra.get("stdin")
        return value if isinstance(value, str) else ""


def parse_request(body: Any) -> list[Step]:
    """`{trajectory_ids, actions, finish?, extra_fields?, <other per-trajectory lists>}`."""
    body = require_object(body)
    ids, actions = body.get("trajectory_ids"), body.get("actions")
    if not isinstance(ids, list) or not isinstance(actions, list) or not ids:
        raise RequestError("trajectory_ids and actions are required: two non-empty lists of equal length")
    if len(ids) != len(actions):
        raise RequestError(f"trajectory_ids has {len(ids)} entries but actions has {len(actions)}")
    if not all(isinstance(a, str) for a in actions):
        raise RequestError("actions must be strings (the model's latest turn)")
    extras = body.get("extra_fields") or [{} for _ in ids]
    if (
        not isinstance(extras, list)
        or len(extras) != len(ids)
        or not all(isinstance(e, dict) for e in extras)
    ):
        raise RequestError("extra_fields must be a list of objects, one per trajectory")
    extras = [dict(e) for e in extras]
    for key, values in body.items():
        if key in _RESERVED:
            continue
        if not isinstance(values, list) or len(values) != len(ids):
            raise RequestError(f"{key} must be a list with one entry per trajectory ({len(ids)})")
        for extra, value in zip(extras, values, strict=True):
            extra[key] = value
    return [
        Step(trajectory_key(tid, i), action, bool(extra.get("finish", False)), extra)
        for i, (tid, action, extra) in enumerate(zip(ids, actions, extras, strict=True))
    ]


def trajectory_key(value: Any, index: int) -> str:
    """A trajectory id with its JSON type: a string or an integer, nothing else."""
    if isinstance(value, str):
        return f"s:{value}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"i:{value}"
    raise RequestError(f"trajectory_ids[{index}] must be a string or an integer, got {json_kind(value)}")


def extract(action: str) -> tuple[str, str] | None:
    """The tool call in an action: ("python", code), ("search", query) or None. Linear time in
    the action's length, whatever it holds (a regex with lazy groups is quadratic on unclosed tags)."""
    blocks = _between(action, "<python>", "</python>") or _python_fences(action)
    if blocks:
        return "python", "\n".join(block.strip() for block in blocks)
    queries = _between(action, "<search>", "</search>")
    if queries:
        return "search", queries[0].strip()
    return None


def _between(text: str, opening: str, closing: str) -> list[str]:
    """The texts between each opening tag and the next closing tag after it."""
    found, at = [], 0
    while (start := text.find(opening, at)) >= 0:
        end = text.find(closing, start + len(opening))
        if end < 0:
            break  # no later opening tag can be closed either
        found.append(text[start + len(opening) : end])
        at = end + len(closing)
    return found


def _python_fences(text: str) -> list[str]:
    """The bodies of fenced blocks whose info string is python, py or python3. Fences pair up in
    order (an unclosed one ends the search), as a Markdown reader sees them."""
    found, at = [], 0
    while (start := text.find(_FENCE, at)) >= 0:
        end = text.find(_FENCE, start + len(_FENCE))
        if end < 0:
            break
        body = text[start + len(_FENCE) : end]
        info, newline, code = body.partition("\n")
        if info.strip().lower() in PYTHON_FENCES and newline:
            found.append(code)
        at = end + len(_FENCE)
    return found


def observation(result: ToolResult) -> str:
    """What the model reads back: output, then errors, then why the call ended early."""
    parts = [result.output]
    if result.stderr:
        parts.append(result.stderr)
    if result.status in (outcome.TIMEOUT, outcome.KILLED, outcome.REJECTED) or result.sandboxError:
        parts.append(f"[{result.status}: {result.message}]")
    return "\n".join(p for p in parts if p)
