"""The dashboard against real data: a real Prometheus scrapes a real tool_sandbox server under
load, the real operator reconciling jobs on the local control plane, and the trainer's metrics
exporter fed by those same tool calls. Every panel query, with the dashboard's variables filled
in, must parse and return numbers; the variables must list the job; the chart's alert rules must
load and evaluate against these series without errors."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartgen.dashboard import DASHBOARD, substitute
from chartgen.helm import chart_with_stub_dependencies, template
from harness import REPO
from harness.localcluster.build import KUBERNETES
from harness.localcluster.cluster import free_port
from harness.localcluster.prometheus import Prometheus
from harness.operator_process import OperatorProcess, drop_finalizers, install_crd, small_job, wait_until
from harness.sandbox_process import SandboxProcess
from trainer_entry.metrics import TrainerMetrics

JOB = "dash"
EXAMPLE = REPO / "examples" / "toolrljob.yaml"
RATE_INTERVAL = "30s"  # Grafana's $__rate_interval for a 1s scrape on a short range is smaller
# Code that makes each outcome the dashboard shows: ok, error, timeout and a truncated output.
CALLS = {
    "ok": "print(sum(range(1000)))",
    "error": "raise ValueError('boom')",
    "timeout": "import time\ntime.sleep(30)",
    "truncated": "print('x' * 100000)",
}


def _post(url: str, body: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.load(resp)


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[SandboxProcess]:
    """A real tool_sandbox server with one python tool (short timeout, small output cap)."""
    tool = {"name": "python", "type": "python", "timeoutSeconds": 2, "maxOutputBytes": 256}
    args = ("--workers", "1", "--capacity", "4", "--queue-size", "64")
    with SandboxProcess.start(tmp_path / "sandbox", *args, tools=[tool], ready_seconds=60) as server:
        yield server


@pytest.fixture
def operator(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator reconciling job JOB in `namespace`, and a job in a second namespace whose
    quota forbids Deployments, so that reconcile errors are real too."""
    install_crd(cluster)
    quota_ns = f"{namespace}-quota"
    cluster.kubectl("create", "namespace", quota_ns)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-deployments"},
            "spec": {"hard": {"count/deployments.apps": "0"}},
        },
        "-n",
        quota_ns,
    )
    op = OperatorProcess(
        cluster.kubeconfig, namespaces=[namespace, quota_ns], log_path=tmp_path / "operator.log"
    )
    try:
        with op:
            cluster.apply(small_job(JOB), "-n", namespace)
            cluster.apply(small_job("quota"), "-n", quota_ns)
            yield op
    finally:
        for ns in (namespace, quota_ns):
            cluster.kubectl("delete", "trj", "--all", "-n", ns, "--wait=false", check=False)
            drop_finalizers(cluster, ns, "quota")
        cluster.kubectl("delete", "namespace", quota_ns, "--wait=false", check=False)


def _train(
    sandbox: SandboxProcess,
    trainer: TrainerMetrics,
    touch_job: Any,
    stop: threading.Event,
    max_steps: int = 100,
    calls_per_kind: int = 2,
) -> None:
    """A bounded load on the pool until `stop`: each step sends every kind of call concurrently,
    the trainer records what it saw, its reward parts and the step as verl reports it, and the job
    is edited (a label), as a user would, so the operator reconciles during the run too."""
    trainer.set_total_steps(max_steps)
    with ThreadPoolExecutor(max_workers=8) as pool:
        for step in range(1, max_steps + 1):
            if stop.is_set():
                return
            trainer.set_phase("generating")
            started = time.monotonic()

            def call(code: str) -> tuple[str, float]:
                t0 = time.monotonic()
                answer = _post(
                    f"{sandbox.url}/v1/execute", {"tool": "python", "input": code, "timeoutSeconds": 1}
                )
                return answer["status"], time.monotonic() - t0

            results = list(pool.map(call, [code for code in CALLS.values() for _ in range(calls_per_kind)]))
            for status, seconds in results:
                trainer.observe_tool_call("python", status, seconds)
            trainer.set_phase("scoring")
            ok = sum(status == "ok" for status, _ in results) / len(results)
            for status, _ in results:
                trainer.observe_reward({"correct": 1.0 if status == "ok" else 0.0, "format": 0.1})
            # one of four trajectories excluded for an infrastructure failure (issue 16)
            trainer.observe_trajectories([None, None, None, "rejected"])
            trainer.set_phase("training")
            trainer.record_step(
                {
                    "critic/score/mean": ok,
                    "timing_s/step": time.monotonic() - started,
                    "response_length/mean": 180.0 + step,
                    "tool_call_counts/mean": len(results) / 4,
                },
                step,
            )
            touch_job(step)
            stop.wait(1.0)


