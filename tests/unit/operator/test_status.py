"""RayJob status -> job phase (one case per table row) and the status document around it."""

from __future__ import annotations

from typing import Any

import pytest
from toolrl_operator.status import (
    NODE_NOT_READY,
    RAYJOB_PHASES,
    LostNode,
    Problems,
    compute_status,
    node_condition,
    pod_node,
    pod_ready,
    pod_waiting_cause,
    rayjob_phase,
    status_changes,
)

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:05:00Z"


def rayjob(deployment: str = "", job_status: str = "", suspend: bool = False, **extra: Any) -> dict[str, Any]:
    status = {"jobDeploymentStatus": deployment, "jobStatus": job_status, **extra}
    return {"metadata": {"name": "gsm8k-python"}, "spec": {"suspend": suspend}, "status": status}


DONE = {"progress": {"step": 100, "totalSteps": 100}}  # what the trainer reports at its end


def deployment(replicas: int = 2, ready: int = 2, generation: int = 1, observed: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "gsm8k-python-tools", "generation": generation},
        "spec": {"replicas": replicas},
        "status": {"readyReplicas": ready, "updatedReplicas": ready, "observedGeneration": observed},
    }


ROWS = [
    # (jobDeploymentStatus, jobStatus, phase, reason)
    ("", "", "Pending", "RayJobCreated"),
    ("Initializing", "", "Provisioning", "RayClusterStarting"),
    ("Waiting", "", "Provisioning", "WaitingForSubmission"),
    ("Retrying", "FAILED", "Provisioning", "Retrying"),
    ("Running", "PENDING", "Running", "RayJobRunning"),
    ("Running", "FAILED", "Failed", "JobFailed"),
    ("Running", "STOPPED", "Failed", "JobStopped"),
    ("Complete", "SUCCEEDED", "Succeeded", "JobSucceeded"),
    ("Complete", "STOPPED", "Failed", "JobStopped"),
    ("Complete", "FAILED", "Failed", "JobNotSucceeded"),
    ("Failed", "FAILED", "Failed", "JobFailed"),
    ("ValidationFailed", "", "Failed", "ValidationFailed"),
    ("Suspending", "", "Suspended", "Suspending"),
    ("Suspended", "", "Suspended", "Suspended"),
]


@pytest.mark.parametrize(("deployment_status", "job_status", "phase", "reason"), ROWS)
def test_each_row_of_the_phase_table(deployment_status, job_status, phase, reason) -> None:
    got = rayjob_phase(rayjob(deployment_status, job_status))
    assert (got.phase, got.reason) == (phase, reason)


QUEUED_ROWS = [
    # (jobDeploymentStatus, phase, reason) while the job waits in Kueue queue "gpu" (not user-suspended)
    ("", "Pending", "Queued"),
    ("Suspending", "Pending", "Queued"),
    ("Suspended", "Pending", "Queued"),
]


@pytest.mark.parametrize(("deployment_status", "phase", "reason"), QUEUED_ROWS)
def test_each_queued_row_of_the_phase_table(deployment_status, phase, reason) -> None:
    got = rayjob_phase(rayjob(deployment_status, suspend=True), queue="gpu")
    assert (got.phase, got.reason) == (phase, reason)
    assert "gpu" in got.message
    assert rayjob_phase(rayjob("Running"), queue="gpu").phase == "Running", "admitted: the usual rows"


def test_the_cases_cover_every_row_of_the_table() -> None:
    covered = {(d, j, False) for d, j, _, _ in ROWS} | {(d, "", True) for d, _, _ in QUEUED_ROWS}
    for rule in RAYJOB_PHASES:
        assert any(
            d == rule.deployment_status and rule.job_status in (None, j) and q == rule.queued
            for d, j, q in covered
        ), rule


def test_a_queued_job_is_pending_and_a_user_suspended_one_suspended(make_job) -> None:
    queued = make_job(cluster={"queueName": "gpu"})
    got = compute_status(queued, rayjob("Suspended", suspend=True), deployment(), 3, NOW)
    assert (got["phase"], got["reason"]) == ("Pending", "Queued")
    assert got["message"] == "waiting in the Kueue queue gpu for admission"
    # before KubeRay has even looked at the RayJob: still the queue, not "no RayCluster yet"
    got = compute_status(queued, rayjob("", suspend=True), deployment(), 3, NOW)
    assert (got["phase"], got["reason"]) == ("Pending", "Queued")
    cluster = {c["type"]: c for c in got["conditions"]}["ClusterReady"]
    assert "queue gpu" in cluster["message"] and cluster["reason"] == "Queued"
    suspended = make_job(cluster={"queueName": "gpu"}, suspend=True)
    assert compute_status(suspended, rayjob("Suspended"), deployment(0, 0), 3, NOW)["phase"] == "Suspended"
    assert compute_status(make_job(), rayjob("Suspended"), deployment(0, 0), 3, NOW)["phase"] == "Suspended"


