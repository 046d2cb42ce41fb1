"""`make demo`: a ToolRLJob trains for real on the embedded local cluster.

The local cluster's real node runs the project's images: the operator installed from the chart
as a pod, a Kubernetes Job that stages a tiny model and toy data on a PersistentVolume, then
`kubectl apply -f examples/toolrljob-cpu.yaml`: KubeRay starts a Ray head and worker, verl's
GRPO loop trains on the CPU, its tool calls go to the job's sandboxed tool-pool pods, the
operator scales the pool with the trainer's phase, and Prometheus scrapes every pod. The demo
prints what a user watches (`kubectl get trj`, conditions, Events, the dashboard's numbers),
saves a PNG of the run, shows the GPU-shaped example scheduled onto the fake GPU nodes, and
cleans up.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

import yaml
from harness import REPO
from harness.localcluster import LocalCluster
from harness.localcluster.__main__ import DEFAULT_ROOT
from harness.localcluster.build import ensure_kube_router_built, ensure_node_built
from harness.operator_process import EXAMPLE_VOLUMES_LABEL, example_volumes, get_json, wait_until
from harness.training_cluster import (
    CPU_EXAMPLE,
    DEMO_REAL_NODES,
    GPU_EXAMPLE,
    JobState,
    TrainingCluster,
    dashboard_queries,
    finite_over,
    plot_run,
    stage_toy_data,
    training_cluster,
)

NAMESPACE = "toolrl-demo"
DEMO_ROOT = DEFAULT_ROOT.with_name(".local-cluster-demo")
OUT = REPO / "demo-output"
TERMINAL = ("Succeeded", "Failed")


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def show(tc: TrainingCluster | LocalCluster, *args: str) -> None:
    print(tc.kubectl(*args).stdout.rstrip(), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster, operator and job running")
    args = parser.parse_args()
    # `kill` (or a CI's timeout) cleans up too, not only Ctrl-C
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    recorded = LocalCluster.recorded(DEFAULT_ROOT)
    running = recorded if recorded and recorded.is_running() else None
    # `make cluster-up`'s cluster is used when it has the real node; one without (kwok only,
    # `--no-real-node`) is left alone and the demo brings up its own beside it
    cluster = running if running and running.real_node else None
    started_here = cluster is None
    if started_here:
        root = DEMO_ROOT if running else DEFAULT_ROOT
        if not running and recorded:
            recorded.down()
        step(
            f"bringing up the local cluster ({root.name}): control plane, KubeRay, {DEMO_REAL_NODES} real "
            "nodes (each with its NetworkPolicy enforcer, the second in a network namespace of its own), "
            "GPU nodes"
        )
        # the job trains with the operator's NetworkPolicies enforced by packets, as on a real cluster
        cluster = LocalCluster(root, real_node=True, network_policy=True, real_nodes=DEMO_REAL_NODES)
        cluster.node_bin_dir = ensure_node_built()
        cluster.kube_router = ensure_kube_router_built()
        cluster.up()
    try:
        with training_cluster(cluster, cluster.root / "demo", NAMESPACE) as tc:
            code = run(tc, started)
            if args.keep:
                print(
                    f"\n--keep: KUBECONFIG={cluster.kubeconfig} Prometheus {tc.prometheus.url} (Ctrl-C ends)"
                )
                while True:
                    time.sleep(3600)
            return code
    finally:
        if started_here and not args.keep:
            step("tearing the local cluster down (it was started for this demo)")
            cluster.down()
        print(f"\ndemo took {time.monotonic() - started:.0f} s")


def run(tc: TrainingCluster, started: float) -> int:
    step("nodes: the real CPU nodes run the pods (each offers half this machine); kwok's GPU nodes pretend")
    show(
        tc,
        "get",
        "nodes",
        "-o",
        "custom-columns=NAME:.metadata.name,GPU:.status.allocatable.nvidia\\.com/gpu,"
        "CPU:.status.allocatable.cpu,RUNTIME:.status.nodeInfo.containerRuntimeVersion",
    )
    step("the operator, installed from the chart (helm), as a pod on a real node")
    show(tc, "get", "pods,servicemonitors,podmonitors,prometheusrules", "-n", "toolrl-system")
    print(f"Prometheus: {tc.prometheus.url} (scraping the pods the chart's monitors select)")

    step("staging the tiny model and toy data: a Job in the trainer image writes them to a PersistentVolume")
    took = stage_toy_data(tc)
    print(tc.kubectl("logs", "job/toy-data", "-n", tc.namespace, "--tail", "1").stdout.rstrip())
    print(f"toy data ready in {took:.0f} s")

    name = yaml.safe_load(CPU_EXAMPLE.read_text())["metadata"]["name"]
    step(f"kubectl apply -n {tc.namespace} -f examples/toolrljob-cpu.yaml")
    applied = time.time()
    show(tc, "apply", "-n", tc.namespace, "-f", str(CPU_EXAMPLE))
    job = watch(tc, name)
    phase = job["status"]["phase"]
    step(f"kubectl get trj -n {tc.namespace}")
    show(tc, "get", "trj", "-n", tc.namespace)

    step("conditions")
    for c in job["status"]["conditions"]:
        print(f"  {c['type']:<20} {c['status']:<6} {c['reason']}: {c.get('message', '')[:160]}")
    step("Events of the job (the autoscaler's decisions among them)")
    for e in tc.events(name):
        print(f"  {e.get('lastTimestamp', '')[11:19]}  {e['reason']:<22} {e['message'][:150]}")

    step("the dashboard's panels, as Prometheus answers them for this run (range: min .. max)")
    for title, expr in dashboard_queries(tc.namespace, name):
        values = finite_over(tc.prometheus, expr, applied, time.time())
        shown = f"{min(values):.3g} .. {max(values):.3g}" if values else "no data"
        print(f"  {title[:60]:<60} {shown}")
    png = plot_run(tc.prometheus, tc.namespace, name, applied - 30, time.time() + 5, OUT / f"{name}.png")
    print(f"\nthe run as a picture (reward, step, tool latency, pool size): {png}")

    gpu_example(tc)
    print(f"\n{name}: {phase}; {time.monotonic() - started:.0f} s since `make demo` started")
    return 0 if phase == "Succeeded" else 1


def watch(tc: TrainingCluster, name: str, timeout: float = 3600) -> dict:
    """Print `kubectl get trj` and the RayJob's status whenever they change, until the job ends."""
    step(f"kubectl get trj {name} -w  (and the RayJob KubeRay runs for it)")
    seen: JobState | None = None
    begun = time.monotonic()
    placed = False

    def ended() -> bool:
        nonlocal seen, placed
        now = tc.state(name)
        if now.step and not placed:  # training: where its pods run (the Ray head and worker apart)
            placed = True
            columns = "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,IP:.status.podIP"
            show(tc, "get", "pods", "-n", tc.namespace, "-l", f"toolrl.dev/job={name}", "-o", columns)
        if now != seen:
            seen = now
            reward = "-" if now.reward is None else f"{now.reward:.3f}"
            print(
                f"  {time.monotonic() - begun:6.0f}s  phase={now.phase!s:<12} step={now.step!s:>2}/"
                f"{now.total_steps or '?'} reward={reward:<6} rayjob={now.deployment}/{now.ray_job}"
                f"  pool desired={now.desired_replicas} ready={now.ready_replicas}",
                flush=True,
            )
        return now.phase in TERMINAL

    wait_until(ended, timeout, f"{name} to succeed or fail", interval=3)
    return tc.job(name)


