"""A ToolRLJob's life on the real control plane with the real KubeRay operator: apply, Running,
failure and success as KubeRay reports them, suspend/resume, spec edits, deletion."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.operator_process import CHILD_KINDS, get_json, job_events, small_job, wait_until
from kubernetes import config
from toolrl_operator.apply import Kube
from toolrl_operator.naming import AUTOSCALER_FIELD_MANAGER, FIELD_MANAGER
from toolrl_operator.rayjob import SUBMITTER_BACKOFF_LIMIT

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "toolrljob.yaml"
JOB = "gsm8k-python"
CHILDREN = [
    ("configmap", f"{JOB}-config", "config"),
    ("rayjob", JOB, "trainer"),
    ("deployment", f"{JOB}-tools", "tool-pool"),
    ("service", f"{JOB}-tools", "tool-pool"),
    ("poddisruptionbudget", f"{JOB}-tools", "tool-pool"),
    ("networkpolicy", f"{JOB}-tools", "tool-pool"),
    ("networkpolicy", f"{JOB}-ray", "trainer"),
    ("serviceaccount", f"{JOB}-trainer", "trainer"),
    ("role", f"{JOB}-trainer", "trainer"),
    ("rolebinding", f"{JOB}-trainer", "trainer"),
]
KINDS = ",".join([*CHILD_KINDS, "pods"])


def apply(cluster, namespace: str, job: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))


def trj(cluster, namespace: str, name: str = JOB) -> dict[str, Any]:
    return get_json(cluster, "trj", name, "-n", namespace)


def wait_phase(cluster, namespace: str, phase: str, name: str = JOB, timeout: float = 240) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        job = trj(cluster, namespace, name)
        status = job.get("status") or {}
        current = status.get("observedGeneration") == job["metadata"]["generation"]
        return job if current and status.get("phase") == phase else None

    return wait_until(probe, timeout, f"{name} phase {phase}", interval=1.0)


OPERATOR_CONDITIONS = ("ToolPoolReady", "ClusterReady", "Running", "Succeeded", "Failed", "Suspended")


def conditions(job: dict[str, Any]) -> dict[str, str]:
    """The operator's conditions (the autoscaler adds its own, AutoscalerHealthy)."""
    return {c["type"]: c["status"] for c in job["status"]["conditions"] if c["type"] in OPERATOR_CONDITIONS}


def event_reasons(cluster, namespace: str, name: str = JOB) -> set[str]:
    return {e["reason"] for e in job_events(cluster, namespace, name)}


