"""SIGKILL the operator while it reconciles 20 jobs, restart it: every job converges, with
exactly one of each child and a complete status. Two operators side by side (a force-deleted pod's
process outliving it): only the one holding the Lease acts, the other takes over once it expired."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter

from harness.operator_process import (
    CHILD_KINDS,
    OperatorProcess,
    delete_jobs,
    get_json,
    install_crd,
    job_events,
    small_job,
    wait_until,
)
from kubernetes import client, config
from toolrl_operator import leader

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


def _reconciles(op: OperatorProcess) -> float:
    """How many syncs the operator ran (its reconcile-duration histogram's count)."""
    name = "toolrl_operator_reconcile_duration_seconds_count"
    [line] = [x for x in op.metrics().splitlines() if x.startswith(name)]
    return float(line.split()[-1])


def _synced(cluster, namespace: str, name: str) -> bool:
    found = cluster.kubectl("get", "trj", name, "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        return False
    job = json.loads(found.stdout)
    return (job.get("status") or {}).get("observedGeneration") == job["metadata"]["generation"]


def test_of_two_operators_only_the_leases_holder_acts_and_the_other_takes_over_when_it_dies(
    cluster, namespace, tmp_path
) -> None:
    install_crd(cluster)
    lease = "toolrl-operator"
    env = {"TOOLRL_LEADER_ELECTION_LEASE": f"{namespace}/{lease}"}
    ops = [
        OperatorProcess(cluster.kubeconfig, [namespace], log_path=tmp_path / f"op-{i}.log", env=env)
        for i in range(2)
    ]

    def the_lease() -> dict:
        found = cluster.kubectl("get", "lease", lease, "-n", namespace, "-o", "json", check=False)
        return json.loads(found.stdout)["spec"] if found.returncode == 0 else {}

    def holding() -> list[OperatorProcess]:
        alive = [op for op in ops if op.proc and op.proc.poll() is None]
        return [op for op in alive if "acquired the Lease" in op.log_tail(400)]

    try:
        for op in ops:
            op.start()
        [first] = wait_until(holding, 60, "an operator to acquire the Lease")
        [standby] = [op for op in ops if op is not first]
        small = job("led-1")
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(small))
        wait_until(lambda: _synced(cluster, namespace, "led-1"), 120, "the holder to sync led-1")
        # the sync's duration is counted just after its status is written (ci14 read it in between)
        wait_until(lambda: _reconciles(first) > 0, 30, "the holder's sync counted in its metrics")
        assert _reconciles(standby) == 0, "the standby synced a job"

        renewed = the_lease()["renewTime"]
        first.kill()
        killed = dt.datetime.now(dt.UTC)
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job("led-2")))
        wait_until(lambda: _synced(cluster, namespace, "led-2"), 180, "the standby to take over, sync led-2")
        spec = the_lease()
        assert holding() == [standby] and spec["leaseTransitions"] == 1, spec
        # it waited for the Lease to expire: it saw the holder's last renewal at most a retry before the kill
        acquired = dt.datetime.fromisoformat(spec["acquireTime"])
        expiry = dt.timedelta(seconds=leader.LEASE_SECONDS - leader.RETRY_SECONDS - 1)
        assert acquired >= killed + expiry, f"taken {acquired}, holder killed {killed}, renewed {renewed}"
        for name in ("led-1", "led-2"):
            created = job_events(cluster, namespace, name, "Created")
            assert len(created) == 1, (name, created)

        standby.stop()  # a graceful stop gives the Lease up: the next operator starts at once
        assert the_lease()["holderIdentity"] == ""
    finally:
        delete_jobs(cluster, namespace, timeout=300)
        for op in ops:
            op.stop()
            print(op.log_tail(30))
