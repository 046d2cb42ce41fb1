"""Fixtures of the chart tests: helm (from the local cluster's toolchain), a renderable copy of
the chart, and the prometheus-operator CRD schemas to validate monitoring objects against."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartgen.helm import chart_with_stub_dependencies, template
from chartgen.monitoring import crd_files
from harness.localcluster.build import KUBERNETES, ensure_built


@pytest.fixture(scope="session")
def helm_bin() -> str:
    """helm from PATH if installed, else the one the local cluster's toolchain builds."""
    return shutil.which("helm") or ensure_built(verbose=False).path("helm")


@pytest.fixture(scope="session")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chart_with_stub_dependencies(tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="session")
def render(helm_bin: str, chart: Path) -> Callable[..., list[dict[str, Any]]]:
    """render(values=None, namespace=...) -> rendered objects."""

    def _render(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        return template(helm_bin, chart, values, kube_version=KUBERNETES, **kwargs)

    return _render


class _CrdLoader(yaml.SafeLoader):
    """PyYAML reads a bare `=` (an enum value in these CRDs) as YAML 1.1's value tag; it is a string."""


_CrdLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_yaml_str)


@pytest.fixture(scope="session")
def monitoring_crd_schemas() -> dict[str, dict[str, Any]]:
    """kind -> openAPIV3Schema of the served version of the prometheus-operator CRDs."""
    schemas = {}
    for kind, path in crd_files().items():
        crd = yaml.load(path.read_text(), Loader=_CrdLoader)
        version = next(v for v in crd["spec"]["versions"] if v["served"])
        schemas[kind] = _closed(version["schema"]["openAPIV3Schema"])
    return schemas


def _closed(node: Any) -> Any:
    """The schema with unknown fields rejected wherever it lists properties and does not say
    x-kubernetes-preserve-unknown-fields: strict validation, so a misspelt field fails the test
    instead of being pruned silently by the API server."""
    if isinstance(node, list):
        return [_closed(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: {p: _closed(s) for p, s in v.items()} if k == "properties" else _closed(v) for k, v in node.items()
    }
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out