def test_apply_creates_every_child_and_reaches_running(cluster, namespace, operator) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
    job = wait_phase(cluster, namespace, "Running")
    uid = job["metadata"]["uid"]

    for kind, name, component in CHILDREN:
        child = get_json(cluster, kind, name, "-n", namespace)
        labels = child["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "toolrl-operator", kind
        assert labels["toolrl.dev/job"] == JOB, kind
        assert labels["app.kubernetes.io/component"] == component, kind
        owners = child["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [("ToolRLJob", uid, True)], kind

    rayjob = get_json(cluster, "rayjob", JOB, "-n", namespace)
    spec = rayjob["spec"]
    assert spec["entrypoint"] == "python -m trainer_entry run --spec /etc/toolrl/job.json"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 300  # the Ray cluster (its GPUs) goes 5 min after the end
    assert spec.get("suspend", False) is False  # omitted when false
    workers = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    assert workers["replicas"] == 2
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"

    cm = get_json(cluster, "configmap", f"{JOB}-config", "-n", namespace)
    doc = json.loads(cm["data"]["job.json"])
    assert doc["metadata"]["uid"] == uid
    assert doc["spec"]["rollout"]["toolCall"]["maxConcurrency"] == 256, "CRD defaults are applied"
    assert yaml.safe_load(cm["data"]["tools.yaml"])["tools"][0]["name"] == "python"

    # The Ray cluster runs on the fake GPU nodes.
    cluster_name = job["status"]["rayClusterName"]
    assert cluster_name
    pods = get_json(cluster, "pods", "-n", namespace, "-l", f"ray.io/cluster={cluster_name}")["items"]
    workers = [p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]
    assert len(workers) == 2 and len(pods) == 3
    assert all(p["status"]["phase"] == "Running" for p in pods)
    for pod in workers:
        node = get_json(cluster, "node", pod["spec"]["nodeName"])
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"

    # KubeRay's submitter Job (K8sJobMode, the operator's hardened template) follows the Ray job:
    # Running on a fake node (the local cluster's kwok stages), as on a real node until the job ends.
    def submitter_pods() -> list[dict[str, Any]]:
        selector = f"batch.kubernetes.io/job-name={JOB}"
        return get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]

    [submitter] = wait_until(
        lambda: [p for p in submitter_pods() if p["status"].get("phase") == "Running"],
        120,
        "the submitter Running",
    )
    assert submitter["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    # KubeRay gives its Job the operator's retries: one per lost head (and per pod that finds none up)
    submitter_job = get_json(cluster, "job", JOB, "-n", namespace)
    assert submitter_job["spec"]["backoffLimit"] == SUBMITTER_BACKOFF_LIMIT, submitter_job["spec"]

    # The tool pool is ready and the status says so.
    def pool_ready() -> dict[str, Any] | None:
        job = trj(cluster, namespace)
        return job if job["status"]["toolPool"].get("readyReplicas") == 2 else None

    pool = wait_until(pool_ready, 60, "2 ready tool-pool replicas in the status")
    status = pool["status"]
    assert status["toolPool"]["endpoint"] == f"http://{JOB}-tools.{namespace}.svc:8080"
    assert [p["status"]["phase"] for p in submitter_pods()] == ["Running"]
    assert conditions(pool) == {
        "ToolPoolReady": "True",
        "ClusterReady": "True",
        "Running": "True",
        "Succeeded": "False",
        "Failed": "False",
        "Suspended": "False",
    }
    assert status["rayJobName"] == JOB
    assert status["startTime"]
    pod_spec = get_json(cluster, "deployment", f"{JOB}-tools", "-n", namespace)["spec"]["template"]["spec"]
    assert pod_spec["automountServiceAccountToken"] is False
    assert pod_spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True

    table = cluster.kubectl("get", "trj", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "STEP", "REWARD", "RESTARTS", "TOOLS", "AGE"]
    assert table[1].split()[:2] == [JOB, "Running"]
    assert status["restarts"] == 0
    assert "2/2" in table[1].split()

    expected_events = {"Created", "PhaseRunning", "RayClusterReady", "ReplicasReady"}
    assert expected_events <= event_reasons(cluster, namespace)
    metrics = operator.metrics()
    assert f'toolrl_operator_jobs{{namespace="{namespace}",phase="Running"}} 1.0' in metrics
    assert "toolrl_operator_reconcile_duration_seconds_count" in metrics


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_progress(cluster, namespace: str, name: str, step: int, total: int) -> None:
    """What the trainer writes into the job's status as it trains (and at its end)."""
    progress = {"step": step, "totalSteps": total, "lastUpdateTime": _now()}
    cluster.kubectl(
        "patch", "trj", name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"progress": progress}}),
    )  # fmt: skip


