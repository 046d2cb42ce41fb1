"""Benchmark of issue 3: how fast the operator turns ToolRLJobs into children and a status.

    python bench/operator/run.py [--serial 50] [--burst 200] [--out bench/results/operator.json]

Needs the local control plane (`make cluster-up`); starts the real operator (`python -m
toolrl_operator`) against it.

(1) serial: jobs created one after another; for each, the time from create to its first status
    (written once all its children are applied) and to `phase: Running` (KubeRay's cluster up
    on the fake GPU nodes). p50/p95. Each job is deleted after it is measured.
(2) burst: jobs created at once; the time until every job has all its children and a current
    status that says so (`Reconciled` True; Provisioning or Running: 32 fake GPUs cannot run them
    all), the operator's peak RSS (VmHWM), its CPU seconds over the burst per sync (its
    toolrl_operator_reconcile_duration_seconds_count) and per job, and the CPU seconds of the API
    server and the other control-plane processes over the same span (their share of the whole).

    A 1000-job burst (issue 37): python bench/operator/run.py --serial 5 --burst 1000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from harness import REPO
from harness.localcluster import LocalCluster
from harness.localcluster.__main__ import DEFAULT_ROOT
from harness.operator_process import OperatorProcess, install_crd
from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families
from toolrl_operator.children import CHILD_KINDS as OPERATOR_CHILD_KINDS

GROUP, VERSION, PLURAL = "toolrl.dev", "v1alpha1", "toolrljobs"
# kind -> (api group, version, plural): a job's children, from the operator's one list
CHILD_KINDS = {c.kind: (c.group, c.version, c.plural) for c in OPERATOR_CHILD_KINDS if c.watched}
PER_JOB = {kind: 1 for kind in CHILD_KINDS} | {"NetworkPolicy": 2}  # the pool's and the Ray pods'


def job(name: str) -> dict[str, Any]:
    """The example, shrunk so many fit on the fake nodes: 1 GPU, a tiny head and pool."""
    doc = yaml.safe_load((REPO / "examples" / "toolrljob.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["cluster"]["workers"] = {"replicas": 1, "gpusPerWorker": 1}
    spec["cluster"]["head"] = {"resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}
    spec["toolPool"]["replicas"] = {"min": 1, "max": 2}
    spec["toolPool"]["resources"] = {"requests": {"cpu": "50m", "memory": "64Mi"}}
    # the example's claims are the user's to make (examples/data-prep-job.yaml); the fake nodes need none
    spec["data"]["volume"] = spec["checkpoint"]["volume"] = {"emptyDir": {}}
    return doc


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metric_total(text: str, family: str) -> float:
    """The sum of a metric family's samples named `<family>_count` or `<family>_total` (or itself)."""
    total = 0.0
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            names = {f"{family}_count", f"{family}_total", family}
            total += sum(s.value for s in metric.samples if s.name in names)
    return total


