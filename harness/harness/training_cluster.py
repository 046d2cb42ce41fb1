"""A local cluster that trains, as a user's would: the real node runs the project's images, the
operator is installed from the chart as a pod (its RBAC, its PodMonitors, ServiceMonitor and
alert rules), the toy data and tiny model are made by a Kubernetes Job onto a PersistentVolume,
and a Prometheus scrapes the pods' IPs as the chart's monitors say (the stand-in for
prometheus-operator, which the local cluster does not run).

`make demo` (scripts/demo.py) walks a user through it; tests/e2e/test_demo_training.py asserts
what the demo shows. Both use `training_cluster()` and the helpers below.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from chartgen.dashboard import DASHBOARD, substitute
from chartgen.helm import helm
from chartgen.monitoring import crd_files
from harness import REPO
from harness.localcluster import LocalCluster
from harness.localcluster.addresses import BRIDGE_IP
from harness.localcluster.build import ensure_prometheus_built
from harness.localcluster.cluster import free_port
from harness.localcluster.images import Image, ensure_image
from harness.localcluster.node import NODE_LABEL
from harness.localcluster.prometheus import Prometheus, monitor_scrape_configs
from harness.operator_process import get_json, wait_until

CHART = REPO / "charts" / "toolrl-operator"
CPU_EXAMPLE = REPO / "examples" / "toolrljob-cpu.yaml"
GPU_EXAMPLE = REPO / "examples" / "toolrljob.yaml"
# the real nodes `make demo` (and the test of what it shows) trains on: the CPU example spreads its Ray
# head and worker over them, its pool's replicas too
DEMO_REAL_NODES = 2
IMAGES = ("operator", "tool-sandbox", "trainer")
OPERATOR_NAMESPACE = "toolrl-system"
RELEASE = "toolrl"
HELM_WAIT = (
    "600s"  # helm install --wait: the operator pod Ready on a loaded machine (300 s ran out at load 15)
)
HELM_TIMEOUT = 360.0  # the helm process itself, beyond its own --wait
# what examples/toolrljob-cpu.yaml mounts at /data (spec.data.volume)
DATA_CLAIM = "toy-data"
CHECKPOINT_CLAIM = "checkpoints"  # a job that saves checkpoints mounts it (tests of recovery)
MODEL_DIR, TOY_DIR = "/data/tiny-qwen2", "/data/toy"
TRAINER_UID = 1000  # the trainer image's user (operator/toolrl_operator/rayjob.py RAY_UID)
# Scrapes every 5 s (the chart's default is 15 s) so that a few-minute run draws a curve.
SCRAPE_INTERVAL = "5s"
# Grafana's $__rate_interval for this scrape interval (4 x the interval, Grafana's rule)
RATE_INTERVAL = "20s"


class JobState(NamedTuple):
    """What a user watches of a running job: `kubectl get trj` and the RayJob KubeRay runs for it."""

    phase: str | None
    step: int | None
    total_steps: int | None
    reward: float | None
    deployment: str | None  # the RayJob's jobDeploymentStatus
    ray_job: str | None  # the RayJob's jobStatus (Ray's own)
    desired_replicas: int | None  # the tool pool's
    ready_replicas: int | None
    reason: str | None = None  # the job's (kubectl get trj -o wide, describe)
    restarts: int | None = None
    attempt: int | None = None


@dataclass
class TrainingCluster:
    cluster: LocalCluster
    namespace: str
    prometheus: Prometheus
    images: dict[str, Image]
    workdir: Path

    def kubectl(self, *args: str, check: bool = True) -> Any:
        return self.cluster.kubectl(*args, check=check)

    def job(self, name: str) -> dict[str, Any]:
        return get_json(self.cluster, "trj", name, "-n", self.namespace)

    def rayjob(self, name: str) -> dict[str, Any] | None:
        found = get_json(self.cluster, "rayjobs", "-n", self.namespace, "-l", f"toolrl.dev/job={name}")
        return found["items"][0] if found["items"] else None

    def state(self, name: str) -> JobState:
        status = self.job(name).get("status", {})
        progress, pool = status.get("progress") or {}, status.get("toolPool") or {}
        rayjob = (self.rayjob(name) or {}).get("status", {})
        return JobState(
            status.get("phase"),
            progress.get("step"),
            progress.get("totalSteps"),
            progress.get("rewardMean"),
            rayjob.get("jobDeploymentStatus"),
            rayjob.get("jobStatus"),
            pool.get("desiredReplicas"),
            pool.get("readyReplicas"),
            status.get("reason"),
            status.get("restarts"),
            status.get("attempt"),
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        selector = f"involvedObject.name={name},involvedObject.kind=ToolRLJob"
        found = get_json(self.cluster, "events", "-n", self.namespace, "--field-selector", selector)["items"]
        return sorted(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def submitter_pods(self, name: str) -> list[dict[str, Any]]:
        """The pods of KubeRay's submitter Job of job `name`, oldest first: the Job runs another pod when
        the trainer it followed was lost (the head's pod or process), a retried attempt gets a new Job."""
        selector = f"batch.kubernetes.io/job-name={name}"
        found = get_json(self.cluster, "pods", "-n", self.namespace, "-l", selector)["items"]
        return sorted(found, key=lambda p: p["metadata"]["creationTimestamp"])

    def trainer_logs(self, name: str) -> list[str]:
        """The trainer's log as each submitter pod followed it, oldest first ('' before a pod logs)."""
        return [
            self.kubectl("logs", pod["metadata"]["name"], "-n", self.namespace, check=False).stdout or ""
            for pod in self.submitter_pods(name)
        ]

    def helm(self, *args: str, check: bool = True) -> Any:
        kubeconfig = ["--kubeconfig", str(self.cluster.kubeconfig)]
        return helm(self.cluster.bin("helm"), *kubeconfig, *args, check=check, timeout=HELM_TIMEOUT)


def checkpointed(tc: TrainingCluster, job: dict[str, Any], save_freq: int) -> Path:
    """Gives `job` a checkpoint volume (a local PersistentVolume in the namespace, writable by the
    trainer) saved every `save_freq` steps and resumed from automatically; the directory on the host
    where the job's checkpoints go (the trainer makes it: /checkpoints/<namespace>/<job> in the pod)."""
    host_dir = tc.workdir / "volumes" / tc.namespace / CHECKPOINT_CLAIM
    host_dir.mkdir(parents=True, exist_ok=True)
    os.chown(host_dir, TRAINER_UID, TRAINER_UID)
    tc.cluster.apply(local_volume(tc.namespace, CHECKPOINT_CLAIM, host_dir))
    job["spec"]["checkpoint"] = {
        "saveFreq": save_freq,
        "resume": "auto",
        "volume": {"persistentVolumeClaim": {"claimName": CHECKPOINT_CLAIM}},
    }
    return host_dir / tc.namespace / job["metadata"]["name"]


def newest_checkpoint(checkpoints: Path) -> int:
    """The step of the newest complete checkpoint under `checkpoints` (verl writes its marker last)."""
    marker = next(checkpoints.rglob("latest_checkpointed_iteration.txt"), None)
    return int(marker.read_text().strip()) if marker else 0


def kill_container_process(tc: TrainingCluster, namespace: str, selector: str) -> str:
    """SIGKILLs the main process of the first container of the one pod `selector` picks, through its real
    node's containerd (as the kernel's OOM killer would: the pod stays, kubelet restarts the container);
    the pod's name."""
    (pod,) = get_json(tc.cluster, "pods", "-n", namespace, "-l", selector)["items"]
    container_id = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    tc.cluster.node_named(pod["spec"]["nodeName"]).ctr("tasks", "kill", "--signal", "SIGKILL", container_id)
    return pod["metadata"]["name"]


def delete_pods(tc: TrainingCluster, namespace: str, selector: str) -> list[str]:
    """Deletes the pods `selector` picks at once (no grace period, as a lost node does); their names."""
    names = tc.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "name").stdout.split()
    if names:
        tc.kubectl("delete", "-n", namespace, *names, "--grace-period=0", "--force", "--wait=false")
    return names


