"""The chart's monitors become Prometheus scrape jobs as prometheus-operator would make them
(localcluster.prometheus, which the demo's Prometheus uses to scrape the real node's pods)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from chartgen.helm import ALL_FEATURES
from harness.localcluster.prometheus import PrometheusError, monitor_scrape_configs

KUBECONFIG = Path("/k/kubeconfig")


@pytest.fixture
def monitors(render: Callable[..., list[dict[str, Any]]]) -> list[dict]:
    objects = render({**ALL_FEATURES, "watchNamespaces": ["rl"]})
    return [o for o in objects if o["kind"] in ("PodMonitor", "ServiceMonitor")]


def test_each_monitor_endpoint_is_one_kubernetes_sd_job(monitors: list[dict]) -> None:
    jobs = {j["job_name"]: j for j in monitor_scrape_configs(monitors, KUBECONFIG)}
    pools = next(j for name, j in jobs.items() if name.startswith("podMonitor/") and "tool-pools" in name)
    operator = next(j for name, j in jobs.items() if name.startswith("serviceMonitor/"))
    assert len(jobs) == 3
    assert pools["kubernetes_sd_configs"] == [
        {"role": "pod", "kubeconfig_file": str(KUBECONFIG), "namespaces": {"names": ["rl"]}}
    ]
    keeps = {
        tuple(r["source_labels"]): r["regex"] for r in pools["relabel_configs"] if r.get("action") == "keep"
    }
    assert keeps[("__meta_kubernetes_pod_label_app_kubernetes_io_component",)] == "tool\\-pool"
    assert keeps[("__meta_kubernetes_pod_container_port_name",)] == "metrics"
    # the chart's relabelings come after the standard labels, with Prometheus' field names
    assert pools["relabel_configs"][-2:] == [
        {"source_labels": ["__meta_kubernetes_pod_label_toolrl_dev_job"], "target_label": "toolrl_job"},
        {
            "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
            "target_label": "toolrl_component",
        },
    ]
    assert operator["honor_labels"] is True and not pools["honor_labels"]
    assert operator["kubernetes_sd_configs"][0]["role"] == "endpoints"
    assert {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"} in operator[
        "relabel_configs"
    ]


def test_fields_it_cannot_translate_are_refused_not_ignored(monitors: list[dict]) -> None:
    monitor = {**monitors[0], "spec": {**monitors[0]["spec"], "podTargetLabels": ["team"]}}
    with pytest.raises(PrometheusError, match="podTargetLabels"):
        monitor_scrape_configs([monitor], KUBECONFIG)
