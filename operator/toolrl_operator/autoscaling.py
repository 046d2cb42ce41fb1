"""The native tool-pool autoscaler: one async kopf daemon per ToolRLJob.

Every few seconds it reads the pool's load and the trainer's phase (signals), asks the pure
decision function (autoscaler) for a size, and writes it to `status.toolPool.desiredReplicas`;
the reconcile handlers make the Deployment follow. Each change of size is an Event with the
inputs; while the metrics cannot be trusted the size holds and the `AutoscalerHealthy`
condition says why. A daemon, not a timer: kopf logs every timer run, and the operator posts
its logs as Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from typing import Any

import aiohttp
import kopf
from prometheus_client import Counter, Gauge

from . import autoscaler, signals
from .apply import ApiError
from .handlers import plain, runtime
from .naming import API_VERSION, GROUP, KIND, PLURAL, VERSION, tool_pool_name
from .status import TERMINAL_PHASES

log = logging.getLogger(__name__)

CONDITION = "AutoscalerHealthy"
DESIRED = Gauge(
    "toolrl_autoscaler_desired_replicas",
    "Tool-pool replicas the autoscaler wants for a job.",
    ["namespace", "toolrl_job"],
)
MAX_REPLICAS = Gauge(
    "toolrl_autoscaler_max_replicas", "The job's spec.toolPool.replicas.max.", ["namespace", "toolrl_job"]
)
DECISIONS = Counter("toolrl_autoscaler_decisions_total", "Autoscaling decisions by reason.", ["reason"])


def native(job: dict[str, Any]) -> bool:
    """Whether the operator itself should size this job's pool right now."""
    spec, status = job.get("spec", {}), job.get("status") or {}
    return (
        spec.get("toolPool", {}).get("autoscaler", "native") == "native"
        and not spec.get("suspend")
        and status.get("phase") not in TERMINAL_PHASES
        and not job["metadata"].get("deletionTimestamp")
    )


def condition(healthy: bool, problem: str, previous: dict[str, Any] | None, now: str) -> dict[str, Any]:
    """The AutoscalerHealthy condition (metav1.Condition shape)."""
    status = "True" if healthy else "False"
    return {
        "type": CONDITION,
        "status": status,
        "lastTransitionTime": previous["lastTransitionTime"]
        if previous and previous.get("status") == status
        else now,
        "reason": "MetricsAvailable" if healthy else "MetricsUnavailable",
        "message": "the autoscaler reads the pool's load"
        if healthy
        else f"holding the pool's size: {problem}",
    }


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def autoscale(
    stopped: kopf.DaemonStopped, namespace: str, name: str, body: kopf.Body, **_: Any
) -> None:
    """Size the job's pool until the job is deleted or the operator stops."""
    scaler = JobScaler(namespace, name)
    async with aiohttp.ClientSession() as session:
        while not stopped:
            try:
                await scaler.tick(session, plain(body))
            except Exception:  # one bad tick must not end the daemon; the next one retries
                log.exception("autoscaling %s/%s failed", namespace, name)
            await stopped.wait(runtime().settings.autoscaler_interval_seconds)
    for gauge in (DESIRED, MAX_REPLICAS):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)


class JobScaler:
    """What the daemon of one job remembers between ticks."""

    def __init__(self, namespace: str, name: str) -> None:
        self.namespace, self.name = namespace, name
        self.state = autoscaler.State()
        self.written: int | None = None

    async def tick(self, session: aiohttp.ClientSession, job: dict[str, Any]) -> None:
        if not native(job):
            return
        rt = runtime()
        policy = autoscaler.Policy.from_job_spec(job["spec"])
        deployment = await asyncio.to_thread(
            rt.kube.get, "apps/v1", "Deployment", self.namespace, tool_pool_name(self.name)
        )
        if deployment is None:
            return  # not created yet: the reconcile handler will
        current = int(deployment.get("spec", {}).get("replicas", 0))
        ready = int((deployment.get("status") or {}).get("readyReplicas", 0))
        reading = await self.read(session, current)
        decision = autoscaler.decide(
            policy,
            self.state,
            autoscaler.Signals(
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
        await self.publish(job, decision, current, reading)

    async def read(self, session: aiohttp.ClientSession, current: int) -> signals.Reading:
        url = runtime().settings.prometheus_url
        if url:
            return await signals.read_prometheus(session, url, self.namespace, self.name, current)
        return await signals.read_direct(session, self.list_pods, self.name, current)

    async def list_pods(self, selector: str) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        answer = await asyncio.to_thread(
            runtime().kube.request, "GET", path, query={"labelSelector": selector}
        )
        return answer.get("items", [])

    async def publish(
        self, job: dict[str, Any], decision: autoscaler.Decision, current: int, reading: signals.Reading
    ) -> None:
        """Write the size and the condition when they change; announce each change."""
        kube = runtime().kube
        status = job.get("status") or {}
        if self.written is None:
            self.written = status.get("toolPool", {}).get("desiredReplicas")
        if decision.replicas != self.written:
            await asyncio.to_thread(
                kube.patch_status,
                API_VERSION,
                KIND,
                self.namespace,
                self.name,
                {"toolPool": {"desiredReplicas": decision.replicas}},
            )
            if decision.replicas != current:
                kopf.info(job, reason="ToolPoolScaled", message=decision.message)
            self.written = decision.replicas
        healthy = reading.load is not None
        mine = next((c for c in status.get("conditions", []) if c.get("type") == CONDITION), None)
        wanted = condition(healthy, reading.problem, mine, _now())
        if mine is None or any(mine.get(k) != wanted[k] for k in ("status", "reason", "message")):
            await asyncio.to_thread(self.write_condition, wanted)
            if not healthy and (mine is None or mine.get("status") != "False"):
                kopf.warn(job, reason="AutoscalerHolding", message=decision.message)

    def write_condition(self, wanted: dict[str, Any]) -> None:
        """Replace our condition in the live list, guarded by resourceVersion so that a
        concurrent status write is never overwritten (a conflict retries on the next tick)."""
        kube = runtime().kube
        live = kube.get(API_VERSION, KIND, self.namespace, self.name)
        if live is None:
            return
        others = [c for c in (live.get("status") or {}).get("conditions", []) if c.get("type") != CONDITION]
        body = {
            "metadata": {"resourceVersion": live["metadata"]["resourceVersion"]},
            "status": {"conditions": [*others, wanted]},
        }
        path = f"/apis/{API_VERSION}/namespaces/{self.namespace}/{PLURAL}/{self.name}/status"
        try:
            kube.request("PATCH", path, body, content_type="application/merge-patch+json")
        except ApiError as err:
            if err.status not in (404, 409):
                raise


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