def test_running_with_any_ray_job_status_is_running() -> None:
    for job_status in ("", "PENDING", "RUNNING", "SUCCEEDED"):
        assert rayjob_phase(rayjob("Running", job_status)).phase == "Running"


def test_failure_reason_and_message_come_from_the_rayjob() -> None:
    got = rayjob_phase(rayjob("Failed", "FAILED", reason="AppFailed", message="Traceback: boom"))
    assert (got.phase, got.reason, got.message) == ("Failed", "AppFailed", "Traceback: boom")
    got = rayjob_phase(rayjob("Failed", "", reason="DeadlineExceeded", message="ran past 600s"))
    assert (got.reason, got.message) == ("DeadlineExceeded", "ran past 600s")


def test_no_rayjob_and_unknown_status_are_pending() -> None:
    assert rayjob_phase(None).phase == "Pending"
    got = rayjob_phase(rayjob("SomethingNew"))
    assert (got.phase, got.reason) == ("Pending", "UnknownRayJobStatus")
    assert "SomethingNew" in got.message


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_running_job_status(make_job) -> None:
    rj = rayjob(
        "Running",
        "RUNNING",
        rayClusterName="gsm8k-python-abcde",
        dashboardURL="gsm8k-python-head-svc.rl.svc.cluster.local:8265",
        startTime="2026-01-01T00:00:01Z",
    )
    status = compute_status(make_job(), rj, deployment(), 3, NOW)
    assert status["phase"] == "Running"
    assert status["observedGeneration"] == 3
    assert status["rayJobName"] == "gsm8k-python"
    assert status["rayClusterName"] == "gsm8k-python-abcde"
    assert status["dashboardURL"] == "gsm8k-python-head-svc.rl.svc.cluster.local:8265"
    assert status["startTime"] == "2026-01-01T00:00:01Z"
    assert "completionTime" not in status
    assert status["toolPool"] == {
        "replicas": 2,
        "readyReplicas": 2,
        "endpoint": "http://gsm8k-python-tools.rl.svc:8080",
        "summary": "2/2",
    }
    assert _conditions(status) == {
        "ToolPoolReady": ("True", "ReplicasReady"),
        "ClusterReady": ("True", "RayClusterReady"),
        "Reconciled": ("True", "ChildrenApplied"),
        "Running": ("True", "RayJobRunning"),
        "Succeeded": ("False", "NotSucceeded"),
        "Failed": ("False", "NotFailed"),
        "Suspended": ("False", "NotSuspended"),
    }
    for cond in status["conditions"]:
        assert cond["observedGeneration"] == 3
        assert cond["lastTransitionTime"] == NOW
        assert cond["message"]


def test_provisioning_cluster_and_pool_not_ready(make_job) -> None:
    rj = rayjob("Initializing", rayClusterName="c1", rayClusterStatus={"state": ""})
    status = compute_status(make_job(), rj, deployment(ready=1), 3, NOW)
    assert status["phase"] == "Provisioning"
    conds = _conditions(status)
    assert conds["ClusterReady"] == ("False", "RayClusterNotReady")
    assert conds["ToolPoolReady"] == ("False", "ReplicasNotReady")
    assert status["toolPool"]["summary"] == "1/2"


def test_pool_rollout_in_progress_is_not_ready(make_job) -> None:
    status = compute_status(make_job(), rayjob("Running"), deployment(generation=2, observed=1), 3, NOW)
    assert _conditions(status)["ToolPoolReady"] == ("False", "ReplicasNotReady")


def test_a_pool_scaled_down_a_moment_ago_says_it_rolls_out_not_2_of_1_ready(make_job) -> None:
    scaled_down = deployment(replicas=1, ready=2, generation=2, observed=1)
    status = compute_status(make_job(), rayjob("Running"), scaled_down, 3, NOW)
    cond = {c["type"]: c for c in status["conditions"]}["ToolPoolReady"]
    assert (cond["status"], cond["reason"]) == ("False", "ReplicasNotReady")
    assert cond["message"] == "tool-pool replicas: 2 ready, 1 wanted (the Deployment is rolling out)"


