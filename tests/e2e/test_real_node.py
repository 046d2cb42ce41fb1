"""The local cluster's two real nodes (localcluster/node.py; the second in a network namespace of its
own, routed to the first) run the project's own images: real pods beside kwok's fake GPU nodes, the
API and cluster DNS reachable from pods on either node, pods on the two nodes reaching each other
directly and through Services, `kubectl logs/exec`, the operator's hardened tool pool under Pod
Security `restricted` (Landlock and seccomp active, hostile code contained), the operator's
NetworkPolicies enforced by packets within and between the nodes (each node runs kube-router's
firewall), a node that crashes under a job's pool (named in the job's status, the pool back on the
other node, the node used again once it is back), the egress guard, and a host put back as it was by
`down`.

One cluster with real nodes runs per machine, so the tests share one (module scope), in any order; the
fixture's teardown stops it and fails the module's last test if a packet left the machine or the
host differs from what it was before `up`.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from chartgen.helm import helm
from harness import REPO
from harness.localcluster import LocalCluster
from harness.localcluster.addresses import BRIDGE_IP, kubernetes_service_ip, node_ip
from harness.localcluster.cluster import real_node_cluster
from harness.localcluster.images import Image, ensure_image
from harness.localcluster.node import (
    BRIDGE,
    GUARD_CHAIN,
    LINK_PREFIX,
    NETNS_DIR,
    NODE_LABEL,
    NODE_NAME,
    in_netns,
)
from harness.operator_process import (
    OperatorProcess,
    delete_jobs,
    get_json,
    install_crd,
    job_events,
    small_job,
    wait_until,
)
from mcp import Client
from openenv.core import GenericEnvClient
from toolrl_operator.job import parse_job
from toolrl_operator.naming import (
    COMPONENT_TOOL_POOL,
    COMPONENT_TRAINER,
    RAY_CLIENT_PORT,
    RAY_DASHBOARD_ACCESS_LABEL,
    RAY_DASHBOARD_PORT,
    RAY_GCS_PORT,
    TOOL_POOL_METRICS_PORT,
    TOOL_POOL_PORT,
    TRAINER_METRICS_PORT,
    selector_labels,
)
from toolrl_operator.rayjob import build_ray_network_policy
from toolrl_operator.settings import Settings
from toolrl_operator.toolpool import build_network_policy

SECOND = "cpu-real-1"  # the second real node, in its own network namespace
REAL_NODES = (NODE_NAME, SECOND)

# counters and ids that change by themselves (measured: two `sysctl -a` 5 s apart)
VOLATILE_SYSCTLS = re.compile(
    r"^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota\.)|kernel\.(ns_last_pid|random\.|pty\.nr)"
    r"|net\.netfilter\.nf_conntrack_count)"
)
OUR_BINARIES = {
    "containerd",
    "containerd-shim-runc-v2",
    "kubelet",
    "kube-proxy",
    "coredns",
    "pause",
    "runc",
    "kube-router",
}


def machine_state() -> dict:
    """What a real node may change on this machine, read with the host's own tools."""

    def run(*cmd: str) -> str:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    def no_counters(save: str) -> list[str]:
        return sorted(re.sub(r"\[\d+:\d+\]", "", ln) for ln in save.splitlines() if not ln.startswith("#"))

    sysctls = sorted(ln for ln in run("sysctl", "-a").splitlines() if not VOLATILE_SYSCTLS.match(ln))
    processes = []
    for d in Path("/proc").iterdir():
        try:
            exe = (d / "cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, ValueError):
            continue
        if Path(exe).name in OUR_BINARIES:
            processes.append(f"{d.name} {exe}")
    return {
        "sysctls": sysctls,
        "iptables": no_counters(run("iptables-save")),
        "ip6tables": no_counters(run("ip6tables-save")),
        # a set, as the others: the order of the listing changes (an image build's network beside the
        # module: seen, "nft differs" with nothing gone and nothing new)
        "nft": sorted(run("nft", "list", "tables").split("\n")),
        "nfacct": sorted(ln.rsplit("=", 1)[1] for ln in run("nfacct", "list").splitlines() if "=" in ln),
        "ipsets": sorted(run("ipset", "list", "-n").split()),
        "links": sorted(Path("/sys/class/net").iterdir()),
        "routes": run("ip", "route", "show", "table", "all").splitlines(),
        "mounts": [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()],
        "cgroups": sorted(str(d) for d in Path("/sys/fs/cgroup").glob("*/*") if d.is_dir()),
        "processes": sorted(processes),
    }


@pytest.fixture(scope="module")
def images() -> dict[str, Image]:
    """The images the tests run, built (or taken from the cache, keyed by their inputs)."""
    return {name: ensure_image(name) for name in ("tool-sandbox", "operator")}


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, images: dict[str, Image]) -> Iterator[LocalCluster]:
    def snapshot(cluster: LocalCluster) -> None:  # no other cluster's node changes the host meanwhile
        cluster.before = machine_state()  # type: ignore[attr-defined]

    # with the NetworkPolicy enforcer (kube-router's firewall): the operator's policies hold in every test
    root = tmp_path_factory.mktemp("real")
    with real_node_cluster(
        root, claimed=snapshot, network_policy=True, real_nodes=len(REAL_NODES)
    ) as cluster:
        for image in images.values():
            cluster.import_image(image.archive, image.ref)
        yield cluster
        # every packet from or to 198.18.0.0/15 that tried another interface than the bridge or
        # loopback was dropped and counted by the guard, over all of the module's tests
        drops = cluster.node.guard_drops()
    problems = [f"the egress guard dropped {drops} packet(s) leaving the machine"] if drops else []
    problems += host_differences(cluster.before, machine_state())  # type: ignore[attr-defined]
    assert not problems, "the real node did not leave the host as it was:\n" + "\n".join(problems)


