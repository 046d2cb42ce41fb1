"""The level-based sync with a fake API: what it applies, skips, repairs and reports."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from toolrl_operator import events
from toolrl_operator.apply import ApiError
from toolrl_operator.children import Live
from toolrl_operator.handlers import Runtime, deployment_view, job_view, rayjob_view
from toolrl_operator.job import Job
from toolrl_operator.naming import AUTOSCALER_FIELD_MANAGER, FIELD_MANAGER
from toolrl_operator.reconcile import ChildError, Reconciler, classify, overlay
from toolrl_operator.settings import Settings
from toolrl_operator.status import pod_node

KEY = ("rl", "gsm8k-python")
SERVICE = ("Service", "gsm8k-python-tools")
POOL = "gsm8k-python-tools"


class FakeKube:
    """Answers like the API server: an applied object comes back with a resourceVersion that
    changes only when the object does, and a uid that changes when it is created anew (after
    `delete`). `fail` maps a kind to the error its apply raises."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.applied: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.scaled: list[tuple[str, int, str]] = []  # (name, replicas, field manager)
        self.fail: dict[str, Exception] = {}
        self.named: set[str | None] = set()  # Events posted under a name of their own
        self.version = 100

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if manifest["kind"] in self.fail:
            raise self.fail[manifest["kind"]]
        self.applied.append(manifest)
        ident = (manifest["kind"], manifest["metadata"]["name"])
        old = self.objects.get(ident)
        if old is None or {k: v for k, v in old.items() if k not in ("rv", "uid")} != manifest:
            self.version += 1
            uid = old["uid"] if old else f"uid-{self.version}"
            self.objects[ident] = {**copy.deepcopy(manifest), "rv": str(self.version), "uid": uid}
        live = copy.deepcopy(self.objects[ident])
        live["metadata"]["resourceVersion"] = live.pop("rv")
        live["metadata"]["uid"] = live.pop("uid")
        return live

    def delete(self, kind: str, name: str) -> None:
        del self.objects[(kind, name)]

    def apply_scale(
        self, api_version: str, kind: str, namespace: str, name: str, replicas: int, field_manager: str
    ) -> dict[str, Any]:
        if "Scale" in self.fail:
            raise self.fail["Scale"]
        self.scaled.append((name, replicas, field_manager))
        return {"kind": "Scale", "spec": {"replicas": replicas}}

    def apply_status(self, *args: Any) -> dict[str, Any]:
        if "Status" in self.fail:
            raise self.fail["Status"]
        self.statuses.append(args[-1])
        return {"status": args[-1]}

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        if "Event" in self.fail:
            raise self.fail["Event"]
        name = manifest["metadata"].get("name")
        if name and name in self.named:
            raise ApiError(409, "AlreadyExists", f'events "{name}" already exists')
        self.named.add(name)
        self.events.append((manifest["type"], manifest["reason"], manifest["message"]))
        return manifest


@pytest.fixture
def runtime(make_job_object):
    """The operator's runtime (not started) over in-memory indexes holding one job (the example)."""
    kube = FakeKube()
    indexes: dict[str, dict[Any, list[dict[str, Any]]]] = {"jobs": {}, "rayjobs": {}, "deployments": {}}
    job = make_job_object()
    job.update({"apiVersion": "toolrl.dev/v1alpha1", "kind": "ToolRLJob"})
    indexes["jobs"][KEY] = [job_view(job)]
    rt = Runtime(Settings(), kube, indexes["jobs"], indexes["rayjobs"], indexes["deployments"])  # type: ignore[arg-type]
    yield rt, kube, indexes
    rt.threads.shutdown()


@pytest.fixture
def world(runtime) -> tuple[Reconciler, FakeKube, dict[str, Any]]:
    """Its reconciler, the fake API and the indexes."""
    rt, kube, indexes = runtime
    return rt.reconciler, kube, indexes


def see_pool(indexes: dict[str, Any], replicas: int, *owners: str) -> None:
    """The pool Deployment's watch event: its size and the field managers that own it, recorded as
    the API server records them (the autoscaler's through the scale subresource)."""
    managed = [
        {"manager": owner, "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
        | ({"subresource": "scale"} if owner == AUTOSCALER_FIELD_MANAGER else {})
        for owner in owners
    ]
    body = {"metadata": {"name": POOL, "managedFields": managed}, "spec": {"replicas": replicas}}
    indexes["deployments"][KEY] = [deployment_view(body)]


def pool_applies(kube: FakeKube) -> list[dict[str, Any]]:
    return [m["spec"] for m in kube.applied if m["kind"] == "Deployment"]


def kinds(kube: FakeKube) -> list[str]:
    return [m["kind"] for m in kube.applied]


def reasons(kube: FakeKube) -> list[str]:
    return [reason for _, reason, _ in kube.events]


def test_a_sync_applies_every_child_writes_the_status_and_a_second_one_does_nothing(world) -> None:
    rec, kube, _ = world
    rec.sync(KEY)
    assert sorted(kinds(kube)) == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "PodDisruptionBudget",
         "NetworkPolicy", "NetworkPolicy", "Deployment", "RayJob"]
    )  # fmt: skip
    assert kinds(kube)[-2:] == ["RoleBinding", "RayJob"], "after what they refer to, which goes in parallel"
    assert len(kube.statuses) == 1 and kube.statuses[0]["observedGeneration"] == 3
    assert reasons(kube) == [events.CREATED, "PhasePending"]
    kube.applied.clear()
    rec.sync(KEY)  # e.g. the watch events of its own applies
    assert kube.applied == [] and len(kube.statuses) == 1 and len(kube.events) == 2


