"""The local control plane behaves like a real cluster: scheduling onto kwok nodes, GPU
capacity, the real KubeRay operator, and garbage collection."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from harness.localcluster import LocalCluster


def wait_for(condition: Callable[[], object], timeout: float = 60, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def get(cluster: LocalCluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def pod(name: str, gpus: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ]
        },
    }


def test_nodes_show_gpu_capacity(cluster: LocalCluster) -> None:
    nodes = get(cluster, "nodes")["items"]
    gpus = {n["metadata"]["name"]: n["status"]["allocatable"].get("nvidia.com/gpu") for n in nodes}
    assert sorted(v for v in gpus.values() if v) == ["8"] * 4
    assert sum(1 for v in gpus.values() if v is None) == 2


def test_deployment_pods_run_on_kwok_nodes(cluster: LocalCluster, namespace: str) -> None:
    cluster.kubectl("create", "deployment", "web", "--image=nginx", "--replicas=3", "-n", namespace)

    def running() -> list[dict]:
        pods = get(cluster, "pods", "-n", namespace, "-l", "app=web")["items"]
        ok = [p for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")]
        return ok if len(ok) == 3 else []

    pods = wait_for(running, what="3 Running pods")
    node_types = {get(cluster, "node", p["spec"]["nodeName"])["metadata"]["labels"]["type"] for p in pods}
    assert node_types == {"kwok"}


def test_gpu_pod_lands_on_gpu_node_and_oversized_stays_pending(cluster: LocalCluster, namespace: str) -> None:
    cluster.apply([pod("fits", 8), pod("too-big", 9)], "-n", namespace)
    fits = wait_for(
        lambda: (p := get(cluster, "pod", "fits", "-n", namespace))["status"].get("phase") == "Running" and p,
        what="the 8-GPU pod Running",
    )
    node = get(cluster, "node", fits["spec"]["nodeName"])
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"

    def failed_scheduling() -> list[dict]:
        events = get(cluster, "events", "-n", namespace, "--field-selector", "involvedObject.name=too-big")[
            "items"
        ]
        return [e for e in events if e["reason"] == "FailedScheduling"]

    events = wait_for(failed_scheduling, what="a FailedScheduling event")
    assert "nvidia.com/gpu" in events[0]["message"]
    assert get(cluster, "pod", "too-big", "-n", namespace)["status"]["phase"] == "Pending"


def test_kuberay_reconciles_a_gpu_raycluster(cluster: LocalCluster, namespace: str) -> None:
    container = {"name": "ray", "image": "rayproject/ray:2.46.0"}
    raycluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc"},
        "spec": {
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {
                    "spec": {
                        "containers": [dict(container, resources={"requests": {"cpu": "1", "memory": "2Gi"}})]
                    }
                },
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": 2,
                    "minReplicas": 2,
                    "maxReplicas": 2,
                    "rayStartParams": {},
                    "template": {
                        "spec": {
                            "containers": [dict(container, resources={"limits": {"nvidia.com/gpu": "8"}})]
                        }
                    },
                }
            ],
        },
    }
    cluster.apply(raycluster, "-n", namespace)

    def ready() -> dict | None:
        rc = get(cluster, "raycluster", "rc", "-n", namespace)
        conds = {c["type"]: c["status"] for c in rc.get("status", {}).get("conditions", [])}
        ok = conds.get("HeadPodReady") == "True" and conds.get("RayClusterProvisioned") == "True"
        return rc if ok else None

    rc = wait_for(ready, timeout=120, what="RayCluster HeadPodReady and RayClusterProvisioned")
    assert rc["status"]["state"] == "ready"
    pods = get(cluster, "pods", "-n", namespace, "-l", "ray.io/cluster=rc")["items"]
    assert len(pods) == 3 and all(p["status"]["phase"] == "Running" for p in pods)
    workers = [p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]
    for w in workers:
        assert get(cluster, "node", w["spec"]["nodeName"])["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_garbage_collector_deletes_dependents(cluster: LocalCluster, namespace: str) -> None:
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = get(cluster, "configmap", "owner", "-n", namespace)
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
            ],
        },
    }
    cluster.apply(dependent, "-n", namespace)
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for(
        lambda: (
            cluster.kubectl("get", "configmap", "dependent", "-n", namespace, check=False).returncode != 0
        ),
        what="the dependent ConfigMap to be garbage-collected",
    )
