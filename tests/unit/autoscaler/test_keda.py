"""The KEDA ScaledObject builder."""

import pytest
import yaml
from chartgen.crd_defaults import spec_schema
from chartgen.outputs import CRD_SOURCE
from toolrl_api.defaulting import apply_defaults
from toolrl_operator import keda
from toolrl_operator.job import parse_job

SPEC_SCHEMA = spec_schema(yaml.safe_load(CRD_SOURCE.read_text()))
REQUIRED = {"model": {"path": "m"}, "data": {"trainFiles": ["t"]}, "tools": [{"name": "p", "type": "python"}]}


def job(status=None, suspend=False, **pool):
    """The job as the sync hands it to the builders: defaulted by the apiserver, then parsed."""
    tool_pool = {
        "replicas": {"min": 2, "max": 40},
        "targetConcurrencyPerReplica": 16,
        "scaleDownDelaySeconds": 90,
        "rolloutAware": True,
        "autoscaler": "keda",
        **pool,
    }
    body = {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "metadata": {"name": "gsm8k", "namespace": "rl", "uid": "u-1"},
        "spec": apply_defaults(SPEC_SCHEMA, {**REQUIRED, "suspend": suspend, "toolPool": tool_pool}),
        **({"status": status} if status else {}),
    }
    return parse_job(body)


def test_scaled_object_targets_the_pool_with_a_prometheus_trigger():
    so = keda.build_scaled_object(job(), "http://prometheus.monitoring:9090")
    assert (so["apiVersion"], so["kind"], so["metadata"]["name"]) == (
        "keda.sh/v1alpha1",
        "ScaledObject",
        "gsm8k-tools",
    )
    assert so["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert so["metadata"]["labels"]["app.kubernetes.io/component"] == "tool-pool"
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gsm8k-tools"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 40)
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 90
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["serverAddress"] == "http://prometheus.monitoring:9090"
    assert meta["threshold"] == "16" and meta["ignoreNullValues"] == "false"
    pool = 'namespace="rl",toolrl_job="gsm8k",toolrl_component="tool-pool"'
    assert f"toolrl_tool_queue_depth{{{pool}}}" in meta["query"]
    assert keda.uses_keda(job()) and not keda.uses_keda(job(autoscaler="native"))


def test_suspended_job_pauses_keda_at_zero():
    suspended = job(suspend=True)
    so = keda.build_scaled_object(suspended, "http://p:9090")
    assert so["metadata"]["annotations"] == {"autoscaling.keda.sh/paused-replicas": "0"}


def test_keda_without_prometheus_says_what_to_set():
    with pytest.raises(keda.KedaConfigError, match="TOOLRL_PROMETHEUS_URL"):
        keda.build_scaled_object(job(), "")


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_job_pauses_keda_at_zero(phase):
    done = job(status={"phase": phase})
    so = keda.build_scaled_object(done, "http://p:9090")
    assert so["metadata"]["annotations"] == {"autoscaling.keda.sh/paused-replicas": "0"}
    running = job(status={"phase": "Running"})
    assert "annotations" not in keda.build_scaled_object(running, "http://p:9090")["metadata"]


def test_refused_scaled_objects_explain_the_keda_setup():
    assert "keda.enabled=true" in keda.explain_api_error(403)
    assert "install KEDA" in keda.explain_api_error(404)
    assert keda.explain_api_error(409) == ""
