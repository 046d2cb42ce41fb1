"""The Grafana dashboard: generated JSON is current, every query parses and uses the contract's
metric names, and every panel states its unit."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from chartgen.dashboard import DASHBOARD, substitute
from chartgen.outputs import DASHBOARD_JSON, REPO, stale_outputs
from chartgen.panels import Panel, Target, render

CONTRACTS = REPO / "docs" / "contracts.md"
JOB_SCOPED = (
    "toolrl_tool_",
    "toolrl_trainer_",
    "toolrl_sandbox_",
    "toolrl_autoscaler_desired_replicas",
    "toolrl_autoscaler_max_replicas",
)


def _exprs() -> list[str]:
    return [t.expr for p in DASHBOARD.panels() for t in p.targets]


def test_generated_files_are_up_to_date() -> None:
    assert stale_outputs() == [], "run `make chart-generate` and commit the result"


def test_committed_json_is_the_rendered_model() -> None:
    assert json.loads(DASHBOARD_JSON.read_text()) == render(DASHBOARD)


def test_variables() -> None:
    variables = render(DASHBOARD)["templating"]["list"]
    assert [v["name"] for v in variables] == ["datasource", "namespace", "job"]
    assert variables[0]["type"] == "datasource" and variables[0]["query"] == "prometheus"
    assert "toolrl_job" in variables[2]["query"]["query"] and "$namespace" in variables[2]["query"]["query"]


def test_every_panel_has_a_unit_and_the_datasource_variable() -> None:
    panels = [p for p in render(DASHBOARD)["panels"] if p["type"] != "row"]
    assert len(panels) == len(DASHBOARD.panels()) >= 12
    for panel in panels:
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])


def test_panels_do_not_overlap_and_fit_the_grid() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in render(DASHBOARD)["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, panel["title"]
        taken |= cells


def test_rates_use_the_rate_interval() -> None:
    for expr in _exprs():
        assert "$" not in substitute(expr, "rl", "gsm8k"), expr
        for window in re.findall(r"(?:rate|increase)\([^\[]*\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", expr


def test_metric_names_are_in_the_contract() -> None:
    contract = set(re.findall(r"toolrl_[a-z_]+", CONTRACTS.read_text()))
    for expr in _exprs():
        for metric in re.findall(r"\btoolrl_[a-z_]+", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            assert base in contract, f"{metric} is not in docs/contracts.md"


def test_job_scoped_series_are_filtered_by_namespace_and_job() -> None:
    for expr in _exprs():
        for metric, selector in re.findall(r"\b(toolrl_[a-z_]+)(\{[^}]*\})?", expr):
            if metric.startswith(JOB_SCOPED):
                assert 'toolrl_job=~"$job"' in selector and 'namespace=~"$namespace"' in selector, expr


def test_every_query_parses(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus"
    rules = [
        {"record": f"dashboard:query_{i}", "expr": substitute(e, "rl", "gsm8k")}
        for i, e in enumerate(_exprs())
    ]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_panel_needs_a_unit_and_a_query() -> None:
    with pytest.raises(ValueError, match="no unit"):
        Panel("Latency", "", (Target("up"),))
    with pytest.raises(ValueError, match="no query"):
        Panel("Latency", "s", ())
