"""The autoscaling loop: when it acts, what it writes, how it keeps and drops each job's
history, that it bounds its concurrency, and that nothing in the operator needs a finalizer."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import kopf
import pytest
import yaml
from chartgen.crd_defaults import spec_schema
from chartgen.outputs import CRD_SOURCE
from prometheus_client import REGISTRY
from toolrl_api.defaulting import apply_defaults
from toolrl_operator import handlers, scale_loop, signals
from toolrl_operator.apply import ApiError
from toolrl_operator.job import parse_job
from toolrl_operator.naming import AUTOSCALER_FIELD_MANAGER
from toolrl_operator.settings import Settings

SPEC_SCHEMA = spec_schema(yaml.safe_load(CRD_SOURCE.read_text()))
REQUIRED = {"model": {"path": "m"}, "data": {"trainFiles": ["t"]}, "tools": [{"name": "p", "type": "python"}]}


def job(phase="Running", name="j", uid="", **spec):
    return {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "metadata": {"name": name, "namespace": "n", "uid": uid or f"uid-{name}"},
        "spec": apply_defaults(  # as the apiserver gives it
            SPEC_SCHEMA,
            {
                **REQUIRED,
                "toolPool": {
                    "replicas": {"min": 1, "max": 4},
                    "targetConcurrencyPerReplica": 8,
                    "scaleDownDelaySeconds": 60,
                    "rolloutAware": False,
                },
                **spec,
            },
        ),
        "status": {"phase": phase},
    }


def deployment(replicas=0):
    return {"metadata": {"name": "d"}, "spec": {"replicas": replicas}, "status": {}}


def test_acts_only_on_live_native_jobs():
    assert scale_loop.native(parse_job(job()))
    assert not scale_loop.native(parse_job(job(suspend=True)))
    assert not scale_loop.native(parse_job(job(phase="Succeeded")))
    assert not scale_loop.native(parse_job(job(toolPool={"autoscaler": "keda"})))
    deleting = job()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not scale_loop.native(parse_job(deleting))


def test_condition_says_why_it_holds_and_keeps_the_transition_time():
    bad = scale_loop.condition(False, "Prometheus at http://p did not answer", None, "T1", 3)
    assert bad == {
        "type": "AutoscalerHealthy",
        "status": "False",
        "observedGeneration": 3,
        "lastTransitionTime": "T1",
        "reason": "MetricsUnavailable",
        "message": "holding the pool's size: Prometheus at http://p did not answer",
    }
    still_bad = scale_loop.condition(False, "other", bad, "T2", 3)
    assert still_bad["lastTransitionTime"] == "T1"
    good = scale_loop.condition(True, "", still_bad, "T3", 4)
    assert (good["status"], good["reason"], good["lastTransitionTime"]) == ("True", "MetricsAvailable", "T3")


def test_no_handler_of_the_operator_puts_a_finalizer_on_jobs():
    """kopf adds a finalizer for daemons, timers and non-optional on.delete handlers; with one,
    a job could not be deleted while no operator runs. (kopf has no public view of its registry.)"""
    registry = kopf.get_default_registry()
    assert handlers.job_event and handlers.start  # the module registered its handlers
    assert not list(registry._spawning.get_all_handlers())
    assert not [h.id for h in registry._changing.get_all_handlers() if h.requires_finalizer]
    assert list(registry._watching.get_all_handlers()), "the watches that feed the reconcile queue"


class FakeKube:
    """Records status applies, which take `apply_delay` seconds so that their concurrency shows,
    the pools' sizes written, and every other request (the loop makes none: it lists nothing)."""

    def __init__(self, apply_delay: float = 0.0) -> None:
        self.applied: list[tuple[str, dict[str, Any], str]] = []
        self.scaled: list[tuple[str, int, str]] = []  # (Deployment, replicas, field manager)
        self.events: list[tuple[str, str, str]] = []
        self.requested: list[tuple[str, str]] = []
        self.apply_delay = apply_delay
        self.running = self.peak = 0
        self.guard = threading.Lock()

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.requested.append((method, path))
        return {"items": []}

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        assert manifest["kind"] == "Event"
        self.events.append((manifest["type"], manifest["involvedObject"]["name"], manifest["reason"]))
        return manifest

    def apply_scale(self, api_version, kind, namespace, name, replicas, field_manager):
        assert (api_version, kind) == ("apps/v1", "Deployment")
        self.scaled.append((name, replicas, field_manager))
        return {"kind": "Scale", "spec": {"replicas": replicas}}

    def apply_status(self, api_version, kind, namespace, name, status, field_manager=""):
        with self.guard:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(self.apply_delay)
        with self.guard:
            self.running -= 1
            self.applied.append((name, status, field_manager))
        return {"status": status}


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def autoscaler(kube):
    """Makes the loop over jobs and their pool Deployments (index views), writing to the fake API on
    a thread pool the size of the operator's."""
    threads = ThreadPoolExecutor(handlers.THREADS)

    def make(jobs, deployments, settings=None, **kwargs) -> scale_loop.Autoscaler:
        return scale_loop.Autoscaler(settings or Settings(), kube, threads, jobs, deployments, **kwargs)

    yield make
    threads.shutdown()


