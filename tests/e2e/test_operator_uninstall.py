"""Uninstalling the operator first never strands a job: the operator puts no finalizer on a
ToolRLJob (and takes off the one an older version left), so with the operator gone deleting a job,
and its namespace, still completes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from harness.operator_process import OperatorProcess, get_json, install_crd, wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "toolrljob.yaml"
OLD_KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"  # what the per-job daemons needed


def small_job(name: str, finalizers: list[str] | None = None) -> dict[str, Any]:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["name"] = name
    if finalizers:
        job["metadata"]["finalizers"] = finalizers
    job["spec"]["cluster"]["workers"] = {"replicas": 1, "gpusPerWorker": 1}
    job["spec"]["toolPool"]["replicas"] = {"min": 1, "max": 2}
    return job


def test_jobs_carry_no_finalizer_and_delete_without_the_operator(cluster, namespace, tmp_path) -> None:
    install_crd(cluster)

    def apply(job: dict[str, Any]) -> None:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))

    apply(small_job("legacy", [OLD_KOPF_FINALIZER]))  # as the operator's earlier version left it
    op = OperatorProcess(cluster.kubeconfig, namespaces=[namespace], log_path=tmp_path / "operator.log")
    with op:
        apply(small_job("fresh"))

        def handled(name: str) -> dict[str, Any] | None:
            """The job once reconciled and sized by the autoscaler (its condition is there)."""
            job = get_json(cluster, "trj", name, "-n", namespace)
            status = job.get("status") or {}
            types = {c["type"] for c in status.get("conditions", [])}
            current = status.get("observedGeneration") == job["metadata"]["generation"]
            return job if current and "AutoscalerHealthy" in types else None

        for name in ("fresh", "legacy"):
            job = wait_until(lambda name=name: handled(name), 120, f"{name} reconciled and autoscaled")
            # none added; the old one was taken off on the operator's first pass over the job
            assert "finalizers" not in job["metadata"], job["metadata"]
            assert job["status"]["toolPool"]["desiredReplicas"] >= 1
    assert op.proc is not None and op.proc.poll() is not None, "the operator is stopped"

    deleted = cluster.kubectl("delete", "trj", "--all", "-n", namespace, "--wait=true", "--timeout=60s")
    assert "fresh" in deleted.stdout and "legacy" in deleted.stdout
    assert get_json(cluster, "trj", "-n", namespace)["items"] == []
    cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", timeout=200)
    gone = cluster.kubectl("get", "namespace", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
