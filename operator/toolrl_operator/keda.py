"""`toolPool.autoscaler: keda`: a KEDA ScaledObject that scales the pool on the same signal.

For clusters that standardise on KEDA. The trigger asks Prometheus for in-flight plus queued
calls across the pool and KEDA's HPA keeps ceil(load / targetConcurrencyPerReplica) replicas;
scale-down waits `scaleDownDelaySeconds`. The rollout-aware part needs the native autoscaler.
Pure: job in, manifest out.
"""

from __future__ import annotations

from typing import Any

from .job import Job
from .naming import COMPONENT_TOOL_POOL, child_metadata, tool_pool_name
from .scale_decision import Policy
from .signals import pool_load_query
from .status import pool_stopped

API_VERSION = "keda.sh/v1alpha1"
PAUSED_REPLICAS = "autoscaling.keda.sh/paused-replicas"


class KedaConfigError(ValueError):
    """The operator cannot build a ScaledObject for this job."""


def explain_api_error(status: int) -> str:
    """What to do when the API server refuses the ScaledObject ('' for other errors)."""
    if status == 403:
        return (
            "the operator may not manage KEDA ScaledObjects (403): install its chart with "
            "keda.enabled=true, or use spec.toolPool.autoscaler: native"
        )
    if status == 404:
        return (
            f"the cluster has no KEDA ScaledObject API ({API_VERSION}, 404): install KEDA, "
            "or use spec.toolPool.autoscaler: native"
        )
    return ""


def uses_keda(job: Job) -> bool:
    return job.spec.tool_pool.autoscaler == "keda"


def build_scaled_object(job: Job, prometheus_url: str) -> dict[str, Any]:
    """The job's ScaledObject (named like the pool's Deployment, which it targets)."""
    if not prometheus_url:
        raise KedaConfigError(
            "spec.toolPool.autoscaler is keda, but the operator has no Prometheus URL for the trigger: "
            "set TOOLRL_PROMETHEUS_URL on the operator, or use spec.toolPool.autoscaler: native"
        )
    meta = job.metadata
    policy = Policy.from_job_spec(job.spec)
    metadata = child_metadata(job.body, tool_pool_name(meta["name"]), COMPONENT_TOOL_POOL)
    if pool_stopped(job):  # else KEDA keeps (or brings back) the pool
        metadata["annotations"] = {PAUSED_REPLICAS: "0"}
    return {
        "apiVersion": API_VERSION,
        "kind": "ScaledObject",
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": tool_pool_name(meta["name"]),
            },
            "minReplicaCount": policy.min_replicas,
            "maxReplicaCount": policy.max_replicas,
            "pollingInterval": 5,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {"stabilizationWindowSeconds": 0},
                        "scaleDown": {"stabilizationWindowSeconds": int(policy.scale_down_delay_seconds)},
                    }
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metricType": "AverageValue",
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": pool_load_query(meta["namespace"], meta["name"]),
                        "threshold": f"{policy.target_concurrency:g}",
                        # No answer is an error (the HPA then holds), never a load of 0.
                        "ignoreNullValues": "false",
                    },
                }
            ],
        },
    }