def test_a_sync_cut_short_after_created_posts_it_once_on_its_retry(world) -> None:
    """The operator killed (or its status write refused) between the Created Event and the status
    that marks the job created: the next sync announces Created again, and the API server keeps one."""
    rec, kube, _ = world
    kube.fail["Status"] = ApiError(500, "InternalError", "etcd timed out")
    with pytest.raises(ApiError):
        rec.sync(KEY)
    assert reasons(kube) == [events.CREATED] and kube.statuses == []
    del kube.fail["Status"]
    rec.sync(KEY)
    assert reasons(kube) == [events.CREATED, "PhasePending"]
    assert len(kube.statuses) == 1


def test_a_created_event_the_api_server_refuses_is_posted_by_the_retried_sync(world) -> None:
    """Created is the one Event a job has once: its post refused, the sync fails before the status
    marks the job created, and its retry posts it."""
    rec, kube, _ = world
    kube.fail["Event"] = ApiError(503, "ServiceUnavailable", "etcd leader changed")
    with pytest.raises(ApiError):
        rec.sync(KEY)
    assert kube.statuses == [] and reasons(kube) == []
    del kube.fail["Event"]
    rec.sync(KEY)
    assert reasons(kube) == [events.CREATED, "PhasePending"] and len(kube.statuses) == 1


def test_drift_of_a_child_is_reverted_and_only_that_child_is_applied(world) -> None:
    rec, kube, _ = world
    rec.sync(KEY)
    kube.applied.clear()
    # someone edits the pool Deployment: its watch shows a new resourceVersion
    rec.child_seen(KEY, "Deployment", "gsm8k-python-tools", "999", deleted=False)
    rec.sync(KEY)
    assert kinds(kube) == ["Deployment"]
    assert events.CHILD_DELETED not in reasons(kube)


def test_a_deleted_child_is_recreated_with_one_event(world) -> None:
    rec, kube, _ = world
    rec.sync(KEY)
    kube.applied.clear()
    kube.delete("Service", "gsm8k-python-tools")
    rec.child_seen(KEY, "Service", "gsm8k-python-tools", "", deleted=True)
    rec.sync(KEY)
    rec.sync(KEY)  # before the watch shows it again: no second apply, no second Event
    assert kinds(kube) == ["Service"]
    assert reasons(kube).count(events.CHILD_DELETED) == 1


def test_a_new_pool_starts_at_min_and_its_size_is_handed_to_the_autoscalers_manager(world) -> None:
    rec, kube, indexes = world
    rec.sync(KEY)
    assert [spec["replicas"] for spec in pool_applies(kube)] == [2] and kube.scaled == []
    see_pool(indexes, 2, FIELD_MANAGER)  # created: the operator's apply owns the size alone
    rec.sync(KEY)
    assert kube.scaled == [(POOL, 2, AUTOSCALER_FIELD_MANAGER)], "the same size, through the scale"
    see_pool(indexes, 2, FIELD_MANAGER, AUTOSCALER_FIELD_MANAGER)
    rec.child_seen(KEY, "Deployment", POOL, "999", deleted=False)
    kube.applied.clear()
    rec.sync(KEY)
    assert ["replicas" in spec for spec in pool_applies(kube)] == [False], "left to its other owner"
    see_pool(indexes, 5, AUTOSCALER_FIELD_MANAGER)  # the autoscaler's decision
    rec.child_seen(KEY, "Deployment", POOL, "1000", deleted=False)
    rec.sync(KEY)
    assert ["replicas" in spec for spec in pool_applies(kube)] == [False, False], "never fought"
    assert len(kube.scaled) == 1


def test_a_restarted_operator_keeps_the_pools_size(world) -> None:
    """The world's reconciler knows nothing yet, as after a restart: the size the autoscaler gave
    the pool stays."""
    rec, kube, indexes = world
    see_pool(indexes, 5, AUTOSCALER_FIELD_MANAGER)
    rec.sync(KEY)
    assert ["replicas" in spec for spec in pool_applies(kube)] == [False] and kube.scaled == []


def test_a_pool_an_earlier_version_sized_keeps_its_size_and_is_handed_over(world) -> None:
    """Earlier versions applied the size the autoscaler wrote to the job's status, as the operator's
    field manager alone: leaving it out of the apply would reset it to 1."""
    rec, kube, indexes = world
    see_pool(indexes, 5, FIELD_MANAGER)
    rec.sync(KEY)
    assert [spec["replicas"] for spec in pool_applies(kube)] == [5]
    assert kube.scaled == [(POOL, 5, AUTOSCALER_FIELD_MANAGER)]


def test_suspension_scales_the_pool_to_0_and_resuming_brings_it_back_to_min(world) -> None:
    rec, kube, indexes = world
    see_pool(indexes, 4, AUTOSCALER_FIELD_MANAGER)
    rec.sync(KEY)
    job = indexes["jobs"][KEY][0]
    job["spec"]["suspend"], job["metadata"]["generation"] = True, 4
    rec.sync(KEY)
    assert kube.scaled == [(POOL, 0, AUTOSCALER_FIELD_MANAGER)]
    see_pool(indexes, 0, AUTOSCALER_FIELD_MANAGER)
    rec.sync(KEY)
    job["spec"]["suspend"], job["metadata"]["generation"] = False, 5
    rec.sync(KEY)
    assert kube.scaled[1:] == [(POOL, 2, AUTOSCALER_FIELD_MANAGER)]
    assert not [spec for spec in pool_applies(kube) if "replicas" in spec]


