"""The rollout-aware autoscaler end to end: the pool is sized from the trainer's rollout phase,
ahead of any load.

A stand-in for the Ray head's trainer metrics endpoint serves trainer_entry's own
`TrainerMetrics` (so the exposition has exactly the real trainer's names and labels), set up as
trainer_entry's metrics hub sets it up, on 127.0.0.1. A real Prometheus scrapes it and a real,
idle tool_sandbox per job, labelling the series as the chart's PodMonitors label the Ray head
(`toolrl_component="trainer"`) and the pool pods (`"tool-pool"`). The real operator runs two jobs
that see the same trainer signals: one with `toolPool.rolloutAware: true`, which pre-scales its
pool when the trainer starts generating, returns to min in a training phase once it knows how
long training takes, and pre-warms shortly before the next generation; and one with
`rolloutAware: false`, whose pool stays at min, as nothing ever calls a tool.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import requests
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
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families
from toolrl_operator import scale_decision, signals
from trainer_entry.metrics import VERL_REWARD_MEAN, VERL_STEP_SECONDS, VERL_TOOL_CALL_COUNTS, TrainerMetrics

AWARE, PLAIN = "prescale", "reactive"  # rolloutAware true / false
MIN, MAX, TARGET, DELAY = 1, 6, 10, 60
# The job's batch: 8 prompts x 4 rollouts, one tool turn, up to 2 parallel calls. The trainer
# expects trajectories x calls per trajectory (seeded with maxToolTurns); the operator caps the
# burst at what can be in flight at once (8 x 4 x 2 = 64).
BATCH, ROLLOUTS, TURNS, PARALLEL = 8, 4, 1, 2
TRAJECTORIES = BATCH * ROLLOUTS
FIRST_EXPECTED = TRAJECTORIES * TURNS  # 32 calls: 4 replicas
CALLS_PER_TRAJECTORY = 1.5  # what the first step then reports
SECOND_EXPECTED = TRAJECTORIES * CALLS_PER_TRAJECTORY  # 48 calls: 5 replicas
FIRST_BURST, SECOND_BURST = math.ceil(FIRST_EXPECTED / TARGET), math.ceil(SECOND_EXPECTED / TARGET)
# Training lasts this long; the operator pre-warms `prewarm_seconds` (30) before it is due to end,
# so in the second training phase the pool sits at min for about TRAINING - 30 seconds (measured: from
# ~2 s into the phase for ~16 s). TRAINING is shorter than DELAY: a return to min within TRAINING is no
# scale-down delay's.
TRAINING = 45.0


class StandInTrainer:
    """The Ray head's /metrics, not yet listening until `start()`: trainer_entry's TrainerMetrics,
    seeded and put in its first generation phase as the metrics hub does (`MetricsHub`,
    `start_hub`), then driven through phases as the trainer's hooks drive it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.metrics = TrainerMetrics(trajectories_per_step=TRAJECTORIES)
        self.metrics.set_expected_calls_per_trajectory(float(TURNS))
        self.server: Any = None
        self.phases: list[tuple[float, str]] = []  # (monotonic time, phase) as set here

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.phase("generating")
        self.server, _ = start_http_server(self.port, addr="127.0.0.1", registry=self.metrics.registry)

    def phase(self, name: str) -> None:
        self.metrics.set_phase(name)
        self.phases.append((time.monotonic(), name))

    def step(self, step: int) -> None:
        """verl's tracking of one finished step, as the trainer's backend passes it on."""
        self.metrics.record_step(
            {
                VERL_STEP_SECONDS: TRAINING,
                VERL_REWARD_MEAN: 0.25,
                VERL_TOOL_CALL_COUNTS: CALLS_PER_TRAJECTORY,
            },
            step,
        )

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def job_manifest(name: str, rollout_aware: bool) -> dict[str, Any]:
    job = small_job(name)
    spec = job["spec"]
    spec["algorithm"].update(trainBatchSize=BATCH, rolloutsPerPrompt=ROLLOUTS)
    spec["rollout"].update(maxToolTurns=TURNS, maxParallelCalls=PARALLEL)
    spec["toolPool"].update(
        replicas={"min": MIN, "max": MAX},
        targetConcurrencyPerReplica=TARGET,
        scaleDownDelaySeconds=DELAY,
        rolloutAware=rollout_aware,
    )
    return job