def test_kuberay_failure_and_success_reach_the_job(cluster, namespace, operator) -> None:
    names = ("fails", "succeeds", "ends-early")
    for name in names:
        apply(cluster, namespace, small_job(name))
    for name in names:
        wait_phase(cluster, namespace, "Running", name)
    report_progress(cluster, namespace, "succeeds", 10, 10)
    report_progress(cluster, namespace, "ends-early", 3, 10)

    cluster.stop_component("kuberay")  # from here on this test writes what KubeRay would write
    try:
        failed = {
            "jobDeploymentStatus": "Failed",
            "jobStatus": "FAILED",
            "reason": "AppFailed",
            "message": "Job entrypoint command failed with exit code 1",
            "endTime": _now(),
        }
        done = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "endTime": _now()}
        for name, status in (("fails", failed), ("succeeds", done), ("ends-early", done)):
            cluster.kubectl(
                "patch",
                "rayjob",
                name,
                "-n",
                namespace,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": status}),
            )

        job = wait_phase(cluster, namespace, "Failed", "fails", timeout=60)
        assert job["status"]["reason"] == "AppFailed"
        assert job["status"]["message"] == "Job entrypoint command failed with exit code 1"
        assert job["status"]["completionTime"] == failed["endTime"]
        cond = {c["type"]: c for c in job["status"]["conditions"]}["Failed"]
        assert (cond["status"], cond["reason"]) == ("True", "AppFailed")
        assert "AppFailed" in event_reasons(cluster, namespace, "fails")
        wait_until(lambda: pool_replicas(cluster, namespace, "fails") == 0, 60, "the finished pool at 0")

        job = wait_phase(cluster, namespace, "Succeeded", "succeeds", timeout=60)
        assert conditions(job)["Succeeded"] == "True"
        assert conditions(job)["Running"] == "False"
        assert job["status"]["completionTime"] == done["endTime"]
        assert "PhaseSucceeded" in event_reasons(cluster, namespace, "succeeds")

        # A Ray job that exits 0 short of totalSteps (a resume that trained nothing) did not succeed.
        job = wait_phase(cluster, namespace, "Failed", "ends-early", timeout=60)
        assert job["status"]["reason"] == "IncompleteTraining"
        assert "step 3 of 10" in job["status"]["message"]
        assert "IncompleteTraining" in event_reasons(cluster, namespace, "ends-early")
    finally:
        cluster.start_component("kuberay")

    # Deleting a finished job's RayJob (its TTL does too) must not run the training again.
    cluster.kubectl("delete", "rayjob", "succeeds", "-n", namespace, "--wait=true")
    cluster.kubectl("delete", "configmap", "succeeds-config", "-n", namespace, "--wait=true")

    def exists(kind: str, name: str) -> bool:
        return cluster.kubectl("get", kind, name, "-n", namespace, check=False).returncode == 0

    wait_until(
        lambda: (
            "ChildDeleted" in event_reasons(cluster, namespace, "succeeds")
            and exists("configmap", "succeeds-config")
        ),
        60,
        "the deleted children repaired",
    )
    assert not exists("rayjob", "succeeds"), "a finished job's RayJob was created again"
    assert get_json(cluster, "toolrljob", "succeeds", "-n", namespace)["status"]["phase"] == "Succeeded"