def test_failed_job_copies_reason_and_completion_time(make_job) -> None:
    rj = rayjob("Failed", "FAILED", reason="AppFailed", message="exit 1", endTime="2026-01-01T01:00:00Z")
    status = compute_status(make_job(), rj, deployment(), 3, NOW)
    assert (status["phase"], status["reason"], status["message"]) == ("Failed", "AppFailed", "exit 1")
    assert status["completionTime"] == "2026-01-01T01:00:00Z"
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["Failed"]["status"], conds["Failed"]["reason"], conds["Failed"]["message"]) == (
        "True",
        "AppFailed",
        "exit 1",
    )
    assert conds["ClusterReady"]["reason"] == "JobFinished"
    assert (
        conds["ClusterReady"]["message"]
        == "the job finished; KubeRay deletes the Ray cluster as the job ends"
    )


def test_a_finished_jobs_cluster_condition_says_how_long_kuberay_keeps_the_cluster(make_job) -> None:
    rj = rayjob("Complete", "SUCCEEDED")
    rj["spec"]["ttlSecondsAfterFinished"] = 3600
    status = compute_status(make_job(), rj, deployment(), 3, NOW)
    assert _conditions(status)["ClusterReady"] == ("False", "JobFinished")
    [cluster] = [c for c in status["conditions"] if c["type"] == "ClusterReady"]
    assert "3600 s after the job ended (runPolicy.ttlSecondsAfterFinished)" in cluster["message"]


def test_suspended_job_and_pool_scaled_to_zero(make_job) -> None:
    status = compute_status(make_job(suspend=True), rayjob("Suspended"), deployment(0, 0), 3, NOW)
    assert status["phase"] == "Suspended"
    conds = _conditions(status)
    assert conds["Suspended"] == ("True", "Suspended")
    assert conds["ToolPoolReady"] == ("False", "ScaledToZero")
    assert conds["ClusterReady"] == ("False", "Suspended")
    assert status["toolPool"]["summary"] == "0/0"


def test_transition_time_moves_only_when_a_condition_flips(make_job) -> None:
    first = compute_status(make_job(), rayjob("Initializing"), deployment(), 3, NOW)
    second = compute_status(make_job(status=first), rayjob("Running"), deployment(), 3, LATER)
    times = {c["type"]: c["lastTransitionTime"] for c in second["conditions"]}
    assert times["ToolPoolReady"] == NOW  # stayed True
    assert times["Running"] == LATER  # False -> True
    assert times["ClusterReady"] == LATER


def test_status_changes_ignores_fields_owned_by_others() -> None:
    old = {"phase": "Running", "toolPool": {"replicas": 2, "desiredReplicas": 5}, "progress": {"step": 9}}
    new = {"phase": "Running", "toolPool": {"replicas": 2}}
    assert status_changes(old, new) == {}
    new = {"phase": "Failed", "toolPool": {"replicas": 3}}
    assert status_changes(old, new) == new


def test_status_changes_ignores_conditions_of_other_writers(make_job) -> None:
    ours = compute_status(make_job(), rayjob("Running"), deployment(), 3, NOW)
    autoscaler = {"type": "AutoscalerHealthy", "status": "True", "reason": "MetricsAvailable"}
    written = {**ours, "conditions": [*ours["conditions"], autoscaler]}
    again = compute_status(make_job(status=written), rayjob("Running"), deployment(), 3, LATER)
    assert status_changes(written, again) == {}
    failed = compute_status(make_job(status=written), rayjob("Failed", "FAILED"), deployment(), 3, LATER)
    assert "conditions" in status_changes(written, failed)


def test_a_finished_job_keeps_its_outcome_when_its_rayjob_is_gone(make_job) -> None:
    done = compute_status(make_job(status=DONE), rayjob("Complete", "SUCCEEDED"), deployment(0, 0), 3, NOW)
    after = compute_status(make_job(status={**DONE, **done}), None, deployment(0, 0), 3, LATER)
    assert (after["phase"], after["reason"]) == ("Succeeded", "JobSucceeded")
    assert after["completionTime"] == done["completionTime"]


def test_one_clock_format_and_one_pool_stopped_rule(make_job) -> None:
    import re

    from toolrl_operator.status import now, pool_stopped

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", now())
    assert pool_stopped(make_job(suspend=True))
    assert pool_stopped(make_job(status={"phase": "Failed"}))
    assert not pool_stopped(make_job(status={"phase": "Running"}))


