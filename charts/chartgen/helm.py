"""Running helm on the chart for tests: render it, lint it.

The chart declares no dependencies (it installs offline; KubeRay has its own chart).
`chart_with_stub_dependencies` gives tests a copy of it, with an empty stand-in for any dependency
a future Chart.yaml might declare: helm refuses to lint, render or install a chart whose declared
dependency is missing from charts/, even when its condition is false.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from .outputs import CHART

RELEASE = "toolrl"


class HelmError(RuntimeError):
    """helm failed; the message carries its stderr."""


def _dependency(name: str) -> dict[str, Any]:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for dep in chart.get("dependencies", []):
        if dep["name"] == name:
            return dep
    raise KeyError(f"Chart.yaml declares no dependency {name!r}")


def chart_with_stub_dependencies(dest: Path) -> Path:
    """A copy of the chart under `dest` whose charts/ holds an empty chart for each dependency."""
    copy = dest / CHART.name
    shutil.copytree(CHART, copy, ignore=shutil.ignore_patterns("charts"))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for dep in chart.get("dependencies", []):
        stub = copy / "charts" / dep["name"]
        (stub / "templates").mkdir(parents=True)
        (stub / "Chart.yaml").write_text(yaml.safe_dump(
            {"apiVersion": "v2", "name": dep["name"], "version": dep["version"],
             "description": "Empty test stand-in for the real dependency chart."}))
        (stub / "values.yaml").write_text("{}\n")
    return copy


def helm(
    binary: str, *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run helm; `timeout` bounds the process (longer than any `--wait --timeout` passed to helm)."""
    result = subprocess.run([binary, *args], capture_output=True, text=True, check=False, timeout=timeout)
    if check and result.returncode != 0:
        command = " ".join(args)
        raise HelmError(f"helm {command} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
    return result


def values_args(values: dict[str, Any] | None, workdir: Path) -> list[str]:
    """`-f` arguments for a values dict (written as JSON, which is YAML)."""
    if not values:
        return []
    with tempfile.NamedTemporaryFile("w", dir=workdir, prefix="values-", suffix=".json", delete=False) as f:
        json.dump(values, f)
    return ["-f", f.name]


def template(binary: str, chart: Path, values: dict[str, Any] | None = None, namespace: str = "toolrl-system",
             kube_version: str = "", show_only: str = "", release: str = RELEASE) -> list[dict[str, Any]]:
    """The chart's rendered objects (CRDs included), as dicts. `kube_version` stands in for the
    cluster's version (helm template has no cluster to ask)."""
    args = ["template", release, str(chart), "--namespace", namespace, "--include-crds",
            *values_args(values, chart.parent)]
    if kube_version:
        args += ["--kube-version", kube_version]
    if show_only:
        args += ["--show-only", show_only]
    return [doc for doc in yaml.safe_load_all(helm(binary, *args).stdout) if doc]


ALL_FEATURES: dict[str, Any] = {
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitors": {"enabled": True}},
    "dashboard": {"enabled": True},
    "alerts": {"enabled": True},
}