def reconciled(job: dict[str, Any]) -> bool:
    """The job's status is current and says every child is applied."""
    status = job.get("status") or {}
    if status.get("observedGeneration") != job["metadata"]["generation"]:
        return False
    return any(c["type"] == "Reconciled" and c["status"] == "True" for c in status.get("conditions", []))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Bench:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    def namespace(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name}})
        return name

    def remove(self, namespace: str) -> None:
        """Delete the namespace, jobs and all: they carry no finalizer, so it needs no operator
        (and no single request deleting hundreds of jobs, which the API server may time out)."""
        self.core.delete_namespace(namespace)

    def create(self, namespace: str, name: str) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job(name))

    def jobs(self, namespace: str) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]

    def children(self, namespace: str) -> Counter[tuple[str, str]]:
        """(job, kind) -> how many children of that kind the job has."""
        counts: Counter[tuple[str, str]] = Counter()
        for kind, (group, version, plural) in CHILD_KINDS.items():
            path = f"/api/{version}" if not group else f"/apis/{group}/{version}"
            items = self._list(path, namespace, plural)
            for item in items:
                counts[(item["metadata"]["labels"]["toolrl.dev/job"], kind)] += 1
        return counts

    def _list(self, path: str, namespace: str, plural: str) -> list[dict[str, Any]]:
        method, url, headers, body, _ = self.api_client.param_serialize(
            "GET",
            f"{path}/namespaces/{namespace}/{plural}",
            query_params=[("labelSelector", "app.kubernetes.io/managed-by=toolrl-operator")],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(method, url, header_params=headers, body=body)
        response.read()
        return json.loads(response.data)["items"]


def serial(bench: Bench, count: int) -> dict[str, Any]:
    namespace = bench.namespace("bench-op-serial")
    to_status, to_running = [], []
    try:
        for i in range(count):
            name = f"serial-{i:03d}"
            started = time.monotonic()
            bench.create(namespace, name)
            first = None
            while True:
                status = (
                    bench.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get(
                        "status"
                    )
                    or {}
                )
                now = time.monotonic() - started
                if first is None and reconciled({"metadata": {"generation": 1}, "status": status}):
                    first = now
                if status.get("phase") == "Running":
                    break
                if now > 120:
                    raise RuntimeError(f"{name} not Running after 120 s: {status}")
                time.sleep(0.02)
            to_status.append(first if first is not None else now)
            to_running.append(now)
            kinds = {
                kind
                for (job_name, kind), n in bench.children(namespace).items()
                if job_name == name and n == PER_JOB[kind]
            }
            if kinds != set(CHILD_KINDS):
                raise RuntimeError(f"{name}: children missing: {set(CHILD_KINDS) - kinds}")
            bench.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            print(
                f"serial {i + 1}/{count}: status {to_status[-1]:.3f}s running {to_running[-1]:.3f}s",
                flush=True,
            )
    finally:
        bench.remove(namespace)

    def summary(values: list[float]) -> dict[str, float]:
        return {
            "p50_s": round(statistics.median(values), 3),
            "p95_s": round(percentile(values, 0.95), 3),
            "max_s": round(max(values), 3),
        }

    return {"jobs": count, "children_and_status": summary(to_status), "running": summary(to_running)}


def burst(
    bench: Bench, count: int, op: OperatorProcess, cluster: LocalCluster, timeout: float
) -> dict[str, Any]:
    namespace = bench.namespace("bench-op-burst")
    names = [f"burst-{i:03d}" for i in range(count)]
    pids = {"operator": op.pid, **cluster.pids}
    try:
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        metrics_before = op.metrics()
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: bench.create(namespace, n), names))
        created = time.monotonic() - started
        while True:
            jobs = bench.jobs(namespace)
            current = [j for j in jobs if reconciled(j)]
            if len(current) == count:
                break
            if time.monotonic() - started > timeout:
                refused = Counter(
                    c["reason"] for j in jobs for c in (j.get("status") or {}).get("conditions", [])
                    if c["type"] == "Reconciled" and c["status"] == "False"
                )  # fmt: skip
                raise RuntimeError(
                    f"only {len(current)}/{count} jobs converged after {timeout:.0f} s; "
                    f"Reconciled False by reason: {dict(refused)}"
                )
            time.sleep(0.25)
        converged = time.monotonic() - started
        cpu = {name: round(cpu_seconds(pid) - cpu_before[name], 2) for name, pid in pids.items()}
        metrics_after = op.metrics()
        family = "toolrl_operator_reconcile_duration_seconds"
        syncs = metric_total(metrics_after, family) - metric_total(metrics_before, family)
        errors_family = "toolrl_operator_reconcile_errors"
        errors = metric_total(metrics_after, errors_family) - metric_total(metrics_before, errors_family)
        counts = bench.children(namespace)
        complete = sum(1 for n in names if all(counts[(n, kind)] == PER_JOB[kind] for kind in CHILD_KINDS))
        phases = Counter(j["status"]["phase"] for j in jobs)
        rss = op.peak_rss_bytes()
        total_cpu = sum(cpu.values())
        per_sync = 1000 * cpu["operator"] / syncs if syncs else float("nan")
        print(
            f"burst: {count} jobs created in {created:.1f}s, converged in {converged:.1f}s, "
            f"{complete} with all children, phases {dict(phases)}, peak RSS {rss / 2**20:.0f} MiB; "
            f"operator CPU {cpu['operator']:.1f} s for {syncs:.0f} syncs ({per_sync:.1f} ms a sync, "
            f"{1000 * cpu['operator'] / count:.1f} ms a job, {errors:.0f} failed), CPU s by process {cpu}",
            flush=True,
        )
    finally:
        bench.remove(namespace)
    return {
        "jobs": count,
        "create_s": round(created, 2),
        "converged_s": round(converged, 2),
        "jobs_with_all_children": complete,
        "phases": dict(phases),
        "operator_peak_rss_mib": round(rss / 2**20, 1),
        "operator_cpu_s": cpu["operator"],
        "syncs": int(syncs),
        "failed_syncs": int(errors),
        "operator_cpu_ms_per_sync": round(per_sync, 2),
        "operator_cpu_ms_per_job": round(1000 * cpu["operator"] / count, 2),
        "cpu_s_by_process": cpu,  # the operator and each control-plane process, over the burst
        "apiserver_cpu_share": round(cpu.get("kube-apiserver", 0.0) / total_cpu, 3) if total_cpu else None,
        "operator_cpu_share": round(cpu["operator"] / total_cpu, 3) if total_cpu else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serial", type=int, default=50)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--burst-timeout", type=float, default=600, help="seconds the burst may take")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the local cluster's directory")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "operator.json")
    args = parser.parse_args()

    cluster = LocalCluster.recorded(args.root)
    if cluster is None or not cluster.is_running():
        sys.exit("no local cluster is running: start one with `make cluster-up`")
    install_crd(cluster)
    bench = Bench(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    log = args.root / "bench-operator.log"
    results: dict[str, Any] = {}
    with OperatorProcess(cluster.kubeconfig, log_path=log) as op:
        if args.serial:
            results["serial"] = serial(bench, args.serial)
        if args.burst:
            results["burst"] = burst(bench, args.burst, op, cluster, args.burst_timeout)
        results["operator_peak_rss_mib"] = round(op.peak_rss_bytes() / 2**20, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