def test_an_edit_of_the_pools_bounds_resizes_it_at_once(world) -> None:
    rec, kube, indexes = world
    see_pool(indexes, 10, AUTOSCALER_FIELD_MANAGER)
    rec.sync(KEY)
    assert kube.scaled == []
    job = indexes["jobs"][KEY][0]
    job["spec"]["toolPool"]["replicas"], job["metadata"]["generation"] = {"min": 2, "max": 6}, 4
    rec.sync(KEY)
    see_pool(indexes, 6, AUTOSCALER_FIELD_MANAGER)
    job["spec"]["toolPool"]["replicas"], job["metadata"]["generation"] = {"min": 8, "max": 12}, 5
    rec.sync(KEY)
    assert [replicas for _, replicas, _ in kube.scaled] == [6, 8]


def test_a_refused_resize_is_made_again_though_every_child_is_applied(world) -> None:
    rec, kube, indexes = world
    see_pool(indexes, 4, AUTOSCALER_FIELD_MANAGER)
    rec.sync(KEY)
    see_pool(indexes, 40, AUTOSCALER_FIELD_MANAGER)  # beyond max (16): someone scaled it as the autoscaler
    kube.fail["Scale"] = ApiError(500, "InternalError", "etcdserver: request timed out")
    with pytest.raises(ChildError, match=f"Deployment {POOL}"):
        rec.sync(KEY)
    del kube.fail["Scale"]
    rec.sync(KEY)
    assert kube.scaled == [(POOL, 16, AUTOSCALER_FIELD_MANAGER)]


def test_a_permanent_error_sets_the_condition_once_and_waits_for_a_spec_change(world) -> None:
    rec, kube, indexes = world
    kube.fail["Deployment"] = ApiError(400, "BadRequest", "quantities must match the regular expression")
    rec.sync(KEY)
    status = kube.statuses[-1]
    reconciled = {c["type"]: c for c in status["conditions"]}["Reconciled"]
    assert (reconciled["status"], reconciled["reason"]) == ("False", "BadRequest")
    assert "quantities" in reconciled["message"]
    assert reasons(kube).count(events.RECONCILE_ERROR) == 1
    attempts = len(kube.applied)
    for _ in range(3):  # events of its children, of its pods...
        rec.sync(KEY)
    assert len(kube.applied) == attempts, "no retry until the spec changes"
    assert reasons(kube).count(events.RECONCILE_ERROR) == 1, "one Event, not a stream"

    del kube.fail["Deployment"]
    indexes["jobs"][KEY][0]["metadata"]["generation"] = 4  # the user fixes the spec
    rec.sync(KEY)
    reconciled = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["Reconciled"]
    assert reconciled["status"] == "True"
    assert "Deployment" in kinds(kube)[attempts:]


def test_a_spec_that_does_not_parse_is_one_event_naming_the_fields_and_nothing_applied(world) -> None:
    """A stored job that does not fit the CRD (e.g. kept from an older CRD): no traceback, no child
    applied, one Warning per generation naming each field; the fixed spec reconciles."""
    rec, kube, indexes = world
    job = indexes["jobs"][KEY][0]
    good = copy.deepcopy(job["spec"])
    job["spec"]["toolPool"]["replicas"]["min"] = 0
    job["spec"]["tools"][0]["type"] = "shell"
    for _ in range(3):
        rec.sync(KEY)
    assert kube.applied == [] and kube.statuses == []
    [(type_, reason, message)] = kube.events
    assert (type_, reason) == ("Warning", events.RECONCILE_ERROR)
    assert "spec.toolPool.replicas.min: Input should be greater than or equal to 1" in message
    assert "spec.tools[0].type: Input should be 'python'" in message and "apply the job again" in message

    job["spec"] = good
    job["metadata"]["generation"] = 4
    rec.sync(KEY)
    assert "RayJob" in kinds(kube) and kube.statuses[-1]["observedGeneration"] == 4


def test_transient_errors_raise_for_a_retry(world) -> None:
    rec, kube, _ = world
    for err in (
        ApiError(503, "ServiceUnavailable", "etcd"),
        ApiError(409, "Conflict", "changed"),
        ApiError(
            403, "Forbidden", 'services "j-tools" is forbidden: exceeded quota: q, requested: services=1'
        ),
        ConnectionResetError("reset"),
    ):
        kube.fail["Service"] = err
        with pytest.raises(ChildError) as caught:
            rec.sync(KEY)
        assert caught.value.cause is err and (caught.value.kind, caught.value.name) == SERVICE
    assert classify(ApiError(403, "Forbidden", "User cannot patch roles")) is not None
    # an apply that races (a Role created in parallel with its binding): the object is missing
    assert classify(ApiError(404, "NotFound", 'rolebindings.rbac.authorization.k8s.io "j" not found')) is None
    # the API itself is missing (KubeRay not installed): no retry helps
    missing_api = ApiError(404, "NotFound", "the server could not find the requested resource")
    assert classify(missing_api) is not None


