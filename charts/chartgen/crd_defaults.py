"""The CRD's defaults as a small pure-data Python module, one copy per distribution that reads job specs.

The CRD's openAPIV3Schema is the one home of each default. The operator gets every job from the
apiserver with them applied; the trainer (a hand-written `job.json`) and the tool pool (a hand-written
`tools.yaml`) apply them themselves, from the module written here. The distributions never import one
another, so each gets its own file; `make chart-check` fails when one is stale.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml

MODULE = "crd_defaults.py"
DISTRIBUTIONS = ("trainer_entry/trainer_entry", "tool_sandbox/tool_sandbox")
"""Where a copy goes (relative to the repository root): the packages that read job-spec fields without
the apiserver in between. The operator is not among them: it reads jobs from the apiserver, defaulted."""

ITEMS = "[]"


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The storage version's schema of `spec`."""
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the apiserver does it: each missing property that has a `default` gets a
    copy of it, then defaulting goes on inside every property present (a filled-in default included)."""
    if isinstance(value, dict):
        for key, prop in schema.get("properties", {}).items():
            if key not in value and "default" in prop:
                value[key] = copy.deepcopy(prop["default"])
            if key in value:
                apply_defaults(prop, value[key])
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            apply_defaults(schema["items"], item)
    return value


def _always_present(schema: dict[str, Any], key: str, prop: dict[str, Any]) -> bool:
    return "default" in prop or (prop.get("type") == "object" and key in schema.get("required", []))


def object_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    """What defaulting adds to an object given empty, in the schema's order: its defaults, and those
    inside each object property that is required (so present in every valid job)."""
    out: dict[str, Any] = {}
    for key, prop in schema.get("properties", {}).items():
        if "default" in prop:
            out[key] = apply_defaults(prop, copy.deepcopy(prop["default"]))
        elif _always_present(schema, key, prop):
            inner = object_defaults(prop)
            if inner:
                out[key] = inner
    return out


def defaults_when_present(schema: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """path -> defaults of each object that is not always there: an array's items (`tools[]`) and an
    optional object without a default of its own (`reward.custom`). Applied only where one is given."""
    out: dict[str, dict[str, Any]] = {}
    for key, prop in schema.get("properties", {}).items():
        where = f"{path}.{key}" if path else key
        if prop.get("type") == "array" and prop.get("items", {}).get("type") == "object":
            items = object_defaults(prop["items"])
            if items:
                out[where + ITEMS] = items
            out.update(defaults_when_present(prop["items"], where + ITEMS))
        elif prop.get("type") == "object":
            if not _always_present(schema, key, prop):
                inner = object_defaults(prop)
                if inner:
                    out[where] = inner
            out.update(defaults_when_present(prop, where))
    return out


def python_literal(value: Any, indent: int = 0) -> str:
    """`value` (YAML data: dicts, lists, strings, numbers, booleans, null) as Python source, one key
    of a non-empty dict per line."""
    if isinstance(value, dict) and value:
        inner = " " * (indent + 4)
        lines = [f"{inner}{json.dumps(k)}: {python_literal(v, indent + 4)}," for k, v in value.items()]
        return "{\n" + "\n".join(lines) + "\n" + " " * indent + "}"
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v, indent) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    raise TypeError(f"a CRD default of type {type(value).__name__} ({value!r}) has no Python literal here")


def render_module(crd_text: str, source: str, command: str) -> str:
    """The generated module's text for a CRD manifest."""
    schema = spec_schema(yaml.safe_load(crd_text))

    def literal(name: str, value: Any) -> str:
        return f"{name}: dict[str, Any] = {python_literal(value)}\n"

    return (
        f'"""The ToolRLJob CRD\'s defaults, as data.\n\n'
        f"GENERATED from {source} by `{command}`\n"
        f"(charts/chartgen/crd_defaults.py): do not edit; change the CRD and regenerate.\n"
        f"`make chart-check` fails while this file is stale.\n"
        f'"""\n\n'
        f"from typing import Any\n\n"
        + literal("SPEC_DEFAULTS", object_defaults(schema))
        + '"""`spec` as defaulting fills it: every default outside arrays and optional objects."""\n\n'
        + literal("DEFAULTS_WHEN_PRESENT", defaults_when_present(schema))
        + '"""Defaults of an array\'s items (`tools[]`) and of an optional object (`reward.custom`),\n'
        + 'by path in spec: applied to each one given."""\n'
    )