def test_success_needs_the_trainer_at_total_steps(make_job) -> None:
    rj = rayjob("Complete", "SUCCEEDED")
    assert compute_status(make_job(status=DONE), rj, deployment(0, 0), 3, NOW)["phase"] == "Succeeded"
    short = compute_status(
        make_job(status={"progress": {"step": 0, "totalSteps": 100}}), rj, deployment(), 3, NOW
    )
    assert (short["phase"], short["reason"]) == ("Failed", "IncompleteTraining")
    assert "step 0 of 100" in short["message"]
    silent = compute_status(make_job(), rj, deployment(), 3, NOW)
    assert (silent["phase"], silent["reason"]) == ("Failed", "IncompleteTraining")
    assert "no progress" in silent["message"]


def test_a_failed_attempt_with_retries_left_is_a_retry_and_the_last_says_the_budget_is_spent(
    make_job,
) -> None:
    job = make_job(runPolicy={"backoffLimit": 2})
    failing = compute_status(job, rayjob("Running", "FAILED", failed=1), deployment(), 3, NOW)
    assert (failing["phase"], failing["reason"], failing["attempt"]) == ("Provisioning", "Retrying", 2)
    retrying = compute_status(
        job, rayjob("Retrying", "FAILED", failed=1, message="trainer: disk full"), deployment(), 3, NOW
    )
    assert (retrying["phase"], retrying["reason"], retrying["attempt"]) == ("Provisioning", "Retrying", 2)
    # while KubeRay deletes the failed attempt's cluster, the status still says which failed and why
    assert retrying["message"] == "attempt 1 failed (trainer: disk full); KubeRay retries", retrying
    rj = rayjob("Failed", "FAILED", failed=3, reason="AppFailed", message="exit 1")
    spent = compute_status(job, rj, deployment(), 3, NOW)
    assert (spent["phase"], spent["reason"], spent["attempt"]) == ("Failed", "BackoffLimitExceeded", 3)
    assert "all 3 attempts failed" in spent["message"] and "AppFailed: exit 1" in spent["message"]
    # without retries a Ray job that failed is not reported as Running while KubeRay catches up
    assert compute_status(make_job(), rayjob("Running", "FAILED"), deployment(), 3, NOW)["phase"] == "Failed"
    assert compute_status(make_job(), rayjob("Running", "RUNNING"), deployment(), 3, NOW)["attempt"] == 1


def test_kuberay_failure_reasons_are_shown_as_they_are(make_job) -> None:
    for reason in ("SubmissionFailed", "DeadlineExceeded", "PreRunningDeadlineExceeded"):
        rj = rayjob("Failed", "", reason=reason, message=f"{reason} said KubeRay")
        status = compute_status(make_job(), rj, deployment(), 3, NOW)
        assert (status["phase"], status["reason"], status["message"]) == (
            "Failed",
            reason,
            f"{reason} said KubeRay",
        )


POD = {"metadata": {"name": "j-head-x"}, "status": {"phase": "Pending"}}


@pytest.mark.parametrize(
    ("status", "reason", "says"),
    [
        (
            {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                             "message": '0/3 nodes are available: persistentvolumeclaim "ckpt" not found.'}]},
            "Unschedulable", 'persistentvolumeclaim "ckpt" not found',
        ),
        (
            {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                             "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]},
            "Unschedulable", "Insufficient nvidia.com/gpu",
        ),
        (
            {"containerStatuses": [{"name": "ray-head", "state": {"waiting": {
                "reason": "ImagePullBackOff", "message": 'Back-off pulling image "nope:1"'}}}]},
            "ImagePullBackOff", 'pulling image "nope:1"',
        ),
    ],
)  # fmt: skip
def test_a_waiting_pod_names_its_cause(status, reason, says) -> None:
    cause = pod_waiting_cause({**POD, "status": {**POD["status"], **status}})
    assert cause is not None and cause[0] == reason and says in cause[1] and "j-head-x" in cause[1]