def test_suspend_and_resume(cluster, namespace, operator) -> None:
    apply(cluster, namespace, small_job(JOB))
    job = wait_phase(cluster, namespace, "Running")
    first_cluster = job["status"]["rayClusterName"]

    cluster.kubectl("patch", "trj", JOB, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    job = wait_phase(cluster, namespace, "Suspended")
    assert conditions(job)["Suspended"] == "True"
    assert get_json(cluster, "rayjob", JOB, "-n", namespace)["spec"]["suspend"] is True
    assert pool_replicas(cluster, namespace) == 0
    wait_until(
        lambda: not get_json(cluster, "rayclusters", "-n", namespace)["items"],
        60,
        "KubeRay deleting the RayCluster of the suspended job",
    )
    assert "Suspended" in event_reasons(cluster, namespace)

    cluster.kubectl("patch", "trj", JOB, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    job = wait_phase(cluster, namespace, "Running")
    assert get_json(cluster, "rayjob", JOB, "-n", namespace)["spec"].get("suspend", False) is False
    assert pool_replicas(cluster, namespace) == 1
    assert job["status"]["rayClusterName"] and job["status"]["rayClusterName"] != first_cluster
    assert "Resumed" in event_reasons(cluster, namespace)


# The autoscaler's loop stays out of this test (its first tick comes before the job, the next a day
# later): the sizes the test sees are the sync's and those it writes itself as the autoscaler does.
# The loop is tested with real load in test_autoscaler_prometheus.
AUTOSCALER_IDLE = {"TOOLRL_AUTOSCALER_INTERVAL_SECONDS": "86400"}


def size_owners(cluster, namespace: str) -> set[str]:
    """The field managers that own the pool Deployment's spec.replicas, as the API server records them."""
    dep = get_json(cluster, "deployment", f"{JOB}-tools", "-n", namespace, "--show-managed-fields")
    fields = [
        (m["manager"], (m.get("fieldsV1") or {}).get("f:spec") or {})
        for m in dep["metadata"]["managedFields"]
    ]
    return {manager for manager, spec in fields if "f:replicas" in spec}


@pytest.mark.parametrize("operator_env", [AUTOSCALER_IDLE], ids=["autoscaler-idle"])
def test_tool_pool_edits_autoscaler_replicas_and_deleted_children(cluster, namespace, operator) -> None:
    job = small_job(JOB)
    apply(cluster, namespace, job)
    wait_phase(cluster, namespace, "Running")
    assert pool_replicas(cluster, namespace) == 1, "created at replicas.min"
    # The sync hands the new pool's size to the autoscaler's field manager, then leaves it out of its
    # own apply (issue 36): one owner, which the operator's apply never fights.
    wait_until(
        lambda: size_owners(cluster, namespace) == {AUTOSCALER_FIELD_MANAGER}, 60, "the size handed over"
    )
    old_checksum = get_json(cluster, "deployment", f"{JOB}-tools", "-n", namespace)["spec"]["template"][
        "metadata"
    ]["annotations"]["toolrl.dev/tools-checksum"]

    edited = copy.deepcopy(job)
    edited["spec"]["toolPool"]["replicas"] = {"min": 3, "max": 6}
    edited["spec"]["toolPool"]["resources"] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
    edited["spec"]["tools"][0]["timeoutSeconds"] = 20
    apply(cluster, namespace, edited)

    def pool_applied() -> dict[str, Any] | None:
        dep = get_json(cluster, "deployment", f"{JOB}-tools", "-n", namespace)
        return dep if dep["spec"]["replicas"] == 3 else None

    dep = wait_until(pool_applied, 60, "the tool pool scaled to the new min")
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "1Gi"}
    checksum = dep["spec"]["template"]["metadata"]["annotations"]["toolrl.dev/tools-checksum"]
    assert checksum != old_checksum
    cm = get_json(cluster, "configmap", f"{JOB}-config", "-n", namespace)
    tools = yaml.safe_load(cm["data"]["tools.yaml"])
    assert tools["tools"][0]["timeoutSeconds"] == 20
    wait_until(
        lambda: trj(cluster, namespace)["status"]["toolPool"].get("summary") == "3/3",
        60,
        "status.toolPool 3/3",
    )

    # The autoscaler sizes the pool through the Deployment's scale subresource, as HPA does; an
    # edit that makes the operator apply the Deployment again keeps that size (not min, not 1).
    kube(cluster).apply_scale("apps/v1", "Deployment", namespace, f"{JOB}-tools", 5, AUTOSCALER_FIELD_MANAGER)
    edited["spec"]["tools"][0]["timeoutSeconds"] = 30
    apply(cluster, namespace, edited)

    def template_applied() -> dict[str, Any] | None:
        dep = get_json(cluster, "deployment", f"{JOB}-tools", "-n", namespace)
        annotations = dep["spec"]["template"]["metadata"]["annotations"]
        return dep if annotations["toolrl.dev/tools-checksum"] != checksum else None

    assert wait_until(template_applied, 60, "the Deployment applied again")["spec"]["replicas"] == 5
    assert size_owners(cluster, namespace) == {AUTOSCALER_FIELD_MANAGER}

    # Bounds edited below the size: clamped at once. Suspended: 0; resumed: back at min.
    edited["spec"]["toolPool"]["replicas"] = {"min": 3, "max": 4}
    apply(cluster, namespace, edited)
    wait_until(lambda: pool_replicas(cluster, namespace) == 4, 60, "the pool clamped to the new max")
    edited["spec"]["suspend"] = True
    apply(cluster, namespace, edited)
    wait_until(lambda: pool_replicas(cluster, namespace) == 0, 60, "the suspended job's pool at 0")
    edited["spec"]["suspend"] = False
    apply(cluster, namespace, edited)
    wait_until(lambda: pool_replicas(cluster, namespace) == 3, 60, "the resumed job's pool back at min")

    # A deleted child comes back.
    cluster.kubectl("delete", "service", f"{JOB}-tools", "-n", namespace)
    service = ("get", "service", f"{JOB}-tools", "-n", namespace)
    wait_until(lambda: cluster.kubectl(*service, check=False).returncode == 0, 60, "the Service re-created")
    # posted by the same sync after the job's status (ci9 looked a moment too early)
    wait_until(lambda: "ChildDeleted" in event_reasons(cluster, namespace), 60, "the ChildDeleted Event")


def test_delete_removes_everything(cluster, namespace, operator) -> None:
    apply(cluster, namespace, small_job(JOB))
    wait_phase(cluster, namespace, "Running")
    assert get_json(cluster, KINDS, "-n", namespace, "-l", f"toolrl.dev/job={JOB}")["items"]

    cluster.kubectl("delete", "trj", JOB, "-n", namespace, "--wait=true", "--timeout=60s")

    def leftovers() -> list[str]:
        items = get_json(cluster, KINDS, "-n", namespace, "-l", f"toolrl.dev/job={JOB}")["items"]
        items += get_json(cluster, "rayclusters,pods,jobs", "-n", namespace)["items"]
        return [f"{i['kind']}/{i['metadata']['name']}" for i in items]

    wait_until(lambda: not leftovers() or None, 120, "garbage collection of every child")
    assert trj_names(cluster, namespace) == []


def test_a_size_its_only_field_manager_stops_applying_is_reset_unless_handed_over(cluster, namespace) -> None:
    """Why the sync hands a pool's size to the autoscaler's field manager before the operator's apply
    leaves it out (toolpool.py), on the real API server: a field its only manager stops applying is
    removed, and a Deployment's replicas then default to 1; one that another manager applied too stays."""
    api = kube(cluster)

    def deployment(name: str, replicas: int | None = None) -> dict[str, Any]:
        labels = {"app": name}
        spec: dict[str, Any] = {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        }
        if replicas is not None:
            spec["replicas"] = replicas
        meta = {"name": name, "namespace": namespace}
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}

    api.apply(deployment("alone", 3))
    assert api.apply(deployment("alone"))["spec"]["replicas"] == 1, "removed, then defaulted"

    api.apply(deployment("handed", 3))
    api.apply_scale("apps/v1", "Deployment", namespace, "handed", 3, AUTOSCALER_FIELD_MANAGER)
    assert api.apply(deployment("handed"))["spec"]["replicas"] == 3
    api.apply_scale("apps/v1", "Deployment", namespace, "handed", 5, AUTOSCALER_FIELD_MANAGER)
    assert api.apply(deployment("handed"))["spec"]["replicas"] == 5


