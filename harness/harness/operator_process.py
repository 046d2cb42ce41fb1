"""The real operator (`python -m toolrl_operator`) as a child process, for e2e tests and benches.

install_crd(cluster)                      # crds/toolrl.dev_toolrljobs.yaml, waits for Established
with OperatorProcess(cluster.kubeconfig, namespaces=[ns], log_path=tmp_path / "op.log") as op:
    ...                                   # op.metrics_url, op.kill(), op.start(), op.peak_rss_bytes()
    delete_jobs(cluster, ns)              # and wait until they are gone
wait_until(lambda: ..., timeout, "what")  # poll until truthy; get_json(cluster, "trj", name, "-n", ns)
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import yaml
from harness import REPO
from harness.localcluster.cluster import free_port
from toolrl_operator.children import CHILD_KINDS as OPERATOR_CHILD_KINDS

CRD_FILE = REPO / "crds" / "toolrl.dev_toolrljobs.yaml"
EXAMPLE = REPO / "examples" / "toolrljob.yaml"
# what the operator creates for a job, as kubectl resource names (plural.group), from the one list
CHILD_KINDS = [child.kubectl_name for child in OPERATOR_CHILD_KINDS if child.watched]  # KEDA is optional
CRD_NAME = "toolrljobs.toolrl.dev"
T = TypeVar("T")


def get_json(cluster: Any, *args: str) -> Any:
    """`kubectl get ... -o json`, parsed."""
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def job_events(cluster: Any, namespace: str, job: str, reason: str | None = None) -> list[dict[str, Any]]:
    """The Events about one ToolRLJob (of one reason, if given)."""
    selector = f"involvedObject.kind=ToolRLJob,involvedObject.name={job}"
    if reason:
        selector += f",reason={reason}"
    return get_json(cluster, "events", "-n", namespace, "--field-selector", selector)["items"]


def wait_until(probe: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """Poll `probe` until it returns something truthy (returned); fail naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen: {last!r}")


class Sampler(Generic[T]):
    """Calls `probe` every `interval` seconds in the background while in its `with` block;
    `samples` holds (monotonic time, value)."""

    def __init__(self, probe: Callable[[], T], interval: float = 0.5) -> None:
        self.probe, self.interval = probe, interval
        self.samples: list[tuple[float, T]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler[T]:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append((time.monotonic(), self.probe()))

    def between(self, start: float, end: float) -> list[T]:
        return [value for at, value in self.samples if start <= at <= end]


EXAMPLE_VOLUMES_LABEL = "toolrl.dev/e2e-namespace"


def example_claims(example: Path = EXAMPLE) -> list[str]:
    """The PersistentVolumeClaims the example mounts (its data, checkpoint and model-cache volumes),
    which examples/data-prep-job.yaml creates on a real cluster."""
    spec = yaml.safe_load(example.read_text())["spec"]
    volumes = [
        spec.get("data", {}).get("volume"),
        spec.get("checkpoint", {}).get("volume"),
        spec.get("model", {}).get("cache", {}).get("volume"),
    ]
    return [v["persistentVolumeClaim"]["claimName"] for v in volumes if v and "persistentVolumeClaim" in v]


def example_volumes(namespace: str) -> dict[str, Any]:
    """A List of the example's claims in `namespace`, each bound to a PersistentVolume of its own,
    so that the example's Ray pods schedule (the scheduler holds pods whose claims are unbound).
    Nothing stores anything: kwok's fake nodes mount no volume. Delete the volumes by their label."""
    items: list[dict[str, Any]] = []
    for claim in example_claims():
        volume = f"{namespace}-{claim}"
        labels = {EXAMPLE_VOLUMES_LABEL: namespace}
        items.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": volume, "labels": labels},
                "spec": {
                    "capacity": {"storage": "1Ti"},
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "claimRef": {"namespace": namespace, "name": claim},
                    "hostPath": {"path": f"/var/lib/toolrl-e2e/{volume}", "type": "DirectoryOrCreate"},
                },
            }
        )
        items.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": namespace, "labels": labels},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": volume,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        )
    return {"apiVersion": "v1", "kind": "List", "items": items}


