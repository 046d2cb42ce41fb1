"""The native tool-pool autoscaler's loop (it runs; scale_decision.py decides): one loop for every ToolRLJob
the operator watches.

Every `autoscaler_interval_seconds` the loop takes the jobs and their pool Deployments from the
operator's in-memory indexes, and for each job (a bounded number at a time) reads the pool's
load and the trainer's phase (signals: from Prometheus, or scraped from the ready pool pods and Ray
head that the reconciler's pod watch last saw; nothing is listed), asks the pure decision function
(scale_decision) for a size and, where it differs from the Deployment's, writes it through the
Deployment's scale subresource as HPA does (its own field manager, which the operator's apply of the
Deployment leaves the field to: toolpool.py says who writes the size when). The decision is
reported in `status.toolPool.desiredReplicas`. Each change of size is an Event with the inputs;
while the metrics cannot be trusted the size holds and the `AutoscalerHealthy` condition says why.

One loop, not a kopf daemon or timer per job: kopf puts a finalizer on every object that has
one, so without a running operator a job (and its namespace) could never be deleted; and 200
daemons cost the operator seconds and tens of MiB in a burst of new jobs. The decision history
of each job lives here, keyed by the job's uid, and goes when the job leaves the index.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Executor
from typing import Any

import aiohttp
from prometheus_client import Counter, Gauge

from . import events, scale_decision, signals
from .apply import ApiError, Kube
from .job import Job, SpecError, parse_job
from .keda import uses_keda
from .naming import API_VERSION, AUTOSCALER_FIELD_MANAGER, KIND
from .reconcile import first
from .settings import Settings
from .status import now, pool_stopped
from .toolpool import scale_pool

log = logging.getLogger(__name__)

CONDITION = "AutoscalerHealthy"
SCALE_FAILED = "ScaleFailed"  # the condition's reason while the pool's size cannot be written
# Jobs read and decided at once: enough that pods timing out (3 s) in many pools do not stretch a
# tick much past the interval, few enough to keep a burst of new jobs cheap.
CONCURRENCY = 64
# Of them, API writes at once (the runtime's pool serves the syncs' applies too): the bound the
# autoscaler's own 8 threads gave before the operator had one pool.
API_CALLS = 8
# A hold is announced as a Warning once it lasts this long: a new pool pod waits for Prometheus's
# service discovery and first scrape (the chart's PodMonitors scrape every 15 s; seen on the local
# cluster: "no scrape target" for the first seconds of every job), a pod restart as long.
HOLDING_WARNING_AFTER_SECONDS = 60.0
DESIRED = Gauge(
    "toolrl_autoscaler_desired_replicas",
    "Tool-pool replicas the autoscaler wants for a job.",
    ["namespace", "toolrl_job"],
)
MAX_REPLICAS = Gauge(
    "toolrl_autoscaler_max_replicas", "The job's spec.toolPool.replicas.max.", ["namespace", "toolrl_job"]
)
DECISIONS = Counter("toolrl_autoscaler_decisions_total", "Autoscaling decisions by reason.", ["reason"])
Key = tuple[str, str]


def native(job: Job) -> bool:
    """Whether the operator itself should size this job's pool right now."""
    return not uses_keda(job) and not pool_stopped(job) and not job.metadata.get("deletionTimestamp")


def condition(
    healthy: bool,
    problem: str,
    previous: Mapping[str, Any] | None,
    now: str,
    generation: int,
    scale_error: str = "",
) -> dict[str, Any]:
    """The AutoscalerHealthy condition (metav1.Condition shape), for the job's `generation`; False
    while the load is unknown (the size holds) or while the pool's size cannot be written."""
    status = "True" if healthy and not scale_error else "False"
    if scale_error:
        reason, message = SCALE_FAILED, scale_error
    elif healthy:
        reason, message = "MetricsAvailable", "the autoscaler reads the pool's load"
    else:
        reason, message = "MetricsUnavailable", f"holding the pool's size: {problem}"
    return {
        "type": CONDITION,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": previous["lastTransitionTime"]
        if previous and previous.get("status") == status
        else now,
        "reason": reason,
        "message": message,
    }


# ---- the loop --------------------------------------------------------------------------------