def kube(cluster) -> Kube:
    """The operator's own API client, as the operator's field manager, with the cluster's credentials."""
    return Kube(config.new_client_from_config(config_file=str(cluster.kubeconfig)), FIELD_MANAGER)


def pool_replicas(cluster, namespace: str, name: str = JOB) -> int:
    return get_json(cluster, "deployment", f"{name}-tools", "-n", namespace)["spec"]["replicas"]


def trj_names(cluster, namespace: str) -> list[str]:
    return [j["metadata"]["name"] for j in get_json(cluster, "trj", "-n", namespace)["items"]]


def test_a_lost_node_is_named_in_the_status_until_it_is_back(cluster, namespace, operator) -> None:
    """The machines of the fake nodes stop reporting (kwok, their kubelets, is stopped: no node lease
    renewed, as when a VM crashes): the Ray worker's pod stays Running in the API until it is
    evicted, so only its node tells, Unknown once the node controller's grace period is over. The
    job's ClusterReady names the node and the pod (a NodeNotReady Warning) and the phase stays; when
    kwok is back, so is ClusterReady."""
    apply(cluster, namespace, small_job(JOB))
    wait_phase(cluster, namespace, "Running")
    workers = f"toolrl.dev/job={JOB},ray.io/node-type=worker"
    [worker] = get_json(cluster, "pods", "-n", namespace, "-l", workers)["items"]
    node, pod = worker["spec"]["nodeName"], worker["metadata"]["name"]

    def cluster_condition(reason: str, naming: str = "") -> dict[str, Any] | None:
        status = trj(cluster, namespace).get("status") or {}
        found = {c["type"]: c for c in status.get("conditions", [])}.get("ClusterReady")
        return found if found and found["reason"] == reason and naming in found["message"] else None

    cluster.stop_component("kwok")
    try:
        # the node controller marks each Unknown after its grace period (50 s), the operator follows; the
        # fake nodes go within seconds of each other, the head's and the submitter's may go first
        lost = wait_until(
            lambda: cluster_condition("NodeNotReady", f"node {node} "), 240, f"ClusterReady to name {node}"
        )
        assert lost["status"] == "False"
        assert f"node {node} is not Ready (Unknown" in lost["message"] and pod in lost["message"], lost
        assert trj(cluster, namespace)["status"]["phase"] == "Running"  # it is not failed for it
        # one as ClusterReady turned NodeNotReady (naming the nodes lost by then: the fake nodes go
        # within a second or two of each other), one for the pool's if its node is a fake one too
        warnings = job_events(cluster, namespace, JOB, "NodeNotReady")
        assert warnings and {e["type"] for e in warnings} == {"Warning"}, warnings
        assert all("is not Ready (Unknown" in e["message"] for e in warnings), warnings
    finally:
        cluster.start_component("kwok")
    wait_until(lambda: cluster_condition("RayClusterReady"), 240, f"ClusterReady once {node} is back")