@pytest.mark.parametrize(("status", "advice"), [(403, "keda.enabled=true"), (404, "install KEDA")])
def test_a_refused_scaled_object_is_reported_with_the_keda_setup(
    make_job_object, world, status, advice
) -> None:
    rec, kube, indexes = world
    job = make_job_object(toolPool={"autoscaler": "keda"})
    job.update({"apiVersion": "toolrl.dev/v1alpha1", "kind": "ToolRLJob"})
    indexes["jobs"][KEY] = [job_view(job)]
    rec.settings = Settings(prometheus_url="http://p:9090")
    kube.fail["ScaledObject"] = ApiError(status, "Forbidden" if status == 403 else "NotFound", "no")
    rec.sync(KEY)
    [(type_, _, message)] = [e for e in kube.events if e[1] == events.RECONCILE_ERROR]
    assert type_ == "Warning" and advice in message


def test_a_finished_job_whose_rayjob_was_deleted_is_not_run_again(world) -> None:
    rec, kube, indexes = world
    indexes["jobs"][KEY][0]["status"] = {
        "phase": "Succeeded", "reason": "JobSucceeded", "message": "done", "observedGeneration": 3,
    }  # fmt: skip
    rec.sync(KEY)  # after the RayJob's DELETED event
    assert "RayJob" not in kinds(kube)
    assert kube.statuses[-1]["phase"] == "Succeeded"
    [deployment] = [m for m in kube.applied if m["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 0


def test_suspending_posts_one_event(world) -> None:
    rec, kube, indexes = world
    rec.sync(KEY)
    indexes["rayjobs"][KEY] = [rayjob_view(kube.objects[("RayJob", "gsm8k-python")] | {"status": {}})]
    job = indexes["jobs"][KEY][0]
    job["spec"]["suspend"], job["metadata"]["generation"] = True, 4
    rec.sync(KEY)
    rec.child_seen(KEY, "RayJob", "gsm8k-python", "12345", deleted=False)  # a RayJob status update
    rec.sync(KEY)
    assert reasons(kube).count(events.SUSPENDED) == 1
    assert events.SPEC_APPLIED in reasons(kube)


def test_waiting_pods_name_the_cause_in_the_status(world) -> None:
    rec, kube, indexes = world
    rec.sync(KEY)
    indexes["rayjobs"][KEY] = [
        {"metadata": {"name": "gsm8k-python"}, "spec": {"suspend": False},
         "status": {"jobDeploymentStatus": "Initializing", "rayClusterName": "gsm8k-python-x"}}
    ]  # fmt: skip
    cause = ("Unschedulable", 'pod h cannot be scheduled: persistentvolumeclaim "ckpt" not found')
    rec.pod_seen(KEY, "h", "trainer", cause, deleted=False)
    rec.sync(KEY)
    status = kube.statuses[-1]
    assert (status["phase"], status["reason"]) == ("Provisioning", "Unschedulable")
    assert 'persistentvolumeclaim "ckpt" not found' in status["message"]


def test_overlay_keeps_others_fields_inside_shared_objects() -> None:
    index = {
        "toolPool": {"desiredReplicas": 5, "replicas": 1},
        "conditions": [
            {"type": "AutoscalerHealthy", "status": "True"},
            {"type": "Running", "status": "False"},
        ],
        "progress": {"step": 3},
    }
    ours = {
        "toolPool": {"replicas": 2},
        "conditions": [{"type": "Running", "status": "True"}],
        "phase": "Running",
    }
    merged = overlay(index, ours)
    assert merged["toolPool"] == {"desiredReplicas": 5, "replicas": 2}
    assert {c["type"]: c["status"] for c in merged["conditions"]} == {
        "AutoscalerHealthy": "True",
        "Running": "True",
    }
    assert merged["progress"] == {"step": 3} and merged["phase"] == "Running"


def test_the_jobs_index_keeps_no_managed_fields_or_annotations(make_job_object) -> None:
    job = make_job_object()
    job["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    job["metadata"]["annotations"] = {"toolrl.dev/last-handled-configuration": "{...the whole spec...}"}
    kept = job_view(job)
    assert "managedFields" not in kept["metadata"] and "annotations" not in kept["metadata"]
    assert kept["metadata"]["name"] == job["metadata"]["name"] and kept["spec"] == job["spec"]
    assert "managedFields" in job["metadata"], "the body itself is left alone"


def test_views_keep_what_the_status_needs() -> None:
    body = {
        "metadata": {"name": "d", "generation": 2},
        "spec": {"replicas": 3, "template": {}},
        "status": {"x": 1},
    }
    assert deployment_view(body) == {"metadata": {"name": "d", "generation": 2}, "spec": {"replicas": 3},
                                     "status": {"x": 1}, "autoscaled": False}  # fmt: skip


def test_the_api_server_sends_only_the_operators_children_and_pods() -> None:
    import kopf
    from kopf._cogs.structs.references import Resource
    from toolrl_operator.handlers import OWNED_SELECTOR, watch_only_owned

    settings = kopf.OperatorSettings()
    watch_only_owned(settings)
    watched = [("", "pods", "Pod"), ("", "configmaps", "ConfigMap"), ("apps", "deployments", "Deployment"),
               ("ray.io", "rayjobs", "RayJob")]  # fmt: skip
    for group, plural, kind in watched:
        resource = Resource(group=group, version="v1", plural=plural, kind=kind, namespaced=True)
        assert settings.watching.label_selectors.collect(resource) == [OWNED_SELECTOR], plural
    jobs = Resource(
        group="toolrl.dev", version="v1alpha1", plural="toolrljobs", kind="ToolRLJob", namespaced=True
    )
    assert settings.watching.label_selectors.collect(jobs) == [], "the jobs themselves: all of them"


def test_a_resync_repairs_what_no_watch_reported(world) -> None:
    """A deletion in a watch gap, and an edit of the ScaledObject (not watched: KEDA may be
    absent), are invisible to the cache; the resync's pass applies every child and repairs both."""
    rec, kube, indexes = world
    indexes["jobs"][KEY][0]["spec"]["toolPool"]["autoscaler"] = "keda"
    rec.settings = Settings(prometheus_url="http://prometheus:9090")
    rec.sync(KEY)
    assert ("ScaledObject", "gsm8k-python-tools") in kube.objects
    kube.delete("Service", "gsm8k-python-tools")  # no watch event: a gap
    kube.objects[("ScaledObject", "gsm8k-python-tools")]["spec"]["maxReplicaCount"] = 99  # someone's edit
    kube.applied.clear()
    rec.sync(KEY)
    assert kube.applied == [], "between resyncs the cache skips children no watch changed"
    rec.resync()
    rec.sync(KEY)
    assert ("Service", "gsm8k-python-tools") in kube.objects, "the missed deletion is repaired"
    assert kube.objects[("ScaledObject", "gsm8k-python-tools")]["spec"]["maxReplicaCount"] != 99
    assert len(kube.applied) == len(rec_children(rec)), "a resync applies every child"
    assert [m for _, r, m in kube.events if r == events.CHILD_DELETED] == [
        "re-created the deleted Service gsm8k-python-tools"
    ]
    kube.applied.clear()
    rec.sync(KEY)
    assert kube.applied == [], "the resync's full pass is one pass"


def test_a_resync_pass_that_fails_is_made_again_in_full(world) -> None:
    rec, kube, _ = world
    rec.sync(KEY)
    rec.resync()
    kube.fail["Service"] = ApiError(503, "ServiceUnavailable", "etcd is slow")
    with pytest.raises(ChildError):
        rec.sync(KEY)  # transient: the queue retries the key
    del kube.fail["Service"]
    kube.applied.clear()
    rec.sync(KEY)
    assert len(kube.applied) == len(rec_children(rec))


def rec_children(rec: Reconciler) -> list[dict[str, Any]]:
    from toolrl_operator.children import build_children
    from toolrl_operator.job import parse_job

    return build_children(parse_job(rec.jobs[KEY][0]), rec.settings)


def test_watch_events_during_syncs_never_break_a_sync(world) -> None:
    """The watches write a job's pods and children on the event loop while a sync thread reads
    them; with many pods and a tiny switch interval an unguarded dict iteration breaks often."""
    import sys
    import threading
    import time

    rec, _, _ = world
    waiting = ("ContainerCreating", "pulling")
    for i in range(5000):
        rec.pod_seen(KEY, f"tools-{i}", "tool-pool", waiting, deleted=False)
    errors: list[BaseException] = []
    stop = threading.Event()

    def syncs() -> None:
        while not stop.is_set():
            try:
                rec.sync(KEY)
            except BaseException as err:  # the test reports any
                errors.append(err)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=syncs)
    thread.start()
    try:
        deadline = time.monotonic() + 3
        round_ = 0
        while time.monotonic() < deadline:
            round_ += 1
            for i in range(5000, 5020):
                rec.pod_seen(KEY, f"tools-{i}", "tool-pool", waiting, deleted=round_ % 2 == 1)
                rec.child_seen(KEY, "ConfigMap", f"extra-{i}", str(round_), deleted=round_ % 2 == 1)
            if errors:
                break
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert errors == []


def test_a_submitter_pod_that_failed_is_one_trainer_restart(world) -> None:
    from toolrl_operator.status import TRAINER_RESTARTED, LostTrainer

    rec, kube, indexes = world
    indexes["rayjobs"][KEY] = [
        {"metadata": {"name": "gsm8k-python"}, "spec": {"suspend": False},
         "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}
    ]  # fmt: skip
    rec.sync(KEY)
    rec.pod_seen(KEY, "gsm8k-python-abc", "trainer", None, deleted=False)  # the submitter, running
    rec.sync(KEY)
    assert kube.statuses[-1].get("restarts", 0) == 0
    lost = LostTrainer("2026-01-01T00:01:00Z", "gsm8k-python-abc", "Error, exit code 1")
    rec.pod_seen(KEY, "gsm8k-python-abc", "trainer", None, deleted=False, lost=lost)
    assert len(rec.queue) == 1, "a pod showing a lost trainer queues its job"
    rec.sync(KEY)
    status = kube.statuses[-1]
    assert (status["restarts"], status["reason"]) == (1, TRAINER_RESTARTED)
    rec.sync(KEY)
    assert reasons(kube).count(TRAINER_RESTARTED) == 1


def test_a_worker_pod_becoming_ready_updates_its_groups_ready_replicas(world, runtime) -> None:
    """Through the pod watch's handler: KubeRay's `ray.io/group` label and the pod's Ready
    condition are recorded; a change of readiness queues the job and the next sync shows it."""
    import asyncio

    import kopf
    from toolrl_operator.handlers import pod_event

    rec, kube, indexes = world
    rec.sync(KEY)
    running = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "c1"}
    indexes["rayjobs"][KEY] = [rayjob_view(kube.objects[("RayJob", "gsm8k-python")] | {"status": running})]
    memo = kopf.Memo(runtime=runtime[0])

    def pod(name: str, group: str, ready: str, type_: str = "MODIFIED") -> None:
        labels = {"toolrl.dev/job": KEY[1], "app.kubernetes.io/component": "trainer", "ray.io/group": group}
        body = {
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "ray-worker"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": ready}]},
        }
        asyncio.run(pod_event(type=type_, body=body, namespace=KEY[0], labels=labels, memo=memo))

    def ready_replicas() -> list[tuple[str, int, int]]:
        return [(g["name"], g["replicas"], g["readyReplicas"]) for g in kube.statuses[-1]["workerGroups"]]

    pod("c1-head-x", "headgroup", "True")
    pod("c1-gpu-workers-a", "gpu-workers", "False")
    pod("c1-gpu-workers-b", "gpu-workers", "True")
    rec.sync(KEY)
    assert ready_replicas() == [("gpu-workers", 2, 1)]
    while len(rec.queue):  # what the pods' events queued: synced above
        rec.queue.done(asyncio.run(rec.queue.get()))
    pod("c1-gpu-workers-a", "gpu-workers", "False")  # an update that changes nothing the status shows
    assert len(rec.queue) == 0, "a pod that stays unready does not queue its job"
    pod("c1-gpu-workers-a", "gpu-workers", "True")
    assert len(rec.queue) == 1, "a pod becoming Ready queues its job"
    rec.sync(KEY)
    assert ready_replicas() == [("gpu-workers", 2, 2)]
    pod("c1-gpu-workers-b", "gpu-workers", "True", type_="DELETED")
    rec.sync(KEY)
    assert ready_replicas() == [("gpu-workers", 2, 1)]


def _reconciled(status: dict[str, Any]) -> dict[str, Any]:
    return {c["type"]: c for c in status["conditions"]}["Reconciled"]


QUOTA = ApiError(
    403,
    "Forbidden",
    'services "gsm8k-python-tools" is forbidden: exceeded quota: no-services, requested: services=1, '
    "used: services=0, limited: services=0",
)
RANGE_FULL = ApiError(
    500,
    "InternalError",
    "Internal error occurred: failed to allocate a serviceIP: range is full",
)


@pytest.mark.parametrize(
    ("err", "reason", "text"),
    [
        (QUOTA, "QuotaExceeded", "exceeded quota: no-services"),
        (RANGE_FULL, "InternalError", "failed to allocate a serviceIP: range is full"),
        (ApiError(503, "", "etcd is slow"), "ServiceUnavailable", "etcd is slow"),
    ],
)
def test_a_child_the_api_refuses_for_now_is_in_the_status_and_retried(world, err, reason, text) -> None:
    """A transient refusal (a quota, a full Service range, an unavailable server) still writes the
    status: a phase, and Reconciled False with the API's reason and message naming the child; the
    sync raises so the work queue backs off; the status clears once the child is created."""
    rec, kube, _ = world
    kube.fail["Service"] = err
    with pytest.raises(Exception, match="Service gsm8k-python-tools"):
        rec.sync(KEY)
    assert kube.statuses == [], "a blip the first retry clears is not written"
    with pytest.raises(Exception, match="Service gsm8k-python-tools"):
        rec.sync(KEY)  # the first retry (1 s later): still refused
    [status] = kube.statuses
    assert (status["phase"], status["reason"]) == ("Pending", reason)
    reconciled = _reconciled(status)
    assert (reconciled["status"], reconciled["reason"]) == ("False", reason)
    assert "Service gsm8k-python-tools" in reconciled["message"] and text in reconciled["message"]
    assert reconciled["observedGeneration"] == 3 and status["message"] == reconciled["message"]
    assert "RayJob" not in kinds(kube), "what refers to the pool waits for it"
    with pytest.raises(Exception, match="Service gsm8k-python-tools"):
        rec.sync(KEY)  # the next retry: the same refusal, no second status write
    assert len(kube.statuses) == 1

    del kube.fail["Service"]  # the quota raised
    rec.sync(KEY)
    reconciled = _reconciled(kube.statuses[-1])
    assert (reconciled["status"], reconciled["reason"]) == ("True", "ChildrenApplied")
    assert (kube.statuses[-1]["phase"], kube.statuses[-1]["reason"]) == ("Pending", "RayJobNotCreated")
    assert {"Service", "RayJob"} <= set(kinds(kube))
    assert ("Normal", "ChildrenApplied", "every child of the job is applied") in kube.events


def test_a_refused_update_of_a_running_jobs_child_keeps_the_phase_and_says_why(world) -> None:
    rec, kube, indexes = world
    rec.sync(KEY)
    running = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "c1"}
    indexes["rayjobs"][KEY] = [rayjob_view(kube.objects[("RayJob", "gsm8k-python")] | {"status": running})]
    rec.sync(KEY)
    assert kube.statuses[-1]["phase"] == "Running"
    kube.fail["Deployment"] = ApiError(
        422, "Invalid", 'Deployment.apps "gsm8k-python-tools" is invalid: spec.replicas: Invalid value'
    )
    rec.resync()
    rec.sync(KEY)  # permanent: reported, not raised
    status = kube.statuses[-1]
    assert status["phase"] == "Running"
    reconciled = _reconciled(status)
    assert (reconciled["status"], reconciled["reason"]) == ("False", "Invalid")
    assert reconciled["message"].startswith("Deployment gsm8k-python-tools not applied: 422 Invalid:")


def test_a_refusal_without_a_reason_gets_a_condition_reason_from_its_http_status(world) -> None:
    """metav1.Condition's reason is CamelCase ([A-Za-z][A-Za-z0-9_,:]*): a proxy's non-JSON 403 or
    a 502 has no Kubernetes reason, and its status code is not a valid one."""
    rec, kube, _ = world
    kube.fail["Service"] = ApiError(403, "", "the API server answered with a non-JSON body: <html>")
    rec.sync(KEY)  # a 403 that is no quota: permanent
    assert _reconciled(kube.statuses[-1])["reason"] == "Forbidden"
    rec.state.clear()  # an operator restarted (a 403 waits for a spec change)
    kube.fail["Service"] = ApiError(502, "", "the API server answered with a non-JSON body: Bad Gateway")
    for _ in range(2):  # transient: written from its first retry on
        with pytest.raises(Exception, match="Bad Gateway"):
            rec.sync(KEY)
    assert _reconciled(kube.statuses[-1])["reason"] == "BadGateway"


def test_a_transient_blip_its_retry_clears_writes_no_status_of_it(world) -> None:
    rec, kube, _ = world
    rec.sync(KEY)
    rec.resync()
    kube.fail["Role"] = ApiError(409, "Conflict", "the object has been modified")
    with pytest.raises(ChildError):
        rec.sync(KEY)
    del kube.fail["Role"]
    rec.sync(KEY)
    assert len(kube.statuses) == 1 and _reconciled(kube.statuses[0])["status"] == "True"


def test_a_sync_of_unchanged_inputs_builds_nothing_and_any_changed_input_builds_again(
    world, monkeypatch
) -> None:
    """The builders are pure: while the job, the settings and the RayJob's suspend are what the
    last sync built from, and every child is applied as built (its watch shows that apply), a sync
    builds no manifest. Each input, changed, is built from again."""
    from toolrl_operator import reconcile

    rec, kube, indexes = world
    builds: list[str] = []
    real_build = reconcile.build_children

    def counting(job: Job, settings: Settings, live: Live | None = None) -> list[dict[str, Any]]:
        builds.append(job.name)
        return real_build(job, settings, live)

    monkeypatch.setattr(reconcile, "build_children", counting)
    rec.sync(KEY)
    rec.sync(KEY)  # the operator's own status now shown by the index: read, built once more
    job = indexes["jobs"][KEY][0]
    job["status"] = copy.deepcopy(kube.statuses[-1])
    rec.sync(KEY)
    builds.clear()
    for _ in range(3):
        rec.sync(KEY)
    job["metadata"]["resourceVersion"] = "written-by-someone"  # e.g. its own status write, seen
    rec.sync(KEY)
    assert builds == [] and len(kube.statuses) <= 2, "unchanged: nothing built, nothing written"
    job["status"]["progress"] = {"step": 3, "totalSteps": 10}  # the trainer's write: no builder reads it
    job["status"]["conditions"].append({"type": "AutoscalerHealthy", "status": "True"})
    rec.sync(KEY)
    assert builds == [], "a status field no builder reads builds nothing"

    rec.child_seen(KEY, "Deployment", "gsm8k-python-tools", "999", deleted=False)  # drift
    rec.sync(KEY)
    assert len(builds) == 1 and kinds(kube)[-1] == "Deployment"
    builds.clear()
    job["status"]["toolPool"]["desiredReplicas"] = 3  # the autoscaler's report: no builder reads it
    rec.sync(KEY)
    assert builds == []
    see_pool(indexes, 3, AUTOSCALER_FIELD_MANAGER)  # the autoscaler's resize, seen
    rec.sync(KEY)
    assert len(builds) == 1
    job["spec"]["toolPool"]["targetConcurrencyPerReplica"] = 7  # a spec edit
    job["metadata"]["generation"] = 4
    rec.sync(KEY)
    assert len(builds) == 2
    rec.settings = Settings(prometheus_url="http://prometheus:9090")
    rec.sync(KEY)
    assert len(builds) == 3
    rec.resync()  # a resync applies every child: built
    rec.sync(KEY)
    assert len(builds) == 4


def test_the_pod_watch_keeps_the_ready_pool_pods_and_ray_heads_for_the_autoscaler(world, runtime) -> None:
    """What the autoscaler scrapes without Prometheus, from the pods' watch events: each ready pod's
    IP, not an unready one's, not a terminating one's; Ray heads apart from workers."""
    import asyncio

    import kopf
    from toolrl_operator.handlers import pod_event

    rec, _, _ = world
    memo = kopf.Memo(runtime=runtime[0])

    def pod(name: str, component: str, ready: bool, ip: str | None = "127.65.0.9", **labels: str) -> None:
        labels = {"toolrl.dev/job": KEY[1], "app.kubernetes.io/component": component, **labels}
        meta: dict[str, Any] = {"name": name, "labels": labels}
        if name.endswith("-old"):
            meta["deletionTimestamp"] = "2026-12-06T00:00:00Z"
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": str(ready)}]}
        body = {"metadata": meta, "spec": {"containers": [{"name": "c"}]}, "status": {**status, "podIP": ip}}
        asyncio.run(pod_event(type="MODIFIED", body=body, namespace=KEY[0], labels=labels, memo=memo))

    pod("tools-b", "tool-pool", True, "127.65.0.2")
    pod("tools-a", "tool-pool", True, "127.65.0.1")
    pod("tools-c", "tool-pool", False)
    pod("tools-old", "tool-pool", True)
    pod("tools-new", "tool-pool", True, None)  # no IP yet
    pod(
        "c1-head-x",
        "trainer",
        True,
        "127.65.1.1",
        **{"ray.io/node-type": "head", "ray.io/group": "headgroup"},
    )
    pod("c1-worker-y", "trainer", True, "127.65.1.2", **{"ray.io/node-type": "worker", "ray.io/group": "gpu"})
    assert rec.ready_pods(KEY) == (
        [("tools-a", "127.65.0.1"), ("tools-b", "127.65.0.2")],
        [("c1-head-x", "127.65.1.1")],
    )
    pod("tools-a", "tool-pool", False)  # no longer ready
    assert rec.ready_pods(KEY)[0] == [("tools-b", "127.65.0.2")]
    assert rec.ready_pods(("rl", "other")) == ([], [])


def test_a_node_that_stops_being_ready_syncs_the_jobs_bound_to_it_and_their_status_names_it(world) -> None:
    rec, kube, _ = world
    rec.pod_seen(KEY, "gsm8k-python-worker-a", "trainer", None, deleted=False, node="gpu-node-3")
    rec.pod_seen(KEY, "gsm8k-python-tools-b", "tool-pool", None, deleted=False, node="cpu-node-1")
    rec.sync(KEY)
    drain(rec)
    rec.node_seen("cpu-node-9", "Unknown")  # holds nothing of the job
    assert len(rec.queue) == 0
    rec.node_seen("gpu-node-3", "Unknown since 2026-01-01T00:01:00Z (NodeStatusUnknown)")
    assert len(rec.queue) == 1
    rec.sync(KEY)
    cluster = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["ClusterReady"]
    assert (cluster["status"], cluster["reason"]) == ("False", "NodeNotReady")
    assert "node gpu-node-3 is not Ready" in cluster["message"]
    assert "gsm8k-python-worker-a" in cluster["message"]
    assert "NodeNotReady" in reasons(kube)  # the flip is an Event too
    drain(rec)
    rec.node_seen("gpu-node-3", "Unknown since 2026-01-01T00:01:00Z (NodeStatusUnknown)")  # no change
    assert len(rec.queue) == 0
    rec.node_seen("gpu-node-3", None)  # back
    assert len(rec.queue) == 1 and rec.unready_nodes == {"cpu-node-9": "Unknown"}
    rec.sync(KEY)
    cluster = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["ClusterReady"]
    assert cluster["reason"] != "NodeNotReady"


def test_a_lost_nodes_terminating_ray_pods_of_the_attempt_are_named_with_what_frees_them(world) -> None:
    """KubeRay replaces a Ray pod only once it is gone, and an evicted pod of an unreachable node stays
    Terminating until the node is back or declared down: the attempt's such pods keep naming the node,
    with the taint that lets it go on; an earlier attempt's (deleted with its RayCluster) are no concern."""
    rec, kube, indexes = world
    rec.sync(KEY)
    running = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "c2"}
    indexes["rayjobs"][KEY] = [rayjob_view(kube.objects[("RayJob", "gsm8k-python")] | {"status": running})]
    evicted = {"metadata": {"name": "x", "deletionTimestamp": "2026-12-06T00:00:00Z", "labels": {}}}
    evicted["spec"] = {"nodeName": "cpu-real-1"}
    evicted["metadata"]["labels"]["ray.io/node-type"] = "worker"
    node = pod_node(evicted)
    assert node == "cpu-real-1"
    rec.pod_seen(KEY, "c1-gpu-worker-a", "trainer", None, deleted=False, node=node, cluster="c1")
    rec.node_seen("cpu-real-1", "Unknown since 2026-12-06T00:00:00Z (NodeStatusUnknown)")
    rec.sync(KEY)
    cluster = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["ClusterReady"]
    assert cluster["reason"] != "NodeNotReady", "an earlier attempt's pod holds nothing of this one"
    rec.pod_seen(KEY, "c2-gpu-worker-b", "trainer", None, deleted=False, node=node, cluster="c2")
    rec.sync(KEY)
    cluster = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["ClusterReady"]
    assert (cluster["status"], cluster["reason"]) == ("False", "NodeNotReady")
    assert "node cpu-real-1 is not Ready" in cluster["message"] and "c2-gpu-worker-b" in cluster["message"]
    assert "c1-gpu-worker-a" not in cluster["message"]
    taint = "kubectl taint nodes cpu-real-1 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
    assert taint in cluster["message"], cluster["message"]
    rec.pod_seen(KEY, "c2-gpu-worker-b", "trainer", None, deleted=True)  # force-deleted: KubeRay replaces it
    rec.sync(KEY)
    cluster = {c["type"]: c for c in kube.statuses[-1]["conditions"]}["ClusterReady"]
    assert cluster["reason"] != "NodeNotReady"


def drain(rec: Reconciler) -> None:
    """Take every queued key off the work queue (as the workers would once synced)."""
    while len(rec.queue):
        rec.queue.done(asyncio.run(rec.queue.get()))
