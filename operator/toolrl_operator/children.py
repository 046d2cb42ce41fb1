"""The one list of a job's child kinds: how each is built, where it lives in the API, whether the
operator watches it and what RBAC that takes. The handlers' watches, the chart's RBAC
(tests/unit/chart/test_rbac_matches_child_kinds.py checks it), the harness's operator process
(harness/operator_process.py), the operator benchmark and the e2e tests derive from it.

Adding a child kind is one entry here (and its builder module).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .configmap import build_configmap
from .job import Job
from .keda import build_scaled_object, uses_keda
from .naming import plural
from .rayjob import build_ray_network_policy, build_rayjob
from .rbac import build_role, build_role_binding, build_service_account
from .settings import Settings
from .status import finished
from .toolpool import Pool, build_deployment, build_network_policy, build_pdb, build_service

Builder = Callable[[Job, Settings, "Live"], "list[dict[str, Any]]"]
WATCH_VERBS = ("list", "watch")
APPLY_VERBS = ("create", "patch")  # server-side apply: patch, and create when absent


@dataclass(frozen=True)
class Live:
    """What a builder may need of the live children: the RayJob's spec.suspend (Kueue owns it
    while a queued job waits), None before the RayJob exists; the pool Deployment's size and who
    owns it (toolpool.manifest_replicas), None before it exists."""

    rayjob_suspend: bool | None = None
    pool: Pool | None = None


@dataclass(frozen=True)
class ChildKind:
    kind: str
    api_version: str  # "v1" or "group/version"
    build: Builder  # job (its spec typed, job.py), settings, live -> manifests of this kind
    watched: bool = True  # events of these objects re-sync their job (drift, deletion, status)
    # Applied after the others (which are applied in parallel), in list order: it refers to them.
    after_others: bool = False

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def plural(self) -> str:
        """Its REST resource name, as apply's paths spell it (naming.plural)."""
        return plural(self.kind)

    @property
    def verbs(self) -> tuple[str, ...]:
        """The operator's RBAC verbs on this kind (the chart grants exactly these)."""
        return (*WATCH_VERBS, *APPLY_VERBS) if self.watched else APPLY_VERBS

    @property
    def kubectl_name(self) -> str:
        """`plural.group`, unambiguous for kubectl."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _one(build: Callable[[Job], dict[str, Any]]) -> Builder:
    return lambda job, settings, live: [build(job)]


def _deployment(job: Job, settings: Settings, live: Live) -> list[dict[str, Any]]:
    return [build_deployment(job, settings, live.pool)]


def _rayjob(job: Job, settings: Settings, live: Live) -> list[dict[str, Any]]:
    # A finished job has no RayJob to (re)create: its training must not run again.
    return [] if finished(job) else [build_rayjob(job, settings, live.rayjob_suspend)]


def _scaled_object(job: Job, settings: Settings, live: Live) -> list[dict[str, Any]]:
    return [build_scaled_object(job, settings.prometheus_url)] if uses_keda(job) else []


def _network_policies(job: Job, settings: Settings, live: Live) -> list[dict[str, Any]]:
    return [build_network_policy(job, settings), build_ray_network_policy(job, settings)]


# In the order they are applied: what pods consume comes first, the RayJob (whose pods use all of
# it) last.
CHILD_KINDS: tuple[ChildKind, ...] = (
    ChildKind("ServiceAccount", "v1", _one(build_service_account)),
    ChildKind("Role", "rbac.authorization.k8s.io/v1", _one(build_role)),
    # The API server checks a RoleBinding against its Role's rules unless the creator may `bind`
    # (the operator may not): before the Role exists it answers 404 (seen with the chart's RBAC).
    ChildKind("RoleBinding", "rbac.authorization.k8s.io/v1", _one(build_role_binding), after_others=True),
    ChildKind("ConfigMap", "v1", _one(build_configmap)),
    ChildKind("Service", "v1", _one(build_service)),
    ChildKind("PodDisruptionBudget", "policy/v1", _one(build_pdb)),
    ChildKind("NetworkPolicy", "networking.k8s.io/v1", _network_policies),
    ChildKind("Deployment", "apps/v1", _deployment),
    # Only with `toolPool.autoscaler: keda`, and KEDA may not be installed: not watched (a watch
    # of a missing API would fail); the periodic resync repairs it.
    ChildKind("ScaledObject", "keda.sh/v1alpha1", _scaled_object, watched=False),
    ChildKind("RayJob", "ray.io/v1", _rayjob, after_others=True),
)
BY_KIND = {child.kind: child for child in CHILD_KINDS}


def status_read_by_builders(status: Mapping[str, Any]) -> dict[str, Any]:
    """The only fields of a job's status that the builders read: whether it finished (no RayJob
    again, no pool). The sync builds again only when these, the metadata, the spec or what it knows
    of the live children change (reconcile.inputs_key), so a builder that reads another status
    field must add it here (tests/unit/operator/test_builders.py checks the builders against a full
    status)."""
    return {"phase": status.get("phase")}


def build_children(job: Job, settings: Settings, live: Live | None = None) -> list[dict[str, Any]]:
    """Plain manifests for all of `job`'s children, in apply order; pure, so it is tested without a
    cluster. With `toolPool.autoscaler: keda` a KEDA ScaledObject sizes the pool (KedaConfigError
    without a Prometheus URL)."""
    live = live or Live()
    return [manifest for child in CHILD_KINDS for manifest in child.build(job, settings, live)]