def test_a_starting_or_running_pod_has_no_cause() -> None:
    assert pod_waiting_cause(POD) is None
    creating = {"containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    assert pod_waiting_cause({**POD, "status": {**POD["status"], **creating}}) is None
    assert pod_waiting_cause({**POD, "status": {"phase": "Running"}}) is None


def test_a_waiting_cause_and_a_reconcile_error_are_shown_while_the_job_waits(make_job) -> None:
    cause = (
        "Unschedulable",
        "pod h cannot be scheduled: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    )
    rj = rayjob("Initializing", rayClusterName="c1")
    status = compute_status(make_job(), rj, deployment(), 3, NOW, Problems(trainer_waiting=cause))
    assert (status["phase"], status["reason"], status["message"]) == ("Provisioning", *cause)
    cluster = {c["type"]: c for c in status["conditions"]}["ClusterReady"]
    assert cluster["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in cluster["message"]
    error = ("Invalid", "RayJob is invalid: spec.x: bad")
    status = compute_status(make_job(), None, deployment(), 3, NOW, Problems(reconcile_error=error))
    assert (status["phase"], status["reason"], status["message"]) == ("Pending", *error)
    assert _conditions(status)["Reconciled"] == ("False", "Invalid")
    running = compute_status(
        make_job(), rayjob("Running"), deployment(), 3, NOW, Problems(trainer_waiting=cause)
    )
    assert running["reason"] == "RayJobRunning", "a running job is not waiting"
    pool = compute_status(make_job(), rj, deployment(ready=0), 3, NOW, Problems(pool_waiting=cause))
    assert {c["type"]: c for c in pool["conditions"]}["ToolPoolReady"]["reason"] == "Unschedulable"


def _rayjob_of(job: dict[str, Any], **status: Any) -> dict[str, Any]:
    """The RayJob the operator builds for `job`, with a KubeRay status, as its index keeps it."""
    from toolrl_operator.handlers import rayjob_view
    from toolrl_operator.rayjob import build_rayjob
    from toolrl_operator.settings import Settings

    return rayjob_view({**build_rayjob(job, Settings(trainer_image="t:1")), "status": status})


RUNNING_CLUSTER = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "c1"}


def test_a_sync_job_shows_its_one_worker_group(make_job) -> None:
    job = make_job()  # the example: 2 workers of 8 GPUs
    rj = _rayjob_of(job, **RUNNING_CLUSTER)
    status = compute_status(job, rj, deployment(), 3, NOW, ready_workers={"gpu-workers": 1, "headgroup": 1})
    assert status["workerGroups"] == [
        {"name": "gpu-workers", "replicas": 2, "readyReplicas": 1, "gpusPerWorker": 8}
    ]
    cluster = {c["type"]: c for c in status["conditions"]}["ClusterReady"]
    assert cluster["message"] == "RayCluster c1 is ready", "one group: the message stays as it was"


def test_a_separate_async_job_shows_both_worker_groups_in_the_rayjobs_order(
    make_job, separate_async_cpu_job
) -> None:
    job = separate_async_cpu_job
    starting = {"jobDeploymentStatus": "Initializing", "rayClusterName": "c1"}
    status = compute_status(
        job, _rayjob_of(job, **starting), deployment(), 3, NOW, ready_workers={"gpu-workers": 1}
    )
    assert status["workerGroups"] == [
        {"name": "gpu-workers", "replicas": 1, "readyReplicas": 1, "gpusPerWorker": 0},
        {"name": "rollout-workers", "replicas": 1, "readyReplicas": 0, "gpusPerWorker": 0},
    ]
    cluster = {c["type"]: c for c in status["conditions"]}["ClusterReady"]
    assert cluster["status"] == "False"
    assert (
        cluster["message"] == "RayCluster c1 is starting; workers: gpu-workers 1/1, rollout-workers 0/1 ready"
    )

    gpu = make_job(
        trainer={"mode": "separate-async"},
        cluster={
            "workers": {"replicas": 2, "gpusPerWorker": 8},
            "rolloutWorkers": {"replicas": 3, "gpusPerWorker": 2},
        },
    )
    both = {"gpu-workers": 2, "rollout-workers": 3}
    status = compute_status(gpu, _rayjob_of(gpu, **RUNNING_CLUSTER), deployment(), 3, NOW, ready_workers=both)
    assert [
        (g["name"], g["replicas"], g["readyReplicas"], g["gpusPerWorker"]) for g in status["workerGroups"]
    ] == [
        ("gpu-workers", 2, 2, 8),
        ("rollout-workers", 3, 3, 2),
    ]
    cluster = {c["type"]: c for c in status["conditions"]}["ClusterReady"]
    assert cluster["message"] == "RayCluster c1 is ready; workers: gpu-workers 2/2, rollout-workers 3/3 ready"


def test_no_rayjob_no_worker_groups(make_job) -> None:
    assert compute_status(make_job(), None, deployment(), 3, NOW)["workerGroups"] == []
    queued = compute_status(make_job(), _rayjob_of(make_job()), deployment(), 3, NOW)
    assert queued["workerGroups"][0]["readyReplicas"] == 0, "no pod seen: none ready"


READY_POD = {
    "metadata": {"name": "c1-gpu-workers-abcde", "labels": {"ray.io/group": "gpu-workers"}},
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}


def test_a_pod_is_ready_by_its_ready_condition_until_it_is_being_deleted() -> None:
    assert pod_ready(READY_POD)
    assert not pod_ready(
        {**READY_POD, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}}
    )
    assert not pod_ready({**READY_POD, "status": {"phase": "Pending"}})
    deleting = {**READY_POD, "metadata": {**READY_POD["metadata"], "deletionTimestamp": NOW}}
    assert not pod_ready(deleting), "a terminating pod of an old cluster is no ready replica"


LOST = {
    "status": {
        "conditions": [
            {"type": "MemoryPressure", "status": "Unknown"},
            {
                "type": "Ready",
                "status": "Unknown",
                "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
                "lastTransitionTime": "2026-01-01T00:01:00Z",
            },
        ]
    }
}


def test_a_nodes_ready_condition_is_named_only_while_it_is_not_ready() -> None:
    assert node_condition(LOST) == "Unknown since 2026-01-01T00:01:00Z (NodeStatusUnknown)"
    assert node_condition({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}) is None
    assert node_condition({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}) == "False"
    assert node_condition({}) is None  # no word from it yet: not lost


def test_a_pod_holds_its_node_until_deleted_or_ended_and_a_ray_pod_until_it_is_gone() -> None:
    """An evicted pod of an unreachable node stays Terminating, a finished submitter stays Failed:
    neither is the job's any more, so neither ties the job to its node; but a Ray pod, which KubeRay
    replaces only once it is gone, does."""
    pod = {"metadata": {"name": "w"}, "spec": {"nodeName": "gpu-node-3"}, "status": {"phase": "Running"}}
    assert pod_node(pod) == "gpu-node-3"
    assert pod_node({**pod, "metadata": {"name": "w", "deletionTimestamp": "2026-01-01T00:06:00Z"}}) == ""
    assert pod_node({**pod, "status": {"phase": "Failed"}}) == ""
    assert pod_node({"metadata": {"name": "w"}, "spec": {}}) == ""  # not scheduled yet
    # KubeRay counts a Terminating Ray pod as its group's and starts no other: it holds its node
    ray = {"name": "w", "labels": {"ray.io/node-type": "worker"}, "deletionTimestamp": "2026-01-01T00:06:00Z"}
    assert pod_node({**pod, "metadata": ray}) == "gpu-node-3"


def test_a_running_jobs_pods_on_a_node_that_is_not_ready_are_named_in_its_conditions(make_job) -> None:
    """KubeRay and the Deployment still count the pods of a lost machine (nothing reports them
    otherwise until they are evicted): the status says which node holds which of them."""
    rj = rayjob("Running", "RUNNING", rayClusterName="gsm8k-python-abcde")
    condition = node_condition(LOST)
    assert condition is not None
    lost = (
        LostNode("gpu-node-3", condition, trainer_pods=("gsm8k-python-abcde-gpu-worker-x7k2p",)),
        LostNode("cpu-node-1", "False", pool_pods=("gsm8k-python-tools-5d9f-abcde",)),
    )
    status = compute_status(make_job(), rj, deployment(), 3, NOW, Problems(lost_nodes=lost))
    conditions = {c["type"]: c for c in status["conditions"]}
    cluster, pool = conditions["ClusterReady"], conditions["ToolPoolReady"]
    assert (cluster["status"], cluster["reason"]) == ("False", NODE_NOT_READY)
    assert "node gpu-node-3 is not Ready (Unknown since 2026-01-01T00:01:00Z" in cluster["message"]
    assert "gsm8k-python-abcde-gpu-worker-x7k2p" in cluster["message"]
    assert "cpu-node-1" not in cluster["message"]
    assert (pool["status"], pool["reason"]) == ("False", NODE_NOT_READY)
    assert "node cpu-node-1 is not Ready (False) with pods gsm8k-python-tools-5d9f-abcde" in pool["message"]
    assert status["phase"] == "Running"  # the job goes on where it can; it is not failed for it
    # once finished, a lost node is nobody's concern
    done = compute_status(
        make_job(status=DONE),
        rayjob("Complete", "SUCCEEDED"),
        deployment(),
        3,
        NOW,
        Problems(lost_nodes=lost),
    )
    assert _conditions(done)["ClusterReady"][1] != NODE_NOT_READY