def ensure_images(cluster: LocalCluster, log: Callable[[str], None] = print) -> dict[str, Image]:
    """The operator, tool-sandbox and CPU trainer images, built if their inputs changed (the
    trainer's first build takes ~17 min here) and imported into every real node."""
    images = {}
    for name in IMAGES:
        image = ensure_image(name, log)
        cluster.import_image(image.archive, image.ref)
        images[name] = image
    return images


def local_volume(namespace: str, claim: str, host_dir: Path) -> list[dict[str, Any]]:
    """A PersistentVolume on the real node's disk at `host_dir` and its claim `claim`."""
    pv_name = f"{namespace}-{claim}"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "claimRef": {"namespace": namespace, "name": claim},
                "local": {"path": str(host_dir)},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": NODE_LABEL, "operator": "In", "values": ["true"]}]}
                        ]
                    }
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": pv_name,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]


# a container as the namespaces' Pod Security level (restricted) admits it
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def toy_data_manifests(namespace: str, host_dir: Path, image: Image) -> list[dict[str, Any]]:
    """A PersistentVolume on the real node's disk, the claim the CPU example mounts, and the Job
    that writes the tiny model and toy dataset into it with the trainer image (as a user would
    stage a model on a cluster's storage)."""
    return [
        *local_volume(namespace, DATA_CLAIM, host_dir),
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "toy-data", "namespace": namespace},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "nodeSelector": {NODE_LABEL: "true"},
                        "automountServiceAccountToken": False,
                        "securityContext": {"runAsUser": TRAINER_UID, "runAsGroup": TRAINER_UID},
                        "containers": [
                            {
                                "name": "tiny-model",
                                "image": image.ref,
                                "imagePullPolicy": "Never",
                                "command": ["python", "-m", "trainer_entry", "tiny-model", MODEL_DIR],
                                "args": ["--toy-data", TOY_DIR],
                                "securityContext": RESTRICTED_CONTAINER,
                                "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}},
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            }
                        ],
                        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": DATA_CLAIM}}],
                    }
                },
            },
        },
    ]


