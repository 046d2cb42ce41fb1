"""kopf handlers: thin glue from watch events to the pure builders, the API and the status.

A job is reconciled level-style: every create/update/resume applies all children by
server-side apply (idempotent, so a restart or a retry is harmless) and then writes the status.
Changes of the RayJob and the tool-pool Deployment, seen through kopf indexes, refresh the
status; a deleted child is re-applied.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from .apply import RETRIABLE, ApiError, Kube, load_api_client
from .children import build_children
from .keda import KedaConfigError, explain_api_error, uses_keda
from .metrics import PHASES, RECONCILE_DURATION, RECONCILE_ERRORS
from .naming import (
    API_VERSION,
    COMPONENT_TOOL_POOL,
    FIELD_MANAGER,
    GROUP,
    KIND,
    LABEL_COMPONENT,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    PLURAL,
    VERSION,
)
from .settings import Settings
from .status import FAILED, compute_status, now, status_changes
from .toolpool import build_deployment, desired_replicas

log = logging.getLogger(__name__)
_APPLY_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="toolrl-apply")
Key = tuple[str, str]
OWNED = {LABEL_MANAGED_BY: MANAGED_BY}


class Runtime:
    """Process-wide state: the API client, per-job locks and what this process last wrote."""

    def __init__(self, settings: Settings, kube: Kube) -> None:
        self.settings = settings
        self.kube = kube
        self._locks: defaultdict[Key, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()
        self.written_status: dict[Key, dict[str, Any]] = {}
        self.applied_generation: dict[Key, int] = {}
        self.newest: dict[Key, dict[str, Any]] = {}  # the last watched body of each job

    def lock(self, key: Key) -> threading.Lock:
        with self._locks_guard:
            return self._locks[key]

    def forget(self, key: Key) -> None:
        with self._locks_guard:
            self._locks.pop(key, None)
        self.written_status.pop(key, None)
        self.applied_generation.pop(key, None)
        self.newest.pop(key, None)

    def with_newest_status(self, job: dict[str, Any]) -> dict[str, Any]:
        """`job` with the status of its last watched body: a handler's body may be older than
        the autoscaler's latest `desiredReplicas` (or the phase), and must not revert them."""
        newest = self.newest.get(_job_key(job))
        return {**job, "status": newest.get("status") or {}} if newest else job


_runtime: Runtime | None = None


def runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        settings = Settings.from_env()
        _runtime = Runtime(settings, Kube(load_api_client(), FIELD_MANAGER))
    return _runtime


def plain(obj: Any) -> Any:
    """A deep plain-dict copy of a kopf body view, safe to keep and to mutate."""
    if isinstance(obj, Mapping):
        return {key: plain(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(value) for value in obj]
    return obj


def first(store: Iterable[Any] | None) -> Any:
    return next(iter(store), None) if store is not None else None


def _job_key(job: Mapping[str, Any]) -> Key:
    return job["metadata"]["namespace"], job["metadata"]["name"]


# ---- startup and indexes ------------------------------------------------------------------


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Keep kopf's bookkeeping in annotations (the status schema is ours) and run handlers wide."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.execution.max_workers = 16
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = MANAGED_BY  # as the autoscaler's own Events say
    settings.watching.server_timeout = 300
    runtime()


@kopf.index(GROUP, VERSION, PLURAL)
def jobs(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, name): job_view(body)}


def job_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """A job as the index keeps it: without managedFields and annotations (kopf's copy of the
    last handled spec among them), which nothing read from the index needs and which were most
    of the operator's memory in a burst of jobs."""
    job = plain(body)
    job["metadata"] = {k: v for k, v in job["metadata"].items() if k not in ("managedFields", "annotations")}
    return job


@kopf.index("ray.io", "v1", "rayjobs", labels=OWNED)
def rayjobs(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, labels[LABEL_JOB]): _rayjob_view(body)}


@kopf.index("apps", "v1", "deployments", labels={**OWNED, LABEL_COMPONENT: COMPONENT_TOOL_POOL})
def deployments(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, labels[LABEL_JOB]): _deployment_view(body)}


