"""A job whose children the cluster refuses says so in its own status (issue 37): with a ResourceQuota
of `services: 0` in its namespace the pool's Service cannot be created; `kubectl get trj` shows the
phase and the `Reconciled` condition carries the quota's reason and the API server's message naming
the Service, beside the Warning Event; once the quota is gone the retry (the work queue's backoff)
creates the Service and the condition clears. The quota is real: the apiserver's admission and the
controller-manager's quota controller, no mocked API."""

from __future__ import annotations

import json
import time
from typing import Any

from harness.operator_process import get_json, job_events, small_job, wait_until

JOB = "refused"
QUOTA = "no-services"
# The operator retries a refused child with backoff (1 s doubling): it clears within about as long
# again as the refusal lasted, plus a sync; generous for a loaded machine.
CLEAR_TIMEOUT = 180.0


def reconciled(cluster: Any, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job's status and its Reconciled condition, both empty until the status is current."""
    job = get_json(cluster, "trj", JOB, "-n", namespace)
    status = job.get("status") or {}
    if status.get("observedGeneration") != job["metadata"]["generation"]:
        return {}, {}
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    return status, conditions.get("Reconciled", {})


def test_a_job_whose_pool_service_a_quota_refuses_says_so_until_the_quota_goes(
    cluster, namespace, operator
) -> None:
    quota = {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": QUOTA, "namespace": namespace}, "spec": {"hard": {"services": "0"}},
    }  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input=json.dumps(quota))
    # until the quota controller has written its status, admission refuses with "status unknown"
    wait_until(
        lambda: get_json(cluster, "resourcequota", QUOTA, "-n", namespace).get("status", {}).get("hard"),
        60,
        "the quota's status",
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(small_job(JOB)))
    service = f"{JOB}-tools"

    refused = wait_until(
        lambda: (r := reconciled(cluster, namespace)) and r[1].get("status") == "False" and r,
        90,
        "Reconciled False",
    )
    refused_at = time.monotonic()
    status, condition = refused
    assert condition["reason"] == "QuotaExceeded", condition
    assert f"Service {service} not applied" in condition["message"], condition
    assert f"exceeded quota: {QUOTA}" in condition["message"], condition
    assert (status["phase"], status["reason"]) == ("Pending", "QuotaExceeded"), status
    assert status["message"] == condition["message"]
    [column] = cluster.kubectl(
        "get", "trj", JOB, "-n", namespace, "--no-headers", "-o", "custom-columns=PHASE:.status.phase"
    ).stdout.split()
    assert column == "Pending"
    errors = wait_until(
        lambda: job_events(cluster, namespace, JOB, "ReconcileError"), 30, "the ReconcileError Event"
    )
    assert any(service in e["message"] and "quota" in e["message"] for e in errors), errors
    assert cluster.kubectl("get", "service", service, "-n", namespace, check=False).returncode != 0
    # the RayJob refers to the pool's Service: it waits for it
    assert cluster.kubectl("get", "rayjobs.ray.io", JOB, "-n", namespace, check=False).returncode != 0

    cluster.kubectl("delete", "resourcequota", QUOTA, "-n", namespace, "--wait=true")
    cleared = wait_until(
        lambda: (r := reconciled(cluster, namespace)) and r[1].get("status") == "True" and r,
        CLEAR_TIMEOUT,
        "Reconciled True once the quota is gone",
    )
    print(f"the condition cleared {time.monotonic() - refused_at:.1f} s after it was first seen")
    assert cleared[1]["reason"] == "ChildrenApplied", cleared[1]
    assert cleared[0]["reason"] != "QuotaExceeded", cleared[0]
    cluster.kubectl("get", "service", service, "-n", namespace)
    wait_until(lambda: job_events(cluster, namespace, JOB, "ChildrenApplied"), 30, "its Event")
    wait_until(lambda: reconciled(cluster, namespace)[0].get("phase") == "Running", 240, "Running")
