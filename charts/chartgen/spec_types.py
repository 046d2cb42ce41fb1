"""The CRD's schemas of `spec` and `status` as typed Python: pydantic v2 models, one class per object, in
the API (toolrl_api.spec_types, toolrl_api.status_types).

The CRD is the one home of each default, enum and bound; the operator parses a job's `spec` into these
classes once per sync (toolrl_operator/job.py) and its builders read attributes instead of dict keys
with restated defaults; the status writers check what they write against the status classes (the
apiserver would drop a field the CRD does not know without a word). Attributes are snake_case, aliased
to the CRD's camelCase names; an enum is a `Literal`; a bound is a `Field` constraint; a default is
the CRD's. What Kubernetes itself defines and the operator passes to pods as it is (resources, env,
tolerations, volumes, labels, ...) stays a plain dict or list: an object with no `properties`, one
that keeps unknown fields, or one named in `KUBERNETES_TYPES`. `make chart-check` fails when the
generated modules are stale.
"""

from __future__ import annotations

import keyword
import re
from typing import Any

import yaml

from .crd_defaults import API_PACKAGE, python_literal, spec_schema, storage_schema

MODULE = "spec_types.py"
STATUS_MODULE = "status_types.py"
DISTRIBUTIONS = (API_PACKAGE,)

KUBERNETES_TYPES = frozenset({"resources", "env", "imagePullSecrets"})
"""Objects (or arrays of objects) with `properties` that are Kubernetes' own types (a subset of
ResourceRequirements, EnvVar, LocalObjectReference), copied into pods verbatim: plain dicts."""

SCALARS = {"string": "str", "integer": "int", "number": "int | float", "boolean": "bool"}
"""A JSON number stays as written (an int default stays an int): `int | float`, not `float`."""
ROOT_CLASS = "Spec"
STATUS_CLASS = "Status"  # its classes are prefixed with it: StatusToolPool beside the spec's ToolPool
_WORD = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake(name: str) -> str:
    """`maxPromptLength` -> `max_prompt_length`, `memoryLimitMiB` -> `memory_limit_mib`; a Python
    keyword gets a trailing underscore (`async_`)."""
    out = _WORD.sub("_", re.sub(r"([KMGT])iB", r"\1ib", name)).lower()
    return out + "_" if keyword.iskeyword(out) else out


def _pascal(name: str) -> str:
    return name[:1].upper() + name[1:]


def _typed(key: str, prop: dict[str, Any]) -> bool:
    """Whether an object property becomes a class of its own."""
    return (
        prop.get("type") == "object"
        and bool(prop.get("properties"))
        and not prop.get("x-kubernetes-preserve-unknown-fields")
        and key not in KUBERNETES_TYPES
    )


class _Renderer:
    def __init__(self) -> None:
        self.classes: list[str] = []  # in definition order: a class after those it refers to
        self.names: set[str] = set()

    def object_class(self, name: str, path: str, schema: dict[str, Any]) -> str:
        if name in self.names:
            raise ValueError(f"two objects of the CRD's spec would both be class {name} (at {path})")
        self.names.add(name)
        required = set(schema.get("required", []))
        fields = [
            self.field(name, path, key, prop, key in required) for key, prop in schema["properties"].items()
        ]
        self.classes.append(
            f"class {name}(_Object):\n"
            f'    """`{path}`."""\n\n' + "".join(f"    {line}\n" for line in fields)
        )
        return name

    def annotation(self, owner: str, path: str, key: str, prop: dict[str, Any]) -> str:
        kind = prop.get("type")
        if "enum" in prop:
            return "Literal[" + ", ".join(python_literal(v) for v in prop["enum"]) + "]"
        if prop.get("x-kubernetes-int-or-string"):
            return "int | str"
        if kind == "object":
            if _typed(key, prop):
                return self.object_class(owner + _pascal(key), path, prop)
            extra = prop.get("additionalProperties")
            if isinstance(extra, dict) and extra.get("type") == "string":
                return "dict[str, str]"
            return "dict[str, Any]"
        if kind == "array":
            items = prop.get("items", {})
            if items.get("type") == "object" and _typed(key, items):
                singular = key[:-1] if key.endswith("s") else key + "Item"
                return f"list[{self.object_class(owner + _pascal(singular), path + '[]', items)}]"
            return f"list[{self.annotation(owner, path + '[]', key, items)}]"
        return SCALARS.get(kind, "Any")

    def field(self, owner: str, parent: str, key: str, prop: dict[str, Any], required: bool) -> str:
        path = f"{parent}.{key}"
        annotation = self.annotation("" if owner == ROOT_CLASS else owner, path, key, prop)
        options = [f"alias={python_literal(key)}"]
        for bound, arg in (("minimum", "ge"), ("maximum", "le"), ("maxLength", "max_length")):
            if bound in prop:
                options.append(f"{arg}={prop[bound]!r}")
        if "pattern" in prop and annotation == "str":
            options.append(f"pattern={python_literal(prop['pattern'])}")
        if "default" in prop:
            default = prop["default"]
            if annotation in self.names and default == {}:
                options.insert(0, f"default_factory={annotation}")  # the class with its own defaults
            elif annotation in self.names:
                literal = python_literal(default)
                options.insert(0, f"default_factory=lambda: {annotation}.model_validate({literal})")
            else:  # a list or dict too: pydantic copies a mutable default for each job
                options.insert(0, f"default={python_literal(default)}")
        elif not required:
            annotation += " | None"
            options.insert(0, "default=None")
        return f"{snake(key)}: {annotation} = Field({', '.join(options)})"


def _module(
    root: str, path: str, schema: dict[str, Any], what: str, source: str, command: str, by_name: bool = False
) -> str:
    config = ", validate_by_name=True" if by_name else ""
    renderer = _Renderer()
    renderer.object_class(root, path, schema)
    return (
        "# ruff: noqa: E501\n"
        f'"""The ToolRLJob CRD\'s `{path}` as pydantic models: one class per object, attributes in\n'
        f"snake_case aliased to the CRD's camelCase, {what}.\n\n"
        f"GENERATED from {source} by `{command}`\n"
        "(charts/chartgen/spec_types.py): do not edit; change the CRD and regenerate.\n"
        "`make chart-check` fails while this file is stale.\n"
        '"""\n\n'
        "from typing import Any, Literal\n\n"
        "from pydantic import BaseModel, ConfigDict, Field\n\n\n"
        "class _Object(BaseModel):\n"
        f"    model_config = ConfigDict(frozen=True, extra=\"forbid\"{config})\n\n\n"
        + "\n\n".join(renderer.classes)
    )


def render_module(crd_text: str, source: str, command: str) -> str:
    """The spec module's text for a CRD manifest."""
    schema = spec_schema(yaml.safe_load(crd_text))
    return _module(ROOT_CLASS, "spec", schema, "the CRD's defaults, enums and bounds", source, command)


def render_status_module(crd_text: str, source: str, command: str) -> str:
    """The status module's text for a CRD manifest: every field optional (a writer sends a fragment)."""
    schema = storage_schema(yaml.safe_load(crd_text))["properties"]["status"]
    what = "the CRD's enums and bounds; every field optional, as a writer's fragment has it"
    # a writer builds them by attribute name (StatusProgress(step=...)); a spec is only ever read
    return _module(STATUS_CLASS, "status", schema, what, source, command, by_name=True)
