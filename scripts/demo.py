"""`make demo`: a ToolRLJob end to end on the embedded local cluster.

The real control plane and KubeRay run the job's GPU cluster on kwok's fake GPU nodes (pods
are scheduled and reported Running, but run no code), the real operator reconciles the job,
and the two pieces that would run inside those pods run here for real: the tool sandbox
server with the job's generated tool config, and the trainer's translation of the job into
verl's configuration (`trainer_entry run --dry-run`). Then the job is deleted and garbage
collection removes every child.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from localcluster import LocalCluster  # noqa: E402
from localcluster.__main__ import DEFAULT_ROOT  # noqa: E402
from operator_process import OperatorProcess, get_json, install_crd, wait_until  # noqa: E402
from sandbox_process import SandboxProcess  # noqa: E402

NAMESPACE = "toolrl-demo"
DEMO_ROOT = DEFAULT_ROOT.with_name(".local-cluster-demo")
EXAMPLE = REPO / "examples" / "toolrljob.yaml"


def step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def show(cluster: LocalCluster, *args: str) -> None:
    print(cluster.kubectl(*args).stdout.rstrip(), flush=True)


def main() -> int:
    recorded = LocalCluster.recorded(DEFAULT_ROOT)
    running = recorded if recorded and recorded.is_running() else None
    # the demo's Ray cluster runs on kwok's fake nodes; `make cluster-up`'s real node (2 CPUs
    # here) fits no 4-CPU Ray head, so beside one the demo starts a kwok-only cluster of its own
    cluster = running if running and not running.real_node else None
    started_here = cluster is None
    if started_here:
        if recorded and not running:
            recorded.down()
        cluster = LocalCluster(DEMO_ROOT if running else DEFAULT_ROOT)
        cluster.up()
    try:
        return run(cluster)
    finally:
        if started_here:
            step("tearing the local cluster down (it was started for this demo)")
            cluster.down()


def run(cluster: LocalCluster) -> int:
    step("nodes (4 fake GPU nodes with nvidia.com/gpu: 8, 2 CPU nodes)")
    show(
        cluster,
        "get",
        "nodes",
        "-o",
        "custom-columns=NAME:.metadata.name,"
        "GPU:.status.allocatable.nvidia\\.com/gpu,CPU:.status.allocatable.cpu",
    )

    step("installing the ToolRLJob CRD and starting the operator")
    install_crd(cluster)
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    log = DEFAULT_ROOT / "logs" / "operator.log"
    with OperatorProcess(cluster.kubeconfig, namespaces=[NAMESPACE], log_path=log):
        print(f"operator log: {log}")
        step(f"kubectl apply -n {NAMESPACE} -f examples/toolrljob.yaml")
        show(cluster, "apply", "-n", NAMESPACE, "-f", str(EXAMPLE))
        name = get_json(cluster, "-f", str(EXAMPLE), "-n", NAMESPACE)["metadata"]["name"]

        started = time.monotonic()
        job = wait_until(
            lambda: (
                (j := get_json(cluster, "trj", name, "-n", NAMESPACE)).get("status", {}).get("phase")
                == "Running"
                and j
            ),
            120,
            "phase Running",
        )
        print(f"phase Running after {time.monotonic() - started:.1f}s")
        show(cluster, "get", "trj", "-n", NAMESPACE)
        step("conditions")
        for c in job["status"]["conditions"]:
            print(f"  {c['type']:<16} {c['status']:<6} {c['reason']}: {c.get('message', '')}")
        step("children (all owned by the job)")
        show(
            cluster,
            "get",
            "configmap,deployment,service,pdb,networkpolicy,serviceaccount,role,"
            "rolebinding,rayjob,raycluster",
            "-n",
            NAMESPACE,
            "-l",
            f"toolrl.dev/job={name}",
        )
        step("the Ray cluster's pods on the fake GPU nodes")
        show(cluster, "get", "pods", "-n", NAMESPACE, "-o", "wide")

        config = get_json(cluster, "configmap", f"{name}-config", "-n", NAMESPACE)["data"]
        with tempfile.TemporaryDirectory() as tmp:
            spec_file, tools_file = Path(tmp) / "job.json", Path(tmp) / "tools.yaml"
            spec_file.write_text(config["job.json"])
            tools_file.write_text(config["tools.yaml"])
            tool_call(tools_file)
            step("what the Ray head runs: python -m trainer_entry run --spec job.json --dry-run")
            out = subprocess.run(
                [sys.executable, "-m", "trainer_entry", "run", "--spec", str(spec_file), "--dry-run"],
                capture_output=True,
                text=True,
            )
            print("\n".join(out.stdout.splitlines()[:40]))
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                return out.returncode

        step("events")
        show(
            cluster,
            "get",
            "events",
            "-n",
            NAMESPACE,
            "--field-selector",
            f"involvedObject.name={name}",
            "--sort-by=.lastTimestamp",
        )
        step(f"kubectl delete trj {name}: the garbage collector removes every child")
        show(cluster, "delete", "trj", name, "-n", NAMESPACE)
        wait_until(
            lambda: (
                not get_json(
                    cluster, "deployment,configmap,rayjob", "-n", NAMESPACE, "-l", f"toolrl.dev/job={name}"
                )["items"]
            ),
            60,
            "children gone",
        )
        print("all children gone")
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
    return 0


def tool_call(tools_file: Path) -> None:
    """Serve the job's tool config with the real sandbox and make one call, as a rollout would."""
    step("the tool pool's server, with the job's generated tools.yaml: one python call")
    with SandboxProcess.start(tools_file.parent / "sandbox", config=tools_file) as server:
        code = "import numpy as np\nprint(np.arange(10).sum())"
        body = server.execute(code)
        took = body["durationSeconds"] * 1000
        print(f"POST /v1/execute {json.dumps({'tool': 'python', 'input': code})}")
        print(f"  -> status={body['status']} output={body['output']!r} in {took:.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
