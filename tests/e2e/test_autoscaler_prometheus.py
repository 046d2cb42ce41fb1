"""The native autoscaler end to end: real tool_sandbox processes stand in for the pool's pods
(Prometheus labels them as the pods would be), a real Prometheus scrapes them, a load generator
replays bursts of tool calls, and the real operator sizes the Deployment in the real apiserver.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from harness.localcluster.cluster import free_port
from harness.operator_process import (
    OperatorProcess,
    Sampler,
    get_json,
    install_crd,
    job_events,
    small_job,
    wait_until,
)
from harness.sandbox_process import SandboxProcess
from toolrl_operator import signals

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "toolrljob.yaml"
JOB = "scale"
# The series labels the chart's PodMonitor gives a pool pod (docs/contracts.md).
POOL_LABELS = {"toolrl_job": JOB, "toolrl_component": "tool-pool"}
MIN, MAX, TARGET, DELAY = 1, 5, 10, 15
# The operator's stable window (TOOLRL_AUTOSCALER_STABLE_WINDOW_SECONDS, 60 by default): a burst's panic
# mode lasts this long after its last burst-sized reading, which came ~12 s before the burst's last answer
# here. Longer than that tail, so max is still recommended after the burst; shorter than the tail plus
# DELAY, so it is the delay, not the window, that holds the pool for DELAY after the burst (measured: the
# first drop came 23 s after the burst, so ~8 s after it without the delay).
WINDOW = 20
PODS = 3
BURST = 150  # concurrent calls, each sleeping CALL_SECONDS in the sandbox
CALL_SECONDS = 3


@pytest.fixture
def sandboxes(tmp_path: Path) -> Iterator[list[SandboxProcess]]:
    """Real tool_sandbox servers on free ports."""
    tools = [{"name": "python", "type": "python", "timeoutSeconds": 30}]
    flags = ("--workers", "1", "--capacity", "8", "--queue-size", "256")
    servers: list[SandboxProcess] = []
    try:
        for i in range(PODS):
            servers.append(SandboxProcess.start(tmp_path / f"sandbox-{i}", *flags, tools=tools))
        yield servers
    finally:
        for server in servers:
            server.stop()


class Burst(threading.Thread):
    """BURST concurrent calls in the background, spread over the pods as the Service would;
    `join()` raises if any call went unanswered. (The answer's outcome is the sandbox's business:
    only the load matters here.)"""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.failures: list[str] = []
        self.outcomes: list[str] = []

    def run(self) -> None:
        async def call(session: aiohttp.ClientSession, i: int) -> None:
            body = {"tool": "python", "input": f"import time; time.sleep({CALL_SECONDS}); print({i})"}
            try:
                async with session.post(f"{self.urls[i % len(self.urls)]}/v1/execute", json=body) as r:
                    answer = await r.json(content_type=None)
                if answer.get("status") not in ("ok", "error", "timeout", "killed", "rejected"):
                    self.failures.append(json.dumps(answer)[:300])
                self.outcomes.append(answer.get("status"))
            except (aiohttp.ClientError, TimeoutError) as err:
                self.failures.append(repr(err))

        async def run() -> None:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
                await asyncio.gather(*(call(session, i) for i in range(BURST)))

        asyncio.run(run())

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        assert not self.failures, (
            f"{len(self.failures)} of {BURST} calls unanswered, e.g. {self.failures[:3]}"
        )


def pool_size(cluster: Any, namespace: str) -> tuple[int | None, int | None]:
    """The job's desired pool size and the Deployment's replicas."""
    job = get_json(cluster, "trj", JOB, "-n", namespace)
    dep = get_json(cluster, "deployment", f"{JOB}-tools", "-n", namespace)
    desired = ((job.get("status") or {}).get("toolPool") or {}).get("desiredReplicas")
    return desired, dep["spec"].get("replicas")


def job_manifest() -> dict[str, Any]:
    job = small_job(JOB)
    job["spec"]["toolPool"].update(
        replicas={"min": MIN, "max": MAX},
        targetConcurrencyPerReplica=TARGET,
        scaleDownDelaySeconds=DELAY,
        rolloutAware=False,
    )
    return job


def desired(cluster: Any, namespace: str) -> int | None:
    job = get_json(cluster, "trj", JOB, "-n", namespace)
    return ((job.get("status") or {}).get("toolPool") or {}).get("desiredReplicas")


def autoscaler_condition(cluster: Any, namespace: str) -> dict[str, Any] | None:
    job = get_json(cluster, "trj", JOB, "-n", namespace)
    conditions = (job.get("status") or {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "AutoscalerHealthy"), None)


def scale_events(cluster: Any, namespace: str) -> list[str]:
    return [e["message"] for e in job_events(cluster, namespace, JOB, "ToolPoolScaled")]


def test_bursts_scale_up_in_panic_down_after_the_delay_and_hold_without_prometheus(
    cluster, namespace, prometheus, sandboxes, tmp_path
):
    pods = {f"pool-{i}": [urlsplit(s.metrics_url).netloc] for i, s in enumerate(sandboxes)}
    labels = {
        f"pool-{i}": {"namespace": namespace, "pod": f"{JOB}-tools-5d8f7-{i}", **POOL_LABELS}
        for i in range(PODS)
    }
    prom = prometheus(pods, labels)
    install_crd(cluster)
    env = {
        "TOOLRL_PROMETHEUS_URL": prom.url,
        "TOOLRL_AUTOSCALER_INTERVAL_SECONDS": "1",
        "TOOLRL_AUTOSCALER_STABLE_WINDOW_SECONDS": str(WINDOW),
    }
    with OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log", env) as op:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job_manifest()))
        healthy = wait_until(
            lambda: (c := autoscaler_condition(cluster, namespace)) and c["status"] == "True" and c,
            120,
            "the autoscaler reading the pool's load",
        )
        assert healthy["reason"] == "MetricsAvailable"
        wait_until(lambda: desired(cluster, namespace) == MIN, 60, "the pool at min while idle")

        with Sampler(lambda: pool_size(cluster, namespace)) as rec:
            # A burst: the panic window scales the pool up to max (never beyond).
            load = Burst([s.url for s in sandboxes])
            load.start()
            wait_until(lambda: desired(cluster, namespace) == MAX, 90, "scale-up to max during the burst")
            load.join()
            quiet_since = time.monotonic()
            wait_until(
                lambda: (
                    get_json(cluster, "deployment", f"{JOB}-tools", "-n", namespace)["spec"]["replicas"]
                    == MAX
                ),
                60,
                "the Deployment following desiredReplicas",
            )
            # Quiet: back to min, but only after scaleDownDelaySeconds.
            wait_until(lambda: desired(cluster, namespace) == MIN, 300, "scale-down to min after the burst")

            # Another burst, and Prometheus stops while the pool is at max: the size holds.
            load = Burst([s.url for s in sandboxes])
            load.start()
            wait_until(lambda: desired(cluster, namespace) == MAX, 90, "scale-up for the second burst")
            prom.stop()
            held = wait_until(
                lambda: (c := autoscaler_condition(cluster, namespace)) and c["status"] == "False" and c,
                60,
                "the AutoscalerHealthy condition turning False",
            )
            load.join()
            hold_start = time.monotonic()
            while time.monotonic() - hold_start < DELAY + 10:
                assert desired(cluster, namespace) == MAX
                time.sleep(1)
            metrics = op.metrics()

    assert held["reason"] == "MetricsUnavailable" and "Prometheus" in held["message"]
    assert 'toolrl_autoscaler_decisions_total{reason="metrics-unavailable"}' in metrics
    assert (
        f'toolrl_autoscaler_desired_replicas{{namespace="{namespace}",toolrl_job="{JOB}"}} {MAX}.0' in metrics
    )
    assert f'toolrl_autoscaler_max_replicas{{namespace="{namespace}",toolrl_job="{JOB}"}} {MAX}.0' in metrics

    sizes = [(t, d, r) for t, (d, r) in rec.samples if d is not None]
    assert all(d <= MAX and (r or 0) <= MAX for _, d, r in sizes), "never beyond max"
    first_drop = next(t for t, d, _ in sizes if t > quiet_since and d < MAX)
    assert first_drop - quiet_since >= DELAY, "no scale-down before scaleDownDelaySeconds"

    messages = scale_events(cluster, namespace)
    ups = [m for m in messages if "(panic)" in m]
    assert ups, f"no scale-up by the panic window among {messages}"
    assert all("load now" in m and f"target {TARGET}/replica" in m for m in messages)
    assert len(messages) <= 12, f"too many scale events (flapping?): {messages}"


def read_prometheus(url: str, namespace: str, pods: int) -> Any:
    async def run() -> Any:
        async with aiohttp.ClientSession() as session:
            return await signals.read_prometheus(session, url, namespace, JOB, pods)

    return asyncio.run(run())


def scrape_directly(urls: list[str]) -> Any:
    """The pool's load from each of the /metrics `urls`, as the autoscaler reads pods without Prometheus."""

    async def run() -> Any:
        async with aiohttp.ClientSession() as session:
            return await signals.scrape_pool(session, [(f"pod-{i}", url) for i, url in enumerate(urls)])

    return asyncio.run(run())


