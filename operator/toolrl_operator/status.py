"""A job's status, computed from its RayJob and tool-pool Deployment. Pure: no API calls."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolrl_api.status_types import Status

from .events import NODE_NOT_READY
from .job import Job
from .naming import LABEL_RAY_NODE_TYPE, SUBMITTER_CONTAINER, tool_pool_url

PENDING, PROVISIONING, RUNNING = "Pending", "Provisioning", "Running"
SUCCEEDED, FAILED, SUSPENDED = "Succeeded", "Failed", "Suspended"
TERMINAL_PHASES = frozenset({SUCCEEDED, FAILED})

RECONCILED = "Reconciled"  # False while the operator cannot apply the job's children
# True from a lost trainer (TRAINER_RESTARTED) until the restarted one reports progress (RESUMED);
# present once a job's trainer was first restarted
RECOVERING = "Recovering"
TRAINER_RESTARTED, RESUMED = "TrainerRestarted", "TrainingResumed"
CONDITION_TYPES = (
    "ToolPoolReady", "ClusterReady", RECONCILED, "Running", "Succeeded", "Failed", "Suspended", RECOVERING
)  # fmt: skip
INCOMPLETE_TRAINING = "IncompleteTraining"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
RETRYING = "Retrying"  # an attempt failed and KubeRay runs the next (runPolicy.backoffLimit)
# Container waiting reasons that mean a pod will not start without someone acting.
STUCK_CONTAINER_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CrashLoopBackOff"}
)
PHASE_CONDITIONS = {RUNNING: "Running", SUCCEEDED: "Succeeded", FAILED: "Failed", SUSPENDED: "Suspended"}


def finished(job: Job) -> bool:
    """Whether the job has ended (Succeeded or Failed): its training must never run again."""
    return job.status.get("phase") in TERMINAL_PHASES


def pool_stopped(job: Job) -> bool:
    """Suspended or finished: no trainer is left for the tool pool to serve, so it runs 0 pods."""
    return job.spec.suspend or finished(job)


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
    PhaseRule("", None, PENDING, "Queued", queued=True),
    PhaseRule("", None, PENDING, "RayJobCreated"),
    PhaseRule("Initializing", None, PROVISIONING, "RayClusterStarting"),
    PhaseRule("Waiting", None, PROVISIONING, "WaitingForSubmission"),
    PhaseRule("Retrying", None, PROVISIONING, RETRYING),
    # The Ray job ended but KubeRay has not moved the RayJob on yet: not Running any more.
    PhaseRule("Running", "FAILED", FAILED, "JobFailed"),
    PhaseRule("Running", "STOPPED", FAILED, "JobStopped"),
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


@dataclass(frozen=True, order=True)
class LostNode:
    """A node that is not Ready (its kubelet stopped posting status: a crashed or partitioned
    machine, or one reporting itself unhealthy) and the job's pods bound to it, by component."""

    node: str
    condition: str  # its Ready condition (node_condition): "Unknown since <time> (NodeStatusUnknown)"
    trainer_pods: tuple[str, ...] = ()
    pool_pods: tuple[str, ...] = ()