def host_differences(before: dict, after: dict) -> list[str]:
    """What `down` left changed on the host, per kind of state (gone and new entries)."""
    differences = []
    for key in before:
        if after[key] != before[key]:
            change = {
                "gone": sorted(set(map(str, before[key])) - set(map(str, after[key]))),
                "new": sorted(set(map(str, after[key])) - set(map(str, before[key]))),
            }
            differences.append(f"{key} differs after down: " + json.dumps(change, indent=1))
    return differences


def pod(name: str, image: Image, command: list[str], node: str | None = None, **spec: object) -> dict:
    """A pod on a real node (`node`, or either) that passes Pod Security `restricted`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node} if node else {NODE_LABEL: "true"},
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "main",
                    "image": image.ref,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            **spec,
        },
    }


def restricted_namespace(cluster: LocalCluster) -> str:
    name = f"real-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    return name


def pod_phase(cluster: LocalCluster, ns: str, name: str) -> str:
    return get_json(cluster, "pod", name, "-n", ns)["status"].get("phase", "")


def test_real_nodes_are_ready_beside_the_fake_gpu_nodes(real: LocalCluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in get_json(real, "nodes")["items"]}
    for index, name in enumerate(REAL_NODES):
        node = nodes[name]
        assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.36.3"
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.")
        assert node["status"]["addresses"][0] == {"type": "InternalIP", "address": node_ip(index)}
        assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert node_ip(0) == BRIDGE_IP
    gpu = [n for n in nodes.values() if "nvidia.com/gpu" in n["status"]["allocatable"]]
    assert len(gpu) == 4 and all(n["spec"]["taints"][0]["key"] == "nvidia.com/gpu" for n in gpu)
    # the egress guard is hooked where every leaving packet passes: the second node's packets leave its
    # namespace only by its link, into the host
    save = subprocess.run(["iptables-save", "-t", "mangle"], capture_output=True, text=True).stdout
    assert f"-A POSTROUTING -j {GUARD_CHAIN}" in save and f"-A {GUARD_CHAIN} -o {BRIDGE} -j RETURN" in save
    assert f"-A {GUARD_CHAIN} -o {LINK_PREFIX}+ -j RETURN" in save
    netns = real.nodes[1].netns
    assert netns and (NETNS_DIR / netns).exists()
    routes = subprocess.run(
        ["ip", "netns", "exec", netns, "ip", "-4", "route"], capture_output=True, text=True, check=True
    ).stdout
    assert "default" not in routes, routes  # nothing but 198.18.0.0/15, by the host


@pytest.mark.parametrize("node", REAL_NODES)
def test_a_pod_reaches_the_api_server_and_cluster_dns(
    real: LocalCluster, images: dict[str, Image], node: str
) -> None:
    """On either node: the second reaches both through its link (the API server and CoreDNS listen on
    the first node's address; the `kubernetes` Service's ClusterIP is its own kube-proxy's)."""
    ns = restricted_namespace(real)
    script = (
        "import json, socket, ssl, urllib.request\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount'\n"
        "addr = socket.getaddrinfo('kubernetes.default.svc.cluster.local', 443)[0][4][0]\n"
        "ctx = ssl.create_default_context(cafile=sa + '/ca.crt')\n"
        "req = urllib.request.Request('https://kubernetes.default.svc/version',"
        " headers={'Authorization': 'Bearer ' + open(sa + '/token').read()})\n"
        "version = json.load(urllib.request.urlopen(req, context=ctx, timeout=30))['gitVersion']\n"
        "print(json.dumps({'dns': addr, 'version': version}))\n"
    )
    real.apply(pod("api", images["tool-sandbox"], ["python", "-c", script], node=node), "-n", ns)
    wait_until(lambda: pod_phase(real, ns, "api") in ("Succeeded", "Failed"), 180, "the pod to finish")
    out = real.kubectl("logs", "api", "-n", ns).stdout
    assert pod_phase(real, ns, "api") == "Succeeded", out
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"dns": kubernetes_service_ip(), "version": "v1.36.3"}
    slices = get_json(real, "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes")
    assert slices["items"][0]["endpoints"][0]["addresses"] == [BRIDGE_IP]
    assert get_json(real, "pod", "api", "-n", ns)["spec"]["nodeName"] == node
    real.kubectl("delete", "namespace", ns, "--wait=false")


def test_pods_on_the_two_nodes_reach_each_other_directly_through_services_and_by_name(
    real: LocalCluster, images: dict[str, Image]
) -> None:
    """Traffic between the nodes: a pod on each serves; from each, the other node's pod answers by its
    IP, through its Service's ClusterIP (DNAT by the client's node's kube-proxy) and by the Service's
    DNS name (the first node's CoreDNS); and the pod on the first node reaches the pod on the second
    through the host's own Service rules (from the host)."""
    ns = restricted_namespace(real)
    port = 8081
    for index, node in enumerate(REAL_NODES):
        manifest = pod(
            f"serve-{index}", images["tool-sandbox"], ["python", "-c", SERVE, str(port)], node=node
        )
        manifest["metadata"]["labels"] = {"serve": str(index)}
        real.apply(manifest, "-n", ns)
        real.apply(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": f"serve-{index}"},
                "spec": {"selector": {"serve": str(index)}, "ports": [{"port": 80, "targetPort": port}]},
            },
            "-n",
            ns,
        )
    pods = {f"serve-{i}": (ns, {}, [port]) for i in range(len(REAL_NODES))}
    ip = wait_until(lambda: running_ips(real, pods), 180, "a serving pod Running on each node")
    assert [get_json(real, "pod", p, "-n", ns)["spec"]["nodeName"] for p in pods] == list(REAL_NODES)
    service_ip = {p: get_json(real, "service", p, "-n", ns)["spec"]["clusterIP"] for p in pods}
    for here, there in (("serve-0", "serve-1"), ("serve-1", "serve-0")):
        targets = [(ip[there], port), (service_ip[there], 80), (f"{there}.{ns}.svc.cluster.local", 80)]
        # the Service's endpoints reach each node's kube-proxy a moment after the pod is Running
        wait_until(
            lambda h=here, t=targets: dial_from(real, ns, h, t) == ["open"] * 3,  # type: ignore[misc]
            60,
            f"{here} to reach {there}, on the other node",
        )
    # the host (the first node) reaches the second's pod by its IP and through the host's own Service rules
    socket.create_connection((ip["serve-1"], port), timeout=5).close()
    socket.create_connection((service_ip["serve-1"], 80), timeout=5).close()
    real.kubectl("delete", "namespace", ns, "--wait=false")


