"""trainer_entry's real progress reporter against the real apiserver, as a pod would run it: the
`J-trainer` ServiceAccount token and the cluster CA in a mounted-style directory, the apiserver
in KUBERNETES_SERVICE_HOST/PORT. Proves the operator's Role lets it patch `status.progress`,
`kubectl get trj` shows it, the operator's own status writes leave it alone, and the Role is
scoped to this job's status only."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from harness.operator_process import get_json, mount_service_account, small_job, wait_until
from trainer_entry.job_status import JobStatusWriter
from trainer_entry.progress import ApiTarget, ProgressReporter, status_path

from trainer_entry import job_status

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "toolrljob.yaml"
JOB = "progress"
OTHER = "neighbour"


def trj(cluster, namespace: str, name: str = JOB) -> dict[str, Any]:
    return get_json(cluster, "trj", name, "-n", namespace)


def reconciled(cluster, namespace: str, phase: str | None = None) -> dict[str, Any] | None:
    """The job once the operator's status reflects its current generation (and `phase`)."""
    job = trj(cluster, namespace)
    status = job.get("status") or {}
    if status.get("observedGeneration") != job["metadata"]["generation"]:
        return None
    return job if phase is None or status.get("phase") == phase else None


def patch_code(target: ApiTarget, path: str, body: dict[str, Any]) -> int:
    """The HTTP status of a merge patch sent as the trainer."""
    request = target.merge_patch(path, body)
    try:
        with urllib.request.urlopen(request, timeout=10, context=target.ssl_context) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def progress_managers(job: dict[str, Any]) -> set[str]:
    """Field managers that own anything under status.progress."""
    return {
        entry["manager"]
        for entry in job["metadata"]["managedFields"]
        if "f:progress" in (entry.get("fieldsV1") or {}).get("f:status", {})
    }


def test_trainer_reports_progress_with_its_scoped_token(
    cluster, namespace, operator, tmp_path, monkeypatch, caplog
) -> None:
    for name in (JOB, OTHER):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(small_job(name)))
    wait_until(lambda: reconciled(cluster, namespace, "Running"), 120, f"{JOB} Running", interval=0.5)
    trainer = f"system:serviceaccount:{namespace}:{JOB}-trainer"
    can_i = ("auth", "can-i", "patch", f"toolrljobs/{JOB}", "--subresource=status", "-n", namespace)
    wait_until(
        lambda: cluster.kubectl(*can_i, "--as", trainer, check=False).stdout.strip() == "yes",
        30,
        "the apiserver authorizing the J-trainer RoleBinding",
    )

    host, port = mount_service_account(cluster, namespace, tmp_path / "serviceaccount", JOB)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    target = ApiTarget.in_cluster(sa_dir=str(tmp_path / "serviceaccount"))

    # A few steps; the clock stands still, so steps 2 and 3 wait for the throttle and the final
    # flush sends the latest.
    reporter = ProgressReporter(target, namespace, JOB, clock=lambda: 0.0)
    assert reporter.update(1, 10, 0.25)
    assert trj(cluster, namespace)["status"]["progress"]["step"] == 1
    assert not reporter.update(2, 10, 0.5)
    assert not reporter.update(3, 10, 0.625)
    assert reporter.flush()
    assert reporter.sent == 2

    job = get_json(cluster, "trj", JOB, "-n", namespace, "--show-managed-fields")
    progress = job["status"]["progress"]
    assert {k: progress[k] for k in ("step", "totalSteps", "rewardMean")} == {
        "step": 3,
        "totalSteps": 10,
        "rewardMean": 0.625,
    }
    assert progress["lastUpdateTime"].endswith("Z")
    managers = progress_managers(job)  # the apiserver names the trainer's after its User-Agent
    assert managers and managers.isdisjoint({"toolrl-operator", "toolrl-operator-autoscaler"}), managers
    assert job["status"]["phase"] == "Running", "the trainer's patch left the operator's fields alone"

    header, *rows = cluster.kubectl("get", "trj", "-n", namespace).stdout.splitlines()
    columns = header.split()
    row = dict(zip(columns, next(r.split() for r in rows if r.split()[0] == JOB), strict=False))
    assert (row["STEP"], row["REWARD"]) == ("3", "0.625")

    # An edit makes the operator reconcile and re-apply its status; progress survives untouched.
    cluster.kubectl(
        "patch",
        "trj",
        JOB,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"toolPool":{"replicas":{"max":5}}}}',
    )
    edited = wait_until(lambda: reconciled(cluster, namespace), 60, "the operator reconciling the edit")
    assert edited["metadata"]["generation"] > job["metadata"]["generation"]
    assert edited["status"]["progress"] == progress

    # The token is scoped: not another job's status, not its own job's spec.
    caplog.set_level(logging.WARNING, logger="trainer_entry.progress")
    assert not ProgressReporter(target, namespace, OTHER).update(1, 10, 0.9)
    assert "progress patch refused (HTTP 403)" in caplog.text
    spec_path = status_path(namespace, JOB).removesuffix("/status")
    assert patch_code(target, spec_path, {"spec": {"toolPool": {"replicas": {"max": 16}}}}) == 403
    assert "progress" not in (trj(cluster, namespace, OTHER).get("status") or {})
    after = trj(cluster, namespace)
    assert after["spec"]["toolPool"]["replicas"]["max"] == 5
    assert after["status"]["progress"] == progress


