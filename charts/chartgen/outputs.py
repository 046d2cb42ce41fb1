"""The generated files and their sources: one place that says what is derived from what.

`root` and `crd` let a test generate everything from a changed CRD into a directory of its own."""

from __future__ import annotations

import json
from pathlib import Path

from . import crd_schema, spec_types
from .crd_defaults import DISTRIBUTIONS, MODULE, render_module
from .dashboard import DASHBOARD
from .panels import render

CHARTS = Path(__file__).resolve().parent.parent
REPO = CHARTS.parent
CHART = CHARTS / "toolrl-operator"
CRD_SOURCE = REPO / "crds" / "toolrl.dev_toolrljobs.yaml"
CRD_COPY = CHART / "crds" / CRD_SOURCE.name
DASHBOARD_JSON = CHART / "dashboards" / f"{DASHBOARD.uid}.json"


CRD_DEFAULTS_MODULES = tuple(REPO / d / MODULE for d in DISTRIBUTIONS)
CRD_SCHEMA_MODULES = tuple(REPO / d / crd_schema.MODULE for d in crd_schema.DISTRIBUTIONS)
SPEC_TYPES_MODULES = tuple(REPO / d / spec_types.MODULE for d in spec_types.DISTRIBUTIONS)
STATUS_TYPES_MODULES = tuple(REPO / d / spec_types.STATUS_MODULE for d in spec_types.DISTRIBUTIONS)
GENERATE_COMMAND = "make chart-generate"


def expected(root: Path = REPO, crd: Path = CRD_SOURCE) -> dict[Path, str]:
    """Every generated file (under `root`) and the content it must have, from the CRD at `crd`."""
    crd_text = crd.read_text()
    source = CRD_SOURCE.relative_to(REPO).as_posix()
    defaults = render_module(crd_text, source, GENERATE_COMMAND)
    schema = crd_schema.render_module(crd_text, source, GENERATE_COMMAND)
    types = spec_types.render_module(crd_text, source, GENERATE_COMMAND)
    status_types = spec_types.render_status_module(crd_text, source, GENERATE_COMMAND)
    files = {
        DASHBOARD_JSON: json.dumps(render(DASHBOARD), indent=2, sort_keys=True) + "\n",
        CRD_COPY: crd_text,
        **dict.fromkeys(CRD_DEFAULTS_MODULES, defaults),
        **dict.fromkeys(CRD_SCHEMA_MODULES, schema),
        **dict.fromkeys(SPEC_TYPES_MODULES, types),
        **dict.fromkeys(STATUS_TYPES_MODULES, status_types),
    }
    return {root / path.relative_to(REPO): text for path, text in files.items()}


def stale_outputs() -> list[Path]:
    return [path for path, text in expected().items() if not path.exists() or path.read_text() != text]


def write_outputs(root: Path = REPO, crd: Path = CRD_SOURCE) -> list[Path]:
    written = []
    for path, text in expected(root, crd).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