def sizes(cluster: Any, namespace: str) -> dict[str, dict[str, Any]]:
    """Per job: its desiredReplicas, AutoscalerHealthy condition and its pool's spec.replicas."""
    listed = get_json(cluster, "toolrljobs,deployments", "-n", namespace)
    out: dict[str, dict[str, Any]] = {AWARE: {}, PLAIN: {}}
    for item in listed["items"]:
        name = item["metadata"]["name"]
        if item["kind"] == "ToolRLJob" and name in out:
            status = item.get("status") or {}
            out[name]["desired"] = (status.get("toolPool") or {}).get("desiredReplicas")
            out[name]["healthy"] = next(
                (c for c in status.get("conditions", []) if c["type"] == "AutoscalerHealthy"), None
            )
        elif item["kind"] == "Deployment" and name.removesuffix("-tools") in out:
            out[name.removesuffix("-tools")]["replicas"] = item["spec"].get("replicas")
    return out


def read_prometheus(url: str, namespace: str, job: str) -> signals.Reading:
    async def run() -> signals.Reading:
        async with aiohttp.ClientSession() as session:
            return await signals.read_prometheus(session, url, namespace, job, MIN)

    return asyncio.run(run())


def sees(url: str, namespace: str, job: str, phase: str, expected: float) -> signals.Reading:
    """Wait until the operator's Prometheus queries for `job` give this phase, these expected calls
    and an idle pool (each scrape job's series catch up within a scrape interval or two)."""

    def probe() -> signals.Reading | None:
        r = read_prometheus(url, namespace, job)
        return r if (r.phase, r.expected_calls, r.load) == (phase, expected, 0.0) else None

    return wait_until(probe, 30, f"Prometheus giving {job}: phase {phase}, {expected:g} calls, load 0")


def tool_calls(metrics_url: str) -> float:
    """Tool calls a tool_sandbox has answered, from its own /metrics."""
    text = requests.get(metrics_url, timeout=5).text
    families = text_string_to_metric_families(text)
    return sum(s.value for f in families for s in f.samples if s.name == "toolrl_tool_calls_total")


def scale_events(cluster: Any, namespace: str, job: str) -> list[str]:
    return [e["message"] for e in job_events(cluster, namespace, job, "ToolPoolScaled")]