def gpu_example(tc: TrainingCluster) -> None:
    """examples/toolrljob.yaml asks for 2 workers with 8 GPUs: they land on kwok's GPU nodes."""
    name = yaml.safe_load(GPU_EXAMPLE.read_text())["metadata"]["name"]
    step(
        "the GPU-shaped example (examples/toolrljob.yaml): its workers are scheduled onto the fake GPU nodes"
    )
    # its data and checkpoint claims (examples/data-prep-job.yaml on a real cluster), bound to volumes
    # that store nothing: the fake nodes mount none
    tc.cluster.kubectl("apply", "-f", "-", input=json.dumps(example_volumes(tc.namespace)))
    show(tc, "apply", "-n", tc.namespace, "-f", str(GPU_EXAMPLE))

    def scheduled() -> list[dict]:
        pods = get_json(
            tc.cluster,
            "pods",
            "-n",
            tc.namespace,
            "-l",
            f"toolrl.dev/job={name},app.kubernetes.io/component=trainer",
        )["items"]
        on_gpu = [p for p in pods if (p["spec"].get("nodeName") or "").startswith("gpu-node")]
        return on_gpu if len(on_gpu) >= 2 else []

    wait_until(scheduled, 300, "the GPU workers scheduled", interval=2)
    show(
        tc,
        "get",
        "pods",
        "-n",
        tc.namespace,
        "-l",
        f"toolrl.dev/job={name}",
        "-o",
        "custom-columns=POD:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase,"
        "GPU:.spec.containers[0].resources.requests.nvidia\\.com/gpu",
    )
    print("(the head asks for 4 CPUs and 16 GiB, more than this machine's real node has: it waits)")
    show(tc, "delete", "trj", name, "-n", tc.namespace)
    volumes = f"{EXAMPLE_VOLUMES_LABEL}={tc.namespace}"
    tc.kubectl("delete", "pvc", "-n", tc.namespace, "-l", volumes, "--wait=false")
    tc.kubectl("delete", "pv", "-l", volumes, "--wait=false")


if __name__ == "__main__":
    sys.exit(main())
