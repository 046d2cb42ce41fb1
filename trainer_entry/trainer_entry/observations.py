"""What the model reads back from a tool call: the one place that decides it.

A tool's `observationFormat` (spec.tools[], python tools only; the CRD's enum) picks the format; `PoolTool`
(tools.py) sets it on each `CallResult` it returns and unwraps the code it sends, and
`CallResult.observation()` (pool_client.py) words the result with `observation` below. Both formats are
documented in the CRD field's description and in tool_sandbox/README.md ("What the model reads back").

- `default`: the program's stdout when it exits 0 (its stderr only when it printed nothing), `Error: ` and
  its stderr when it fails (stdout dropped; shown only when stderr is empty), one sentence for a timeout, a
  kill, a rejection or an unreachable pool, then `[output truncated]` when a stream was cut.
- `sandbox-fusion`: what verl's SandboxFusionTool (ReTool's code interpreter) shows of SandboxFusion's
  answer: the first fenced Python block of the code is what runs; a run that finished (SandboxFusion's
  run_result.status `Finished`: any exit code, a signal) shows stdout directly followed by stderr, anything
  else `no stdout here`.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any, Protocol


class WordedResult(Protocol):
    """What of a tool call's result (pool_client.CallResult, which satisfies it) the wording reads: this
    module depends on its shape only, so pool_client, whose results word themselves with it, can import
    it."""

    status: str
    output: str
    stdout: str
    stderr: str
    duration_seconds: float
    truncated: bool
    attempts: int
    error: str
    raw: dict[str, Any]
    observation_format: str


OBSERVATION_DEFAULT = "default"
OBSERVATION_SANDBOX_FUSION = "sandbox-fusion"
# the CRD's enum of spec.tools[].observationFormat (tests/unit/trainer_entry/test_observations.py)
OBSERVATION_FORMATS = (OBSERVATION_DEFAULT, OBSERVATION_SANDBOX_FUSION)
# verl's SandboxFusionTool's text when SandboxFusion's run did not finish (a timeout, no run at all)
SANDBOX_FUSION_UNFINISHED = "no stdout here"
# the pool's statuses of a program that ended by itself (exit code or signal): SandboxFusion's `Finished`
_FINISHED = ("ok", "error", "killed")
# a call the trainer refused before it reached the pool (tools.pool_input): no code ran in any format
_REFUSED = "invalid"

# A fenced block: ``` and its language tag (letters, digits, _ + -; or none), the rest of that line, then
# everything up to the next ``` (the block's own line breaks and indentation included). Possessive before
# the lazy body, so an opening fence is scanned once: linear time, whatever the model wrote.
_FENCE = re.compile(r"```([\w+-]*+)[ \t]*+(\n?+)(.*?)```", re.DOTALL)
# the tags of a block that holds Python (any case); a block tagged otherwise (```text) is not run
PYTHON_TAGS = ("python", "python3", "py", "py3")


def unwrap_fenced_code(code: str) -> str:
    """A python call's code as the sandbox-fusion format runs it: the first fenced block tagged as Python
    (```python ... ```, ```py ... ```, on one line too) or untagged with its code on the lines after the
    fence (```\\n ... ```), without its fences, dedented, blank space around it stripped; code with no such
    block runs as it is. ReTool's tool does the same with the first ```python block (stripped). An
    untagged fence must end its line, so a string literal holding ``` is rarely taken for one."""
    for block in _FENCE.finditer(code):
        tag, line_break, body = block.groups()
        if tag.lower() in PYTHON_TAGS or (not tag and line_break):
            return textwrap.dedent(body).strip()
    return code


def observation(result: WordedResult) -> str:
    """The text the model reads back for `result`, in its `observation_format`. A call refused before it
    reached the pool (no code argument) reads the same in every format: no code ran."""
    if result.observation_format == OBSERVATION_SANDBOX_FUSION and result.status != _REFUSED:
        return sandbox_fusion_observation(result)
    return default_observation(result)


def ran_to_its_end(result: WordedResult) -> bool:
    """The pool ran the program and it ended by itself, with an exit code (0 or not) or a signal: what
    SandboxFusion reports as run_result.status `Finished` (the pool's own /run_code maps its results the
    same way). Not a timeout, not a sandbox error (a worker lost, a fork refused), not a call the pool
    refused or never answered (then no pool answer is in `raw`)."""
    return bool(result.raw) and result.status in _FINISHED and not result.raw.get("sandboxError")


def sandbox_fusion_observation(result: WordedResult) -> str:
    """As verl's SandboxFusionTool shows SandboxFusion's answer: stdout directly followed by stderr (no
    separator, whatever the exit code) when the run finished, else `no stdout here`. Nothing is added: a
    stream cut at the tool's maxOutputBytes carries the pool's own marker inside it."""
    if ran_to_its_end(result):
        return result.stdout + result.stderr
    return SANDBOX_FUSION_UNFINISHED


def default_observation(result: WordedResult) -> str:
    """The output, or a clear account of what failed."""
    if result.status == "ok":
        text = result.output if result.output else result.stdout
        if result.stderr and not result.output:
            text = f"{text}\n{result.stderr}" if text else result.stderr
    elif result.status == "timeout":
        text = f"Error: the tool call timed out after {result.duration_seconds:.1f}s."
    elif result.status == "killed":
        text = "Error: the tool process was killed (it exceeded a resource limit)."
    elif result.status == "rejected":
        text = f"Error: the tool pool rejected the call ({result.error or 'overloaded'})."
    elif result.status == "unreachable":
        text = f"Error: the tool could not be reached after {result.attempts} attempts ({result.error})."
    else:
        detail = result.stderr or result.output or result.error or "unknown error"
        text = f"Error: {detail}"
    if result.truncated:
        text += "\n[output truncated]"
    return text