class Autoscaler:
    """Ticks over all jobs; remembers each job's decision history by uid. `threads` runs its blocking
    API calls (handlers.Runtime); `jobs` and `deployments` are the operator's kopf indexes, and `pods`
    the ready pods of a job as the reconciler's pod watch saw them (Reconciler.ready_pods)."""

    def __init__(
        self,
        settings: Settings,
        kube: Kube,
        threads: Executor,
        jobs: Mapping[Key, Iterable[dict[str, Any]]],
        deployments: Mapping[Key, Iterable[dict[str, Any]]],
        pods: Callable[[Key], ReadyPods] = lambda key: ([], []),
        concurrency: int = CONCURRENCY,
    ) -> None:
        self.settings, self.kube, self.calls = settings, kube, ApiCalls(threads)
        self.jobs, self.deployments, self.pods = jobs, deployments, pods
        self.concurrency = concurrency
        self.scalers: dict[str, JobScaler] = {}
        # each job's typed spec by uid, with the resourceVersion it was parsed at: parsing 1000 jobs
        # took 0.2-0.4 s of every tick
        self.parsed: dict[str, tuple[str, Job]] = {}

    async def run(self) -> None:
        """Tick every `autoscaler_interval_seconds` (at once if a tick took longer) until cancelled."""
        interval = self.settings.autoscaler_interval_seconds
        connector = aiohttp.TCPConnector(limit=4 * self.concurrency)  # a few pods per pool at once
        async with aiohttp.ClientSession(connector=connector) as s:
            while True:
                started = time.monotonic()
                try:
                    await self.tick(s)
                except Exception:  # a bad tick must not end the loop; the next one retries
                    log.exception("autoscaler tick failed")
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def tick(self, session: aiohttp.ClientSession) -> None:
        """One round: forget the jobs that are gone, then size every live one."""
        live = {job["metadata"]["uid"]: job for key in list(self.jobs) for job in self.jobs.get(key, ())}
        for uid in self.scalers.keys() - live.keys():
            self.scalers.pop(uid).forget()
        for uid in self.parsed.keys() - live.keys():
            del self.parsed[uid]
        due = []
        for uid, body in live.items():
            key = (body["metadata"]["namespace"], body["metadata"]["name"])
            version = body["metadata"].get("resourceVersion", "")
            cached = self.parsed.get(uid)
            if version and cached is not None and cached[0] == version:
                job = cached[1]
            else:
                try:
                    job = parse_job(body)
                except SpecError as err:  # the sync reports it (an Event, the Reconciled condition)
                    log.debug("not autoscaling %s/%s: %s", *key, err)
                    continue
                if version:
                    self.parsed[uid] = (version, job)
            deployment = first(self.deployments.get(key))
            if native(job) and deployment is not None:  # no pool yet: the reconcile handler makes it
                due.append((uid, key, job, deployment))
        url = self.settings.prometheus_url
        bound = asyncio.Semaphore(self.concurrency)

        async def one(uid: str, key: Key, job: Job, deployment: dict[str, Any]) -> None:
            async def read(current: int) -> signals.Reading:
                if url:
                    return await signals.read_prometheus(session, url, *key, current)
                return await signals.read_direct(session, *self.pods(key), current)

            if uid not in self.scalers:
                window = self.settings.autoscaler_stable_window_seconds
                self.scalers[uid] = JobScaler(*key, self.kube, self.calls, window)
            async with bound:
                try:
                    await self.scalers[uid].tick(job, deployment, read)
                except Exception:  # one job's trouble must not stop the others
                    log.exception("autoscaling %s/%s failed", *key)

        await asyncio.gather(*(one(*item) for item in due))


Reader = Callable[[int], Awaitable[signals.Reading]]  # the job's reading, given its pool's replicas
ReadyPods = tuple[list[signals.Target], list[signals.Target]]  # a job's ready pool pods, Ray heads


