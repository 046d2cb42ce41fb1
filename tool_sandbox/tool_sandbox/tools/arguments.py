"""A tool call's JSON arguments checked against its tool's schema (function tools' `parameters`, a remote
MCP tool's `inputSchema`) without ever stopping the pool, and the shapes every client can send.

jsonschema alone is not safe on the event loop: a schema's `pattern` with catastrophic backtracking froze
the whole pool for hours on a 35-character argument (Python's `re` holds the GIL), `uniqueItems` compares
objects pairwise (seconds at 33 KiB), and a `$ref` to a URL is fetched, without a timeout, at every call.
Here: patterns run in the `regex` engine with a timeout (it releases the GIL), `uniqueItems` is one pass
over hashable copies, every keyword checks the call's deadline, the whole check runs in a thread of its
own, and no reference is ever fetched (a function tool's schema with a remote `$ref` is refused at
load; a remote MCP tool's is left to its server)."""

from __future__ import annotations

import asyncio
import functools
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import referencing
import regex
from jsonschema import ValidationError

MAX_DEPTH = 100  # nesting of a call's arguments: the pool's own clients (MCP: ~250 levels in all) send these
# The pool's own keyword, added to a function tool's schema that does not say which other keys may come
# (declared_only): keys outside `properties` (and `patternProperties`) are refused.
DECLARED_ONLY = "x-toolrl-declared-only"
VALIDATION_THREADS = 4
CHECK_SECONDS = 2.0  # the longest a call's arguments may take to check (its timeout, when shorter)
_executor: ThreadPoolExecutor | None = None
_deadline = threading.local()  # the deadline of the check running in this thread


class TooSlow(Exception):
    """The check ran past its deadline."""


