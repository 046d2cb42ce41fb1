"""Level-based reconciliation on the real control plane: drift of every child kind is reverted,
a child whose re-creation was refused (a quota) comes back once it can, a permanent error posts
one Event and waits for a spec change; and the knobs a real cluster needs reach the pods (env
from a Secret on the Ray containers, the pool's nodeSelector), and a waiting job names why."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from harness.operator_process import get_json, job_events, small_job, wait_until
from toolrl_operator.children import CHILD_KINDS

JOB = "recon"
DRIFT_TIMEOUT = 30.0  # "within seconds": a watch event and one sync; generous for a loaded machine
COMPONENT = "app.kubernetes.io/component"


def apply(cluster: Any, namespace: str, job: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))


def trj(cluster: Any, namespace: str, name: str = JOB) -> dict[str, Any]:
    return get_json(cluster, "trj", name, "-n", namespace)


def current_status(cluster: Any, namespace: str, name: str = JOB) -> dict[str, Any]:
    job = trj(cluster, namespace, name)
    status = job.get("status") or {}
    return status if status.get("observedGeneration") == job["metadata"]["generation"] else {}


def children(cluster: Any, namespace: str, job: str = JOB) -> list[tuple[str, str, dict[str, Any]]]:
    """(kubectl kind, name, object) of every child the job has."""
    found = []
    for child in CHILD_KINDS:
        if not child.watched:
            continue
        items = get_json(cluster, child.kubectl_name, "-n", namespace, "-l", f"toolrl.dev/job={job}")["items"]
        found += [(child.kubectl_name, item["metadata"]["name"], item) for item in items]
    return found


def test_drift_of_every_child_kind_is_reverted(cluster, namespace, operator) -> None:
    apply(cluster, namespace, small_job(JOB))
    wait_until(lambda: current_status(cluster, namespace).get("phase") == "Running", 240, "Running")
    owned = children(cluster, namespace)
    assert {kind for kind, _, _ in owned} == {c.kubectl_name for c in CHILD_KINDS if c.watched}

    # a field the operator owns, changed on every child: its component label
    for kind, name, _ in owned:
        cluster.kubectl("label", "--overwrite", kind, name, "-n", namespace, f"{COMPONENT}=drifted")
    # and fields in the specs a user would edit: the pool's image and size, the trainer's Role
    pool = f"{JOB}-tools"
    cluster.kubectl("set", "image", f"deployment/{pool}", "tool-sandbox=evil:latest", "-n", namespace)
    cluster.kubectl("scale", f"deployment/{pool}", "--replicas=7", "-n", namespace)
    cluster.kubectl(
        "patch", "role", f"{JOB}-trainer", "-n", namespace, "--type=json",
        "-p", json.dumps([{"op": "add", "path": "/rules/-",
                           "value": {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}}]),
    )  # fmt: skip
    started = time.monotonic()

    def reverted() -> list[str]:
        """What is still drifted (empty: nothing)."""
        left = [f"{kind}/{name}" for kind, name, item in children(cluster, namespace)
                if item["metadata"]["labels"][COMPONENT] == "drifted"]  # fmt: skip
        dep = get_json(cluster, "deployment", pool, "-n", namespace)
        if dep["spec"]["template"]["spec"]["containers"][0]["image"] == "evil:latest":
            left.append("pool image")
        if dep["spec"]["replicas"] == 7:
            left.append("pool replicas")
        role = get_json(cluster, "role", f"{JOB}-trainer", "-n", namespace)
        if any("secrets" in r["resources"] for r in role["rules"]):
            left.append("role rules")
        return left

    wait_until(lambda: not reverted(), DRIFT_TIMEOUT, "every drifted child reverted", interval=1.0)
    print(f"drift of {len(owned)} children reverted in {time.monotonic() - started:.1f} s")


def test_a_child_whose_recreation_was_refused_comes_back(cluster, namespace, operator) -> None:
    apply(cluster, namespace, small_job(JOB))
    wait_until(lambda: current_status(cluster, namespace).get("phase"), 120, "a first status")
    service = ("service", f"{JOB}-tools", "-n", namespace)
    wait_until(lambda: cluster.kubectl("get", *service, check=False).returncode == 0, 60, "the Service")
    quota = {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "no-services", "namespace": namespace}, "spec": {"hard": {"services": "0"}},
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(quota))
    cluster.kubectl("delete", *service, "--wait=true")

    # the re-creation is refused (403, exceeded quota) and retried with backoff
    wait_until(
        lambda: any("quota" in e["message"] for e in job_events(cluster, namespace, JOB, "ReconcileError")),
        60,
        "the refused re-creation reported",
    )
    assert cluster.kubectl("get", *service, check=False).returncode != 0
    cluster.kubectl("delete", "resourcequota", "no-services", "-n", namespace, "--wait=true")
    wait_until(lambda: cluster.kubectl("get", *service, check=False).returncode == 0, 60, "the Service back")


def _require_pool_node_selector(cluster: Any, namespace: str) -> None:
    """A cluster policy (a ValidatingAdmissionPolicy, as a platform team would write) that refuses
    Deployments without a nodeSelector in `namespace`; waits until it is in force."""
    name = f"pool-placement-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["apps"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["deployments"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": "has(object.spec.template.spec.nodeSelector)",
                    "message": "Deployments here must set a nodeSelector (policy pool-placement)",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": namespace}}}},
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": [policy, binding]}))  # fmt: skip
    probe = ("create", "deployment", "probe", "--image=x", "-n", namespace, "--dry-run=server")
    wait_until(lambda: cluster.kubectl(*probe, check=False).returncode != 0, 60, "the policy in force")


def test_a_permanent_error_posts_one_event_and_waits_for_a_spec_change(cluster, namespace, operator) -> None:
    _require_pool_node_selector(cluster, namespace)
    try:
        job = small_job(JOB)
        apply(cluster, namespace, job)

        def reconciled() -> dict[str, Any] | None:
            conditions = {c["type"]: c for c in current_status(cluster, namespace).get("conditions", [])}
            return conditions.get("Reconciled")

        failed = wait_until(
            lambda: (c := reconciled()) and c["status"] == "False" and c, 90, "Reconciled False"
        )
        assert "policy pool-placement" in failed["message"], failed
        status = current_status(cluster, namespace)
        assert status["phase"] == "Pending" and status["message"] == failed["message"]
        # Events of the job keep coming (here: the job touched, as kubectl annotate does); the
        # operator neither retries the same spec nor repeats itself.
        for i in range(3):
            cluster.kubectl("annotate", "--overwrite", "trj", JOB, "-n", namespace, f"poke={i}")
            time.sleep(5)
        errors = job_events(cluster, namespace, JOB, "ReconcileError")
        assert sum(e.get("count", 1) for e in errors) == 1, [e["message"] for e in errors]

        fixed = copy.deepcopy(job)
        fixed["spec"]["toolPool"]["nodeSelector"] = {"node.kubernetes.io/instance-type": "cpu-32"}
        apply(cluster, namespace, fixed)
        wait_until(lambda: (c := reconciled()) and c["status"] == "True", 90, "Reconciled True after the fix")
        wait_until(lambda: current_status(cluster, namespace).get("phase") == "Running", 240, "Running")
    finally:
        cluster.kubectl(
            "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
            f"pool-placement-{namespace}", "--ignore-not-found", check=False,
        )  # fmt: skip


def test_env_from_a_secret_reaches_the_ray_containers_and_the_pool_honours_its_node_selector(
    cluster, namespace, operator
) -> None:
    cluster.kubectl("create", "secret", "generic", "hf", "--from-literal=token=hf_x", "-n", namespace)
    job = small_job(JOB)
    secret_env = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    job["spec"]["cluster"]["env"] = [secret_env]
    job["spec"]["cluster"]["envFrom"] = [{"secretRef": {"name": "hf"}}]
    job["spec"]["toolPool"]["nodeSelector"] = {"node.kubernetes.io/instance-type": "cpu-32"}
    apply(cluster, namespace, job)
    status = wait_until(
        lambda: (s := current_status(cluster, namespace)).get("phase") == "Running" and s, 240, "Running"
    )
    ray_pods = f"ray.io/cluster={status['rayClusterName']}"
    pods = get_json(cluster, "pods", "-n", namespace, "-l", ray_pods)["items"]
    assert len(pods) == 2, "head and one worker"
    for pod in pods:
        [container] = [c for c in pod["spec"]["containers"] if c["name"] in ("ray-head", "ray-worker")]
        assert secret_env in container["env"], pod["metadata"]["name"]
        assert {"secretRef": {"name": "hf"}} in container["envFrom"]

    def pool_nodes() -> set[str]:
        pods = get_json(cluster, "pods", "-n", namespace, "-l", f"toolrl.dev/job={JOB},{COMPONENT}=tool-pool")
        return {p["spec"].get("nodeName", "") for p in pods["items"]}

    nodes = wait_until(lambda: (n := pool_nodes()) and "" not in n and n, 60, "the pool's pods scheduled")
    for node in nodes:
        labels = get_json(cluster, "node", node)["metadata"]["labels"]
        assert labels["node.kubernetes.io/instance-type"] == "cpu-32", node


def test_a_waiting_job_names_the_missing_pvc_and_the_missing_gpus(cluster, namespace, operator) -> None:
    no_pvc = small_job("no-pvc")
    no_pvc["spec"]["checkpoint"] = {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}}
    too_big = small_job("too-big")
    too_big["spec"]["cluster"]["workers"] = {"replicas": 1, "gpusPerWorker": 16}  # nodes have 8
    for job in (no_pvc, too_big):
        apply(cluster, namespace, job)

    def says(name: str, text: str) -> dict[str, Any] | None:
        status = current_status(cluster, namespace, name)
        return status if text in status.get("message", "") else None

    status = wait_until(
        lambda: says("no-pvc", 'persistentvolumeclaim "ckpt" not found'), 120, "the PVC named"
    )
    assert status["phase"] in ("Pending", "Provisioning") and status["reason"] == "Unschedulable"
    status = wait_until(lambda: says("too-big", "nvidia.com/gpu"), 120, "the GPUs named")
    assert status["phase"] in ("Pending", "Provisioning")
