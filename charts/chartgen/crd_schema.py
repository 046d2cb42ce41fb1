"""The CRD's schema of `spec`, with its CEL rules, as a pure-data module of the API
(toolrl_api.crd_schema).

The CRD is the one home of each bound, enum and rule (`x-kubernetes-validations`). The operator gets
every job through the apiserver, which applies them; the trainer also runs specs that never met one
(`python -m trainer_entry run --spec job.json`) and the pool reads a hand-written tools.yaml: both check
them against this copy of the CRD's own schema and rules (toolrl_api.validation) instead of restating
them. `make chart-check` fails when the copy is stale.
"""

from __future__ import annotations

from typing import Any

import yaml

from .crd_defaults import API_PACKAGE, python_literal, spec_schema

MODULE = "crd_schema.py"
DISTRIBUTIONS = (API_PACKAGE,)


def render_module(crd_text: str, source: str, command: str) -> str:
    """The generated module's text for a CRD manifest."""
    schema: dict[str, Any] = spec_schema(yaml.safe_load(crd_text))
    return (
        "# ruff: noqa: E501\n"
        '"""The ToolRLJob CRD\'s schema of `spec`, with its CEL rules (`x-kubernetes-validations`),\n'
        "as data.\n\n"
        f"GENERATED from {source} by `{command}`\n"
        f"(charts/chartgen/crd_schema.py): do not edit; change the CRD and regenerate.\n"
        f"`make chart-check` fails while this file is stale.\n"
        f'"""\n\n'
        f"from typing import Any\n\n"
        f"SPEC_SCHEMA: dict[str, Any] = {python_literal(schema)}\n"
        '"""The storage version\'s openAPIV3Schema of `spec`, verbatim (k8s extensions included)."""\n'
    )