@pytest.fixture
def idle(monkeypatch) -> None:
    """Every pool's ready pods answer their /metrics: no call in flight."""

    async def read_direct(session, pool_pods, head_pods, expected_pods):
        return signals.Reading(0.0, pods=expected_pods)

    monkeypatch.setattr(scale_loop.signals, "read_direct", read_direct)


@pytest.fixture
def events(kube) -> list[tuple[str, str, str]]:
    """(type, job, reason) of the Events posted."""
    return kube.events


def desired_gauge(name: str) -> float | None:
    labels = {"namespace": "n", "toolrl_job": name}
    return REGISTRY.get_sample_value("toolrl_autoscaler_desired_replicas", labels)


async def test_one_loop_sizes_every_job_keeps_history_by_uid_and_forgets_gone_jobs(
    autoscaler, kube, events, idle
):
    jobs = {("n", f"j{i}"): [job(name=f"j{i}")] for i in range(3)}
    pools = {key: [deployment(0)] for key in jobs}
    loop = autoscaler(jobs, pools)
    async with aiohttp.ClientSession() as session:
        await loop.tick(session)
        # an empty pool has no load: each job's Deployment gets min through its scale subresource, and
        # the status reports it, both applied by the autoscaler's own field manager
        assert sorted(kube.scaled) == [(f"j{i}-tools", 1, AUTOSCALER_FIELD_MANAGER) for i in range(3)]
        assert sorted(name for name, _, _ in kube.applied) == ["j0", "j1", "j2"]
        assert kube.requested == [], "the pods come from the pod watch: nothing is listed"
        for pool in pools.values():
            pool[0]["spec"]["replicas"] = 1  # the Deployments' watch shows the writes
        for _name, status, manager in kube.applied:
            assert manager == AUTOSCALER_FIELD_MANAGER == "toolrl-operator-autoscaler"
            assert status["toolPool"] == {"desiredReplicas": 1}
            [cond] = status["conditions"]
            assert (cond["type"], cond["status"]) == ("AutoscalerHealthy", "True")
        assert sorted(events) == [("Normal", f"j{i}", "ToolPoolScaled") for i in range(3)]
        assert desired_gauge("j0") == 1
        assert set(loop.scalers) == {"uid-j0", "uid-j1", "uid-j2"}
        history = loop.scalers["uid-j0"].state

        await loop.tick(session)  # nothing changed: nothing written, the history grows
        assert len(kube.applied) == len(kube.scaled) == len(events) == 3
        assert loop.scalers["uid-j0"].state != history

        del jobs[("n", "j0")]
        await loop.tick(session)
        assert set(loop.scalers) == {"uid-j1", "uid-j2"}
        assert desired_gauge("j0") is None

        jobs[("n", "j0")] = [job(name="j0", uid="uid-new")]  # same name, a new job: a fresh history
        await loop.tick(session)
        fresh, old = loop.scalers["uid-new"].state, loop.scalers["uid-j1"].state
        assert (len(fresh.samples), len(old.samples)) == (1, 4)
        assert len(kube.applied) == 4


