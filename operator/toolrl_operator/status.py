"""A job's status, computed from its RayJob and tool-pool Deployment. Pure: no API calls."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .naming import tool_pool_url

PENDING, PROVISIONING, RUNNING = "Pending", "Provisioning", "Running"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
TERMINAL_PHASES = frozenset({SUCCEEDED, FAILED})

CONDITION_TYPES = ("ToolPoolReady", "ClusterReady", "Running", "Succeeded", "Failed", "Suspended")
PHASE_CONDITIONS = {RUNNING: "Running", SUCCEEDED: "Succeeded", FAILED: "Failed", SUSPENDED: "Suspended"}


def finished(job: Mapping[str, Any]) -> bool:
    """Whether the job has ended (Succeeded or Failed): its training must never run again."""
    return (job.get("status") or {}).get("phase") in TERMINAL_PHASES


def pool_stopped(job: Mapping[str, Any]) -> bool:
    """Suspended or finished: no trainer is left for the tool pool to serve, so it runs 0 pods."""
    return bool((job.get("spec") or {}).get("suspend")) or finished(job)


def now() -> str:
    """The present as a metav1.Time (RFC 3339, seconds, UTC), for conditions and timestamps."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class PhaseRule:
    """One row: a RayJob `jobDeploymentStatus` (and `jobStatus`, None = any) gives a phase;
    a `queued` row only matches while the job waits in a Kueue queue for admission."""

    deployment_status: str
    job_status: str | None
    phase: str
    reason: str
    queued: bool = False


# KubeRay v1 RayJob status -> ToolRLJob phase. The first matching row wins.
RAYJOB_PHASES: tuple[PhaseRule, ...] = (
    # Kueue: the RayJob is created suspended and stays so until admitted; the user did not suspend.
    PhaseRule("Suspending", None, PENDING, "Queued", queued=True),
    PhaseRule("Suspended", None, PENDING, "Queued", queued=True),
    PhaseRule("", None, PENDING, "RayJobCreated"),
    PhaseRule("Initializing", None, PROVISIONING, "RayClusterStarting"),
    PhaseRule("Waiting", None, PROVISIONING, "WaitingForSubmission"),
    PhaseRule("Retrying", None, PROVISIONING, "Retrying"),
    PhaseRule("Running", None, RUNNING, "RayJobRunning"),
    PhaseRule("Complete", "SUCCEEDED", SUCCEEDED, "JobSucceeded"),
    PhaseRule("Complete", "STOPPED", FAILED, "JobStopped"),
    PhaseRule("Complete", None, FAILED, "JobNotSucceeded"),
    PhaseRule("Failed", None, FAILED, "JobFailed"),
    PhaseRule("ValidationFailed", None, FAILED, "ValidationFailed"),
    PhaseRule("Suspending", None, SUSPENDED, "Suspending"),
    PhaseRule("Suspended", None, SUSPENDED, "Suspended"),
)


@dataclass(frozen=True)
class Phase:
    phase: str
    reason: str
    message: str


def waiting_queue(job: dict[str, Any]) -> str:
    """The Kueue queue the job waits in for admission when not suspended by the user, else ''."""
    spec = job.get("spec") or {}
    return "" if spec.get("suspend") else (spec.get("cluster") or {}).get("queueName") or ""


def rayjob_phase(rayjob: dict[str, Any] | None, queue: str = "") -> Phase:
    """Map a RayJob (None: not created or not yet seen) to the job's phase, reason and message;
    `queue` is the Kueue queue the job waits in (waiting_queue)."""
    if rayjob is None:
        return Phase(PENDING, "RayJobNotCreated", "waiting for the RayJob to be created")
    rj = rayjob.get("status") or {}
    deployment, job_status = rj.get("jobDeploymentStatus", ""), rj.get("jobStatus", "")
    for rule in RAYJOB_PHASES:
        if rule.queued and not queue:
            continue
        if rule.deployment_status == deployment and rule.job_status in (None, job_status):
            if rule.queued:
                return Phase(PENDING, rule.reason, f"waiting in the Kueue queue {queue} for admission")
            reason = rule.reason
            if rule.phase == FAILED and rj.get("reason"):
                reason = rj["reason"]
            detail = rj.get("message") or _describe(deployment, job_status)
            return Phase(rule.phase, reason, detail)
    return Phase(
        PENDING, "UnknownRayJobStatus", f"unrecognised RayJob status {_describe(deployment, job_status)}"
    )


def _describe(deployment: str, job_status: str) -> str:
    text = f"RayJob deployment status {deployment or 'New'}"
    return f"{text}, Ray job status {job_status}" if job_status else text


def cluster_ready(rayjob: dict[str, Any] | None, phase: str) -> tuple[bool, str, str]:
    """(ready, reason, message) of the Ray cluster. KubeRay moves a RayJob to Running only once
    its cluster is ready, and stops refreshing rayClusterStatus while it cannot reach Ray."""
    rj = (rayjob or {}).get("status") or {}
    name = rj.get("rayClusterName", "")
    state = (rj.get("rayClusterStatus") or {}).get("state", "")
    if phase in TERMINAL_PHASES:
        return False, "JobFinished", "the Ray cluster is shut down after the job finishes"
    if phase == SUSPENDED:
        return False, "Suspended", "the Ray cluster is deleted while the job is suspended"
    if rj.get("jobDeploymentStatus") == "Running" or state == "ready":
        return True, "RayClusterReady", f"RayCluster {name} is ready"
    if not name:
        return False, "RayClusterNotCreated", "KubeRay has not created the RayCluster yet"
    return False, "RayClusterNotReady", f"RayCluster {name} is {state or 'starting'}"


