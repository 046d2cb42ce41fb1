"""The apiserver's structural defaulting of a CRD's schema, for specs that never met an apiserver.

The CRD's schema (crd_schema.py, generated from the CRD) holds every default; spec.py derives the
defaults it applies to a hand-written `job.json` from it with these functions, when it is imported.
`make chart-generate` (charts/chartgen/crd_defaults.py) uses the same functions to write the tool pool's
defaults, so the rules of defaulting have this one home. Pure: no import of the generated schema here.
"""

from __future__ import annotations

import copy
from typing import Any

ITEMS = "[]"


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