def test_kubectl_exec_runs_in_a_pod(real: LocalCluster, images: dict[str, Image]) -> None:
    ns = restricted_namespace(real)
    real.apply(
        pod("sleeper", images["tool-sandbox"], ["python", "-c", "import time; time.sleep(600)"]), "-n", ns
    )
    wait_until(lambda: pod_phase(real, ns, "sleeper") == "Running", 180, "the pod Running")
    out = real.kubectl("exec", "sleeper", "-n", ns, "--", "python", "-c", "import os; print(os.getuid())")
    assert out.stdout.strip() == "65534"
    real.kubectl("delete", "namespace", ns, "--wait=false")


def pool_job(name: str) -> dict:
    """The example job with a one-replica pool small enough for the real node (2 CPUs here)."""
    job = small_job(name)
    job["spec"]["toolPool"].update(
        {
            "replicas": {"min": 1, "max": 1},
            "capacityPerReplica": 4,
            "targetConcurrencyPerReplica": 4,
            "maxSessionsPerReplica": 4,
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        }
    )
    return job


def ready_pool_pod(cluster: LocalCluster, ns: str) -> dict | None:
    pods = get_json(cluster, "pods", "-n", ns, "-l", "app.kubernetes.io/component=tool-pool")["items"]
    for p in pods:
        conditions = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}
        if conditions.get("Ready") == "True":
            return p
    return None