def node_condition(node: Mapping[str, Any]) -> str | None:
    """A node's Ready condition as the status names it, or None while it is Ready: its status,
    since when and its reason (not its message, which some kubelets rewrite at every update)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") == "True":
        return None
    since = f" since {ready['lastTransitionTime']}" if ready.get("lastTransitionTime") else ""
    reason = f" ({ready['reason']})" if ready.get("reason") else ""
    return f"{ready.get('status', 'Unknown')}{since}{reason}"


def pod_node(pod: Mapping[str, Any]) -> str:
    """The node a pod holds a place on: '' once it has ended, or is being deleted and another takes its
    place (an evicted pod stays Terminating while its node is unreachable: a Deployment's or a Job's is
    replaced at once). A Ray pod keeps its place until it is gone: KubeRay counts a Terminating pod
    as its group's (v1.6.1, reconcilePods) and starts no other meanwhile."""
    meta, ended = pod["metadata"], (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
    if ended or (meta.get("deletionTimestamp") and LABEL_RAY_NODE_TYPE not in (meta.get("labels") or {})):
        return ""
    return str((pod.get("spec") or {}).get("nodeName") or "")


def ray_cluster(rayjob: Mapping[str, Any] | None) -> str:
    """The RayCluster of the RayJob's attempt now ('' before KubeRay names one)."""
    return str(((rayjob or {}).get("status") or {}).get("rayClusterName") or "")


def lost_nodes_message(lost: tuple[LostNode, ...], trainer: bool) -> str:
    """What the job's Ray pods (trainer=True) or pool pods lose to nodes that are not Ready."""
    parts = []
    for node in lost:
        pods = node.trainer_pods if trainer else node.pool_pods
        if pods:
            parts.append(f"node {node.node} is not Ready ({node.condition}) with pods {', '.join(pods)}")
    if not parts:
        return ""
    if not trainer:
        return (
            "; ".join(parts) + ": they run again when it comes back, or elsewhere once Kubernetes evicts them"
            " (their toleration of node.kubernetes.io/unreachable: 300 s by default)"
        )
    nodes = " ".join(node.node for node in lost if node.trainer_pods)
    return (
        "; ".join(parts) + ": KubeRay replaces a Ray pod only once it is gone, and a pod of an unreachable"
        " node is gone only when the node comes back or is declared down. If it is down for good,"
        f" `kubectl taint nodes {nodes} node.kubernetes.io/out-of-service=nodeshutdown:NoExecute` (or"
        " deleting the Node) lets Kubernetes delete its pods and KubeRay start others elsewhere"
    )


@dataclass(frozen=True, order=True)
class LostTrainer:
    """A pod of KubeRay's submitter Job that failed while its attempt went on: the trainer it
    submitted and followed was lost (seen: the Ray head pod deleted or its process killed; the
    submitter's log stream breaks). KubeRay's Job runs another submitter pod, which submits the
    trainer again to the (new) head; the trainer resumes from the last checkpoint."""

    ended: str  # the container's finishedAt (RFC 3339), which orders them
    pod: str
    detail: str  # "Error, exit code 1"


def lost_trainer(pod: Mapping[str, Any]) -> LostTrainer | None:
    """The LostTrainer a pod shows, or None (any other pod, or a submitter still running or done)."""
    status = pod.get("status") or {}
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    if status.get("phase") != "Failed" or SUBMITTER_CONTAINER not in names:
        return None
    for container in status.get("containerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated")
        if container.get("name") == SUBMITTER_CONTAINER and ended:
            detail = f"{ended.get('reason') or 'Terminated'}, exit code {ended.get('exitCode')}"
            return LostTrainer(ended.get("finishedAt") or "", pod["metadata"]["name"], detail)
    reason = status.get("reason") or "Failed"  # e.g. evicted before its container ran
    return LostTrainer("", pod["metadata"]["name"], f"{reason}: {status.get('message') or 'pod failed'}")


@dataclass(frozen=True)
class Problems:
    """What the status must name besides the RayJob's state: an error applying the children
    (reconcile.py), why the trainer's or the pool's pods wait (pod_waiting_cause), each a
    (reason, message) or None, and the trainers lost within the current attempt (lost_trainer)."""

    reconcile_error: tuple[str, str] | None = None
    trainer_waiting: tuple[str, str] | None = None
    pool_waiting: tuple[str, str] | None = None
    lost_trainers: tuple[LostTrainer, ...] = ()
    lost_nodes: tuple[LostNode, ...] = ()  # nodes not Ready that hold pods of the job


def pod_waiting_cause(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why a pod does not start, as (reason, message), or None: the scheduler's verdict (a missing
    PVC, insufficient nvidia.com/gpu, an untolerated taint) or a container that cannot start (an
    image that cannot be pulled, a missing Secret or ConfigMap)."""
    name = pod.get("metadata", {}).get("name", "")
    status = pod.get("status") or {}
    if status.get("phase") not in ("Pending", None):
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            reason = cond.get("reason") or "Unschedulable"
            return reason, f"pod {name} cannot be scheduled: {cond.get('message') or reason}"
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_CONTAINER_REASONS:
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return waiting[
                "reason"
            ], f"pod {name}, container {container.get('name')}: {waiting['reason']}{detail}"
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Whether a pod counts as a ready replica: its Ready condition is True and it is not being
    deleted (the pods of a RayCluster KubeRay replaces, still Ready while they terminate)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def worker_group_status(
    rayjob: Mapping[str, Any] | None, ready_workers: Mapping[str, int]
) -> list[dict[str, Any]]:
    """`status.workerGroups`: each worker group of the RayJob (its index view's `workerGroups`:
    name, desired replicas, GPUs per worker), in its order, with its Ready pods (`ready_workers`:
    by KubeRay's group label); none before the RayJob exists or once it is gone."""
    return [
        {
            "name": group["name"],
            "replicas": group["replicas"],
            "readyReplicas": int(ready_workers.get(group["name"], 0)),
            "gpusPerWorker": group["gpusPerWorker"],
        }
        for group in (rayjob or {}).get("workerGroups") or []
    ]


def worker_groups_summary(groups: list[dict[str, Any]]) -> str:
    """Each group's Ready/desired pods, e.g. `gpu-workers 1/1, rollout-workers 0/1 ready`."""
    return ", ".join(f"{g['name']} {g['readyReplicas']}/{g['replicas']}" for g in groups) + " ready"


def waiting_queue(job: Job) -> str:
    """The Kueue queue the job waits in for admission when not suspended by the user, else ''."""
    return "" if job.spec.suspend else job.spec.cluster.queue_name


def queued(rayjob: dict[str, Any] | None, queue: str) -> bool:
    """Whether the RayJob waits for Kueue's admission: a queue, and Kueue keeps it suspended."""
    return bool(queue) and bool(((rayjob or {}).get("spec") or {}).get("suspend"))


def rayjob_phase(rayjob: dict[str, Any] | None, queue: str = "") -> Phase:
    """Map a RayJob (None: not created or not yet seen) to the job's phase, reason and message;
    `queue` is the Kueue queue the job waits in (waiting_queue)."""
    if rayjob is None:
        return Phase(PENDING, "RayJobNotCreated", "waiting for the RayJob to be created")
    rj = rayjob.get("status") or {}
    deployment, job_status = rj.get("jobDeploymentStatus", ""), rj.get("jobStatus", "")
    for rule in RAYJOB_PHASES:
        if rule.queued and not queued(rayjob, queue):
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


def cluster_ready(rayjob: dict[str, Any] | None, phase: str, queue: str = "") -> tuple[bool, str, str]:
    """(ready, reason, message) of the Ray cluster. KubeRay moves a RayJob to Running only once
    its cluster is ready, and stops refreshing rayClusterStatus while it cannot reach Ray."""
    rj = (rayjob or {}).get("status") or {}
    name = rj.get("rayClusterName", "")
    state = (rj.get("rayClusterStatus") or {}).get("state", "")
    if phase in TERMINAL_PHASES:
        ttl = int(((rayjob or {}).get("spec") or {}).get("ttlSecondsAfterFinished") or 0)
        when = (
            f"{ttl} s after the job ended (runPolicy.ttlSecondsAfterFinished)" if ttl else "as the job ends"
        )
        return False, "JobFinished", f"the job finished; KubeRay deletes the Ray cluster {when}"
    if phase == SUSPENDED:
        return False, "Suspended", "the Ray cluster is deleted while the job is suspended"
    if rj.get("jobDeploymentStatus") == "Running" or state == "ready":
        return True, "RayClusterReady", f"RayCluster {name} is ready"
    if queued(rayjob, queue):
        return False, "Queued", f"the RayCluster is created once Kueue admits the job from queue {queue}"
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
    if ready >= replicas:  # e.g. scaled down a moment ago: "2/1 ready" would read as a contradiction
        message = f"tool-pool replicas: {ready} ready, {replicas} wanted (the Deployment is rolling out)"
        return replicas, ready, False, "ReplicasNotReady", message
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
    since = old["lastTransitionTime"] if old is not None and old.get("status") == status else now
    return {
        "type": ctype,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": since,
        "reason": reason,
        "message": message,
    }


def attempt(rayjob: dict[str, Any] | None) -> int:
    """Which attempt of the training this is (1 + the attempts KubeRay counted as ended; an ended
    RayJob counts its own)."""
    rj = (rayjob or {}).get("status") or {}
    ended = int(rj.get("failed") or 0) + int(rj.get("succeeded") or 0)
    return max(ended, 1) if rj.get("jobDeploymentStatus") in ("Complete", "Failed") else ended + 1


@dataclass(frozen=True)
class AttemptFailure:
    """An attempt of the training that failed and that KubeRay retries (runPolicy.backoffLimit)."""

    attempt: int
    reason: str  # KubeRay's (AppFailed, SubmissionFailed, ...), else the phase table's (JobFailed)
    message: str  # KubeRay's message (the Ray job's), else the RayJob's state in words


def failed_attempt(job: Job, rayjob: dict[str, Any] | None, phase: Phase) -> AttemptFailure | None:
    """The attempt the RayJob shows failed with a retry to come, or None; `phase` is the RayJob's
    own (rayjob_phase). KubeRay counts the failed attempt when it moves the RayJob to Retrying; both
    moments say which attempt failed and why until KubeRay clears its status for the next one (the
    Ray cluster is deleted in between: 4 s seen on the real node), so the status keeps it as
    `lastAttemptFailure` (last_attempt_failure)."""
    rj = (rayjob or {}).get("status") or {}
    failed = int(rj.get("failed") or 0)
    deployment = rj.get("jobDeploymentStatus")
    if phase.phase == FAILED and deployment == "Running" and failed < job.spec.run_policy.backoff_limit:
        return AttemptFailure(failed + 1, phase.reason, phase.message)
    if deployment == "Retrying" and failed:
        return AttemptFailure(failed, rj.get("reason") or "JobFailed", phase.message)
    return None


def last_attempt_failure(
    old: Mapping[str, Any], failure: AttemptFailure | None, now: str
) -> dict[str, Any] | None:
    """`status.lastAttemptFailure`: the last attempt seen to fail and be retried, kept while the next
    attempts start and run and after the job ends (the status is the record: the RayJob forgets it).
    `time` is when the operator first saw that attempt fail; what it says is the latest seen of it."""
    last = old.get("lastAttemptFailure")
    if failure is None:
        return last
    seen = last["time"] if last and last.get("attempt") == failure.attempt and last.get("time") else now
    return {"attempt": failure.attempt, "reason": failure.reason, "message": failure.message, "time": seen}


def judge(job: Job, rayjob: dict[str, Any] | None, phase: Phase) -> Phase:
    """The RayJob's phase, checked against what the trainer reported and the retry budget:
    a Ray job that exits 0 short of `totalSteps` did not succeed (a resume that trains 0 steps
    does exactly that); a failure with attempts left is a retry; the last failure says so."""
    rj = (rayjob or {}).get("status") or {}
    limit = job.spec.run_policy.backoff_limit
    failed = int(rj.get("failed") or 0)
    if phase.phase == SUCCEEDED:
        progress = job.status.get("progress") or {}
        step, total = progress.get("step"), progress.get("totalSteps")
        if not progress:
            return Phase(
                FAILED, INCOMPLETE_TRAINING, "the Ray job exited 0, but the trainer reported no progress"
            )
        if not total or step is None or step < total:
            return Phase(
                FAILED,
                INCOMPLETE_TRAINING,
                f"the Ray job exited 0 at step {step} of {total}: the trainer did not reach totalSteps",
            )
    failure = failed_attempt(job, rayjob, phase)
    if failure is not None:
        return Phase(
            PROVISIONING, RETRYING, f"attempt {failure.attempt} failed ({failure.message}); KubeRay retries"
        )
    if phase.phase == FAILED and limit and failed > limit:
        return Phase(
            FAILED,
            BACKOFF_LIMIT_EXCEEDED,
            f"all {failed} attempts failed (runPolicy.backoffLimit {limit}); the last: {phase.reason}: "
            f"{phase.message}",
        )
    return phase


def compute_status(
    job: Job,
    rayjob: dict[str, Any] | None,
    deployment: dict[str, Any] | None,
    observed_generation: int,
    now: str,
    problems: Problems | None = None,
    ready_workers: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The operator-owned part of `job.status` (never `progress`, never `toolPool.desiredReplicas`).
    `ready_workers`: the job's Ready Ray pods by group (KubeRay's `ray.io/group` label)."""
    problems = problems or Problems()
    meta = job.metadata
    old = job.status
    queue = waiting_queue(job)
    failure = None
    if rayjob is None and old.get("phase") in TERMINAL_PHASES:
        # The finished job's RayJob is gone (its TTL, or deleted): the outcome stays.
        phase = Phase(old["phase"], old.get("reason", ""), old.get("message", ""))
    else:
        observed = rayjob_phase(rayjob, queue)
        failure = failed_attempt(job, rayjob, observed)
        phase = judge(job, rayjob, observed)
    last_failure = last_attempt_failure(old, failure, now)
    waiting = phase.phase in (PENDING, PROVISIONING) and not queued(rayjob, queue)
    if waiting and problems.reconcile_error:
        phase = Phase(phase.phase, *problems.reconcile_error)
    elif waiting and problems.trainer_waiting:
        phase = Phase(phase.phase, *problems.trainer_waiting)
    rj = (rayjob or {}).get("status") or {}

    pool_replicas, pool_ready, pool_ok, pool_reason, pool_message = tool_pool_status(deployment)
    if not pool_ok and pool_replicas and problems.pool_waiting:
        pool_reason, pool_message = problems.pool_waiting[0], f"{pool_message}; {problems.pool_waiting[1]}"
    cl_ok, cl_reason, cl_message = cluster_ready(rayjob, phase.phase, queue)
    if not cl_ok and waiting and problems.trainer_waiting:
        cl_reason, cl_message = problems.trainer_waiting[0], f"{cl_message}; {problems.trainer_waiting[1]}"
    live = phase.phase not in (*TERMINAL_PHASES, SUSPENDED)
    lost_trainer_pods = lost_nodes_message(problems.lost_nodes, trainer=True)
    if lost_trainer_pods and live:  # KubeRay still counts them: their node stopped saying otherwise
        cl_ok, cl_reason, cl_message = False, NODE_NOT_READY, lost_trainer_pods
    lost_pool_pods = lost_nodes_message(problems.lost_nodes, trainer=False)
    if lost_pool_pods and live:
        pool_ok, pool_reason, pool_message = False, NODE_NOT_READY, f"{pool_message}; {lost_pool_pods}"
    groups = worker_group_status(rayjob, ready_workers or {})
    if len(groups) > 1 and rj.get("rayClusterName") and live:
        # separate-async: which group the cluster waits for (its trainer or its rollout workers)
        cl_message = f"{cl_message}; workers: {worker_groups_summary(groups)}"
    applied_ok, applied_reason, applied_message = (
        (False, *problems.reconcile_error)
        if problems.reconcile_error
        else (True, "ChildrenApplied", "every child of the job is applied")
    )
    previous = {c["type"]: c for c in old.get("conditions", [])}
    conditions = [
        _condition(previous, "ToolPoolReady", pool_ok, pool_reason, pool_message, observed_generation, now),
        _condition(previous, "ClusterReady", cl_ok, cl_reason, cl_message, observed_generation, now),
        _condition(
            previous, RECONCILED, applied_ok, applied_reason, applied_message, observed_generation, now
        ),
    ]
    restarts, recovering = restarts_and_recovery(old, phase.phase, problems.lost_trainers)
    if recovering is not None and recovering[0]:
        phase = Phase(phase.phase, recovering[1], recovering[2])
    for ctype in ("Running", "Succeeded", "Failed", "Suspended"):
        active = PHASE_CONDITIONS.get(phase.phase) == ctype
        reason = phase.reason if active else f"Not{ctype}"
        message = phase.message if active else f"the job is {phase.phase}"
        conditions.append(_condition(previous, ctype, active, reason, message, observed_generation, now))
    if recovering is not None:
        conditions.append(_condition(previous, RECOVERING, *recovering, observed_generation, now))

    status: dict[str, Any] = {
        "phase": phase.phase,
        "reason": phase.reason,
        "message": phase.message,
        "observedGeneration": observed_generation,
        "attempt": attempt(rayjob) if rayjob is not None else old.get("attempt", 1),
        **restarts,
        **({"lastAttemptFailure": last_failure} if last_failure else {}),
        "rayJobName": (rayjob or {}).get("metadata", {}).get("name", ""),
        "rayClusterName": rj.get("rayClusterName", ""),
        "dashboardURL": rj.get("dashboardURL", ""),
        "toolPool": {
            "replicas": pool_replicas,
            "readyReplicas": pool_ready,
            "endpoint": tool_pool_url(meta["name"], meta["namespace"]),
            "summary": f"{pool_ready}/{pool_replicas}",
        },
        "workerGroups": groups,
        "conditions": conditions,
    }
    start = rj.get("startTime") or old.get("startTime")
    if start:
        status["startTime"] = start
    if phase.phase in TERMINAL_PHASES:
        status["completionTime"] = rj.get("endTime") or old.get("completionTime") or now
    Status.model_validate(status)  # the API's types: a field the CRD lacks (the apiserver drops it) raises
    return status


def restarts_and_recovery(
    old: Mapping[str, Any], phase: str, lost: tuple[LostTrainer, ...]
) -> tuple[dict[str, Any], tuple[bool, str, str] | None]:
    """`restarts` and `lastRestart` of the status, and the Recovering condition (None before the
    first restart). A lost trainer counts once: those that ended after the last one counted (the
    status is the record, so an operator restart counts nothing twice). The job recovers until the
    trainer reports progress after the loss."""
    restarts, last = int(old.get("restarts") or 0), old.get("lastRestart")
    new = sorted(t for t in lost if not last or t.ended > last["time"])
    if new:
        restarts += len(new)
        last = {"time": new[-1].ended or now(), "pod": new[-1].pod, "detail": new[-1].detail}
    fields: dict[str, Any] = {"restarts": restarts, **({"lastRestart": last} if last else {})}
    if not last:
        return fields, None
    progress = old.get("progress") or {}
    reported = progress.get("lastUpdateTime") or ""
    if phase in (RUNNING, PROVISIONING) and reported <= last["time"]:
        message = (
            f"restart {restarts}: the trainer was lost ({last['pod']} ended: {last['detail']}, at "
            f"{last['time']}; a lost Ray head does this); KubeRay submits it again and training resumes "
            f"from the last checkpoint"
        )
        return fields, (True, TRAINER_RESTARTED, message)
    if reported > last["time"]:
        message = f"training resumed after restart {restarts}: step {progress.get('step')} reported"
        return fields, (False, RESUMED, message)
    return fields, (False, f"Not{RECOVERING}", f"the job is {phase}")


def _differs(old: Any, new: Any) -> bool:
    if _is_conditions(old) and _is_conditions(new):
        # A list keyed by type: only the types in `new` (ours) count, not others' conditions.
        before = {c["type"]: c for c in old}
        return any(_differs(before.get(c["type"]), c) for c in new)
    if isinstance(old, dict) and isinstance(new, dict):
        return any(_differs(old.get(key), value) for key, value in new.items())
    return bool(old != new)


def _is_conditions(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(c, dict) and "type" in c for c in value)


def status_changes(old: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The top-level keys of `new` that differ from `old` (empty: no write needed). Keys
    other writers own inside a nested object (e.g. `toolPool.desiredReplicas`) are ignored."""
    return {key: value for key, value in new.items() if _differs(old.get(key), value)}