def test_rollout_aware_pool_prescales_for_generation_and_idles_in_training(
    cluster, namespace, prometheus, tmp_path: Path
):
    tools = [{"name": "python", "type": "python", "timeoutSeconds": 30}]
    trainer = StandInTrainer()
    pools: dict[str, SandboxProcess] = {}
    try:
        for job in (AWARE, PLAIN):
            # never called, only scraped: one worker starts in half the CPU time of the default two
            pools[job] = SandboxProcess.start(tmp_path / f"sandbox-{job}", "--workers", "1", tools=tools)
        targets, labels = {}, {}
        for job in (AWARE, PLAIN):
            targets[f"pool-{job}"] = [urlsplit(pools[job].metrics_url).netloc]
            labels[f"pool-{job}"] = {
                "namespace": namespace,
                "pod": f"{job}-tools-6c9f4-0",
                "toolrl_job": job,
                "toolrl_component": "tool-pool",
            }
            # The Ray head as the chart's trainer PodMonitor labels it; both jobs see one trainer.
            targets[f"trainer-{job}"] = [trainer.target]
            labels[f"trainer-{job}"] = {
                "namespace": namespace,
                "pod": f"{job}-k7x2q-head-9bz4m",
                "toolrl_job": job,
                "toolrl_component": "trainer",
            }
        prom = prometheus(targets, labels)
        install_crd(cluster)
        env = {"TOOLRL_PROMETHEUS_URL": prom.url, "TOOLRL_AUTOSCALER_INTERVAL_SECONDS": "1"}
        with OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log", env) as op:
            for job, aware in ((AWARE, True), (PLAIN, False)):
                manifest = json.dumps(job_manifest(job, aware))
                cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)

            # The Ray head is not serving yet: both pools idle at min, the autoscaler healthy.
            def settled() -> dict[str, dict[str, Any]] | None:
                now = sizes(cluster, namespace)
                ok = all(
                    s.get("desired") == MIN
                    and s.get("replicas") == MIN
                    and (s.get("healthy") or {}).get("status") == "True"
                    for s in now.values()
                )
                return now if ok else None

            before = wait_until(settled, 120, "both pools at min with AutoscalerHealthy True")
            transition = before[AWARE]["healthy"]["lastTransitionTime"]
            assert read_prometheus(prom.url, namespace, AWARE).phase is None

            def reaches(size: int, seconds: float, why: str, deployment_seconds: float = 60) -> None:
                """The rollout-aware job's desiredReplicas, then its Deployment, reach `size`."""
                for field, deadline in (("desired", seconds), ("replicas", deployment_seconds)):
                    wait_until(
                        lambda f=field: sizes(cluster, namespace)[AWARE].get(f) == size,
                        deadline,
                        f"{field} {size}: {why}",
                    )

            with Sampler(lambda: sizes(cluster, namespace), interval=0.2) as rec:
                # The trainer starts its first generation: the rollout-aware pool is pre-scaled for
                # the expected calls while the pool is still idle.
                trainer.start()
                reaches(FIRST_BURST, 60, f"the pre-scale for {FIRST_EXPECTED} expected calls")
                # The other job reads the very same signals from Prometheus (and an idle pool).
                for job in (AWARE, PLAIN):
                    sees(prom.url, namespace, job, "generating", FIRST_EXPECTED)

                # Scoring, then the first training phase: its length is not known yet, so the pool holds.
                trainer.phase("scoring")
                time.sleep(2)
                trainer.phase("training")
                training_1 = time.monotonic()
                time.sleep(TRAINING)

                # The first step is logged and the second generation expects more calls.
                trainer.step(1)
                trainer.phase("generating")
                generating_2 = time.monotonic()
                reaches(SECOND_BURST, 60, f"the second pre-scale for {SECOND_EXPECTED:g} expected calls")
                sees(prom.url, namespace, PLAIN, "generating", SECOND_EXPECTED)

                # The second training phase: back to min at once (no scale-down delay) ...
                trainer.phase("scoring")
                time.sleep(2)
                trainer.phase("training")
                training_2 = time.monotonic()
                reaches(MIN, TRAINING, "back to min while the trainer trains", TRAINING)
                # ... and pre-warmed for the next generation while the trainer still reports training.
                reaches(SECOND_BURST, 2 * TRAINING, "pre-warmed before the next generation")
                prewarmed = time.monotonic()
                assert trainer.phases[-1][1] == "training"
                assert read_prometheus(prom.url, namespace, AWARE).phase == "training"
                time.sleep(3)  # a few more samples of the other job
            metrics = op.metrics()
            final = sizes(cluster, namespace)
            aware_events = scale_events(cluster, namespace, AWARE)
            plain_events = scale_events(cluster, namespace, PLAIN)
            calls = {job: tool_calls(pool.metrics_url) for job, pool in pools.items()}
    finally:
        trainer.stop()
        for pool in pools.values():
            pool.stop()

    # The pools stayed idle: no load could have caused any of this.
    assert calls == {AWARE: 0, PLAIN: 0}
    assert all("load now 0," in m for m in aware_events), aware_events
    samples = [s for _, s in rec.samples]
    assert len(samples) > 100, f"only {len(samples)} samples"

    # The rollout-unaware job, same signals: never moved off min.
    assert all(s[PLAIN].get("desired") == MIN and s[PLAIN].get("replicas") == MIN for s in samples), [
        (s[PLAIN].get("desired"), s[PLAIN].get("replicas")) for s in samples
    ]
    assert plain_events == []
    # The first training phase, not yet timed, held the pre-scaled pool.
    held = rec.between(training_1 + 5, generating_2)
    assert held and all(s[AWARE]["desired"] >= FIRST_BURST for s in held)
    # Within the second training phase the pool was at min before it was pre-warmed.
    second = [s[AWARE]["desired"] for s in rec.between(training_2, prewarmed)]
    assert MIN in second, second
    assert all(d <= MAX for s in samples for d in (s[AWARE]["desired"], s[AWARE]["replicas"]))

    # AutoscalerHealthy stayed True throughout, for both jobs.
    for job in (AWARE, PLAIN):
        assert all((s[job].get("healthy") or {}).get("status") == "True" for s in samples), job
        assert final[job]["healthy"]["reason"] == "MetricsAvailable"
    assert final[AWARE]["healthy"]["lastTransitionTime"] == transition

    reasons = [m.split("(", 1)[1].split(")", 1)[0] for m in aware_events if "(" in m]
    for reason in scale_decision.ROLLOUT_AWARE:
        assert reason in reasons, f"no ({reason}) scale event among {aware_events}"
    for reason in scale_decision.ROLLOUT_AWARE:
        assert f'toolrl_autoscaler_decisions_total{{reason="{reason}"}}' in metrics
    assert (
        f'toolrl_autoscaler_desired_replicas{{namespace="{namespace}",toolrl_job="{AWARE}"}} '
        f"{SECOND_BURST}.0" in metrics
    )
    assert f'toolrl_autoscaler_desired_replicas{{namespace="{namespace}",toolrl_job="{PLAIN}"}} {MIN}.0' in (
        metrics
    )