async def test_jobs_are_read_concurrently_within_the_bound(autoscaler, kube, events):
    kube.apply_delay = 0.2
    jobs = {("n", f"j{i}"): [job(name=f"j{i}")] for i in range(6)}
    loop = autoscaler(jobs, {key: [deployment(0)] for key in jobs}, concurrency=3)
    async with aiohttp.ClientSession() as session:
        await loop.tick(session)
    assert kube.peak == 3
    assert len(kube.applied) == 6


async def test_skips_jobs_it_must_not_size_and_survives_a_bad_one(autoscaler, kube, events):
    broken = job(name="broken", toolPool={"replicas": {"min": 5, "max": 2}})
    unparsed = job(name="unparsed", toolPool={"replicas": {"min": 0, "max": 2}})  # a stored job of no CRD
    jobs = {
        ("n", "unparsed"): [unparsed],
        ("n", "suspended"): [job(name="suspended", suspend=True)],
        ("n", "done"): [job(name="done", phase="Succeeded")],
        ("n", "no-pool-yet"): [job(name="no-pool-yet")],
        ("n", "broken"): [broken],
        ("n", "ok"): [job(name="ok")],
    }
    pools = {key: [deployment(0)] for key in jobs if key[1] != "no-pool-yet"}
    async with aiohttp.ClientSession() as session:
        await autoscaler(jobs, pools).tick(session)
    assert [name for name, _, _ in kube.applied] == ["ok"]
    assert [name for name, _, _ in kube.scaled] == ["ok-tools"]


async def test_holds_with_unreadable_metrics_writing_and_warning_once(autoscaler, kube, events):
    jobs = {("n", "j"): [job()]}
    loop = autoscaler(jobs, {("n", "j"): [deployment(2)]})  # no pod ready
    async with aiohttp.ClientSession() as session:
        await loop.tick(session)
        await loop.tick(session)
    [(_, status, _)] = kube.applied
    assert status["toolPool"] == {"desiredReplicas": 2}  # held at the current size
    assert kube.scaled == []
    [cond] = status["conditions"]
    assert cond["status"] == "False" and "none of the pool's 2 pods is ready" in cond["message"]
    assert events == [], "a hold shorter than a scrape or two is in the condition, not a Warning"


async def test_a_hold_keeps_the_deployments_size_which_the_loop_writes_itself(autoscaler, kube, events):
    """The Deployment's size is the last decision (or a size the sync set, 0 for a suspended job, a
    clamp to edited bounds): the hold keeps it, whatever the status last reported."""
    written = job()
    written["status"]["toolPool"] = {"desiredReplicas": 3}  # the report before the sync set 2
    loop = autoscaler({("n", "j"): [written]}, {("n", "j"): [deployment(2)]})
    async with aiohttp.ClientSession() as session:
        await loop.tick(session)
    [(_, status, _)] = kube.applied
    assert status["toolPool"] == {"desiredReplicas": 2} and kube.scaled == []
    assert "none of the pool's 2 pods is ready" in status["conditions"][0]["message"]


async def test_the_size_is_compared_with_the_deployment_not_with_the_report(autoscaler, kube, events):
    """The status already reports 1 (an earlier decision), the Deployment shows 0 (a resumed job's
    pool, or someone's scale): the loop sizes the Deployment, and the report stays as it is."""
    cond = scale_loop.condition(True, "", None, "T0", 1)
    reported = job()
    reported["status"].update({"toolPool": {"desiredReplicas": 1}, "conditions": [cond]})
    loop = autoscaler({("n", "j"): [reported]}, {("n", "j"): [deployment(0)]})
    async with aiohttp.ClientSession() as session:
        await loop.tick(session)
    assert kube.scaled == [("j-tools", 1, AUTOSCALER_FIELD_MANAGER)]
    assert kube.applied == [] and events == [("Normal", "j", "ToolPoolScaled")]


