"""Every child of a job, in the order they are applied (what pods consume comes first)."""

from __future__ import annotations

from typing import Any

from .configmap import build_configmap
from .keda import build_scaled_object, uses_keda
from .rayjob import build_ray_network_policy, build_rayjob
from .rbac import build_role, build_role_binding, build_service_account
from .settings import Settings
from .status import finished
from .toolpool import build_deployment, build_network_policy, build_pdb, build_service


def build_children(
    job: dict[str, Any], settings: Settings, current_rayjob_suspend: bool | None = None
) -> list[dict[str, Any]]:
    """Plain manifests for all of `job`'s children; pure, so it is tested without a cluster.
    With `toolPool.autoscaler: keda` a KEDA ScaledObject sizes the pool (KedaConfigError without
    a Prometheus URL). A finished job has no RayJob to (re)create: its training must not run again."""
    children = [
        build_service_account(job),
        build_role(job),
        build_role_binding(job),
        build_configmap(job),
        build_service(job),
        build_pdb(job),
        build_network_policy(job, settings),
        build_deployment(job, settings),
        build_ray_network_policy(job, settings),
    ]
    if uses_keda(job):
        children.append(build_scaled_object(job, settings.prometheus_url))
    if not finished(job):
        children.append(build_rayjob(job, settings, current_rayjob_suspend))
    return children