def test_signals_from_real_prometheus_and_real_pods(prometheus, sandboxes):
    """The operator's queries against a real Prometheus scraping real tool_sandbox processes."""
    namespace = "rl"
    pods = {f"pool-{i}": [urlsplit(s.metrics_url).netloc] for i, s in enumerate(sandboxes)}
    labels = {
        f"pool-{i}": {"namespace": namespace, "pod": f"{JOB}-tools-5d8f7-{i}", **POOL_LABELS}
        for i in range(PODS)
    }
    prom = prometheus(pods, labels)
    wait_until(prom.targets_up, 30, "Prometheus scraping the pool")
    idle = wait_until(
        lambda: (r := read_prometheus(prom.url, namespace, PODS)).load is not None and r, 30, "a reading"
    )
    assert (idle.load, idle.pods) == (0.0, PODS)

    load = Burst([s.url for s in sandboxes])
    load.start()
    busy = wait_until(
        lambda: (r := read_prometheus(prom.url, namespace, PODS)).load and r.load >= 100 and r,
        60,
        "Prometheus seeing the burst",
    )
    direct = wait_until(
        lambda: (r := scrape_directly([s.metrics_url for s in sandboxes])).load and r,
        30,
        "the pods' own /metrics",
    )
    load.join()
    assert busy.pods == PODS and busy.load <= BURST
    assert direct.pods == PODS and 0 < direct.load <= BURST
    wait_until(lambda: read_prometheus(prom.url, namespace, PODS).load == 0, 30, "the load back to 0")
    assert scrape_directly([s.metrics_url for s in sandboxes]).load == 0

    # Another namespace's pool is not this one's.
    assert read_prometheus(prom.url, "elsewhere", 0).load == 0.0
    assert read_prometheus(prom.url, "elsewhere", 2).load is None

    # A pod that does not answer spoils the reading: hold, naming the pod.
    dead = f"127.0.0.1:{free_port()}"
    broken = prometheus(
        {**pods, "dead": [dead]},
        {**labels, "dead": {"namespace": namespace, "pod": f"{JOB}-tools-5d8f7-x", **POOL_LABELS}},
    )
    r = wait_until(
        lambda: "5d8f7-x" in (r := read_prometheus(broken.url, namespace, PODS + 1)).problem and r,
        30,
        "the dead pod seen",
    )
    assert r.load is None and f"{JOB}-tools-5d8f7-x" in r.problem
    assert scrape_directly([*(s.metrics_url for s in sandboxes), f"http://{dead}/metrics"]).load is None

    # Prometheus itself gone: hold, saying so.
    prom.stop()
    gone = read_prometheus(prom.url, namespace, PODS)
    assert gone.load is None and prom.url in gone.problem
