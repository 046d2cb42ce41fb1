"""The `function` tool: a user's Python function (its source a file the operator mounts from a
ConfigMap), called per call INSIDE the sandbox with the model's JSON arguments, with the isolation,
limits, verdicts and metrics of a python call. Its return value is the observation.

The model's arguments are checked against the tool's `parameters` first; a key the schema does not
declare is refused (the model's fault) unless the schema says what other keys may come
(`additionalProperties` true or a schema; `arguments.declared_only`): a function may have keyword
arguments its author never offered to the model (`def lookup(q, _debug=False)`).

Its keyword-only parameters (after `*`) are per-sample values, as verl passes a tool's `create_kwargs`
from the row (`extra_info.tools_kwargs.<tool>.create_kwargs`, e.g. the ground truth): the trainer sends
them as the call's `sample`, the model never sees them (they are not in `parameters`) and cannot give
them (a call that names one is refused as the model's fault). A call that lacks a required one is the
data's fault, not the model's (fault infra: the trajectory is excluded, the message names the row's key).

A call runs a small runner program in a sandboxed child: the user's source is placed in the call's
directory as a module of its own (so an `if __name__ == "__main__":` block does not run), the
arguments come on standard input, the function's own prints go to standard error and the runner
prints the return value (a string as it is, anything else as JSON). Whether the call failed, and
whose fault it was, comes from the worker (the child's exit), as for any python call."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import jsonschema

from tool_sandbox.config import ConfigError, ServerSettings, ToolConfig
from tool_sandbox.sandbox import outcome
from tool_sandbox.sandbox.pool import Pool
from tool_sandbox.tools.arguments import argument_problems, declared_only, remote_references, validator
from tool_sandbox.tools.base import Tool, ToolInputError, ToolResult
from tool_sandbox.tools.python import PythonTool

MODULE_FILE = "tool_function.py"  # the user's source, in the call's directory
MAX_SOURCE_BYTES = 1 << 20  # a ConfigMap holds at most 1 MiB

# The runner: argv is never used (the sandbox's program has none); the function's name and the name its
# file is shown by come as the first line of stdin (JSON), its JSON arguments as the rest.
# The source is read by its name in the working directory, not by an absolute path: a child under a uid of
# its own (root mode) may not pass through the directories above its working directory.
# A failure is shown as the interpreter words it (`own_frames`): the exception's type and message, and the
# lines of the function's own file it passed through, without their source text (the function's source is
# not the model's to read) and without any other file (the runner's path is the worker's directory). The
# source is compiled under the name `<FILE>`, which no file has: nothing that reads source lines by a code
# object's file name (a warning's line, the interpreter's traceback printer, inspect) can read it either.
RUNNER = """\
import asyncio, inspect, json, sys, traceback, types
name, file = json.loads(sys.stdin.readline())
arguments = sys.stdin.read()
compiled = f"<{file}>"
out, sys.stdout = sys.stdout, sys.stderr  # what the source prints goes to stderr


def main():
    module = types.ModuleType("tool_function")
    module.__file__ = "tool_function.py"
    sys.modules["tool_function"] = module
    with open("tool_function.py", "rb") as source:
        code = compile(source.read(), compiled, "exec")
    exec(code, module.__dict__)
    function = getattr(module, name, None)
    if not callable(function):
        sys.exit(f"{file} defines no function {name!r}; define it at the top level of the source")
    if arguments == "":  # the start's check: the function's keyword-only parameters (per-sample values)
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):
            parameters = []
        keyword_only = {p.name: p.default is p.empty for p in parameters if p.kind is p.KEYWORD_ONLY}
        out.write("ok " + json.dumps(keyword_only))
        sys.exit(0)
    value = function(**json.loads(arguments))
    if inspect.isawaitable(value):
        async def wait():
            return await value
        value = asyncio.run(wait())
    sys.stdout.flush()
    out.write(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str))


def own_frames(te):
    # the interpreter's report (its causes and group members too), with the function file's frames only
    own = [
        traceback.FrameSummary(file, f.lineno, f.name, line="") for f in te.stack if f.filename == compiled
    ]
    te.stack = traceback.StackSummary.from_list(own)
    for inner in (te.__cause__, te.__context__, *(te.exceptions or ())):
        if inner is not None:
            own_frames(inner)
    return te


try:
    main()
except SystemExit:
    raise
except BaseException as exc:
    sys.stdout.flush()
    report = traceback.TracebackException.from_exception(exc, lookup_lines=False)
    sys.stderr.write("".join(own_frames(report).format()))
    sys.exit(1)
"""


def check_parameters(schema: Any, where: str) -> None:
    """A function tool's `parameters`: a valid JSON schema (draft 2020-12) of an object."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ConfigError(
            f'{where}.parameters: must be a JSON schema of an object ({{"type": "object", "properties":'
            " {...}}): the model's arguments are the function's keyword arguments"
        )
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(
            f"{where}.parameters: not a valid JSON schema: {exc.message}; fix the schema"
        ) from exc
    remote = remote_references(schema)
    if remote:
        raise ConfigError(
            f"{where}.parameters: $ref {remote[0]!r} points outside the schema; the pool fetches no schema"
            " (it would at every call): put the definition under $defs and refer to it as #/$defs/..."
        )