def shape_problem(value: Any, surrogates: bool = False) -> str:
    """What makes these arguments unsendable, or "": nesting past MAX_DEPTH (every client and JSON
    encoder has a limit, at depths that differ by protocol; the pool answers it the same way in all), and with
    `surrogates` a lone surrogate (JSON may escape one; UTF-8, and so the MCP client, cannot carry it)."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, where = stack.pop()
        if depth > MAX_DEPTH:
            return f"the arguments nest more than {MAX_DEPTH} levels deep (at {where}); send a flatter object"
        if isinstance(item, dict):
            for key, child in item.items():
                stack.append((key, depth, where))
                stack.append((child, depth + 1, f"{where}/{key}"[:200]))
        elif isinstance(item, list):
            stack.extend((child, depth + 1, f"{where}/{index}"[:200]) for index, child in enumerate(item))
        elif surrogates and isinstance(item, str) and not _encodable(item):
            return (
                f"the arguments hold a lone surrogate (at {where or '/'}), which UTF-8 cannot encode and so"
                " this tool's client cannot send; send valid Unicode text"
            )
    return ""


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def remote_references(schema: Any) -> list[str]:
    """The `$ref`/`$dynamicRef` values of a schema that point outside it (anything but "#...")."""
    found, stack = [], [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in ("$ref", "$dynamicRef") and isinstance(value, str) and not value.startswith("#"):
                    found.append(value)
                else:
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _until() -> float:
    return getattr(_deadline, "until", float("inf"))


def _check_deadline() -> None:
    if time.monotonic() > _until():
        raise TooSlow


def _search(pattern: str, text: str) -> bool | None:
    """re.search's answer, in bounded time (None: out of time)."""
    left = _until() - time.monotonic()
    if left <= 0:
        return None
    try:
        return regex.search(pattern, text, timeout=None if math.isinf(left) else left) is not None
    except TimeoutError:
        return None
    except regex.error:  # a pattern only Python's re reads (the schema was checked with it)
        return re.search(pattern, text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string"):
        found = _search(pattern, instance)
        if found is None:
            shown = instance if len(instance) <= 40 else instance[:40] + "..."
            yield ValidationError(
                f"{shown!r} could not be matched against the pattern {pattern!r} in the time a call's"
                " arguments may take to check; send a value that fits the pattern"
            )
        elif not found:
            yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "object"):
        for pattern, subschema in patterns.items():
            for key, value in instance.items():
                if _search(pattern, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _undeclared(instance: dict[str, Any], schema: Any) -> list[str]:
    """The keys of `instance` that neither the schema's `properties` nor its `patternProperties` name."""
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [key for key in instance if key not in properties and not any(_search(p, key) for p in patterns)]


def _additional_properties(
    validator: Any, extra: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    patterns = list(schema.get("patternProperties", {}))
    extras = _undeclared(instance, schema)
    if validator.is_type(extra, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra, path=key)
    elif not extra and extras:  # jsonschema's own messages
        joined = ", ".join(repr(key) for key in sorted(extras))
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(
                f"{joined} {verb} not match any of the regexes: {', '.join(map(repr, sorted(patterns)))}"
            )
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({joined} {verb} unexpected)")


def _declared_only(validator: Any, on: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not (on and validator.is_type(instance, "object")):
        return
    extras = _undeclared(instance, schema)
    if extras:
        declared = [*schema.get("properties", {})]
        declared += [f"names matching {pattern!r}" for pattern in schema.get("patternProperties", {})]
        takes = f"this tool takes {', '.join(declared)}" if declared else "this tool takes no arguments"
        noun = "argument" if len(extras) == 1 else "arguments"
        joined = ", ".join(repr(key) for key in sorted(extras))
        yield ValidationError(f"unexpected {noun} {joined}; {takes}")


def declared_only(schema: dict[str, Any]) -> dict[str, Any]:
    """A function tool's schema as its calls are checked: a schema that does not say which other keys
    may come (neither `additionalProperties` nor `unevaluatedProperties`) takes only the keys it declares.
    JSON Schema would pass the others, and they reach the function as keyword arguments its author may
    never have offered to the model (`def lookup(q, _debug=False)`)."""
    if "additionalProperties" in schema or "unevaluatedProperties" in schema:
        return schema
    return {**schema, DECLARED_ONLY: True}


def _same(value: Any) -> Any:
    """A hashable copy equal for JSON-equal values (1 and 1.0 alike, True and 1 not)."""
    if isinstance(value, bool) or value is None:
        return ("constant", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(_same(item) for item in value))
    return ("object", frozenset((key, _same(item)) for key, item in value.items()))


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if unique and validator.is_type(instance, "array"):
        seen: dict[Any, int] = {}
        for index, item in enumerate(instance):
            first = seen.setdefault(_same(item), index)
            if first != index:
                yield ValidationError(f"has non-unique elements (items {first} and {index} are equal)")
                return


def _bounded(keyword: Callable[..., Any]) -> Callable[..., Any]:
    def check(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        _check_deadline()
        yield from keyword(validator, value, instance, schema) or ()

    return check


_BASE = jsonschema.Draft202012Validator
BoundedValidator = jsonschema.validators.extend(
    _BASE,
    {
        **{name: _bounded(keyword) for name, keyword in _BASE.VALIDATORS.items()},
        "pattern": _bounded(_pattern),
        "patternProperties": _bounded(_pattern_properties),
        "additionalProperties": _bounded(_additional_properties),
        "uniqueItems": _bounded(_unique_items),
        DECLARED_ONLY: _bounded(_declared_only),
    },
)


def validator(schema: dict[str, Any]) -> Any:
    """A validator of a (checked) schema that never fetches a reference."""
    return BoundedValidator(schema, registry=referencing.Registry())


async def argument_problems(checker: Any, arguments: Any, seconds: float, surrogates: bool = False) -> str:
    """What is wrong with a call's arguments, or "": their shape (shape_problem), then by its tool's
    schema when `checker` is one (the first five problems); in a thread, not on the event loop, within
    `seconds` or CHECK_SECONDS (arguments not checked by then count as wrong)."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(VALIDATION_THREADS, thread_name_prefix="arguments")
    seconds = min(seconds, CHECK_SECONDS)
    check = functools.partial(_problems, checker, arguments, seconds, surrogates)
    return await asyncio.get_running_loop().run_in_executor(_executor, check)


def _problems(checker: Any, arguments: Any, seconds: float, surrogates: bool) -> str:
    _deadline.until = time.monotonic() + seconds
    shape = shape_problem(arguments, surrogates)
    if shape or checker is None:
        return shape
    found: list[ValidationError] = []
    late = ""
    try:
        for error in checker.iter_errors(arguments):
            found.append(error)
            if len(found) >= 100:
                break
    except TooSlow:
        late = (
            f"checking the arguments against the tool's schema took longer than {seconds:g}s, so they were"
            " not accepted; send smaller arguments"
        )
    except referencing.exceptions.Unresolvable as exc:
        late = f"the tool's schema refers to {exc.ref!r}, which the pool does not fetch"
    problems = sorted(found, key=lambda e: [str(p) for p in e.absolute_path])[:5]
    return "; ".join([*(_problem(e) for e in problems), *([late] if late else [])])


def _problem(error: ValidationError) -> str:
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message