def _rayjob_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a RayJob the status needs; the cluster template is left out to save memory."""
    return {
        "metadata": {"name": body["metadata"]["name"]},
        "spec": {"suspend": body.get("spec", {}).get("suspend", False)},
        "status": plain(body.get("status") or {}),
    }


def _deployment_view(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": body["metadata"]["name"], "generation": body["metadata"].get("generation", 0)},
        "spec": {"replicas": body.get("spec", {}).get("replicas", 0)},
        "status": plain(body.get("status") or {}),
    }


# ---- reconcile ----------------------------------------------------------------------------


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def reconcile(body: kopf.Body, reason: str, diff: kopf.Diff, rayjobs: kopf.Index, **_: Any) -> None:
    job = plain(body)
    if job["metadata"].get("deletionTimestamp"):
        return
    rayjob = first(rayjobs.get(_job_key(job)))
    apply_job(job, rayjob)
    if reason == "create":
        kopf.info(body, reason="Created", message="created ConfigMap, RBAC, tool pool and RayJob")
    elif reason == "update":
        _announce_update(body, job, diff)


def _announce_update(body: kopf.Body, job: dict[str, Any], diff: kopf.Diff) -> None:
    fields = sorted({".".join(map(str, change[1])) for change in diff})
    kopf.info(body, reason="SpecApplied", message=f"applied changes of {', '.join(fields) or 'spec'}")
    if any(tuple(change[1]) in {("spec", "suspend"), ("spec",)} for change in diff):
        if job["spec"].get("suspend"):
            kopf.info(body, reason="Suspended", message="suspended the RayJob and scaled the tool pool to 0")
        else:
            kopf.info(body, reason="Resumed", message="resumed the RayJob and the tool pool")


def apply_job(job: dict[str, Any], rayjob: dict[str, Any] | None) -> None:
    """Apply every child of `job`, then write its status; API errors become kopf retries."""
    rt = runtime()
    key = _job_key(job)
    started = time.monotonic()
    current_suspend = rayjob["spec"]["suspend"] if rayjob else None
    try:
        # Under the job's lock, from the newest status: job_event resizes the pool concurrently.
        with rt.lock(key):
            children = build_children(rt.with_newest_status(job), rt.settings, current_suspend)
            others = [m for m in children if m["kind"] != "RayJob"]
            # Independent objects go in parallel; the RayJob, whose pods use them, goes last.
            applied = _APPLY_POOL.map(_apply, others)
            live = {m["kind"]: obj for m, obj in zip(others, applied, strict=True)}
            if len(others) < len(children):
                rayjob = _rayjob_view(rt.kube.apply(children[-1]))
            rt.applied_generation[key] = job["metadata"].get("generation", 1)
        refresh_status(job, rayjob, _deployment_view(live["Deployment"]))
    except KedaConfigError as err:
        _failed(job, "KedaConfig", str(err))
        raise kopf.TemporaryError(str(err), delay=60) from err
    except ApiError as err:
        _failed(job, err.reason or str(err.status), str(err))
        raise kopf.TemporaryError(str(err), delay=2 if err.status in RETRIABLE else 30) from err
    except Exception as err:  # connection resets and timeouts: retry, and count them
        _failed(job, type(err).__name__, str(err))
        raise kopf.TemporaryError(str(err), delay=2) from err
    RECONCILE_DURATION.observe(time.monotonic() - started)


def _apply(manifest: dict[str, Any]) -> dict[str, Any]:
    """Apply one child; a ScaledObject the cluster refuses says how to set KEDA up."""
    try:
        return runtime().kube.apply(manifest)
    except ApiError as err:
        advice = explain_api_error(err.status) if manifest["kind"] == "ScaledObject" else ""
        if advice:
            raise KedaConfigError(f"{advice} ({err})") from err
        raise


def _failed(job: dict[str, Any], reason: str, message: str) -> None:
    RECONCILE_ERRORS.labels(reason).inc()
    kopf.warn(job, reason="ReconcileError", message=message)


def refresh_status(
    job: dict[str, Any], rayjob: dict[str, Any] | None, deployment: dict[str, Any] | None
) -> None:
    """Write the status computed from the children, if it changed, and announce transitions."""
    rt = runtime()
    key = _job_key(job)
    with rt.lock(key):
        old = rt.written_status.get(key) or job.get("status") or {}
        generation = rt.applied_generation.get(key, old.get("observedGeneration", 0))
        if not generation:
            return  # nothing applied yet: the reconcile handler writes the first status
        new = compute_status({**job, "status": old}, rayjob, deployment, generation, now())
        PHASES.record(key[0], key[1], new["phase"])
        if not status_changes(old, new):
            return
        try:
            written = rt.kube.apply_status(API_VERSION, KIND, key[0], key[1], new)
        except ApiError as err:
            if err.status == 404:
                return
            raise
        rt.written_status[key] = written.get("status") or {}
    _announce_status(job, old, new)


def _announce_status(job: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> None:
    if old.get("phase") != new["phase"]:
        message = f"{old.get('phase') or 'New'} -> {new['phase']}: {new['message']}"
        if new["phase"] == FAILED:
            kopf.warn(job, reason=new["reason"], message=message)
        else:
            kopf.info(job, reason=f"Phase{new['phase']}", message=message)
    before = {c["type"]: c["status"] for c in old.get("conditions", [])}
    for cond in new["conditions"]:
        flipped = before.get(cond["type"]) != cond["status"]
        announce = cond["status"] == "True" or cond["type"] in before
        if cond["type"] in ("ToolPoolReady", "ClusterReady") and flipped and announce:
            kopf.info(job, reason=cond["reason"], message=cond["message"])


# ---- children and job events ----------------------------------------------------------------


def _live_job(jobs: kopf.Index, key: tuple[str, str]) -> Any:
    """The child's job from the index, unless it is gone or being deleted (then nothing to do)."""
    job = first(jobs.get(key))
    return None if job is None or job["metadata"].get("deletionTimestamp") else job