class FunctionResult(ToolResult):
    """A function call's answer: when it returned, the model reads its value alone (what the
    function printed stays in `stderr`); when it failed, the traceback as for any call."""

    def observation(self) -> str:
        return self.output if self.status == outcome.OK else super().observation()


class FunctionTool(Tool):
    type = "function"
    description = "Call the user's function with JSON arguments."
    runs_code = True
    takes_sample = True

    @classmethod
    def check_config(cls, values: dict[str, Any], where: str) -> None:
        # the CRD's rules held (tools.parse_tools): parameters and function are there, names identifiers
        check_parameters(values["parameters"], where)
        if not values.get("source"):
            raise ConfigError(
                f"{where}: a function tool needs source, the path of its Python file (the operator sets it"
                " from function.configMap)"
            )

    @classmethod
    def create(cls, config: ToolConfig, pool: Pool | None, settings: ServerSettings) -> Tool:
        assert pool is not None, "a function tool runs in the sandbox pool"
        return cls(config, pool, settings)

    def __init__(self, config: ToolConfig, pool: Pool, settings: ServerSettings) -> None:
        super().__init__(config)
        self.function_name: str = config.function.get("name") or config.name
        self.input_schema = config.parameters
        self.validator = validator(declared_only(config.parameters))
        self.sandbox = PythonTool(config, pool, settings)  # its limits and its way of running a program
        self.files: dict[str, str] = {}
        # the name a failure's traceback shows the function's file by: the file's own, without its directory
        self.shown_file = os.path.basename(config.source or "") or MODULE_FILE
        # the function's keyword-only parameters (read at start): name -> required (no default)
        self.sample_parameters: dict[str, bool] = {}

    async def start(self) -> None:
        """Read the source and import it once in the sandbox: a source that is missing, does not
        import or lacks the function stops the pool's start with what to fix."""
        where = f"function tool {self.name!r} ({self.config.source})"
        try:
            with open(self.config.source, "rb") as handle:
                source = handle.read(MAX_SOURCE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(
                f"{where}: cannot read its source: {exc.strerror}; check function.configMap (name and key)"
            ) from exc
        if len(source) > MAX_SOURCE_BYTES:
            raise ConfigError(f"{where}: the source is over {MAX_SOURCE_BYTES} bytes")
        self.files = {MODULE_FILE: base64.b64encode(source).decode()}
        result = await self._run("")
        said, _, keyword_only = result.output.strip().partition(" ")
        if result.status != outcome.OK or said != "ok":
            detail = (result.stderr or result.message or result.output).strip()[-2000:]
            raise ConfigError(
                f"{where}: the source does not import or lacks function {self.function_name!r}"
                f" ({result.status}):\n{detail}\nfix the source in the ConfigMap"
            )
        self.sample_parameters = json.loads(keyword_only or "{}")
        shown = sorted(set(self.sample_parameters) & set(self.input_schema.get("properties") or {}))
        if shown:
            raise ConfigError(
                f"{where}: {', '.join(shown)} of {self.function_name}() is keyword-only: a per-sample value"
                f" from the row (extra_info.tools_kwargs.{self.name}.create_kwargs), never the model's;"
                " remove it from parameters, or make it an ordinary parameter for the model to give"
            )

    async def execute(self, payload: Any, timeout: float | None) -> ToolResult:
        return await self.execute_with_sample(payload, {}, timeout)

    async def execute_with_sample(
        self, payload: Any, sample: dict[str, Any], timeout: float | None
    ) -> ToolResult:
        if not isinstance(payload, dict):
            raise ToolInputError("input of a function tool must be a JSON object of the function's arguments")
        forged = sorted(set(payload) & set(self.sample_parameters))
        said = (
            f"{', '.join(forged)} is not an argument of this tool"
            if forged
            else await argument_problems(self.validator, payload, self.effective_timeout(timeout))
        )
        if said:
            message = f"invalid arguments for {self.name}: {said}"
            return ToolResult(status=outcome.ERROR, stderr=message, message=message, fault=outcome.FAULT_CODE)
        lacking = [
            name for name, required in self.sample_parameters.items() if required and name not in sample
        ]
        if lacking:
            message = (
                f"{self.name}: the call's sample gives no {', '.join(lacking)} (a keyword-only parameter of "
                f"{self.function_name}()): the row's extra_info.tools_kwargs.{self.name}.create_kwargs must"
                " hold it (the data's fault, not the model's)"
            )
            return ToolResult(
                status=outcome.ERROR, stderr=message, message=message, fault=outcome.FAULT_INFRA
            )
        values = {**payload, **{k: v for k, v in sample.items() if k in self.sample_parameters}}
        return await self._run(_json(values), timeout)

    async def _run(self, arguments: str, timeout: float | None = None) -> ToolResult:
        stdin = f"{json.dumps([self.function_name, self.shown_file])}\n{arguments}"
        result = await self.sandbox.run(
            {"code": RUNNER, "stdin": stdin}, self.effective_timeout(timeout), files=self.files
        )
        return FunctionResult(**vars(result))


def _json(arguments: dict[str, Any]) -> str:
    """The arguments as JSON for the runner: UTF-8 as sent (\\u escapes of non-ASCII text, escaped
    again in the worker frame, made a 19 MiB body overflow it), escapes only for lone surrogates."""
    text = json.dumps(arguments, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(arguments)
    return text
