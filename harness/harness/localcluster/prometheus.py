"""A real Prometheus (Debian's `prometheus` package) with a generated scrape config, for e2e
tests and the demo. Each instance has its own port and data directory.

`monitor_scrape_configs` does for the chart's PodMonitors and ServiceMonitor what prometheus-operator does: it
turns each into a scrape job that discovers pods through the Kubernetes API, so a Prometheus
beside the local cluster scrapes the real pods' IPs as one in the cluster would."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .cluster import free_port

PROMETHEUS_BINARY = "/usr/bin/prometheus"


class PrometheusError(RuntimeError):
    pass


def scrape_config(
    targets: dict[str, list[str]], labels: dict[str, dict[str, str]] | None = None, interval: str = "1s"
) -> dict:
    """One static scrape job per entry of `targets` (job name -> ["host:port", ...])."""
    labels = labels or {}
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": hosts, "labels": labels.get(job, {})}]}
            for job, hosts in targets.items()
        ],
    }


# PodMonitor relabeling fields (camelCase) and Prometheus' names for them
RELABEL_FIELDS = {
    "sourceLabels": "source_labels",
    "targetLabel": "target_label",
    "separator": "separator",
    "regex": "regex",
    "replacement": "replacement",
    "action": "action",
    "modulus": "modulus",
}


def _meta_label(label: str) -> str:
    """A label's name in service discovery: `app.kubernetes.io/name` -> `app_kubernetes_io_name`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


@dataclass(frozen=True)
class _MonitorKind:
    role: str  # kubernetes_sd role
    endpoints: str  # the spec field listing the scraped ports
    labels: str  # meta label prefix the selector matches
    port: str  # meta label naming the port
    prefix: str  # job_name prefix prometheus-operator uses


MONITOR_KINDS = {
    "PodMonitor": _MonitorKind(
        "pod",
        "podMetricsEndpoints",
        "__meta_kubernetes_pod_label_",
        "__meta_kubernetes_pod_container_port_name",
        "podMonitor",
    ),
    "ServiceMonitor": _MonitorKind(
        "endpoints",
        "endpoints",
        "__meta_kubernetes_service_label_",
        "__meta_kubernetes_endpoint_port_name",
        "serviceMonitor",
    ),
}


def monitor_scrape_configs(monitors: list[dict], kubeconfig: Path) -> list[dict]:
    """Scrape jobs for PodMonitor and ServiceMonitor objects (monitoring.coreos.com/v1), as
    prometheus-operator generates them: targets found through the API server, kept by the
    monitor's label selector and port name, labelled namespace/pod/container (and service) and
    job, then the endpoint's relabelings. Supported: `selector.matchLabels`, `namespaceSelector`
    (`any`, `matchNames`) and each endpoint's `port`, `path`, `interval`, `honorLabels` and
    `relabelings`; anything else is refused rather than ignored."""
    jobs = []
    for monitor in monitors:
        kind = MONITOR_KINDS[monitor["kind"]]
        meta, spec = monitor["metadata"], monitor["spec"]
        unsupported = set(spec) - {"selector", "namespaceSelector", kind.endpoints}
        unsupported |= set(spec.get("selector", {})) - {"matchLabels"}
        for endpoint in spec[kind.endpoints]:
            unsupported |= set(endpoint) - {"port", "path", "interval", "honorLabels", "relabelings"}
        if unsupported:
            what = f"{monitor['kind']} {meta['name']}"
            raise PrometheusError(f"{what}: fields not translated: {sorted(unsupported)}")
        sd: dict = {"role": kind.role, "kubeconfig_file": str(kubeconfig)}
        namespaces = spec.get("namespaceSelector", {})
        if not namespaces.get("any"):
            sd["namespaces"] = {"names": namespaces.get("matchNames") or [meta["namespace"]]}
        keep = [
            {"action": "keep", "source_labels": [kind.labels + _meta_label(k)], "regex": re.escape(v)}
            for k, v in spec.get("selector", {}).get("matchLabels", {}).items()
        ]
        named = [
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        ]
        if kind.role == "endpoints":
            service = ["__meta_kubernetes_service_name"]
            named += [
                {"source_labels": service, "target_label": "service"},
                {"source_labels": service, "target_label": "job"},
            ]
        else:
            named.append({"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"})
        for i, endpoint in enumerate(spec[kind.endpoints]):
            port = {"action": "keep", "source_labels": [kind.port], "regex": re.escape(endpoint["port"])}
            relabel = [*keep, port, *named]
            relabel += [{RELABEL_FIELDS[k]: v for k, v in r.items()} for r in endpoint.get("relabelings", [])]
            job = {
                "job_name": f"{kind.prefix}/{meta['namespace']}/{meta['name']}/{i}",
                "metrics_path": endpoint.get("path", "/metrics"),
                "honor_labels": bool(endpoint.get("honorLabels")),
                "kubernetes_sd_configs": [sd],
                "relabel_configs": relabel,
            }
            if endpoint.get("interval"):
                job["scrape_interval"] = endpoint["interval"]
            jobs.append(job)
    return jobs


@dataclass
class Prometheus:
    root: Path
    config: dict
    rule_files: list[Path] = field(default_factory=list)
    port: int = 0
    proc: subprocess.Popen | None = None
    # where it listens: loopback, or the real node's bridge address for pods to reach it
    host: str = "127.0.0.1"
    # Debian's package by default; kubernetes_sd_configs need build.ensure_prometheus_built()'s
    binary: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> Prometheus:
        binary = self.binary or shutil.which("prometheus") or PROMETHEUS_BINARY
        if not Path(binary).exists():
            raise PrometheusError(
                "prometheus is not installed: run `make setup` (it installs Debian's "
                "`prometheus` package), or `apt-get install -y prometheus`."
            )
        self.root.mkdir(parents=True, exist_ok=True)
        cfg = dict(self.config, rule_files=[str(p) for p in self.rule_files])
        (self.root / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.port = self.port or free_port()
        log = (self.root / "prometheus.log").open("ab")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.root / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.root / 'data'}",
                f"--web.listen-address={self.host}:{self.port}",
                "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=1d",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited ({self.proc.returncode}): {self._tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready after {timeout}s: {self._tail()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """Instant query (now, or at unix time `at`); raises PrometheusError with Prometheus'
        message if the query is bad."""
        return self._api("query", {"query": promql, **({"time": at} if at is not None else {})})

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict]:
        """Range query (unix seconds): one series of [t, "value"] pairs per label set."""
        return self._api("query_range", {"query": promql, "start": start, "end": end, "step": step})

    def _api(self, endpoint: str, params: dict) -> list[dict]:
        url = f"{self.url}/api/v1/{endpoint}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise PrometheusError(f"query {params['query']!r} failed: {body.get('error')}")
        return body["data"]["result"]

    def targets_up(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as r:
            active = json.load(r)["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def _tail(self) -> str:
        try:
            return "\n".join((self.root / "prometheus.log").read_text().splitlines()[-20:])
        except OSError:
            return ""
