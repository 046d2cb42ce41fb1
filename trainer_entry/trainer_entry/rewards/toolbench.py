"""StableToolBench-style reward from the calls of a trajectory.

    score = formatWeight·format + functionCallWeight·function_call + finishWeight·finish
            + errorPenalty·error_rate + finishBonus·answered

format: every call is well formed (and there is one); function_call: share of calls whose observation
has no error; finish: `Finish` was called; error_rate: share of calls that failed; answered: `Finish`
with return_type give_answer and a non-empty final_answer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from trainer_entry.protocols import is_finish
from trainer_entry.spec import DEFAULTS

DEFAULT_WEIGHTS = DEFAULTS["reward"]["toolbench"]  # the CRD's, from the spec's one table

REACT_STEP = re.compile(
    r"Action:\s*(?P<name>[^\n]+?)\s*\n\s*Action Input:\s*(?P<input>.*?)"
    r"(?:\n\s*Observation:\s*(?P<obs>.*?))?(?=\n\s*(?:Thought:|Action:)|\Z)",
    re.DOTALL,
)
HERMES_CALL = re.compile(r"<tool_call>\s*(?P<call>.*?)\s*</tool_call>", re.DOTALL)
HERMES_RESPONSE = re.compile(r"<tool_response>\s*(?P<obs>.*?)\s*</tool_response>", re.DOTALL)


@dataclass(frozen=True)
class Step:
    name: str
    arguments: dict[str, Any] | None  # None: the call was malformed
    observation: str | None  # None: no observation (Finish, or the trajectory ended)


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text.strip() or "{}")
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def steps_from_text(solution: str) -> list[Step]:
    """The calls of a ReAct or hermes trajectory, in order."""
    if "<tool_call>" in solution:
        responses = [m["obs"] for m in HERMES_RESPONSE.finditer(solution)]
        steps = []
        for i, match in enumerate(HERMES_CALL.finditer(solution)):
            call = _json_object(match["call"])
            name = str(call.get("name", "")) if call else ""
            arguments = call.get("arguments") if call else None
            if isinstance(arguments, str):
                arguments = _json_object(arguments)
            steps.append(
                Step(
                    name,
                    arguments if isinstance(arguments, dict) else None,
                    responses[i] if i < len(responses) else None,
                )
            )
        return steps
    return [
        Step(m["name"].strip(), _json_object(m["input"]), m["obs"].strip() if m["obs"] is not None else None)
        for m in REACT_STEP.finditer(solution)
    ]


def steps_from_answer(doc: dict[str, Any]) -> list[Step]:
    """The calls of a StableToolBench answer file (`trys[-1].chain`: Action / Action Input nodes)."""
    chain = doc["trys"][-1]["chain"] if doc.get("trys") else doc["answer_generation"]["chain"]
    steps: list[Step] = []
    name = None
    for node in chain:
        if node.get("node_type") == "Action":
            name = node["description"]
        elif node.get("node_type") == "Action Input" and name is not None:
            steps.append(Step(name, _json_object(node["description"]), node.get("observation")))
            name = None
    return steps


def failed(observation: str | None) -> bool:
    """A StableToolBench observation with a non-empty `error`, or one of our `Error:` observations."""
    if observation is None:
        return False
    text = observation.strip()
    if text.startswith("Error:"):
        return True
    doc = _json_object(text)
    return bool(doc and doc.get("error"))


def score_steps(steps: list[Step], weights: dict[str, float] | None = None) -> dict[str, float]:
    w = {**DEFAULT_WEIGHTS, **(weights or {})}
    calls = [s for s in steps if not is_finish(s.name)]
    finishes = [s for s in steps if is_finish(s.name)]
    well_formed = bool(steps) and all(s.arguments is not None for s in steps)
    failures = sum(1 for s in calls if s.arguments is None or failed(s.observation))
    function_call = (len(calls) - failures) / len(calls) if calls else 0.0
    error_rate = failures / len(calls) if calls else 0.0
    finish = finishes[-1].arguments if finishes else None
    answered = bool(
        finish and finish.get("return_type") == "give_answer" and str(finish.get("final_answer", "")).strip()
    )
    parts = {
        "format": float(well_formed),
        "function_call": function_call,
        "finish": float(bool(finishes)),
        "error_rate": error_rate,
        "answered": float(answered),
    }
    total = (
        w["formatWeight"] * parts["format"]
        + w["functionCallWeight"] * function_call
        + w["finishWeight"] * parts["finish"]
        + w["errorPenalty"] * error_rate
        + w["finishBonus"] * parts["answered"]
    )
    return {"score": total, **parts}


def score(solution: str, weights: dict[str, float] | None = None) -> dict[str, float]:
    return score_steps(steps_from_text(solution), weights)