async def test_a_hold_that_lasts_is_warned_of_once(autoscaler, kube, events, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(scale_loop.time, "monotonic", lambda: clock[0])
    pool = deployment(2)  # and none of its pods ready: the size holds
    loop = autoscaler({("n", "j"): [job()]}, {("n", "j"): [pool]})
    async with aiohttp.ClientSession() as session:
        await loop.tick(session)
        clock[0] += scale_loop.HOLDING_WARNING_AFTER_SECONDS - 1
        await loop.tick(session)
        assert events == []
        clock[0] += 1
        await loop.tick(session)
        clock[0] += 600
        await loop.tick(session)
        assert events == [("Warning", "j", "AutoscalerHolding")]
        pool["spec"]["replicas"] = 0  # readable (no pod: load 0)
        await loop.tick(session)
        assert loop.scalers["uid-j"].holding_since is None, "the hold ended"
        pool["spec"]["replicas"] = 2  # the next hold is a new one
        await loop.tick(session)
        clock[0] += scale_loop.HOLDING_WARNING_AFTER_SECONDS
        await loop.tick(session)
    warnings = [e for e in events if e[0] == "Warning"]
    assert warnings == [("Warning", "j", "AutoscalerHolding")] * 2


async def test_restart_remembers_what_the_status_already_says(autoscaler, kube, events, idle):
    cond = scale_loop.condition(True, "", None, "T0", 1)
    written = job()
    written["status"].update({"toolPool": {"desiredReplicas": 1}, "conditions": [cond]})
    async with aiohttp.ClientSession() as session:
        loop = autoscaler({("n", "j"): [written]}, {("n", "j"): [deployment(1)]})
        await loop.tick(session)
    assert kube.applied == kube.scaled == events == []


async def test_startup_starts_one_ticking_loop_and_cleanup_stops_it(monkeypatch):
    """The start-up handler keeps the runtime in kopf's memo and starts the reconciler and this loop;
    the clean-up handler ends both."""
    ticks: list[float] = []

    async def counting_tick(self, session):
        ticks.append(time.monotonic())

    monkeypatch.setattr(scale_loop.Autoscaler, "tick", counting_tick)
    monkeypatch.setattr(handlers, "load_api_client", lambda connections: None)
    monkeypatch.setenv("TOOLRL_AUTOSCALER_INTERVAL_SECONDS", "0.05")
    memo = kopf.Memo()
    await handlers.start(memo=memo, jobs={}, rayjobs={}, deployments={})
    while len(ticks) < 3:
        await asyncio.sleep(0.01)
    work = list(memo.runtime.work)  # no leader election configured: the work starts at once
    await handlers.stop(memo=memo)
    assert [task.cancelled() for task in work] == [True, True] and not memo.runtime.work


async def test_a_new_generation_is_acknowledged_in_the_condition(autoscaler, kube, events, idle):
    """AutoscalerHealthy carries observedGeneration like the operator's conditions; a spec change
    re-publishes it even when the health did not change."""
    cond = scale_loop.condition(True, "", None, "T0", 1)
    edited = job()
    edited["metadata"]["generation"] = 2
    edited["status"].update({"toolPool": {"desiredReplicas": 1}, "conditions": [cond]})
    async with aiohttp.ClientSession() as session:
        loop = autoscaler({("n", "j"): [edited]}, {("n", "j"): [deployment(1)]})
        await loop.tick(session)
    [(_, status, _)] = kube.applied
    [written] = status["conditions"]
    assert (written["observedGeneration"], written["lastTransitionTime"]) == (2, "T0")


async def test_the_pods_come_from_the_pod_watch_and_each_spec_is_parsed_once_per_version(
    autoscaler, kube, events, monkeypatch
):
    """Without Prometheus the loop scrapes the ready pods the reconciler's pod watch saw (a listing
    of every pool pod and Ray head per tick was ~9 MB of JSON at 1000 jobs); a job's spec is parsed
    again only when its resourceVersion moves (1000 parses were 0.2-0.4 s of every tick)."""
    parsed: list[str] = []
    real_parse = scale_loop.parse_job
    monkeypatch.setattr(
        scale_loop, "parse_job", lambda body: parsed.append(body["metadata"]["name"]) or real_parse(body)
    )
    asked: list[tuple[str, str]] = []

    def pods(key):
        asked.append(key)
        return [], []

    jobs = {("n", f"j{i}"): [job(name=f"j{i}")] for i in range(2)}
    for i, key in enumerate(jobs):
        jobs[key][0]["metadata"]["resourceVersion"] = str(10 + i)
    loop = autoscaler(jobs, {key: [deployment(2)] for key in jobs}, pods=pods)
    async with aiohttp.ClientSession() as session:
        await loop.tick(session)
        await loop.tick(session)
        assert sorted(asked) == sorted([*jobs, *jobs]) and kube.requested == []
        assert sorted(parsed) == ["j0", "j1"], "parsed once while the resourceVersion holds"
        messages = {status["conditions"][0]["message"] for _, status, _ in kube.applied}
        assert messages == {
            "holding the pool's size: none of the pool's 2 pods is ready to read the load from"
        }
        jobs[("n", "j1")][0]["metadata"]["resourceVersion"] = "99"  # the job changed
        await loop.tick(session)
    assert sorted(parsed) == ["j0", "j1", "j1"]


async def test_the_stable_window_is_the_operators_setting(autoscaler, monkeypatch):
    from toolrl_operator import scale_decision
    from toolrl_operator.settings import SettingsError

    assert Settings.from_env({}).autoscaler_stable_window_seconds == 60.0
    env = {"TOOLRL_AUTOSCALER_STABLE_WINDOW_SECONDS": "20"}
    assert Settings.from_env(env).autoscaler_stable_window_seconds == 20.0
    for bad in ("0", "5", "soon"):  # not a number of seconds, or shorter than the panic window (6 s)
        with pytest.raises(SettingsError, match="TOOLRL_AUTOSCALER_STABLE_WINDOW_SECONDS"):
            Settings.from_env({"TOOLRL_AUTOSCALER_STABLE_WINDOW_SECONDS": bad})

    policies: list[scale_decision.Policy] = []
    decide = scale_decision.decide
    monkeypatch.setattr(
        scale_decision, "decide", lambda policy, *args: policies.append(policy) or decide(policy, *args)
    )
    loop = autoscaler({("n", "j"): [job()]}, {("n", "j"): [deployment(0)]}, Settings.from_env(env))
    async with aiohttp.ClientSession() as session:
        await loop.tick(session)
    assert [p.stable_window_seconds for p in policies] == [20.0]
    assert policies[0].scale_down_delay_seconds == 60  # the job's own settings still come from its spec


async def test_a_size_that_cannot_be_written_is_said_once_per_streak_and_retried(
    autoscaler, kube, events, idle
):
    """A refused scale write (here the operator's ServiceAccount without the deployments/scale grant)
    leaves the size where it is: the condition says why (ScaleFailed), one Warning per streak, and the
    next tick tries again; once a write goes through, the condition is healthy again."""
    refusals = [ApiError(403, "Forbidden", 'deployments.apps "j-tools" is forbidden: cannot patch scale')]

    def apply_scale(*args):
        if refusals:
            raise refusals[0]
        return FakeKube.apply_scale(kube, *args)

    kube.apply_scale = apply_scale  # type: ignore[method-assign]
    jobs = {("n", "j"): [job()]}
    pools = {("n", "j"): [deployment(0)]}
    loop = autoscaler(jobs, pools)
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            await loop.tick(session)
        [cond] = kube.applied[-1][1]["conditions"]
        assert (cond["status"], cond["reason"]) == ("False", "ScaleFailed"), cond
        assert cond["message"].startswith("cannot size the pool 0 -> 1: 403 Forbidden"), cond
        assert events == [("Warning", "j", "AutoscalerScaleFailed")], "one Warning for the streak"
        assert kube.scaled == []
        refusals.clear()
        await loop.tick(session)
        assert kube.scaled == [("j-tools", 1, AUTOSCALER_FIELD_MANAGER)]
        [cond] = kube.applied[-1][1]["conditions"]
        assert (cond["status"], cond["reason"]) == ("True", "MetricsAvailable"), cond
        assert events[-1] == ("Normal", "j", "ToolPoolScaled")
