"""VerlTool's `POST /get_observation` dialect (pure parsing and rendering): a batch of
trajectories' latest actions in, one observation per trajectory out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tool_sandbox.api.requests import RequestError, require_object
from tool_sandbox.sandbox import outcome
from tool_sandbox.tools.base import ToolResult

_PYTHON_TAG = re.compile(r"<python>(.*?)</python>", re.DOTALL)
_PYTHON_FENCE = re.compile(r"```\n?python(.*?)```", re.DOTALL)
_SEARCH_TAG = re.compile(r"<search>(.*?)</search>", re.DOTALL)
_RESERVED = ("trajectory_ids", "actions", "extra_fields")


@dataclass(frozen=True)
class Step:
    trajectory_id: str
    action: str
    finish: bool
    extra: dict[str, Any]


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
        Step(str(tid), action, bool(extra.get("finish", False)), extra)
        for tid, action, extra in zip(ids, actions, extras, strict=True)
    ]


def extract(action: str) -> tuple[str, str] | None:
    """The tool call in an action: ("python", code), ("search", query) or None."""
    blocks = _PYTHON_TAG.findall(action) or _PYTHON_FENCE.findall(action)
    if blocks:
        return "python", "\n".join(block.strip() for block in blocks)
    queries = _SEARCH_TAG.findall(action)
    if queries:
        return "search", queries[0].strip()
    return None


def observation(result: ToolResult) -> str:
    """What the model reads back: output, then errors, then why the call ended early."""
    parts = [result.output]
    if result.stderr:
        parts.append(result.stderr)
    if result.status in (outcome.TIMEOUT, outcome.KILLED, outcome.REJECTED) or result.sandboxError:
        parts.append(f"[{result.status}: {result.message}]")
    return "\n".join(p for p in parts if p)