@kopf.on.event("ray.io", "v1", "rayjobs", labels=OWNED)
def rayjob_event(
    type: str,
    body: kopf.Body,
    namespace: str,
    labels: kopf.Labels,
    jobs: kopf.Index,
    deployments: kopf.Index,
    **_: Any,
) -> None:
    key = (namespace, labels[LABEL_JOB])
    job = _live_job(jobs, key)
    if job is None:
        return
    if type == "DELETED":
        _repair(key, None)
    else:
        _refresh_from_child(job, _rayjob_view(body), first(deployments.get(key)))


@kopf.on.event("apps", "v1", "deployments", labels={**OWNED, LABEL_COMPONENT: COMPONENT_TOOL_POOL})
def deployment_event(
    type: str,
    body: kopf.Body,
    namespace: str,
    labels: kopf.Labels,
    jobs: kopf.Index,
    rayjobs: kopf.Index,
    **_: Any,
) -> None:
    key = (namespace, labels[LABEL_JOB])
    job = _live_job(jobs, key)
    if job is None:
        return
    if type == "DELETED":
        _repair(key, first(rayjobs.get(key)))
    else:
        _refresh_from_child(job, first(rayjobs.get(key)), _deployment_view(body))


def _refresh_from_child(
    job: dict[str, Any], rayjob: dict[str, Any] | None, deployment: dict[str, Any] | None
) -> None:
    try:
        refresh_status(job, rayjob, deployment)
    except ApiError as err:
        _failed(job, err.reason or str(err.status), f"status: {err}")
        raise


# Children whose only event that matters is their deletion (RayJob and Deployment are above).
REPAIRED_ON_DELETE = (
    ("", "v1", "configmaps"),
    ("", "v1", "services"),
    ("", "v1", "serviceaccounts"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("networking.k8s.io", "v1", "networkpolicies"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
)


async def child_deleted(
    type: str, namespace: str, labels: kopf.Labels, jobs: kopf.Index, rayjobs: kopf.Index, **_: Any
) -> None:
    """Async so that the many other events of these children cost no thread hop."""
    key = (namespace, labels[LABEL_JOB])
    job = first(jobs.get(key))
    if type == "DELETED" and job is not None and not job["metadata"].get("deletionTimestamp"):
        await asyncio.to_thread(_repair, key, first(rayjobs.get(key)))


for _group, _version, _plural in REPAIRED_ON_DELETE:
    kopf.on.event(_group, _version, _plural, labels=OWNED, id=f"child_deleted/{_plural}")(child_deleted)


def _repair(key: Key, rayjob: dict[str, Any] | None) -> None:
    """A child was deleted while its job lives: apply the job again (fresh from the API)."""
    job = runtime().kube.get(API_VERSION, KIND, *key)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return
    kopf.warn(job, reason="ChildDeleted", message="a child object was deleted; re-creating it")
    apply_job(job, rayjob)


@kopf.on.event(GROUP, VERSION, PLURAL)
async def job_event(
    type: str, body: kopf.Body, namespace: str, name: str, deployments: kopf.Index, **_: Any
) -> None:
    """Forget deleted jobs; make the pool follow the autoscaler's `status.toolPool.desiredReplicas`.
    Async: most job events need nothing, and then cost no thread hop."""
    key = (namespace, name)
    rt = runtime()
    if type == "DELETED":
        PHASES.record(namespace, name, None)
        rt.forget(key)
        return
    job = plain(body)
    rt.newest[key] = job
    deployment = first(deployments.get(key))
    if deployment is None or job["metadata"].get("deletionTimestamp") or uses_keda(job):
        return
    if rt.applied_generation.get(key) != job["metadata"].get("generation"):
        return  # the spec changed: the update handler applies it
    if deployment["spec"]["replicas"] != desired_replicas(job):
        try:
            await asyncio.to_thread(_resize_pool, key)
        except ApiError as err:
            _failed(job, err.reason or str(err.status), f"Deployment: {err}")
            raise


def _resize_pool(key: Key) -> None:
    """Apply the pool's Deployment from the newest body, under the lock apply_job holds too."""
    rt = runtime()
    with rt.lock(key):
        job = rt.newest.get(key)
        if job is not None and rt.applied_generation.get(key) == job["metadata"].get("generation"):
            rt.kube.apply(build_deployment(job, rt.settings))