@pytest.fixture(scope="module")
def pool(real: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A ToolRLJob reconciled by the real operator (a host process here) in a namespace that
    enforces Pod Security `restricted`; its tool pool's one pod, Ready on the real node."""
    install_crd(real)
    ns = restricted_namespace(real)
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with OperatorProcess(real.kubeconfig, namespaces=[ns], log_path=log) as op:
        job = pool_job("pool")
        # on the first node, whose namespace is the host's: the tests call the pool from the host, which
        # the pool's policy admits only on its own node (kubelet's probes)
        job["spec"]["toolPool"]["nodeSelector"] = {"kubernetes.io/hostname": NODE_NAME}
        real.apply(job, "-n", ns)
        try:
            found = wait_until(lambda: ready_pool_pod(real, ns), 300, "the tool pool's pod Ready")
        except AssertionError:
            print(op.log_tail(60))
            print(real.kubectl("describe", "pods", "-n", ns).stdout[-4000:])
            raise
        ip = found["status"]["podIP"]
        yield {
            "namespace": ns,
            "pod": found,
            "url": f"http://{ip}:{TOOL_POOL_PORT}",
            "metrics_url": f"http://{ip}:{TOOL_POOL_METRICS_PORT}/metrics",
        }
        delete_jobs(real, ns)


def _http(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_hardened_tool_pool_pod_is_ready_with_landlock_and_seccomp(real: LocalCluster, pool: dict) -> None:
    spec = pool["pod"]["spec"]
    assert spec["nodeName"] in REAL_NODES
    assert spec["automountServiceAccountToken"] is False
    container = spec["containers"][0]["securityContext"]
    assert container["readOnlyRootFilesystem"] and container["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    status, body = _http(pool["url"] + "/readyz")
    assert status == 200 and body["ready"] is True, body
    layers = body["sandbox"]
    assert layers["landlockAbi"] >= 1 and layers["seccomp"] is True and layers["noNewPrivs"] is True, layers


def test_hostile_code_is_contained_inside_the_pool_pod(real: LocalCluster, pool: dict) -> None:
    cases = [
        ("import os\nwhile True:\n    os.fork()", "PermissionError"),
        ("print(open('/etc/passwd').read())", "PermissionError"),
        ("import socket\nsocket.socket().connect(('198.18.0.1', 53))", "PermissionError"),
        ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "PermissionError"),
        ("import os\nos.execv('/bin/sh', ['sh', '-c', 'echo escaped'])", "PermissionError"),
        ("x = bytearray(1 << 34)", "MemoryError"),
    ]
    for code, text in cases:
        status, result = _http(
            pool["url"] + "/v1/execute", {"tool": "python", "input": code, "timeoutSeconds": 5}
        )
        assert status == 200, result
        assert (
            result["status"] == "error" and text in result["stdout"] + result["stderr"] + result["message"]
        ), (
            code,
            result,
        )
    _, result = _http(pool["url"] + "/v1/execute", {"tool": "python", "input": "print(6 * 7)"})
    assert (result["status"], result["stdout"]) == ("ok", "42\n")
    name = pool["pod"]["metadata"]["name"]
    after = get_json(real, "pod", name, "-n", pool["namespace"])
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0


async def test_openenv_and_mcp_clients_run_their_flows_against_the_pool_pod(pool: dict) -> None:
    """The protocols' own clients from PyPI, unchanged, against the pool pod on the real node (its image,
    its pod network): the mcp SDK over streamable HTTP lists and calls the job's tools, OpenEnv's client
    runs an episode over its WebSocket with state kept across steps; the pod counts both protocols."""
    async with Client(pool["url"] + "/mcp") as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert "python" in listed, listed
        ran = await client.call_tool("python", {"code": "print(6 * 7)"})
        assert not ran.is_error and ran.content[0].text == "42\n", ran
        failed = await client.call_tool("python", {"code": "1 / 0"})
        assert failed.is_error and failed.structured_content["fault"] == "code", failed
    async with GenericEnvClient(base_url=pool["url"]) as env:
        first = await env.reset(episode_id="real-node")
        assert first.observation["status"] == "ready" and not first.done, first
        await env.step({"code": "x = 20"})
        step = await env.step({"code": "print(x + 22)"})
        assert step.observation["stdout"] == "42\n" and step.observation["fault"] is None, step
        assert (await env.state())["step_count"] == 2
    with urllib.request.urlopen(pool["metrics_url"], timeout=30) as resp:
        metrics = resp.read().decode()
    for protocol in ("mcp", "openenv"):
        assert f'outcome="ok",protocol="{protocol}",tool="python"' in metrics, protocol


def test_helm_chart_runs_the_operator_in_a_pod_that_reconciles_a_job(
    real: LocalCluster, images: dict[str, Image]
) -> None:
    """The chart from the repository, its image imported (pulling nothing), only its RBAC: the
    operator pod (on either real node) reconciles a job whose pool pod runs on a real node."""
    install_crd(real)  # as the chart's crds/ would; helm leaves an existing CRD alone
    op_ns, job_ns = restricted_namespace(real), restricted_namespace(real)
    chart = REPO / "charts" / "toolrl-operator"  # as a user installs it, from the repository
    base = ["--kubeconfig", str(real.kubeconfig), "--namespace", op_ns]
    release = "op"
    helm(real.bin("helm"), "install", release, str(chart), *base, "--set", f"watchNamespaces={{{job_ns}}}")
    try:
        deployment = f"{release}-toolrl-operator"

        def running_operator() -> dict | None:
            pods = get_json(real, "pods", "-n", op_ns)["items"]
            ok = [p for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")]
            return ok[0] if ok else None

        try:
            op_pod = wait_until(running_operator, 240, "the operator pod Running")
        except AssertionError:
            print(real.kubectl("describe", "pods", "-n", op_ns).stdout[-4000:])
            raise
        assert op_pod["spec"]["nodeName"] in REAL_NODES
        assert op_pod["spec"]["serviceAccountName"] == deployment
        assert (
            op_pod["spec"]["containers"][0]["image"]
            == "toolrl-operator:" + images["operator"].ref.rsplit(":", 1)[1]
        )
        pulled = get_json(real, "events", "-n", op_ns, "--field-selector", "reason=Pulled")["items"]
        assert pulled and all("already present on machine" in e["message"] for e in pulled), pulled

        real.apply(pool_job("helm-job"), "-n", job_ns)
        try:
            found = wait_until(lambda: ready_pool_pod(real, job_ns), 300, "the job's pool pod Ready")
        except AssertionError:
            print(real.kubectl("logs", "-n", op_ns, f"deployment/{deployment}", "--tail", "60").stdout)
            raise
        assert found["spec"]["nodeName"] in REAL_NODES

        def pool_status_written() -> dict | None:
            status = get_json(real, "toolrljob", "helm-job", "-n", job_ns).get("status", {})
            sized = status.get("conditions") and status.get("toolPool", {}).get("desiredReplicas") == 1
            return status if sized else None

        # written by the operator in the pod (the only operator watching job_ns): its conditions, and
        # the autoscaler's size at its first tick (the pool may be Ready before that tick)
        wait_until(pool_status_written, 120, "the operator's status and the autoscaler's desiredReplicas 1")
        delete_jobs(real, job_ns)
    finally:
        helm(real.bin("helm"), "uninstall", release, *base, "--wait", "--timeout", "120s", check=False)


# Registry names of each kind containerd treats its own way: docker.io's short names (library/ and
# registry-1.docker.io), docker.io written out, and other registries.
ABSENT_IMAGES = (
    "toolrl-trainer:0.0.0-absent",
    "docker.io/library/busybox:0.0.0-absent",
    "registry-1.docker.io/library/busybox:0.0.0-absent",
    "ghcr.io/example/absent:1",
    "registry.k8s.io/absent:1",
)


def test_the_node_pulls_nothing_from_anywhere(real: LocalCluster, images: dict[str, Image]) -> None:
    """An image that was not imported fails to pull at once, for every registry name, through the
    closed loopback port and without resolving the registry's name (a `lookup` in the error would
    mean a DNS query left through the host's resolver)."""
    ns = restricted_namespace(real)
    template = images["tool-sandbox"]
    for i, ref in enumerate(ABSENT_IMAGES):
        manifest = pod(f"pull-{i}", template, ["true"])
        manifest["spec"]["containers"][0].update(image=ref, imagePullPolicy="Always")
        real.apply(manifest, "-n", ns)

    def pull_errors() -> dict[str, str]:
        errors = {}
        for item in get_json(real, "pods", "-n", ns)["items"]:
            for status in item["status"].get("containerStatuses") or []:
                waiting = status["state"].get("waiting") or {}
                if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") and waiting.get("message"):
                    errors[status["image"]] = waiting["message"]
        return errors

    wait_until(lambda: len(pull_errors()) == len(ABSENT_IMAGES), 180, "every pull to fail")
    for ref, message in pull_errors().items():
        assert "127.0.0.1:9" in message, f"{ref}: the pull did not go to the closed port: {message}"
        assert "lookup" not in message and "no such host" not in message, f"{ref} resolved a name: {message}"
    real.kubectl("delete", "namespace", ns, "--wait=false")


# NetworkPolicies by packets. Ray's ports that run code besides the dashboard (GCS, the Ray client), and
# an MCP server's:
RAY_CODE_PORTS = (RAY_GCS_PORT, RAY_CLIENT_PORT)
MCP_PORT = 8000
# A pod that accepts TCP connections on each port of its argv:
SERVE = (
    "import socket, sys, threading\n"
    "def serve(port):\n"
    "    s = socket.create_server(('0.0.0.0', port), backlog=64)\n"
    "    while True:\n"
    "        s.accept()[0].close()\n"
    "for p in sys.argv[1:]:\n"
    "    threading.Thread(target=serve, args=(int(p),), daemon=True).start()\n"
    "threading.Event().wait()\n"
)
# Dials each [address, port] of argv[1] (JSON) at once: "open", "closed", or another error's name.
# kube-router REJECTs a denied connection with an ICMP port-unreachable, which the kernel rate-limits per
# destination (net.ipv4.icmp_ratelimit: a burst of ~6, then one a second): of a dozen connections denied
# at once, some see no answer and time out (seen: 6 of 11). Refused or timed out, the connection was
# not made: "closed". Every connection opens before the policies are applied, so a network that drops
# everything fails there.
DIAL = (
    "import json, socket, sys\n"
    "from concurrent.futures import ThreadPoolExecutor\n"
    "def dial(target):\n"
    "    try:\n"
    "        socket.create_connection(tuple(target), timeout=3).close()\n"
    "        return 'open'\n"
    "    except (ConnectionRefusedError, TimeoutError):\n"
    "        return 'closed'\n"
    "    except OSError as exc:\n"
    "        return type(exc).__name__\n"
    "with ThreadPoolExecutor(8) as pool:\n"
    "    print(json.dumps(list(pool.map(dial, json.loads(sys.argv[1])))))\n"
)


def dial_from(
    cluster: LocalCluster, namespace: str, pod_name: str, targets: list[tuple[str, int]]
) -> list[str]:
    """What each connection from inside `pod_name` to `targets` gave: "open", "closed" or an error's name."""
    out = cluster.kubectl(
        "exec", pod_name, "-n", namespace, "--", "python", "-c", DIAL, json.dumps(targets), timeout=60
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def dial_from_node(cluster: LocalCluster, index: int, targets: list[tuple[str, int]]) -> list[str]:
    """What each connection from real node `index`'s own network namespace gave (as `dial_from`)."""
    argv = in_netns(cluster.nodes[index].netns, sys.executable, "-c", DIAL, json.dumps(targets))
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    return json.loads(out.strip().splitlines()[-1])


def running_ips(cluster: LocalCluster, pods: dict[str, tuple[str, dict, list[int]]]) -> dict[str, str] | None:
    """Each pod's IP once all of them are Running, else None."""
    ips = {}
    for name, (namespace, _, _) in pods.items():
        status = get_json(cluster, "pod", name, "-n", namespace)["status"]
        if status.get("phase") != "Running" or not status.get("podIP"):
            return None
        ips[name] = status["podIP"]
    return ips


def readme_policies(marker: str, namespaces: dict[str, str]) -> list[dict]:
    """The YAML block that follows `<!-- network-policy-example: marker -->` in README.md, as written but
    for its namespaces (`namespaces` maps the README's names to the test's)."""
    text = (REPO / "README.md").read_text()
    block = re.search(rf"<!-- network-policy-example: {marker} -->\n```yaml\n(.*?)```", text, re.S)
    assert block, f"README.md has no example policy {marker!r}"
    policies = [doc for doc in yaml.safe_load_all(block.group(1)) if doc]
    for policy in policies:
        policy["metadata"]["namespace"] = namespaces[policy["metadata"]["namespace"]]
        for rule in policy["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                names = peer.get("namespaceSelector", {}).get("matchLabels", {})
                if "kubernetes.io/metadata.name" in names:
                    names["kubernetes.io/metadata.name"] = namespaces[names["kubernetes.io/metadata.name"]]
    return policies


def test_the_operators_network_policies_hold_by_packets(real: LocalCluster, images: dict[str, Image]) -> None:
    """The tool pool's and the Ray pods' NetworkPolicies as the operator builds them (its own builders,
    for a job with an `http` tool and an `mcp` tool whose server runs in another namespace), on pods that
    carry the job's labels, spread over the two real nodes (the pool on the second, the job's Ray pod,
    the http tool's endpoint and the mcp server on the first) and enforced by each node's kube-router
    (egress where the client runs, ingress where the server does): without the policies every
    connection below opens; with them, the pool reaches only the http tool's endpoint and the mcp
    server's port on the server's pods (not those pods' other ports, not another pod of the server's
    namespace, not another namespace, not another job's pool, not the job's own Ray pods' GCS, client or
    dashboard ports, not the API server or either node's kubelet), only the job's Ray pods reach the pool,
    only a namespace labelled for it reaches the Ray dashboard and nothing else reaches GCS or the Ray
    client port, and the pool's own node still reaches it (kubelet's probes) but not the other node. The
    README's example policies for the mcp server's namespace (deny all ingress, admit the tool pools of the
    job's namespace) then
    close the server to a pod of no job and to another namespace while the pool still reaches it.
    Deleted, the denied connections open again."""
    ns, dashboards = restricted_namespace(real), restricted_namespace(real)
    tools_ns, elsewhere = restricted_namespace(real), restricted_namespace(real)
    monitoring = restricted_namespace(real)  # Prometheus's (Settings.monitoring_namespace)
    real.kubectl("label", "namespace", dashboards, f"{RAY_DASHBOARD_ACCESS_LABEL}=true")
    job_name = "np"
    mcp_labels = {"app": "docs-mcp"}
    # name -> (namespace, labels, ports it serves)
    pods: dict[str, tuple[str, dict, list[int]]] = {
        "pool": (
            ns,
            selector_labels(job_name, COMPONENT_TOOL_POOL),
            [TOOL_POOL_PORT, TOOL_POOL_METRICS_PORT],
        ),
        "ray": (
            ns,
            selector_labels(job_name, COMPONENT_TRAINER),
            [RAY_DASHBOARD_PORT, *RAY_CODE_PORTS, TRAINER_METRICS_PORT],
        ),
        "prometheus": (monitoring, {}, []),  # a metrics reader
        "upstream": (ns, {}, [8081, 8082]),  # the http tool's endpoint is its :8081
        "stranger": (ns, {}, [8081]),  # a pod of no job
        "kuberay": (dashboards, {}, []),  # a client in a namespace labelled for the dashboard
        "mcp": (tools_ns, mcp_labels, [MCP_PORT, MCP_PORT + 1]),  # the mcp tool's server
        "mcp-neighbour": (tools_ns, {}, [MCP_PORT]),  # another pod of the server's namespace
        "elsewhere": (elsewhere, {}, [8081]),  # a pod of another namespace
        "other-pool": (ns, selector_labels("other", COMPONENT_TOOL_POOL), [TOOL_POOL_PORT]),  # another job's
    }
    # the pool's node and the pods it must not reach beside it there; every admitted path crosses nodes
    on_second = {"pool", "stranger", "kuberay", "mcp-neighbour", "elsewhere", "prometheus"}
    for name, (where, labels, ports) in pods.items():
        node = SECOND if name in on_second else NODE_NAME
        manifest = pod(name, images["tool-sandbox"], ["python", "-c", SERVE, *map(str, ports)], node=node)
        manifest["metadata"]["labels"] = labels
        real.apply(manifest, "-n", where)
    ip = wait_until(lambda: running_ips(real, pods), 180, "the pods Running with their IPs")

    # client -> [(what, address, port, admitted by the policies)]
    cases: dict[str, list[tuple[str, str, int, bool]]] = {
        "pool": [
            ("the http tool's endpoint", ip["upstream"], 8081, True),
            ("that pod's port no tool names", ip["upstream"], 8082, False),
            ("another pod", ip["stranger"], 8081, False),
            ("the mcp tool's server", ip["mcp"], MCP_PORT, True),
            ("the mcp server's port no tool names", ip["mcp"], MCP_PORT + 1, False),
            ("another pod of the mcp server's namespace", ip["mcp-neighbour"], MCP_PORT, False),
            ("a pod of another namespace", ip["elsewhere"], 8081, False),
            ("another job's pool", ip["other-pool"], TOOL_POOL_PORT, False),
            *(
                (f"the job's Ray pod's port {p}", ip["ray"], p, False)
                for p in (RAY_DASHBOARD_PORT, *RAY_CODE_PORTS)
            ),
            ("the API server", BRIDGE_IP, real.ports["apiserver"], False),
            ("the first node's kubelet", BRIDGE_IP, real.ports["kubelet"], False),
            ("its own node's kubelet", node_ip(1), real.ports[real.nodes[1].suffixed("kubelet")], False),
        ],
        "ray": [
            ("the pool, from the job's Ray pod", ip["pool"], TOOL_POOL_PORT, True),
            ("the pool's metrics, from the job's Ray pod", ip["pool"], TOOL_POOL_METRICS_PORT, False),
        ],
        # a metrics reader reaches the metrics ports and nothing else of the pool or the Ray pods
        "prometheus": [
            ("the pool's metrics, from the monitoring namespace", ip["pool"], TOOL_POOL_METRICS_PORT, True),
            ("the pool's tools, from the monitoring namespace", ip["pool"], TOOL_POOL_PORT, False),
            ("the trainer's metrics, from the monitoring namespace", ip["ray"], TRAINER_METRICS_PORT, True),
            ("the Ray dashboard, from the monitoring namespace", ip["ray"], RAY_DASHBOARD_PORT, False),
        ],
        "stranger": [
            ("the mcp server, from a pod of no job", ip["mcp"], MCP_PORT, True),
            ("the pool, from a pod of no job", ip["pool"], TOOL_POOL_PORT, False),
            ("the Ray dashboard, from a pod of no job", ip["ray"], RAY_DASHBOARD_PORT, False),
            *((f"Ray's port {p}, from a pod of no job", ip["ray"], p, False) for p in RAY_CODE_PORTS),
        ],
        "kuberay": [("the Ray dashboard, from the labelled namespace", ip["ray"], RAY_DASHBOARD_PORT, True)],
        "elsewhere": [("the mcp server, from another namespace", ip["mcp"], MCP_PORT, True)],
    }

    def seen() -> dict[str, str]:
        def one(client: str) -> dict[str, str]:
            got = dial_from(real, pods[client][0], client, [(a, p) for _, a, p, _ in cases[client]])
            return {f"{client} -> {what}": r for (what, _, _, _), r in zip(cases[client], got, strict=True)}

        with ThreadPoolExecutor(len(cases)) as ex:
            return {k: v for part in ex.map(one, cases) for k, v in part.items()}

    all_open = {f"{c} -> {what}": "open" for c, rows in cases.items() for what, _, _, _ in rows}
    enforced = {
        f"{c} -> {what}": "open" if admitted else "closed"
        for c, rows in cases.items()
        for what, _, _, admitted in rows
    }

    last: dict[str, str] = {}

    def expect(want: dict[str, str], what: str) -> None:
        def matches() -> bool:
            last.clear()
            last.update(seen())
            return last == want

        try:
            wait_until(matches, 60, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nwanted: {want}\nseen:   {last}") from None

    expect(all_open, "every connection open without a policy")
    # both nodes reach the pool without a policy: "closed" below is the policy's doing, not the route's
    assert [
        *dial_from_node(real, 0, [(ip["pool"], TOOL_POOL_PORT)]),
        *dial_from_node(real, 1, [(ip["pool"], TOOL_POOL_PORT)]),
    ] == ["open", "open"]

    body = pool_job(job_name)
    body["metadata"].update(namespace=ns, uid=str(uuid.uuid4()))
    body["spec"]["tools"].append(
        {"name": "lookup", "type": "http", "url": f"http://{ip['upstream']}:8081/lookup"}
    )
    server = {"url": f"http://docs-mcp.{tools_ns}.svc:{MCP_PORT}/mcp", "podSelector": mcp_labels}
    body["spec"]["tools"].append({"name": "docs", "type": "mcp", "mcp": server})
    job = parse_job(body)
    settings = Settings(monitoring_namespace=monitoring)
    policies = [build_network_policy(job, settings), build_ray_network_policy(job, settings)]
    for policy in policies:
        policy["metadata"].pop("ownerReferences")  # no such job: the garbage collector would delete them
    real.apply(policies)
    expect(enforced, "the policies enforced")
    # kubelet's probes: the pool's own node reaches it, the other node (the host) does not
    assert dial_from_node(real, 1, [(ip["pool"], TOOL_POOL_PORT)]) == ["open"]
    assert dial_from_node(real, 0, [(ip["pool"], TOOL_POOL_PORT)]) == ["closed"]

    examples = readme_policies("mcp-server-namespace", {"tools": tools_ns, "rl-team": ns})
    real.apply(examples)
    closed_to_others = {
        "stranger -> the mcp server, from a pod of no job": "closed",
        "elsewhere -> the mcp server, from another namespace": "closed",
    }
    expect({**enforced, **closed_to_others}, "the README's policies for the mcp server's namespace enforced")

    for policy in [*policies, *examples]:
        meta = policy["metadata"]
        real.kubectl("delete", "networkpolicy", meta["name"], "-n", meta.get("namespace", ns))
    expect(all_open, "every connection open again once the policies are deleted")
    real.kubectl("delete", "namespace", ns, dashboards, tools_ns, elsewhere, monitoring, "--wait=false")


def test_the_operators_own_pool_policy_denies_its_pool_pod_the_api_server(
    real: LocalCluster, pool: dict
) -> None:
    """The policy the running operator applied to its job's pool (no http or mcp tool: no egress at all):
    the pool pod opens no connection to the API server (directly or through the `kubernetes` Service)
    nor to CoreDNS, which a pod without a policy reaches (the API test here)."""
    ns, name = pool["namespace"], pool["pod"]["metadata"]["name"]
    policy = get_json(real, "networkpolicy", "pool-tools", "-n", ns)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and "egress" not in policy["spec"]
    targets = [(BRIDGE_IP, real.ports["apiserver"]), (kubernetes_service_ip(), 443), (BRIDGE_IP, 53)]
    assert dial_from(real, ns, name, targets) == ["closed"] * 3


# how long the lost node's pool pods tolerate it before they are evicted (the test's job sets it; the
# default, 300 s, is what the status message names)
EVICT_AFTER_SECONDS = 5


def pool_pods_by_node(cluster: LocalCluster, ns: str) -> dict[str, list[str]]:
    """The job's pool pods that are Ready and not being deleted, by node."""
    found: dict[str, list[str]] = {}
    pods = get_json(cluster, "pods", "-n", ns, "-l", f"app.kubernetes.io/component={COMPONENT_TOOL_POOL}")
    for p in pods["items"]:
        conditions = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}
        if conditions.get("Ready") == "True" and not p["metadata"].get("deletionTimestamp"):
            found.setdefault(p["spec"]["nodeName"], []).append(p["metadata"]["name"])
    return found


def inflight_calls(pod_ip: str) -> float:
    """The calls a pool pod runs now, from its /metrics."""
    with urllib.request.urlopen(f"http://{pod_ip}:{TOOL_POOL_METRICS_PORT}/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    found = re.search(r"^toolrl_tool_inflight (\S+)$", metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def node_ready(cluster: LocalCluster, name: str) -> bool:
    """Ready, and the node controller has taken back its not-ready and unreachable taints (a moment
    after Ready: a pod placed before would find the node still tainted)."""
    node = get_json(cluster, "node", name)
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
    taints = [t["key"] for t in node["spec"].get("taints", []) if t["key"].startswith("node.kubernetes.io/")]
    return ready and not taints


def pool_condition(cluster: LocalCluster, ns: str, job: str) -> dict:
    status = get_json(cluster, "toolrljob", job, "-n", ns).get("status") or {}
    return {c["type"]: c for c in status.get("conditions", [])}.get("ToolPoolReady") or {}


def test_a_crashed_node_is_named_its_pool_comes_back_on_the_other_and_a_drain_fails_only_the_pool(
    real: LocalCluster, tmp_path: Path
) -> None:
    """A job's two pool pods, one on each real node (a topology spread that honours taints), under the
    real operator. The second node crashes (its kubelet, kube-proxy, containerd, firewall and every
    process of its pods SIGKILLed, as a VM that stops): once the node controller marks it Unknown, the
    job's ToolPoolReady is False, reason NodeNotReady, naming the node and the pod, with a NodeNotReady
    Warning; after the pods' toleration (the job's, 5 s) the lost pod is evicted and its replacement
    runs on the first node, ToolPoolReady is True again and the pool answers a call, while the node is
    still down. The node boots: Ready again, and a pool pod deleted on the first node comes back on it
    (the spread puts it there). Then a spot-style drain of the first node (cordon, evict: `kubectl
    drain`) while a call runs there: the call answers as the pool's failure (`fault: infra`, which the
    trainer masks out of the gradient) once the pod's drain time is over, never as the code's; the
    evicted pod's replacement runs on the second node and the pool is whole again. Deleted, the job
    leaves no pod behind."""
    ns = restricted_namespace(real)
    job = pool_job("lost")
    spread = {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "nodeTaintsPolicy": "Honor",  # a lost node (tainted unreachable) counts for nothing
        "labelSelector": {"matchLabels": selector_labels("lost", COMPONENT_TOOL_POOL)},
    }
    tolerations = [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": EVICT_AFTER_SECONDS}
        for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
    ]
    job["spec"]["toolPool"].update(
        replicas={"min": 2, "max": 2}, topologySpreadConstraints=[spread], tolerations=tolerations
    )
    # a call that outlives the pool's drain (20 s)
    [python] = [t for t in job["spec"]["tools"] if t["name"] == "python"]
    python["timeoutSeconds"] = 120

    def placed(counts: dict[str, int]) -> dict[str, list[str]] | None:
        """The pool's Ready pods by node, once there are `counts` of them on each node named."""
        by_node = pool_pods_by_node(real, ns)
        return by_node if {node: len(pods) for node, pods in by_node.items()} == counts else None

    def tool_pool_ready(reason: str) -> dict | None:
        condition = pool_condition(real, ns, "lost")
        return condition if condition.get("reason") == reason else None

    install_crd(real)
    with OperatorProcess(real.kubeconfig, namespaces=[ns], log_path=tmp_path / "operator.log") as op:
        real.apply(job, "-n", ns)
        try:
            first = wait_until(
                lambda: placed({NODE_NAME: 1, SECOND: 1}), 300, "a pool pod Ready on each node"
            )
        except AssertionError:
            print(op.log_tail(60))
            raise
        [lost_pod] = first[SECOND]
        real.crash_node(1)
        crashed = time.monotonic()
        try:
            # the node controller's grace period (50 s) first, then the operator's next sync
            lost = wait_until(lambda: tool_pool_ready("NodeNotReady"), 240, "ToolPoolReady to name the node")
            named = time.monotonic() - crashed
            assert lost["status"] == "False", lost
            assert (
                f"node {SECOND} is not Ready (Unknown" in lost["message"] and lost_pod in lost["message"]
            ), lost
            warnings = job_events(real, ns, "lost", "NodeNotReady")
            assert warnings and {e["type"] for e in warnings} == {"Warning"}, warnings
            assert all(SECOND in e["message"] for e in warnings), warnings
            # evicted after the pods' toleration: its replacement runs beside the other pod, the pool whole
            moved = wait_until(lambda: placed({NODE_NAME: 2}), 240, "the lost pod replaced on the first node")
            wait_until(lambda: pool_condition(real, ns, "lost").get("status") == "True", 120, "ToolPoolReady")
            back = time.monotonic() - crashed
            pod_ip = get_json(real, "pod", moved[NODE_NAME][0], "-n", ns)["status"]["podIP"]
            status, result = _http(
                f"http://{pod_ip}:8080/v1/execute", {"tool": "python", "input": "print(6 * 7)"}
            )
            assert status == 200 and result["stdout"].strip() == "42", result
            assert real.kubectl("get", "node", SECOND, "-o", "jsonpath={.spec.taints[*].key}").stdout
        finally:
            real.boot_node(1)
        print(f"lost node named after {named:.0f}s, the pool whole again after {back:.0f}s")
        wait_until(lambda: node_ready(real, SECOND), 120, f"{SECOND} Ready again")
        # the node is used again: a pool pod deleted on the first node comes back on the second
        real.kubectl("delete", "pod", moved[NODE_NAME][0], "-n", ns)
        spread_again = wait_until(
            lambda: placed({NODE_NAME: 1, SECOND: 1}), 240, "a pool pod Ready on the second node again"
        )

        # a spot-style drain of the first node, a call in flight on its pool pod
        [drained] = spread_again[NODE_NAME]
        drained_ip = get_json(real, "pod", drained, "-n", ns)["status"]["podIP"]
        long_call = {
            "tool": "python",
            "input": "import time\ntime.sleep(100)\nprint('never')",
            "timeoutSeconds": 110,
        }
        with ThreadPoolExecutor(1) as caller:
            in_flight = caller.submit(_http, f"http://{drained_ip}:8080/v1/execute", long_call, 180)
            wait_until(lambda: inflight_calls(drained_ip) == 1, 60, "the long call running on the pool pod")
            selector = f"toolrl.dev/job=lost,app.kubernetes.io/component={COMPONENT_TOOL_POOL}"
            try:
                # the pool's /tmp is an emptyDir: a drain that may evict it deletes its data
                drain = ["drain", NODE_NAME, "--pod-selector", selector, "--delete-emptydir-data"]
                done = real.kubectl(*drain, "--timeout", "180s", timeout=240, check=False)
                assert done.returncode == 0, done.stderr
                status, answer = in_flight.result(timeout=180)
            finally:
                real.kubectl("uncordon", NODE_NAME)
        assert (answer.get("status"), answer.get("fault")) == ("error", "infra"), (status, answer)
        assert "shutting down" in answer["message"], answer
        wait_until(lambda: placed({SECOND: 2}), 240, "the drained pool pod replaced on the second node")
        wait_until(lambda: pool_condition(real, ns, "lost").get("status") == "True", 120, "ToolPoolReady")
        delete_jobs(real, ns)
        wait_until(
            lambda: not get_json(real, "pods", "-n", ns)["items"], 180, "no pod of the deleted job left"
        )
    real.kubectl("delete", "namespace", ns, "--wait=false")
