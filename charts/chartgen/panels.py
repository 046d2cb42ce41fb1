"""A small model of a Grafana dashboard: just what our dashboard uses, rendered to Grafana's JSON.

Why not write the JSON by hand: grid positions, refIds, datasource references and units are
repetitive and easy to get wrong; here they are computed, and every panel must declare a unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GRID_WIDTH = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel; `legend` is Grafana's legendFormat."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """A time series panel. `unit` is a Grafana unit id (s, reqps, ops, short, none...)."""

    title: str
    unit: str
    targets: tuple[Target, ...]
    description: str = ""
    width: int = 12
    height: int = 8
    stack: bool = False

    def __post_init__(self) -> None:
        if not self.unit:
            raise ValueError(f"panel {self.title!r} has no unit: every panel must say what it measures in")
        if not self.targets:
            raise ValueError(f"panel {self.title!r} has no query")
        if not 0 < self.width <= GRID_WIDTH:
            raise ValueError(f"panel {self.title!r}: width must be 1..{GRID_WIDTH}, got {self.width}")


@dataclass(frozen=True)
class Row:
    """A titled group of panels, laid out left to right and wrapped at the grid width."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class QueryVariable:
    """A dashboard variable filled from Prometheus with `label_values(<metric selector>, <label>)`."""

    name: str
    label: str
    selector: str
    label_name: str

    @property
    def query(self) -> str:
        return f"label_values({self.selector}, {self.label_name})"


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[QueryVariable, ...]
    rows: tuple[Row, ...]
    tags: tuple[str, ...] = field(default_factory=tuple)

    def panels(self) -> list[Panel]:
        return [p for row in self.rows for p in row.panels]


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = [
        {"datasource": DATASOURCE, "expr": t.expr, "legendFormat": t.legend or "__auto",
         "range": True, "refId": chr(ord("A") + i)}
        for i, t in enumerate(panel.targets)
    ]
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                           "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"}},
            },
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": targets,
    }


def _variable_json(var: QueryVariable) -> dict[str, Any]:
    return {
        "name": var.name,
        "label": var.label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": var.query,
        "query": {"query": var.query, "refId": f"{var.name}-variable"},
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "sort": 1,
        "current": {},
        "hide": 0,
        "options": [],
    }


def render(dashboard: Dashboard) -> dict[str, Any]:
    """Grafana dashboard JSON (schemaVersion 39) with rows and panel positions laid out."""
    panels: list[dict[str, Any]] = []
    next_id = 1
    y = 0
    for row in dashboard.rows:
        panels.append({"id": next_id, "type": "row", "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}, "panels": []})
        next_id += 1
        y += 1
        x, line_height = 0, 0
        for panel in row.panels:
            if x + panel.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel_json(panel, next_id, x, y))
            next_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    datasource_var = {"name": "datasource", "label": "Data source", "type": "datasource",
                      "query": "prometheus", "current": {}, "hide": 0, "options": [], "refresh": 1,
                      "regex": "", "includeAll": False, "multi": False}
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": list(dashboard.tags),
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [datasource_var, *(_variable_json(v) for v in dashboard.variables)]},
        "panels": panels,
    }
