"""VerlTool's `POST /get_observation` dialect: a batch of trajectories' latest actions in, one
observation per trajectory out (pure parsing and rendering, and the route)."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Annotated, Any, NotRequired

from aiohttp import web
from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError

from tool_sandbox.admission import Rejected
from tool_sandbox.api.requests import (
    FieldMessages,
    error_message,
    first_error,
    json_kind,
    or_empty,
    require_object,
    strict_typed_dict,
)
from tool_sandbox.api.web import json_response, read_json
from tool_sandbox.calls import ExecuteRequest, RequestError, shown
from tool_sandbox.sandbox import outcome
from tool_sandbox.service import Service
from tool_sandbox.sessions import VERLTOOL, SessionExists, SessionLimit
from tool_sandbox.tools.base import ToolInputError, ToolResult

PROTOCOL = "verltool"
# Finished trajectories remembered (never reopened), oldest forgotten first; each by a fixed-size
# digest of its caller and id, so a few requests with huge ids cannot fill the memory.
FINISHED_TRAJECTORIES_KEPT = 100_000

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


TRAJECTORIES_REQUIRED = "trajectory_ids and actions are required: two non-empty lists of equal length"
EXTRA_FIELDS = "extra_fields must be a list of objects, one per trajectory"
# The per-trajectory lists' types (any other key is one more per-trajectory list, checked below with
# the lengths: rules across fields). A trajectory id's type is checked last, by `trajectory_key`.
GET_OBSERVATION = TypeAdapter(
    strict_typed_dict(
        "GetObservationBody",
        {
            "trajectory_ids": Annotated[list[Any], Field(min_length=1)],
            "actions": list[str],
            "extra_fields": NotRequired[Annotated[list[dict[str, Any]], BeforeValidator(or_empty)]],
        },
        extra="allow",
    )
)
GET_OBSERVATION_MESSAGES: FieldMessages = {
    "trajectory_ids": lambda *_: TRAJECTORIES_REQUIRED,
    "actions": lambda error, _: (
        TRAJECTORIES_REQUIRED
        if len(error["loc"]) == 1
        else "actions must be strings (the model's latest turn)"
    ),
    "extra_fields": lambda *_: EXTRA_FIELDS,
}


def parse_request(body: Any) -> list[Step]:
    """`{trajectory_ids, actions, finish?, extra_fields?, <other per-trajectory lists>}`."""
    body = require_object(body)
    try:
        parsed = GET_OBSERVATION.validate_python(body)
    except ValidationError as exc:
        error = first_error(exc)
        if error["loc"] not in (("trajectory_ids",), ("actions",)):  # both are lists: lengths first
            _same_length(body["trajectory_ids"], body["actions"])
        raise RequestError(error_message(error, GET_OBSERVATION_MESSAGES)) from None
    ids, actions = parsed["trajectory_ids"], parsed["actions"]
    _same_length(ids, actions)
    extras = parsed.get("extra_fields") or [{} for _ in ids]
    if len(extras) != len(ids):
        raise RequestError(EXTRA_FIELDS)
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


def _same_length(ids: list[Any], actions: list[Any]) -> None:
    if len(ids) != len(actions):
        raise RequestError(f"trajectory_ids has {len(ids)} entries but actions has {len(actions)}")


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


def routes(service: Service) -> web.RouteTableDef:
    routes = web.RouteTableDef()
    finished: OrderedDict[str, None] = OrderedDict()  # the session keys of finished trajectories

    @routes.post("/get_observation")
    async def get_observation(request: web.Request) -> web.Response:
        steps = parse_request(await read_json(request))
        caller = request.remote or "unknown"
        answers: list[tuple[str, bool, bool, str | None]] = [("", False, False, None)] * len(steps)
        trajectories: dict[str, list[int]] = {}
        for index, step in enumerate(steps):
            trajectories.setdefault(step.trajectory_id, []).append(index)

        async def in_order(indices: list[int]) -> None:  # one trajectory's steps one after another
            for index in indices:
                answers[index] = await _observe(service, finished, steps[index], caller)

        await asyncio.gather(*(in_order(indices) for indices in trajectories.values()))
        return json_response(
            {
                "observations": [a[0] for a in answers],
                "dones": [a[1] for a in answers],
                "valids": [a[2] for a in answers],
                "faults": [a[3] for a in answers],
            }
        )

    return routes


async def _observe(
    service: Service, finished: OrderedDict[str, None], step: Step, caller: str
) -> tuple[str, bool, bool, str | None]:
    """One trajectory's step: (observation, done, valid, fault). Python state lives in a session per
    trajectory, scoped to the caller's address: a trajectory id names a session only for the
    client that made it, and a finished one (its key in `finished`) is never opened again."""
    key = f"{caller}\0{step.trajectory_id}".encode("utf-8", "surrogatepass")
    session_id = "verltool:" + hashlib.blake2b(key, digest_size=16).hexdigest()
    if step.finish:
        finished[session_id] = None
        finished.move_to_end(session_id)
        while len(finished) > FINISHED_TRAJECTORIES_KEPT:
            finished.popitem(last=False)
        await service.close_session(session_id, VERLTOOL)
        return "", True, True, None
    if session_id in finished:
        name = shown(step.trajectory_id.split(":", 1)[1], 80)
        why = f"[{outcome.ERROR}: trajectory {name} was finished; use a new trajectory id]"
        return why, True, False, outcome.FAULT_CODE
    call = extract(step.action)
    if call is None:
        return "", False, False, None
    kind, text = call
    tool = service.tool_of_type(kind)
    if tool is None:  # the model chose a tag for a tool this pool lacks: its failure, not the pool's
        why = f"this pool has no {kind} tool; it serves {', '.join(service.tools)}"
        return f"[{outcome.ERROR}: {why}]", False, False, outcome.FAULT_CODE
    try:
        if kind == "python":
            opened = await service.ensure_session(tool.name, session_id, VERLTOOL)
            if isinstance(opened, ToolResult):
                return opened.observation(), False, False, opened.whose_fault()
            payload = {"code": text, "stdin": step.stdin}
            result = await service.execute(
                ExecuteRequest(tool.name, payload, None, session_id), VERLTOOL, PROTOCOL
            )
        else:
            result = await service.execute(ExecuteRequest(tool.name, text, None, None), protocol=PROTOCOL)
    except (Rejected, SessionLimit, SessionExists) as exc:
        return f"[{outcome.REJECTED}: {exc}]", False, False, outcome.FAULT_INFRA
    except ToolInputError as exc:
        return f"[{outcome.ERROR}: {exc}]", False, False, outcome.FAULT_CODE
    return result.observation(), False, True, result.whose_fault()