class JobScaler:
    """What the loop remembers of one job between ticks."""

    def __init__(
        self, namespace: str, name: str, kube: Kube, calls: ApiCalls, stable_window_seconds: float
    ) -> None:
        self.namespace, self.name = namespace, name
        self.kube, self.calls = kube, calls
        self.stable_window_seconds = stable_window_seconds
        self.state = scale_decision.State()
        self.written: tuple[int | None, dict[str, Any] | None] | None = None  # reported: size, condition
        self.holding_since: float | None = None  # monotonic start of the current hold, if any
        self.warned = False  # the current hold's Warning is out
        self.scale_failing = False  # the last write of the pool's size failed (its Warning is out)

    def forget(self) -> None:
        for gauge in (DESIRED, MAX_REPLICAS):
            with contextlib.suppress(KeyError):
                gauge.remove(self.namespace, self.name)

    async def tick(self, job: Job, deployment: dict[str, Any], read: Reader) -> None:
        policy = scale_decision.Policy.from_job_spec(
            job.spec, stable_window_seconds=self.stable_window_seconds
        )
        current = int(deployment["spec"].get("replicas", 0))
        ready = int(deployment["status"].get("readyReplicas", 0))
        reading = await read(current)
        decision = scale_decision.decide(
            policy,
            self.state,
            scale_decision.Signals(
                now=time.monotonic(),
                current_replicas=current,
                ready_replicas=ready,
                load=reading.load,
                problem=reading.problem,
                phase=reading.phase,
                expected_calls=reading.expected_calls,
            ),
        )
        self.state = decision.state
        DESIRED.labels(self.namespace, self.name).set(decision.replicas)
        MAX_REPLICAS.labels(self.namespace, self.name).set(policy.max_replicas)
        DECISIONS.labels(decision.reason).inc()
        await self.publish(job.body, decision, current, reading)

    def last_written(self, job: Mapping[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
        """The size and condition this loop last reported in the job's status; at its first tick of
        a job (an operator restart), what the status already says. (The size itself is compared with
        the Deployment's spec.replicas, which the loop writes directly: what the pool runs, also
        after the sync set it — 0 for a suspended job, a clamp to edited bounds — or someone scaled it.)"""
        if self.written is None:
            status = job.get("status") or {}
            mine = next((c for c in status.get("conditions", []) if c.get("type") == CONDITION), None)
            desired = (status.get("toolPool") or {}).get("desiredReplicas")
            self.written = (desired if isinstance(desired, int) else None, mine)
        return self.written

    async def publish(
        self,
        job: Mapping[str, Any],
        decision: scale_decision.Decision,
        current: int,
        reading: signals.Reading,
    ) -> None:
        """Size the pool where the decision differs from its Deployment, and announce it; report the
        decision and the condition when either changes. Both are server-side applies as the
        autoscaler's own field manager: no read, no conflict with the operator's fields."""
        written_replicas, written_condition = self.last_written(job)
        healthy = reading.load is not None
        await self.warn_of_a_long_hold(job, healthy, decision.message)
        scale_error = ""
        if decision.replicas != current:
            try:
                await self.calls(scale_pool, self.kube, self.namespace, self.name, decision.replicas)
            except ApiError as err:
                if err.status == 404:
                    return  # the pool or the job is gone; the sync re-creates it, or the next tick forgets it
                # the size stays where it is; the condition and one Warning per streak say why (a
                # missing deployments/scale grant, a webhook or quota refusing it), the next tick retries
                scale_error = f"cannot size the pool {current} -> {decision.replicas}: {err}"
                if not self.scale_failing:
                    await self.announce(job, events.WARNING, events.AUTOSCALER_SCALE_FAILED, scale_error)
            else:
                await self.announce(job, events.NORMAL, events.TOOL_POOL_SCALED, decision.message)
        self.scale_failing = bool(scale_error)
        generation = int(job["metadata"].get("generation") or 1)
        wanted = condition(healthy, reading.problem, written_condition, now(), generation, scale_error)
        compared = ("status", "reason", "message", "observedGeneration")
        same_condition = written_condition is not None and all(
            written_condition.get(k) == wanted[k] for k in compared
        )
        if decision.replicas == written_replicas and same_condition:
            return
        body = {"toolPool": {"desiredReplicas": decision.replicas}, "conditions": [wanted]}
        try:
            await self.calls(
                self.kube.apply_status,
                API_VERSION,
                KIND,
                self.namespace,
                self.name,
                body,
                AUTOSCALER_FIELD_MANAGER,
            )
        except ApiError as err:
            if err.status == 404:
                return  # the job is gone; the next tick forgets it
            raise
        self.written = (decision.replicas, wanted)

    async def warn_of_a_long_hold(self, job: Mapping[str, Any], healthy: bool, message: str) -> None:
        """One Warning per hold that outlasts HOLDING_WARNING_AFTER_SECONDS. The condition says at once
        that the size holds; a new pool pod has no scrape target until Prometheus's next discovery and
        scrape, so every job used to start with a Warning that was true but meant nothing."""
        if healthy:
            self.holding_since, self.warned = None, False
            return
        if self.holding_since is None:
            self.holding_since = time.monotonic()
        if not self.warned and time.monotonic() - self.holding_since >= HOLDING_WARNING_AFTER_SECONDS:
            await self.announce(job, events.WARNING, events.AUTOSCALER_HOLDING, message)
            self.warned = True

    async def announce(self, job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an Event on the job; best effort, as kopf's own are."""
        manifest = events.event_manifest(job, type_, reason, message, dt.datetime.now(dt.UTC))
        try:
            await self.calls(self.kube.create, manifest)
        except Exception as err:
            log.warning("event %s on %s/%s not posted: %s", reason, self.namespace, self.name, err)


class ApiCalls:
    """The autoscaler's blocking API calls: on the runtime's thread pool (handlers.Runtime), API_CALLS
    at most at once, so a burst of scalers never queues ahead of the syncs' applies."""

    def __init__(self, threads: Executor, at_once: int = API_CALLS) -> None:
        self.threads, self.at_once = threads, asyncio.Semaphore(at_once)

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self.at_once:
            return await asyncio.get_running_loop().run_in_executor(self.threads, fn, *args)