def stage_toy_data(tc: TrainingCluster, timeout: float = 1200) -> float:
    """Run the toy-data Job to completion; returns its duration in seconds."""
    host_dir = tc.workdir / "volumes" / tc.namespace / DATA_CLAIM
    host_dir.mkdir(parents=True, exist_ok=True)
    os.chown(host_dir, TRAINER_UID, TRAINER_UID)
    started = time.monotonic()
    tc.cluster.apply(toy_data_manifests(tc.namespace, host_dir, tc.images["trainer"]))

    def finished() -> str | None:
        status = get_json(tc.cluster, "job", "toy-data", "-n", tc.namespace).get("status", {})
        kinds = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
        return "Complete" if "Complete" in kinds else "Failed" if "Failed" in kinds else None

    outcome = wait_until(finished, timeout, "the toy-data Job to finish", interval=2)
    if outcome != "Complete":
        logs = tc.kubectl("logs", "job/toy-data", "-n", tc.namespace, "--tail", "40", check=False)
        raise RuntimeError(f"the toy-data Job failed:\n{logs.stdout}{logs.stderr}")
    return time.monotonic() - started


def chart_values(namespace: str, prometheus_url: str) -> dict[str, Any]:
    """The chart's values for the local cluster: everything on, one watched namespace. Prometheus and
    KubeRay run on the host, which is the first real node: the pods of another node see Prometheus's
    scrapes and KubeRay's dashboard calls (through the API server's proxy) come from the first node's
    address, which the jobs' NetworkPolicies admit by these CIDRs (on its own node a pod's policy admits
    the node anyway, for kubelet's probes; seen: a Ray head on the second node, KubeRay could not read
    its job's end, and the RayJob failed 30 s after its submitter ended)."""
    return {
        "watchNamespaces": [namespace],
        "metricsFromCIDRs": [f"{BRIDGE_IP}/32"],
        "kuberayFromCIDRs": [f"{BRIDGE_IP}/32"],
        "autoscaler": {"prometheusUrl": prometheus_url},
        "metrics": {
            "serviceMonitor": {"enabled": True, "interval": SCRAPE_INTERVAL},
            "podMonitors": {"enabled": True, "interval": SCRAPE_INTERVAL},
        },
        "alerts": {"enabled": True},
        "dashboard": {"enabled": True},
    }


def _install_monitoring_crds(cluster: LocalCluster) -> None:
    """prometheus-operator's CRDs (the chart's monitors are objects of these kinds)."""
    for path in crd_files().values():
        cluster.kubectl("apply", "--server-side", "-f", str(path))


def start_prometheus(tc: TrainingCluster, port: int) -> Prometheus:
    """Prometheus on the node's bridge address (the operator pod's autoscaler reads it), with
    the chart's monitors and alert rules as read back from the cluster."""
    monitors = [
        *get_json(tc.cluster, "podmonitors", "-n", OPERATOR_NAMESPACE)["items"],
        *get_json(tc.cluster, "servicemonitors", "-n", OPERATOR_NAMESPACE)["items"],
    ]
    rules = tc.workdir / "alert-rules.yaml"
    groups = [
        g
        for r in get_json(tc.cluster, "prometheusrules", "-n", OPERATOR_NAMESPACE)["items"]
        for g in r["spec"]["groups"]
    ]
    rules.write_text(yaml.safe_dump({"groups": groups}))
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "scrape_configs": monitor_scrape_configs(monitors, tc.cluster.kubeconfig),
    }
    binary = str(ensure_prometheus_built())
    prom = Prometheus(tc.workdir / "prometheus", config, [rules], port=port, host=BRIDGE_IP, binary=binary)
    return prom.start()


