"""The CRD's defaults as a small pure-data module of the API (toolrl_api.crd_defaults), for the tool
pool, which reads job-spec fields without the apiserver in between.

The CRD's openAPIV3Schema is the one home of each default. The operator gets every job from the
apiserver with them applied; the tool pool (a hand-written `tools.yaml`) applies them itself, from the
module written here; the trainer derives them when it starts from the API's copy of the CRD's schema
(toolrl_api.crd_schema). Both with the same rules of defaulting, `toolrl_api.defaulting`'s (the API is a
leaf distribution: the generator imports it and no runtime distribution). `make chart-check` fails when
the module is stale.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from toolrl_api.defaulting import defaults_when_present, object_defaults

MODULE = "crd_defaults.py"
API_PACKAGE = "api/toolrl_api"
"""Where every generated module of the API goes (relative to the repository root): the one package the
operator, the trainer and the tool pool share."""
DISTRIBUTIONS = (API_PACKAGE,)


def storage_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The storage version's openAPIV3Schema."""
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The storage version's schema of `spec`."""
    schema: dict[str, Any] = storage_schema(crd)["properties"]["spec"]
    return schema


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
