"""The handlers' glue with a fake API: what they apply, under which lock, from which body."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
from toolrl_operator import handlers
from toolrl_operator.handlers import Runtime, apply_job
from toolrl_operator.settings import Settings


class FakeKube:
    """Records applied manifests; answers like the API server (the object as applied)."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.held: list[bool] = []
        self.runtime: Runtime | None = None

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        key = (manifest["metadata"]["namespace"], manifest["metadata"]["labels"]["toolrl.dev/job"])
        assert self.runtime is not None
        self.held.append(self.runtime.lock(key).locked())
        self.applied.append(manifest)
        return copy.deepcopy(manifest)

    def apply_status(self, *args: Any) -> dict[str, Any]:
        self.statuses.append(args[-1])
        return {"status": args[-1]}


@pytest.fixture
def fake(monkeypatch) -> FakeKube:
    kube = FakeKube()
    rt = Runtime(Settings(), kube)  # type: ignore[arg-type]
    kube.runtime = rt
    monkeypatch.setattr(handlers, "_runtime", rt)
    monkeypatch.setattr(handlers.kopf, "info", lambda *a, **k: None)
    monkeypatch.setattr(handlers.kopf, "warn", lambda *a, **k: None)
    return kube


def _kinds(kube: FakeKube) -> list[str]:
    return [m["kind"] for m in kube.applied]


def test_a_finished_job_whose_rayjob_was_deleted_is_not_run_again(make_job, fake) -> None:
    job = make_job(status={"phase": "Succeeded", "reason": "JobSucceeded", "message": "done"})
    apply_job(job, None)  # what _repair does after the RayJob's DELETED event
    assert "RayJob" not in _kinds(fake)
    assert fake.statuses[-1]["phase"] == "Succeeded"
    deployment = next(m for m in fake.applied if m["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 0


def test_apply_job_builds_the_pool_from_the_newest_status_under_the_jobs_lock(make_job, fake) -> None:
    stale = make_job(status={"phase": "Running", "toolPool": {"desiredReplicas": 3}})
    newest = make_job(status={"phase": "Running", "toolPool": {"desiredReplicas": 9}})
    handlers.runtime().newest[("rl", "gsm8k-python")] = newest
    apply_job(stale, None)
    deployment = next(m for m in fake.applied if m["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 9, "an older body must not revert the autoscaler's size"
    assert all(fake.held), "every child is applied under the job's lock"
    assert "RayJob" in _kinds(fake)


def test_resizing_the_pool_waits_for_the_jobs_lock_and_uses_the_newest_body(make_job, fake) -> None:
    rt = handlers.runtime()
    key = ("rl", "gsm8k-python")
    rt.applied_generation[key] = 3
    rt.newest[key] = make_job(status={"phase": "Running", "toolPool": {"desiredReplicas": 4}})
    lock = rt.lock(key)
    lock.acquire()
    worker = threading.Thread(target=handlers._resize_pool, args=(key,))
    worker.start()
    worker.join(0.2)
    assert fake.applied == [], "no apply while apply_job holds the lock"
    rt.newest[key] = make_job(status={"phase": "Running", "toolPool": {"desiredReplicas": 6}})
    lock.release()
    worker.join()
    assert [m["spec"]["replicas"] for m in fake.applied] == [6]


@pytest.mark.parametrize(("status", "advice"), [(403, "keda.enabled=true"), (404, "install KEDA")])
def test_a_refused_scaled_object_is_reported_with_the_keda_setup(make_job, fake, monkeypatch, status, advice):
    from toolrl_operator.apply import ApiError

    warnings: list[tuple[str, str]] = []
    monkeypatch.setattr(handlers.kopf, "warn", lambda _j, reason, message: warnings.append((reason, message)))
    applied = fake.apply

    def refuse_scaled_objects(manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["kind"] == "ScaledObject":
            raise ApiError(status, "Forbidden" if status == 403 else "NotFound", "no")
        return applied(manifest)

    monkeypatch.setattr(fake, "apply", refuse_scaled_objects)
    handlers.runtime().settings = Settings(prometheus_url="http://p:9090")
    with pytest.raises(handlers.kopf.TemporaryError):
        apply_job(make_job(toolPool={"autoscaler": "keda"}), None)
    assert warnings and warnings[-1][0] == "ReconcileError"
    assert advice in warnings[-1][1]


def test_the_jobs_index_keeps_no_managed_fields_or_annotations(make_job) -> None:
    job = make_job()
    job["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    job["metadata"]["annotations"] = {"toolrl.dev/last-handled-configuration": "{...the whole spec...}"}
    kept = handlers.job_view(job)
    assert "managedFields" not in kept["metadata"] and "annotations" not in kept["metadata"]
    assert kept["metadata"]["name"] == job["metadata"]["name"] and kept["spec"] == job["spec"]
    assert "managedFields" in job["metadata"], "the body itself is left alone"