def _numbers(prom: Prometheus, expr: str) -> list[float]:
    return [float(r["value"][1]) for r in prom.query(expr) if math.isfinite(float(r["value"][1]))]


def _label_values(prom: Prometheus, query: str) -> set[str]:
    """Grafana's label_values(selector, label), through Prometheus' series API."""
    selector, label = query.removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
    url = f"{prom.url}/api/v1/series?" + urllib.parse.urlencode({"match[]": selector})
    return {series[label] for series in _get_json(url)["data"] if label in series}


def test_every_panel_returns_data(
    cluster: Any, namespace: str, sandbox: SandboxProcess, operator: OperatorProcess, tmp_path: Path
) -> None:
    trainer = TrainerMetrics(trajectories_per_step=4)
    trainer_port = free_port()
    trainer.serve(trainer_port, addr="127.0.0.1")

    chart = chart_with_stub_dependencies(tmp_path)
    [rule] = template(
        cluster.bin("helm"),
        chart,
        {"alerts": {"enabled": True}},
        kube_version=KUBERNETES,
        show_only="templates/prometheusrule.yaml",
    )
    rules = tmp_path / "alerts.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    job_labels = {"namespace": namespace, "toolrl_job": JOB}
    operator_target = urllib.parse.urlsplit(operator.metrics_url).netloc
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            # As the chart's PodMonitors label them: namespace, and toolrl_job from the pod label.
            {
                "job_name": "tool-pool",
                "static_configs": [
                    {"targets": [urllib.parse.urlsplit(sandbox.metrics_url).netloc], "labels": job_labels}
                ],
            },
            {
                "job_name": "trainer",
                "static_configs": [{"targets": [f"127.0.0.1:{trainer_port}"], "labels": job_labels}],
            },
            # As the chart's ServiceMonitor: the operator's own namespace label yields to its series'.
            {
                "job_name": "operator",
                "honor_labels": True,
                "static_configs": [{"targets": [operator_target], "labels": {"namespace": "toolrl-system"}}],
            },
        ],
    }
    prom = Prometheus(tmp_path / f"prometheus-{uuid.uuid4().hex[:6]}", config, [rules]).start()
    stop = threading.Event()
    load = threading.Thread()
    try:
        wait_until(prom.targets_up, 60, "every scrape target up")

        def touch_job(step: int) -> None:
            cluster.kubectl("label", "trj", JOB, "-n", namespace, f"e2e-step={step}", "--overwrite")

        failures: list[BaseException] = []

        def train() -> None:
            try:
                _train(sandbox, trainer, touch_job, stop)
            except Exception as err:  # shown with the panels it left without data
                failures.append(err)

        load = threading.Thread(target=train, daemon=True)
        load.start()
        queries = [
            (panel.title, substitute(t.expr, namespace, JOB, RATE_INTERVAL))
            for panel in DASHBOARD.panels()
            for t in panel.targets
        ]

        def empty() -> list[tuple[str, str]]:
            return [(title, expr) for title, expr in queries if not _numbers(prom, expr)]

        deadline = time.monotonic() + 120  # the operator's first reconciles and autoscaler ticks
        while (missing := empty()) and time.monotonic() < deadline and not failures:
            time.sleep(2)
        assert not failures, f"the load on tool_sandbox failed: {failures[0]!r}"
        assert not missing, (
            "panel queries without data:\n"
            + "\n".join(f"{t}: {e}" for t, e in missing)
            + f"\noperator log:\n{operator.log_tail(20)}"
        )

        variables = {v.name: v for v in DASHBOARD.variables}
        assert namespace in _label_values(prom, variables["namespace"].query)
        job_query = variables["job"].query.replace("$namespace", namespace)
        assert _label_values(prom, job_query) == {JOB}

        groups = _get_json(f"{prom.url}/api/v1/rules")["data"]["groups"]
        evaluated = {r["name"]: r for g in groups for r in g["rules"]}
        assert len(evaluated) == 6
        bad = {name: r.get("lastError") for name, r in evaluated.items() if r["health"] != "ok"}
        assert not bad, f"alert rules failing to evaluate: {bad}"
    finally:
        stop.set()
        if load.is_alive():
            load.join(60)
        prom.stop()
