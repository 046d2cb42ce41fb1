"""SIGKILL the operator while it reconciles 20 jobs, restart it: every job converges, with
exactly one of each child and a complete status."""

from __future__ import annotations

import json
import time
from collections import Counter

from harness.operator_process import (
    CHILD_KINDS,
    OperatorProcess,
    delete_jobs,
    get_json,
    install_crd,
    small_job,
    wait_until,
)
from kubernetes import client, config

JOBS = 20


def job(name: str) -> dict:
    doc = small_job(name)
    doc["spec"]["cluster"]["head"] = {"resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}
    doc["spec"]["toolPool"]["replicas"] = {"min": 1, "max": 2}
    return doc


def test_sigkill_mid_reconcile_then_restart_converges(cluster, namespace, tmp_path) -> None:
    install_crd(cluster)
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    names = [f"restart-{i:02d}" for i in range(JOBS)]
    op = OperatorProcess(cluster.kubeconfig, namespaces=[namespace], log_path=tmp_path / "operator.log")
    op.start()
    try:
        docs = "\n---\n".join(json.dumps(job(n)) for n in names)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=docs)

        def some_rayjobs() -> int:
            return len(api.list_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs")["items"])

        wait_until(some_rayjobs, 60, "the operator creating a first RayJob", interval=0.02)
        op.kill()
        jobs = api.list_namespaced_custom_object("toolrl.dev", "v1alpha1", namespace, "toolrljobs")["items"]
        reconciled = sum(1 for j in jobs if (j.get("status") or {}).get("observedGeneration"))
        assert reconciled < JOBS, "the operator finished before it was killed; nothing was interrupted"

        time.sleep(1)
        op.start()

        def converged() -> bool:
            jobs = get_json(cluster, "trj", "-n", namespace)["items"]
            return len(jobs) == JOBS and all(
                (j.get("status") or {}).get("phase") == "Running"
                and j["status"].get("observedGeneration") == j["metadata"]["generation"]
                for j in jobs
            )

        wait_until(converged, 420, f"all {JOBS} jobs Running", interval=2.0)
        jobs = {j["metadata"]["name"]: j for j in get_json(cluster, "trj", "-n", namespace)["items"]}
        assert sorted(jobs) == names
        for kind in CHILD_KINDS:
            items = get_json(
                cluster, kind, "-n", namespace, "-l", "app.kubernetes.io/managed-by=toolrl-operator"
            )
            per_job = Counter(i["metadata"]["labels"]["toolrl.dev/job"] for i in items["items"])
            expected = 2 if kind.startswith("networkpolicies") else 1  # the pool's and the Ray pods'
            assert per_job == dict.fromkeys(names, expected), f"{kind}: {per_job}"
            for item in items["items"]:
                owner = jobs[item["metadata"]["labels"]["toolrl.dev/job"]]["metadata"]["uid"]
                assert [o["uid"] for o in item["metadata"]["ownerReferences"]] == [owner], kind
        rayclusters = get_json(cluster, "rayclusters", "-n", namespace)["items"]
        clusters = Counter(c["metadata"]["ownerReferences"][0]["name"] for c in rayclusters)
        assert clusters == dict.fromkeys(names, 1), "one RayCluster per RayJob"
        for name, j in jobs.items():
            status = j["status"]
            assert status["rayJobName"] == name
            assert status["rayClusterName"]
            assert status["startTime"]
            mine = {"ToolPoolReady", "ClusterReady", "Running", "Succeeded", "Failed", "Suspended"}
            assert mine <= {c["type"] for c in status["conditions"]}  # the autoscaler adds its own
            assert status["toolPool"]["endpoint"] == f"http://{name}-tools.{namespace}.svc:8080"
    finally:
        delete_jobs(cluster, namespace, timeout=300)  # no finalizers: no operator needed
        op.stop()
        print(op.log_tail(60))
