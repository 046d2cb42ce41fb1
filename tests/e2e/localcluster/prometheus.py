"""A real Prometheus (Debian's `prometheus` package) with a generated scrape config, for e2e
tests and the demo. Each instance has its own port and data directory."""

from __future__ import annotations

import json
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


@dataclass
class Prometheus:
    root: Path
    config: dict
    rule_files: list[Path] = field(default_factory=list)
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Prometheus:
        binary = shutil.which("prometheus") or PROMETHEUS_BINARY
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
                f"--web.listen-address=127.0.0.1:{self.port}",
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

    def query(self, promql: str) -> list[dict]:
        """Instant query; raises PrometheusError with Prometheus' message if the query is bad."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise PrometheusError(f"query {promql!r} failed: {body.get('error')}")
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
