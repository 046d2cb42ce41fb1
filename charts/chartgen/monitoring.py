"""The prometheus-operator CRDs (ServiceMonitor, PodMonitor, PrometheusRule) the chart's monitoring
objects are written against, read from the prometheus-operator Go module: `go mod download`
fetches it once into the Go module cache, so nothing third-party is committed here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator"
VERSION = "v0.85.0"
KINDS = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors",
         "PrometheusRule": "prometheusrules"}


def crd_files() -> dict[str, Path]:
    """kind -> CRD manifest of the kinds the chart uses."""
    module = f"{PROMETHEUS_OPERATOR}@{VERSION}"
    out = subprocess.run(["go", "mod", "download", "-json", module],
                         capture_output=True, text=True, check=False, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"`go mod download {module}` failed (is Go installed and the module proxy "
                           f"reachable?): {out.stderr}{out.stdout}")
    crd_dir = Path(json.loads(out.stdout)["Dir"]) / "example" / "prometheus-operator-crd"
    return {kind: crd_dir / f"monitoring.coreos.com_{plural}.yaml" for kind, plural in KINDS.items()}
