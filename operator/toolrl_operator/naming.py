"""Names, labels and owner references of a job's children (docs/contracts.md is the source)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolrl_api import API_VERSION, GROUP, KIND, PLURAL, VERSION

__all__ = ["API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION"]  # the API's, re-exported for the operator

MANAGED_BY = "toolrl-operator"
# Server-side apply field managers: the operator's (children, its status fields) and the
# autoscaler's (the pool Deployment's spec.replicas, through its scale subresource: toolpool.py;
# status.toolPool.desiredReplicas and the AutoscalerHealthy condition).
FIELD_MANAGER = "toolrl-operator"
AUTOSCALER_FIELD_MANAGER = "toolrl-operator-autoscaler"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_JOB = "toolrl.dev/job"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# KubeRay's label on each Ray pod: its group's name (a worker group's groupName, or headgroup)
LABEL_RAY_GROUP = "ray.io/group"
LABEL_RAY_CLUSTER = "ray.io/cluster"  # KubeRay's: the RayCluster a Ray pod belongs to
LABEL_RAY_NODE_TYPE = "ray.io/node-type"  # KubeRay's: head or worker

COMPONENT_TOOL_POOL = "tool-pool"
COMPONENT_TRAINER = "trainer"
COMPONENT_CONFIG = "config"
# The container of KubeRay's submitter Job (the operator's template): its pods' fate is the trainer's.
SUBMITTER_CONTAINER = "ray-job-submitter"

TOOL_POOL_PORT = 8080  # the pool's tool API (the Service's port), /healthz, /readyz
TOOL_POOL_METRICS_PORT = 9090  # the pool's /metrics, alone: metrics readers reach no tool
TRAINER_METRICS_PORT = 9400
# the container port names the chart's PodMonitors scrape (templates/podmonitors.yaml; a test checks)
TOOL_POOL_METRICS_PORT_NAME, TRAINER_METRICS_PORT_NAME = "metrics", "trainer-metrics"
RAY_DASHBOARD_PORT = 8265  # also Ray's job-submission API: unauthenticated, runs any code
RAY_GCS_PORT = 6379
RAY_CLIENT_PORT = 10001
# Without TOOLRL_KUBERAY_NAMESPACE, namespaces with this label reach Ray dashboards (KubeRay's).
RAY_DASHBOARD_ACCESS_LABEL = "toolrl.dev/ray-dashboard-access"
CONFIG_MOUNT = "/etc/toolrl"
REWARD_DIR = "reward"  # inside CONFIG_MOUNT: /etc/toolrl/reward/<key>
FUNCTIONS_DIR = "functions"  # inside CONFIG_MOUNT of a pool pod: a function tool's source, <tool>.py
DATA_MOUNT = "/data"
CHECKPOINT_MOUNT = "/checkpoints"
MODEL_CACHE_MOUNT = "/models"  # spec.model.cache: HF_HOME is a directory in it (rayjob.HF_HOME)


def plural(kind: str) -> str:
    """A kind's REST resource name, the segment of its URL: the lower-cased kind in the plural, as
    Kubernetes names its resources and controller-gen a CRD's by default (-y made -ies, else +s). It
    holds for every kind the operator writes (test_api_client checks each); one named otherwise
    would need its plural written down."""
    name = kind.lower()
    return f"{name[:-1]}ies" if name.endswith("y") else f"{name}s"


def config_name(job: str) -> str:
    return f"{job}-config"


def rayjob_name(job: str) -> str:
    return job


def tool_pool_name(job: str) -> str:
    return f"{job}-tools"


def ray_network_policy_name(job: str) -> str:
    return f"{job}-ray"


def namespace_selector(namespace: str) -> dict[str, Any]:
    """A NetworkPolicy peer: every pod of one namespace."""
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}


def ip_blocks(cidrs: tuple[str, ...]) -> list[dict[str, Any]]:
    """NetworkPolicy peers: the addresses of `cidrs`."""
    return [{"ipBlock": {"cidr": cidr}} for cidr in cidrs]


def metrics_peers(namespaces: list[str], cidrs: tuple[str, ...]) -> list[dict[str, Any]]:
    """The NetworkPolicy peers that may read a job's /metrics: every pod of `namespaces`, and `cidrs`."""
    return [*map(namespace_selector, namespaces), *ip_blocks(cidrs)]


def trainer_name(job: str) -> str:
    return f"{job}-trainer"


def tool_pool_url(job: str, namespace: str) -> str:
    return f"http://{tool_pool_name(job)}.{namespace}.svc:{TOOL_POOL_PORT}"


def selector_labels(job: str, component: str) -> dict[str, str]:
    """The labels that select a component's pods; stable for the job's lifetime."""
    return {LABEL_JOB: job, LABEL_COMPONENT: component}


def labels(job: str, component: str) -> dict[str, str]:
    """Labels every child carries: who manages it, which job, which part."""
    return {LABEL_MANAGED_BY: MANAGED_BY, **selector_labels(job, component)}


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """A controller reference to the job, so deleting the job garbage-collects the child."""
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(job: Mapping[str, Any], name: str, component: str) -> dict[str, Any]:
    """metadata of a child object: name, namespace, labels and the owner reference."""
    meta = job["metadata"]
    return {
        "name": name,
        "namespace": meta["namespace"],
        "labels": labels(meta["name"], component),
        "ownerReferences": [owner_reference(job)],
    }