def tool_pool_status(deployment: dict[str, Any] | None) -> tuple[int, int, bool, str, str]:
    """(replicas, readyReplicas, ready, reason, message) of the tool-pool Deployment."""
    if deployment is None:
        return 0, 0, False, "NotCreated", "the tool-pool Deployment does not exist yet"
    replicas = int((deployment.get("spec") or {}).get("replicas", 0))
    st = deployment.get("status") or {}
    ready = int(st.get("readyReplicas", 0))
    updated = int(st.get("updatedReplicas", 0))
    current = st.get("observedGeneration", 0) >= deployment.get("metadata", {}).get("generation", 0)
    if replicas == 0:
        return 0, ready, False, "ScaledToZero", "the tool pool is scaled to zero"
    if current and ready >= replicas and updated >= replicas:
        return replicas, ready, True, "ReplicasReady", f"{ready}/{replicas} tool-pool replicas ready"
    return replicas, ready, False, "ReplicasNotReady", f"{ready}/{replicas} tool-pool replicas ready"


def _condition(
    previous: dict[str, dict[str, Any]],
    ctype: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> dict[str, Any]:
    status = "True" if ok else "False"
    old = previous.get(ctype)
    changed = old is None or old.get("status") != status
    return {
        "type": ctype,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": now if changed else old["lastTransitionTime"],
        "reason": reason,
        "message": message,
    }


def compute_status(
    job: dict[str, Any],
    rayjob: dict[str, Any] | None,
    deployment: dict[str, Any] | None,
    observed_generation: int,
    now: str,
) -> dict[str, Any]:
    """The operator-owned part of `job.status` (never `progress`, never `toolPool.desiredReplicas`)."""
    meta = job["metadata"]
    old = job.get("status") or {}
    if rayjob is None and old.get("phase") in TERMINAL_PHASES:
        # The finished job's RayJob is gone (its TTL, or deleted): the outcome stays.
        phase = Phase(old["phase"], old.get("reason", ""), old.get("message", ""))
    else:
        phase = rayjob_phase(rayjob, waiting_queue(job))
    rj = (rayjob or {}).get("status") or {}

    pool_replicas, pool_ready, pool_ok, pool_reason, pool_message = tool_pool_status(deployment)
    cl_ok, cl_reason, cl_message = cluster_ready(rayjob, phase.phase)
    previous = {c["type"]: c for c in old.get("conditions", [])}
    conditions = [
        _condition(previous, "ToolPoolReady", pool_ok, pool_reason, pool_message, observed_generation, now),
        _condition(previous, "ClusterReady", cl_ok, cl_reason, cl_message, observed_generation, now),
    ]
    for ctype in ("Running", "Succeeded", "Failed", "Suspended"):
        active = PHASE_CONDITIONS.get(phase.phase) == ctype
        reason = phase.reason if active else f"Not{ctype}"
        message = phase.message if active else f"the job is {phase.phase}"
        conditions.append(_condition(previous, ctype, active, reason, message, observed_generation, now))

    status: dict[str, Any] = {
        "phase": phase.phase,
        "reason": phase.reason,
        "message": phase.message,
        "observedGeneration": observed_generation,
        "rayJobName": (rayjob or {}).get("metadata", {}).get("name", ""),
        "rayClusterName": rj.get("rayClusterName", ""),
        "dashboardURL": rj.get("dashboardURL", ""),
        "toolPool": {
            "replicas": pool_replicas,
            "readyReplicas": pool_ready,
            "endpoint": tool_pool_url(meta["name"], meta["namespace"]),
            "summary": f"{pool_ready}/{pool_replicas}",
        },
        "conditions": conditions,
    }
    start = rj.get("startTime") or old.get("startTime")
    if start:
        status["startTime"] = start
    if phase.phase in TERMINAL_PHASES:
        status["completionTime"] = rj.get("endTime") or old.get("completionTime") or now
    return status


def _differs(old: Any, new: Any) -> bool:
    if _is_conditions(old) and _is_conditions(new):
        # A list keyed by type: only the types in `new` (ours) count, not others' conditions.
        before = {c["type"]: c for c in old}
        return any(_differs(before.get(c["type"]), c) for c in new)
    if isinstance(old, dict) and isinstance(new, dict):
        return any(_differs(old.get(key), value) for key, value in new.items())
    return old != new


def _is_conditions(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(c, dict) and "type" in c for c in value)


def status_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The top-level keys of `new` that differ from `old` (empty: no write needed). Keys
    other writers own inside a nested object (e.g. `toolPool.desiredReplicas`) are ignored."""
    return {key: value for key, value in new.items() if _differs(old.get(key), value)}