@contextlib.contextmanager
def training_cluster(
    cluster: LocalCluster, workdir: Path, namespace: str, log: Callable[[str], None] = print
) -> Iterator[TrainingCluster]:
    """The chart's operator, Prometheus and the toy data in `namespace` on a running cluster with
    a real node; uninstalled again on exit (the cluster itself stays)."""
    images = ensure_images(cluster, log)
    workdir.mkdir(parents=True, exist_ok=True)
    _install_monitoring_crds(cluster)
    for ns in (namespace, OPERATOR_NAMESPACE):
        cluster.kubectl("create", "namespace", ns, check=False)
        cluster.kubectl(
            "label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
        )
    port = free_port()
    tc = TrainingCluster(cluster, namespace, Prometheus(workdir, {}), images, workdir)
    values = workdir / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values(namespace, f"http://{BRIDGE_IP}:{port}")))
    log(f"helm install {RELEASE} charts/toolrl-operator -n {OPERATOR_NAMESPACE} -f {values}")
    try:
        tc.helm(
            "install",
            RELEASE,
            str(CHART),
            "-n",
            OPERATOR_NAMESPACE,
            "-f",
            str(values),
            "--wait",
            "--timeout",
            HELM_WAIT,
        )
    except Exception:  # what kept the operator from turning Ready: its pod, the node, the Events
        for args in (("get", "pods", "-A", "-o", "wide"), ("describe", "pods", "-n", OPERATOR_NAMESPACE)):
            log(tc.kubectl(*args, check=False).stdout[-4000:])
        raise
    try:
        tc.prometheus = start_prometheus(tc, port)
        try:
            yield tc
        finally:
            tc.prometheus.stop()
    finally:
        if cluster.is_running():
            tc.kubectl(
                "delete", "trj", "--all", "-n", namespace, "--wait=true", "--timeout=120s", check=False
            )
            tc.helm(
                "uninstall", RELEASE, "-n", OPERATOR_NAMESPACE, "--wait", "--timeout", "120s", check=False
            )
            tc.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
            for claim in (DATA_CLAIM, CHECKPOINT_CLAIM):
                tc.kubectl("delete", "pv", f"{namespace}-{claim}", "--wait=false", check=False)


# ----- what a user looks at ------------------------------------------------------------------


def dashboard_queries(namespace: str, job: str) -> list[tuple[str, str]]:
    """(panel title, query) of every panel of the chart's dashboard, for this job."""
    return [
        (panel.title, substitute(t.expr, namespace, job, RATE_INTERVAL))
        for panel in DASHBOARD.panels()
        for t in panel.targets
    ]


def finite(prom: Prometheus, expr: str, at: float | None = None) -> list[float]:
    """The query's finite values (now, or at unix time `at`)."""
    return [v for r in prom.query(expr, at) if math.isfinite(v := float(r["value"][1]))]


def finite_over(prom: Prometheus, expr: str, start: float, end: float) -> list[float]:
    """Every finite value the query took between `start` and `end` (unix seconds)."""
    step = max(5.0, (end - start) / 300)
    return [
        v
        for series in prom.query_range(expr, start, end, step)
        for _, value in series["values"]
        if math.isfinite(v := float(value))
    ]


def plot_run(prom: Prometheus, namespace: str, job: str, start: float, end: float, out: Path) -> Path:
    """A PNG of the run drawn from Prometheus: reward, tool-call latency and pool size over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = f'namespace="{namespace}", toolrl_job="{job}"'
    step = max(5.0, (end - start) / 200)
    charts = [
        ("reward mean", f"max(toolrl_trainer_reward_mean{{{sel}}})", "reward"),
        ("training step", f"max(toolrl_trainer_step{{{sel}}})", "step"),
        (
            "tool-call latency p50 / p95",
            [
                (
                    f"p{round(q * 100)}",
                    f"histogram_quantile({q}, sum by (le) "
                    f"(rate(toolrl_tool_call_duration_seconds_bucket{{{sel}}}[{RATE_INTERVAL}])))",
                )
                for q in (0.5, 0.95)
            ],
            "seconds",
        ),
        (
            "tool pool replicas",
            [
                ("desired", f"max(toolrl_autoscaler_desired_replicas{{{sel}}})"),
                ("serving", f"count(toolrl_tool_capacity{{{sel}}})"),
            ],
            "replicas",
        ),
    ]
    fig, axes = plt.subplots(len(charts), 1, figsize=(9, 2.4 * len(charts)), sharex=True)
    for ax, (title, queries, unit) in zip(axes, charts, strict=True):
        if isinstance(queries, str):
            queries = [(title, queries)]
        for label, expr in queries:
            for series in prom.query_range(expr, start, end, step):
                points = [
                    (float(t) - start, float(v)) for t, v in series["values"] if math.isfinite(float(v))
                ]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, label=label, drawstyle="steps-post" if unit != "seconds" else "default")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if len(queries) > 1:
            ax.legend(fontsize=8, loc="upper left")
    axes[-1].set_xlabel(f"seconds since the job was applied ({namespace}/{job})")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
