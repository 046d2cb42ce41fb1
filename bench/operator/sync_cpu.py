"""The operator's CPU per sync, in-process: the real Reconciler, builders, status table and API client
(`apply.Kube` over the kubernetes package's ApiClient and REST layer), with only the socket replaced
by an in-memory API server that answers as kube-apiserver does (the applied object back with
metadata, managedFields and a resourceVersion that changes only when the object does).

    python bench/operator/sync_cpu.py [--jobs 200] [--rounds 5] [--profile out.prof] [--out x.json]

What it measures, per job and sync, as the process's CPU time while one sync runs (time.process_time:
the sync thread and its apply threads):
- create: a new job's first sync (every child applied, the first status written);
- no-op: a sync after the watch events of its own applies, nothing changed (the bulk of a burst's
  syncs: every child's and every pod's event queues one);
- resync: the periodic resync's pass (every child applied again, the status unchanged).
It also counts the API calls each kind of sync made. The watches, kopf's event processing and the
API server are not in these numbers (bench/operator/run.py measures the whole operator).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import pstats
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from harness import REPO
from toolrl_api.defaulting import apply_defaults
from toolrl_operator.apply import Kube
from toolrl_operator.handlers import Runtime, deployment_view, job_view, rayjob_view
from toolrl_operator.reconcile import Reconciler
from toolrl_operator.settings import Settings

try:  # the job the cluster benchmark creates: run as a script, its directory is on the path
    from run import job as bench_job
except ImportError:  # imported as bench.operator.sync_cpu (tests)
    from bench.operator.run import job as bench_job

CRD = REPO / "crds" / "toolrl.dev_toolrljobs.yaml"
NAMESPACE = "bench"
Key = tuple[str, str]


def fields_v1(value: Any) -> Any:
    """managedFields' fieldsV1 of an object: about as large as the object (kube-apiserver's shape)."""
    if isinstance(value, dict):
        return {f"f:{k}": fields_v1(v) for k, v in value.items()}
    if isinstance(value, list):
        return {f"k:{json.dumps(item, sort_keys=True)[:60]}": fields_v1(item) for item in value}
    return {}


class Response:
    def __init__(self, status: int, data: bytes) -> None:
        self.status, self.reason, self.data, self.headers = status, "", data, {}


class FakeApiServer:
    """The pool_manager of the kubernetes package's REST client: answers server-side applies and
    creates in memory, counting the calls by method and kind of path."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 1000
        self.calls: Counter[str] = Counter()

    def request(self, method: str, url: str, body: str | None = None, **_: Any) -> Response:
        path = url.split("?", 1)[0].split("://", 1)[-1].split("/", 1)[1]
        doc = json.loads(body) if body else {}
        if method == "POST":  # an Event
            self.calls["event"] += 1
            return Response(201, json.dumps(doc).encode())
        if path.endswith("/status"):
            self.calls["status"] += 1
            return Response(200, json.dumps(doc).encode())
        if path.endswith("/scale"):  # the pool's size: its manager then owns spec.replicas
            self.calls["scale"] += 1
            live = self.objects[path.removesuffix("/scale")]["live"]
            manager = parse_qs(urlsplit(url).query)["fieldManager"][0]
            live["spec"]["replicas"] = doc["spec"]["replicas"]
            live["metadata"]["managedFields"] = [
                *(m for m in live["metadata"]["managedFields"] if m["manager"] != manager),
                {"manager": manager, "operation": "Apply", "subresource": "scale", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            ]  # fmt: skip
            self.version += 1
            live["metadata"]["resourceVersion"] = str(self.version)
            return Response(200, json.dumps(doc).encode())
        self.calls["apply"] += 1
        old = self.objects.get(path)
        meta = doc["metadata"]
        if old is None or old["spec-hash"] != json.dumps(doc, sort_keys=True):
            self.version += 1
            live = copy.deepcopy(doc)
            live["metadata"] |= {
                "uid": old["live"]["metadata"]["uid"] if old else f"uid-{self.version}",
                "resourceVersion": str(self.version),
                "generation": 1,
                "creationTimestamp": "2026-12-06T00:00:00Z",
                "managedFields": [
                    {"manager": "toolrl-operator", "operation": "Apply", "apiVersion": doc["apiVersion"],
                     "time": "2026-12-06T00:00:00Z", "fieldsType": "FieldsV1",
                     "fieldsV1": fields_v1({k: v for k, v in doc.items() if k not in ("apiVersion", "kind")})}
                ],
            }  # fmt: skip
            if doc["kind"] in ("Deployment", "RayJob"):
                live["status"] = {"observedGeneration": 1, "replicas": 1, "conditions": [{"type": "Ready"}]}
            if old is not None and doc["kind"] == "Deployment":  # its size stays with its other owner
                before = old["live"]
                live["metadata"]["managedFields"] += [
                    m for m in before["metadata"]["managedFields"] if m.get("subresource") == "scale"
                ]
                live["spec"].setdefault("replicas", before["spec"].get("replicas"))
            self.objects[path] = {"spec-hash": json.dumps(doc, sort_keys=True), "live": live}
        assert meta["name"]
        return Response(200, json.dumps(self.objects[path]["live"]).encode())


def make_jobs(count: int) -> list[dict[str, Any]]:
    crd = yaml.safe_load(CRD.read_text())
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    jobs = []
    for i in range(count):
        doc = bench_job(f"bench-{i:04d}")
        apply_defaults(spec_schema, doc["spec"])
        doc["metadata"] |= {"namespace": NAMESPACE, "uid": f"u{i}", "generation": 1, "resourceVersion": "1"}
        jobs.append(doc)
    return jobs


def reconciler(jobs: list[dict[str, Any]]) -> tuple[Reconciler, FakeApiServer, dict[str, Any]]:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = "https://apiserver.invalid"
    api_client = client.ApiClient(configuration)
    server = FakeApiServer()
    api_client.rest_client.pool_manager = server  # type: ignore[assignment]
    indexes: dict[str, dict[Any, list[dict[str, Any]]]] = {"jobs": {}, "rayjobs": {}, "deployments": {}}
    for doc in jobs:
        indexes["jobs"][(NAMESPACE, doc["metadata"]["name"])] = [job_view(doc)]
    runtime = Runtime(Settings(), Kube(api_client, "toolrl-operator"), indexes["jobs"], indexes["rayjobs"],
                      indexes["deployments"])  # fmt: skip
    return runtime.reconciler, server, indexes


def see_own_writes(rec: Reconciler, server: FakeApiServer, indexes: dict[str, Any], key: Key) -> None:
    """What the watches deliver after a sync: each child's event (its resourceVersion), the
    RayJob's and the Deployment's index views, the job with the status just written."""
    name = key[1]
    for entry in server.objects.values():
        live = entry["live"]
        meta = live["metadata"]
        if meta.get("labels", {}).get("toolrl.dev/job") != name:
            continue
        rec.child_seen(key, live["kind"], meta["name"], meta["resourceVersion"], deleted=False)
        if live["kind"] == "RayJob":
            indexes["rayjobs"][key] = [rayjob_view(live)]
        if live["kind"] == "Deployment":
            indexes["deployments"][key] = [deployment_view(live)]
    state = rec.state.get(key)
    if state is not None and state.status:
        job = indexes["jobs"][key][0]
        job["status"] = {**(job.get("status") or {}), **copy.deepcopy(state.status)}


def timed(rec: Reconciler, key: Key) -> float:
    started = time.process_time()
    try:
        rec.sync(key)
    except Exception as err:  # a bench of the happy path: any error is a bug
        raise SystemExit(f"sync of {key} failed: {err}") from err
    return time.process_time() - started


def measure(jobs: int, rounds: int, profile: Path | None) -> dict[str, Any]:
    rec, server, indexes = reconciler(make_jobs(jobs))
    keys = sorted(indexes["jobs"])
    result: dict[str, Any] = {"jobs": jobs, "rounds": rounds}
    calls_before = Counter(server.calls)
    create = [timed(rec, key) for key in keys]
    result["create"] = summary(create, server.calls - calls_before, jobs)
    for key in keys:
        see_own_writes(rec, server, indexes, key)
    # the status written by the first sync, now seen: the next syncs may still write (e.g. the
    # RayJob's view arrived; the pool's size handed to the autoscaler's field manager, then left out
    # of the Deployment's apply): settling passes, not measured
    for _ in range(2):
        for key in keys:
            rec.sync(key)
            see_own_writes(rec, server, indexes, key)
    profiler = cProfile.Profile() if profile else None
    calls_before = Counter(server.calls)
    noop = []
    for _ in range(rounds):
        for key in keys:
            if profiler:
                profiler.enable()
            noop.append(timed(rec, key))
            if profiler:
                profiler.disable()
    result["noop"] = summary(noop, server.calls - calls_before, jobs * rounds)
    calls_before = Counter(server.calls)
    rec.resync()
    resync = [timed(rec, key) for key in keys]
    result["resync"] = summary(resync, server.calls - calls_before, jobs)
    result["rss_mib"] = rss_mib()
    if profiler and profile:
        profiler.dump_stats(str(profile))
        pstats.Stats(str(profile)).sort_stats("cumulative").print_stats(30)
    return result


def rss_mib() -> float:
    """This process's resident memory now (the operator's state for `jobs` jobs, the fake server's
    objects and the imports)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def summary(seconds: list[float], calls: Counter[str], syncs: int) -> dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    return {
        "syncs": len(ms),
        "cpu_ms_mean": round(statistics.fmean(ms), 3),
        "cpu_ms_p50": round(statistics.median(ms), 3),
        "cpu_ms_p95": round(sorted(ms)[int(0.95 * (len(ms) - 1))], 3),
        "api_calls_per_sync": {k: round(v / syncs, 2) for k, v in sorted(calls.items())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5, help="no-op syncs of every job")
    parser.add_argument("--profile", type=Path, help="cProfile the no-op syncs into this file")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = measure(args.jobs, args.rounds, args.profile)
    print("| sync | syncs | CPU ms mean | p50 | p95 | API calls per sync |")
    print("|---|---:|---:|---:|---:|---|")
    for kind in ("create", "noop", "resync"):
        r = result[kind]
        calls = ", ".join(f"{k} {v}" for k, v in r["api_calls_per_sync"].items()) or "none"
        cpu = f"{r['cpu_ms_mean']} | {r['cpu_ms_p50']} | {r['cpu_ms_p95']}"
        print(f"| {kind} | {r['syncs']} | {cpu} | {calls} |")
    print(f"\nRSS at the end: {result['rss_mib']} MiB ({args.jobs} jobs; the fake API server's objects too)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
