"""The chart's generated files and their sources: one place that says what is derived from what."""

from __future__ import annotations

import json
from pathlib import Path

from .dashboard import DASHBOARD
from .panels import render

CHARTS = Path(__file__).resolve().parent.parent
REPO = CHARTS.parent
CHART = CHARTS / "toolrl-operator"
CRD_SOURCE = REPO / "crds" / "toolrl.dev_toolrljobs.yaml"
CRD_COPY = CHART / "crds" / CRD_SOURCE.name
DASHBOARD_JSON = CHART / "dashboards" / f"{DASHBOARD.uid}.json"


def expected() -> dict[Path, str]:
    """Every generated file of the chart and the content it must have."""
    return {
        DASHBOARD_JSON: json.dumps(render(DASHBOARD), indent=2, sort_keys=True) + "\n",
        CRD_COPY: CRD_SOURCE.read_text(),
    }


def stale_outputs() -> list[Path]:
    return [path for path, text in expected().items() if not path.exists() or path.read_text() != text]


def write_outputs() -> list[Path]:
    written = []
    for path, text in expected().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
