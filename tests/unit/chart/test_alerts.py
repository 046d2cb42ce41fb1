"""The chart's alert rules, rendered with default thresholds, pass `promtool check rules` and the
unit tests in charts/alerts/alerts_test.yaml (when each alert fires and when it stays quiet)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ALERT_TESTS = REPO / "charts" / "alerts" / "alerts_test.yaml"
ALERTS = {
    "ToolRLToolLatencyHigh",
    "ToolRLToolFailureRateHigh",
    "ToolRLToolPoolSaturated",
    "ToolRLToolPoolDegraded",
    "ToolRLJobFailed",
    "ToolRLOperatorReconcileErrors",
}


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: apt-get install prometheus (make setup installs it)"
    return path


@pytest.fixture
def rules_dir(render: Callable[..., list[dict[str, Any]]], tmp_path: Path) -> Path:
    [rule] = render({"alerts": {"enabled": True}}, show_only="templates/prometheusrule.yaml")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    return tmp_path


def test_rules_pass_promtool_check(rules_dir: Path) -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(rules_dir / "rules.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_rules_pass_promtool_unit_tests(rules_dir: Path) -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", ALERT_TESTS.name],
        cwd=rules_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_expects_it_to_fire(rules_dir: Path) -> None:
    rules = yaml.safe_load((rules_dir / "rules.yaml").read_text())
    defined = {r["alert"] for group in rules["groups"] for r in group["rules"]}
    assert defined == ALERTS
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    firing = {case["alertname"] for t in tests for case in t["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for t in tests for case in t["alert_rule_test"] if not case["exp_alerts"]}
    assert firing == ALERTS
    assert quiet == ALERTS


def test_thresholds_come_from_values(render: Callable[..., list[dict[str, Any]]]) -> None:
    values = {
        "alerts": {
            "enabled": True,
            "toolLatency": {"p99Seconds": 7.5, "for": "3m"},
            "toolFailures": {"ratio": 0.25},
            "alertLabels": {"team": "rl"},
        }
    }
    [rule] = render(values, show_only="templates/prometheusrule.yaml")
    by_name = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    latency = by_name["ToolRLToolLatencyHigh"]
    assert latency["expr"].rstrip().endswith("> 7.5")
    assert latency["for"] == "3m"
    assert by_name["ToolRLToolFailureRateHigh"]["expr"].rstrip().endswith("> 0.25")
    assert all(r["labels"]["team"] == "rl" for r in by_name.values())
