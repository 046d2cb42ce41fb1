"""The CRD's defaults as a small pure-data Python module, for the tool pool, which reads job-spec fields
without the apiserver in between.

The CRD's openAPIV3Schema is the one home of each default. The operator gets every job from the
apiserver with them applied; the tool pool (a hand-written `tools.yaml`) applies them itself, from the
module written here; the trainer derives them when it starts from its copy of the CRD's schema
(crd_schema.py). Both with the same rules of defaulting, `trainer_entry.crd_defaulting`'s (this
generator runs in the workspace, where every distribution is installed). `make chart-check` fails when
the module is stale.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from trainer_entry.crd_defaulting import apply_defaults, defaults_when_present, object_defaults

__all__ = ["DISTRIBUTIONS", "MODULE", "apply_defaults", "python_literal", "render_module", "spec_schema"]

MODULE = "crd_defaults.py"
DISTRIBUTIONS = ("tool_sandbox/tool_sandbox",)
"""Where a copy goes (relative to the repository root): the packages that read job-spec defaults without
the apiserver in between and have no copy of the CRD's schema. The trainer derives its defaults from its
crd_schema.py (crd_schema.DISTRIBUTIONS); the operator reads jobs from the apiserver, defaulted."""


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The storage version's schema of `spec`."""
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


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