def small_job(name: str) -> dict[str, Any]:
    """The example job on one 1-GPU worker with a pool of 1..4, so several fit on the fake nodes."""
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["name"] = name
    job["spec"]["cluster"]["workers"] = {"replicas": 1, "gpusPerWorker": 1}
    job["spec"]["toolPool"]["replicas"] = {"min": 1, "max": 4}
    return job


def install_crd(cluster: Any, crd_file: Path = CRD_FILE) -> None:
    """Apply the ToolRLJob CRD (server-side) and wait until the API serves it."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_file))

    def established() -> bool:
        res = cluster.kubectl("get", f"crd/{CRD_NAME}", "-o", "json", check=False)
        status = json.loads(res.stdout).get("status") if res.returncode == 0 else None
        conditions = (status or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_until(established, 60, f"CRD {CRD_NAME} Established")


def delete_jobs(cluster: Any, namespace: str, timeout: float = 120) -> None:
    """Delete every ToolRLJob of `namespace` and wait until they are gone. The jobs carry no
    finalizer, so this works with or without a running operator."""
    cluster.kubectl(
        "delete", "toolrljobs", "--all", "-n", namespace, "--wait=true", f"--timeout={int(timeout)}s"
    )


def drop_finalizers(cluster: Any, namespace: str, job: str) -> None:
    """Let job `job` go without an operator (kopf's finalizer of a job it saw would hold it): a test's
    clean-up after its operator stopped. Quiet when the job is gone."""
    patch = '{"metadata":{"finalizers":null}}'
    cluster.kubectl("patch", "trj", job, "-n", namespace, "--type=merge", "-p", patch, check=False)


class OperatorProcess:
    """Start, kill and restart the operator against a kubeconfig; ports are picked free."""

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: Sequence[str] = (),
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.namespaces = list(namespaces)
        self.log_path = log_path
        self.env = env or {}
        self.liveness_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def liveness_url(self) -> str:
        return f"http://127.0.0.1:{self.liveness_port}/healthz"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the operator is not running; call start()"
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> OperatorProcess:
        """Launch the operator and wait until its liveness endpoint answers."""
        argv = [
            sys.executable,
            "-m",
            "toolrl_operator",
            "--liveness-port",
            str(self.liveness_port),
            "--metrics-port",
            str(self.metrics_port),
        ]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        out = self.log_path.open("ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        finally:
            if self.log_path:
                out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the operator exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.alive():
                return self
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(
            f"the operator did not answer {self.liveness_url} in {timeout}s:\n{self.log_tail()}"
        )

    def alive(self) -> bool:
        try:
            with urllib.request.urlopen(self.liveness_url, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            return resp.read().decode()

    def peak_rss_bytes(self) -> int:
        """The process's peak resident set size so far (VmHWM), read from /proc."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc status; this needs Linux")

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crash would leave things."""
        self._signal(signal.SIGKILL, grace=0)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds."""
        self._signal(signal.SIGTERM, grace)

    def _signal(self, sig: signal.Signals, grace: float) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=grace or None)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def mount_service_account(cluster, namespace: str, directory: Path, job: str) -> tuple[str, str]:
    """Write what a pod of `<job>-trainer` gets mounted (`token`, `ca.crt`) into `directory`;
    return the apiserver's (host, port), what the pod sees as KUBERNETES_SERVICE_HOST/PORT."""
    token = cluster.kubectl("create", "token", f"{job}-trainer", "-n", namespace).stdout.strip()
    kubeconfig = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = kubeconfig["clusters"][0]["cluster"]
    directory.mkdir()
    (directory / "token").write_text(token)
    (directory / "ca.crt").write_bytes(base64.b64decode(server["certificate-authority-data"]))
    url = urlsplit(server["server"])
    return url.hostname, str(url.port)
