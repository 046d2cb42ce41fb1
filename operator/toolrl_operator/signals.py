"""What the autoscaler observes: the tool pool's load and the trainer's rollout phase.

Two sources. With a Prometheus URL the operator asks Prometheus (which already scrapes every
pod); without one it scrapes the pool's ready pods' ``/metrics`` itself. Either way a reading
whose load cannot be trusted (Prometheus down, a pod not answering, no samples) has
``load=None`` and a ``problem`` saying why, and the autoscaler holds the pool's size. The
trainer's phase is best effort: missing, it only turns the rollout-aware part off.

Queries and parsers are pure; ``read_prometheus`` and ``read_direct`` do the I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .naming import (
    COMPONENT_TOOL_POOL,
    TOOL_POOL_METRICS_PORT,
    TRAINER_METRICS_PORT,
)

INFLIGHT = "toolrl_tool_inflight"
QUEUE_DEPTH = "toolrl_tool_queue_depth"
PHASE = "toolrl_trainer_rollout_phase"
EXPECTED_CALLS = "toolrl_trainer_expected_tool_calls"
# Series labels the chart's PodMonitors relabel from the pod labels (docs/contracts.md).
PROM_JOB_LABEL = "toolrl_job"  # from toolrl.dev/job
PROM_COMPONENT_LABEL = "toolrl_component"  # from app.kubernetes.io/component
TIMEOUT = aiohttp.ClientTimeout(total=3)


@dataclass(frozen=True)
class Reading:
    """One observation of a job's pool and trainer."""

    load: float | None  # in-flight + queued calls across the pool; None when not trustworthy
    problem: str = ""
    pods: int = 0  # pool pods the load was read from
    phase: str | None = None
    expected_calls: float | None = None


# ---- Prometheus ---------------------------------------------------------------------------------


def pool_selector(namespace: str, job: str) -> str:
    """PromQL matchers for a job's pool pods, by the pods' labels (a pod-name prefix would also
    match the pools of jobs named `<job>-tools-...`)."""
    return f'namespace="{namespace}",{PROM_JOB_LABEL}="{job}",{PROM_COMPONENT_LABEL}="{COMPONENT_TOOL_POOL}"'


def pool_load_query(namespace: str, job: str) -> str:
    """In-flight plus queued calls across the pool (also the KEDA trigger's query)."""
    sel = pool_selector(namespace, job)
    return f"sum({INFLIGHT}{{{sel}}}) + sum({QUEUE_DEPTH}{{{sel}}})"


def pool_up_query(namespace: str, job: str) -> str:
    return f"up{{{pool_selector(namespace, job)}}}"


def trainer_queries(namespace: str, job: str) -> tuple[str, str]:
    sel = f'namespace="{namespace}",{PROM_JOB_LABEL}="{job}"'
    return f"{PHASE}{{{sel}}} == 1", f"max({EXPECTED_CALLS}{{{sel}}})"


def vector(payload: Mapping[str, Any]) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of an instant-query answer; raises ValueError on an error answer."""
    if payload.get("status") != "success":
        raise ValueError(f"{payload.get('errorType', 'error')}: {payload.get('error', payload)}")
    data = payload.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"expected an instant vector, got {data.get('resultType')}")
    return [(item.get("metric", {}), float(item["value"][1])) for item in data.get("result", [])]


def pool_from_vectors(
    up: list[tuple[dict[str, str], float]], load: list[tuple[dict[str, str], float]], expected_pods: int
) -> Reading:
    """The pool's reading from the `up` and load answers; `expected_pods` is the Deployment's
    replicas (0: nothing to scrape, the load is 0)."""
    down = sorted(labels.get("pod", "?") for labels, value in up if value < 1)
    if down:
        return Reading(None, f"pool pods not answering Prometheus scrapes: {', '.join(down)}", len(up))
    if not up:
        if expected_pods == 0:
            return Reading(0.0)
        return Reading(
            None, "Prometheus has no scrape target for the pool's pods (is the PodMonitor installed?)"
        )
    if not load:
        return Reading(None, f"Prometheus has no {INFLIGHT}/{QUEUE_DEPTH} samples for the pool", len(up))
    return Reading(load[0][1], pods=len(up))


def trainer_from_vectors(
    phase: list[tuple[dict[str, str], float]], expected: list[tuple[dict[str, str], float]]
) -> tuple[str | None, float | None]:
    current = next((labels.get("phase") for labels, value in phase if value >= 1), None)
    return current, (expected[0][1] if expected else None)


async def _instant(
    session: aiohttp.ClientSession, url: str, query: str
) -> list[tuple[dict[str, str], float]]:
    async with session.get(f"{url.rstrip('/')}/api/v1/query", params={"query": query}, timeout=TIMEOUT) as r:
        return vector(await r.json(content_type=None))


async def read_prometheus(
    session: aiohttp.ClientSession, url: str, namespace: str, job: str, expected_pods: int
) -> Reading:
    """The pool's load and the trainer's phase, from Prometheus's HTTP API."""
    try:
        up, load = await asyncio.gather(
            _instant(session, url, pool_up_query(namespace, job)),
            _instant(session, url, pool_load_query(namespace, job)),
        )
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        return Reading(None, f"Prometheus at {url} did not answer: {_describe(err)}")
    reading = pool_from_vectors(up, load, expected_pods)
    try:
        phase, expected = trainer_from_vectors(
            *await asyncio.gather(*(_instant(session, url, q) for q in trainer_queries(namespace, job)))
        )
    except (aiohttp.ClientError, TimeoutError, ValueError):
        phase, expected = None, None
    return Reading(reading.load, reading.problem, reading.pods, phase, expected)