def test_trainer_owns_its_tool_pool_degraded_condition_and_posts_events(
    cluster, namespace, operator, tmp_path, monkeypatch
) -> None:
    """Issue 16, nothing silent: the trainer's ToolPoolDegraded condition (server-side apply under its
    own field manager) and its Events, with the J-trainer token; the operator's status writes keep the
    condition, and the trainer's apply keeps the operator's."""
    name = "degraded"
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(small_job(name)))
    wait_until(
        lambda: (trj(cluster, namespace, name).get("status") or {}).get("conditions"),
        120,
        f"the operator's conditions on {name}",
        interval=0.5,
    )
    host, port = mount_service_account(cluster, namespace, tmp_path / "serviceaccount", name)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    target = ApiTarget.in_cluster(sa_dir=str(tmp_path / "serviceaccount"))
    writer = JobStatusWriter(target, namespace, name)  # no uid: learnt from the API's first answer
    can_create = ("auth", "can-i", "create", "events", "-n", namespace)
    account = f"system:serviceaccount:{namespace}:{name}-trainer"
    wait_until(
        lambda: cluster.kubectl(*can_create, "--as", account, check=False).stdout.strip() == "yes",
        30,
        "the apiserver authorizing the J-trainer Role's events rule",
    )

    held = "step 2: 5 of 8 trajectories excluded for infrastructure failures (timeout 5)"
    assert writer.set_degraded(True, job_status.INFRA_FAILURE_RATIO_EXCEEDED, held)
    assert writer.event(job_status.WARNING, job_status.TOOL_POOL_DEGRADED, held)
    job = get_json(cluster, "trj", name, "-n", namespace, "--show-managed-fields")
    by_type = {c["type"]: c for c in job["status"]["conditions"]}
    assert by_type["ToolPoolDegraded"]["status"] == "True"
    assert by_type["ToolPoolDegraded"]["message"] == held
    assert {"ToolPoolReady", "ClusterReady", "Reconciled"} <= set(by_type), "the operator's stay"
    key = "k:" + json.dumps({"type": "ToolPoolDegraded"}, separators=(",", ":"))
    owners = {
        entry["manager"]
        for entry in job["metadata"]["managedFields"]
        if key in ((entry.get("fieldsV1") or {}).get("f:status", {}).get("f:conditions") or {})
    }
    assert owners == {"toolrl-trainer"}, owners
    assert writer.uid == job["metadata"]["uid"]

    # an edit makes the operator re-apply its status: the trainer's condition survives
    cluster.kubectl("patch", "trj", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_until(
        lambda: (trj(cluster, namespace, name).get("status") or {}).get("phase") == "Suspended",
        120,
        "the operator suspending the job",
    )
    by_type = {c["type"]: c for c in trj(cluster, namespace, name)["status"]["conditions"]}
    assert by_type["ToolPoolDegraded"]["status"] == "True" and by_type["ToolPoolDegraded"]["message"] == held

    assert writer.set_degraded(False, job_status.RECOVERED, "step 2 resumed after 40s")
    assert writer.event(job_status.NORMAL, job_status.TOOL_POOL_RECOVERED, "step 2 resumed after 40s")
    by_type = {c["type"]: c for c in trj(cluster, namespace, name)["status"]["conditions"]}
    assert (by_type["ToolPoolDegraded"]["status"], by_type["ToolPoolDegraded"]["reason"]) == (
        "False",
        "Recovered",
    )
    assert by_type["Suspended"]["status"] == "True", "the operator's conditions are untouched"

    events = json.loads(
        cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json"
        ).stdout
    )["items"]
    mine = [
        (e["type"], e["reason"], e["involvedObject"]["uid"])
        for e in events
        if e["source"]["component"] == "toolrl-trainer"
    ]
    assert sorted(mine) == [  # listed in name order (generateName), not in time order
        ("Normal", "ToolPoolRecovered", job["metadata"]["uid"]),
        ("Warning", "ToolPoolDegraded", job["metadata"]["uid"]),
    ]
    described = cluster.kubectl("describe", "trj", name, "-n", namespace).stdout
    assert "ToolPoolDegraded" in described and "ToolPoolRecovered" in described