# ---- direct scraping ------------------------------------------------------------------------------


# The pods come from the operator's pod watch (reconcile.Reconciler.ready_pods): the pool's and the
# Ray head's, each as (name, IP) while Ready and not terminating, those the Service routes to. Listing
# every pool pod and Ray head of a namespace each tick cost a 1000-job burst ~9 MB of JSON every 5 s.
Target = tuple[str, str]  # (pod name, IP)


def parse_pool_metrics(text: str) -> float:
    """In-flight + queued calls from one tool_sandbox's /metrics; ValueError when absent."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (INFLIGHT, QUEUE_DEPTH):
            found[family.name] = sum(sample.value for sample in family.samples)
    missing = {INFLIGHT, QUEUE_DEPTH} - found.keys()
    if missing:
        raise ValueError(f"/metrics has no {', '.join(sorted(missing))}")
    return found[INFLIGHT] + found[QUEUE_DEPTH]


def parse_trainer_metrics(text: str) -> tuple[str | None, float | None]:
    """(phase, expected calls) from the trainer's /metrics."""
    phase, expected = None, None
    for family in text_string_to_metric_families(text):
        if family.name == PHASE:
            phase = next((s.labels.get("phase") for s in family.samples if s.value >= 1), None)
        elif family.name == EXPECTED_CALLS and family.samples:
            expected = family.samples[0].value
    return phase, expected


async def _get_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url, timeout=TIMEOUT) as response:
        response.raise_for_status()
        return await response.text()


async def scrape_pool(session: aiohttp.ClientSession, targets: list[tuple[str, str]]) -> Reading:
    """Sums the load over `targets` ((pod name, metrics URL)); any failure spoils the reading."""
    results = await asyncio.gather(*(_get_text(session, url) for _, url in targets), return_exceptions=True)
    total, failed = 0.0, []
    for (pod, _), result in zip(targets, results, strict=True):
        try:
            if isinstance(result, BaseException):
                raise result
            total += parse_pool_metrics(result)
        except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as err:
            failed.append(f"{pod} ({_describe(err)})")
    if failed:
        return Reading(None, f"pool pods not answering /metrics: {'; '.join(failed)}", len(targets))
    return Reading(total, pods=len(targets))


async def read_direct(
    session: aiohttp.ClientSession,
    pool_pods: list[Target],
    head_pods: list[Target],
    expected_pods: int,
    pool_port: int = TOOL_POOL_METRICS_PORT,
    trainer_port: int = TRAINER_METRICS_PORT,
) -> Reading:
    """The pool's load from its ready pods' /metrics, the phase from the Ray head's /metrics.
    `pool_pods` and `head_pods` are the job's ready pods; `expected_pods` is the Deployment's
    replicas (0: nothing to scrape, the load is 0)."""
    if not pool_pods and expected_pods:
        return Reading(None, f"none of the pool's {expected_pods} pods is ready to read the load from")
    targets = [(name, f"http://{ip}:{pool_port}/metrics") for name, ip in pool_pods]
    reading = await scrape_pool(session, targets)
    phase, expected = None, None
    if head_pods:
        try:
            text = await _get_text(session, f"http://{head_pods[0][1]}:{trainer_port}/metrics")
            phase, expected = parse_trainer_metrics(text)
        except Exception:  # best effort: no phase only turns the rollout-aware part off
            phase, expected = None, None
    return Reading(reading.load, reading.problem, reading.pods, phase, expected)


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
