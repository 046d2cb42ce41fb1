"""Start, reuse and stop a real local control plane: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok (fake GPU/CPU nodes) and the KubeRay operator;
with `real_node=True` also `real_nodes` real CPU nodes (node.py) in place of kwok's fake CPU nodes,
and with `network_policy=True` kube-router's firewall on each, which enforces NetworkPolicies.

Every process listens on 127.0.0.1 on a free port, so two clusters on one machine never
collide. (With a real node the apiserver listens on the node's bridge address instead, so pods
reach it; one real node runs per machine.) The state of a running cluster (pids, ports) lives
in `<root>/state.json`, so a later command can reuse or stop it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, NamedTuple

import yaml

from .addresses import BRIDGE_IP, FAKE_NODE_IP, FAKE_POD_CIDR, MAX_REAL_NODES, SERVICE_CIDR
from .build import Toolchain, ensure_built, ensure_kube_router_built, ensure_node_built
from .certs import write_pki
from .node import (
    DNS_READY_PORT,
    PAUSE_IMAGE,
    NodeError,
    RealNode,
    firewall_synced,
    in_netns,
    kube_router_argv,
    missing_requirements,
)

GPU_NODES = 4
GPUS_PER_NODE = 8
CPU_NODES = 2
START_ORDER = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kuberay"]
# each real node's, in order; node i >= 1's are named `<name>-<i>` (RealNode.suffixed); the cluster's DNS
# runs on node 0 only
NODE_ORDER = ["containerd", "kubelet", "kube-proxy", "coredns"]
CLUSTER_DNS = "coredns"
# the NetworkPolicy enforcer, last: it reads its node's object (kubelet registers it)
KUBE_ROUTER = "kube-router"
# fake GPU nodes carry this taint when a real node runs beside them, so only pods asking for a
# GPU land there (the apiserver's ExtendedResourceToleration plugin adds the toleration)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


class ClusterError(RuntimeError):
    """A component failed to start; the message names it and shows its log's tail."""


class Component(NamedTuple):
    """How to start one component (LocalCluster.COMPONENTS): its command line, a readiness check
    that start_component polls, and what that check waits for (in a timeout's message)."""

    argv: list[str]
    ready: Callable[[], bool]
    waits_for: str


# Listening ports come from below the kernel's ephemeral range: a port the kernel handed out (bind to
# port 0) is free only until a client's outgoing connection takes it as its source port, which is what
# happened to a KubeRay started a few seconds later ("bind: address already in use"). Two choices in
# this range collide only with each other, and a bind check leaves out those in use. It ends below the
# NodePort range (node.NODE_PORT_RANGE): kube-router lets every pod reach the host on those ports whatever
# the NetworkPolicies, and the apiserver or kubelet listening there would be open to a denied pod.
LISTEN_PORTS = (20000, 29999)


def free_port() -> int:
    """A loopback TCP port nothing listens on, from LISTEN_PORTS (outside the ephemeral range)."""
    low, high = LISTEN_PORTS
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ClusterError(f"no free loopback port in {low}-{high} after 200 tries")


def node_manifest(name: str, gpus: int, taint: bool = False) -> dict:
    """A kwok-managed fake node; `gpus` > 0 makes it a GPU node (with GPU_TAINT if `taint`)."""
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "gpu-8x" if gpus else "cpu-32",
    }
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
        labels["nvidia.com/gpu.present"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": [dict(GPU_TAINT)]} if gpus and taint else {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


@dataclass
class LocalCluster:
    """A control plane rooted at `root` (pki, data, logs, kubeconfig, state)."""

    root: Path
    gpu_nodes: int = GPU_NODES
    cpu_nodes: int = CPU_NODES
    toolchain: Toolchain | None = None
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    real_node: bool = False
    node_bin_dir: Path | None = None
    # how many, with real_node: node 0 in the host's network namespace, the others each in one of its own
    real_nodes: int = 1
    network_policy: bool = False  # kube-router's firewall on the real node (node.kube_router_argv)
    kube_router: Path | None = None  # its binary

    def __post_init__(self) -> None:
        if self.real_node:
            self.cpu_nodes = 0  # the real node is the CPU node
        if self.network_policy and not self.real_node:
            raise ClusterError("network_policy needs the real node: kwok's fake pods send no packets")
        if self.real_node and not 1 <= self.real_nodes <= MAX_REAL_NODES:
            raise ClusterError(f"real_nodes={self.real_nodes}: the address plan holds 1 to {MAX_REAL_NODES}")

    @property
    def components(self) -> list[str]:
        return START_ORDER + [name for node in self.nodes for name in self.node_components(node)]

    def node_components(self, node: RealNode) -> list[str]:
        """`node`'s components, in start order, by the names the cluster gives them."""
        names = [n for n in NODE_ORDER if n != CLUSTER_DNS or node.serves_dns]
        return [node.suffixed(n) for n in names + ([KUBE_ROUTER] if self.network_policy else [])]

    def split_component(self, name: str) -> tuple[str, RealNode | None]:
        """A component's name -> its kind (a key of COMPONENTS or NODE_COMPONENTS) and its real node
        (None: the control plane's)."""
        base, _, index = name.rpartition("-")
        if index.isdigit() and base in NODE_COMPONENTS and self.real_node and int(index) < self.real_nodes:
            return base, self.nodes[int(index)]
        if name in NODE_COMPONENTS:
            return name, self.node
        return name, None

    @property
    def api_host(self) -> str:
        """Where the apiserver listens: loopback, or the bridge address pods reach."""
        return BRIDGE_IP if self.real_node else "127.0.0.1"

    @property
    def server(self) -> str:
        return f"https://{self.api_host}:{self.ports['apiserver']}"

    @property
    def nodes(self) -> list[RealNode]:
        if not self.real_node:
            return []
        assert self.node_bin_dir is not None, "no node binaries; call up()"
        bin_dir = self.node_bin_dir
        n = self.real_nodes
        return [RealNode(self.root, bin_dir, self.network_policy, i, sharing=n) for i in range(n)]

    @property
    def node(self) -> RealNode:
        """Node 0: the host's namespace, the cluster's DNS."""
        assert self.real_node, "this cluster has no real node"
        return self.nodes[0]

    def import_image(self, archive: Path, ref: str) -> None:
        """Import an OCI archive into every real node's containerd at once (RealNode.import_image): the
        trainer's took ~120 s into one node here, both nodes at once ~120 s too, one after the other ~230."""
        with ThreadPoolExecutor(max(1, len(self.nodes))) as pool:
            list(pool.map(lambda node: node.import_image(archive, ref), self.nodes))

    def node_named(self, name: str) -> RealNode:
        """The real node the API calls `name` (a pod's spec.nodeName)."""
        found = [node for node in self.nodes if node.name == name]
        if not found:
            raise ClusterError(f"{name!r} is not a real node of this cluster: {[n.name for n in self.nodes]}")
        return found[0]

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    def bin(self, name: str) -> str:
        assert self.toolchain is not None, "cluster has no toolchain; call up() or load()"
        return self.toolchain.path(name)

    # ----- lifecycle -------------------------------------------------------------------

    @classmethod
    def recorded(cls, root: Path) -> LocalCluster | None:
        """The cluster recorded under `root`, running or not (a crashed one still needs cleanup)."""
        try:
            state = json.loads((root / "state.json").read_text())
        except (OSError, ValueError):
            return None
        bin_dir = Path(state["binDir"])
        node_bin = state.get("nodeBinDir")
        cluster = cls(
            root,
            state["gpuNodes"],
            state["cpuNodes"],
            Toolchain(bin_dir, bin_dir / "crds"),
            state["ports"],
            state["pids"],
            real_node=node_bin is not None,
            node_bin_dir=Path(node_bin) if node_bin else None,
            real_nodes=state.get("realNodes", 1),
            network_policy=bool(state.get("kubeRouter")),
            kube_router=Path(state["kubeRouter"]) if state.get("kubeRouter") else None,
        )
        cluster.cpu_nodes = state["cpuNodes"]
        return cluster

    def is_running(self) -> bool:
        try:
            return all(self._alive(n) for n in self.components) and self._apiserver_ready()
        except (OSError, ValueError, KeyError):
            return False

    def up(self, timeout: float = 120.0, log: Callable[[str], None] = print, claim_wait: float = 0.0) -> None:
        """Start every component in order, waiting for each to be healthy. With a real node,
        `claim_wait` is how long to wait for another cluster's real node to go away."""
        self.toolchain = self.toolchain or ensure_built()
        if self.real_node:
            self.node_bin_dir = self.node_bin_dir or ensure_node_built()
        if self.network_policy:
            self.kube_router = self.kube_router or ensure_kube_router_built()
        if self.root.exists():
            shutil.rmtree(self.root)
        for d in ("pki", "logs", "etcd"):
            (self.root / d).mkdir(parents=True)
        ports = [
            "etcd",
            "etcd-peer",
            "apiserver",
            "kcm",
            "scheduler",
            "kwok",
            "kuberay-metrics",
            "kuberay-health",
        ]
        for node in self.nodes:
            ports += node.port_names()
        self.ports = {n: free_port() for n in ports}
        started = time.monotonic()
        if self.real_node:
            # the node's bridge, sysctls and egress guard come first: the apiserver listens
            # on the bridge, and no pod may start before the guard
            self.node.claim(wait=claim_wait, is_alive=cluster_alive)
            self._save_state()
            try:
                self.node.prepare_host()
                for node in self.nodes[1:]:
                    node.prepare_namespace()
            except BaseException:
                self.down(remove=False)
                raise
        pki = write_pki(self.root / "pki", extra_ips=[BRIDGE_IP] if self.real_node else [])
        self._write_kubeconfig(pki)
        stock = Path(self.bin("kwok-stages.yaml")).read_text()
        (self.root / "kwok-stages.yaml").write_text(fake_node_stages(stock))
        self._link_binaries()
        try:
            for node in self.nodes:
                node.write_configs(self.kubeconfig, pki["ca.crt"], self.ports)
            for name in self.components:
                self.start_component(name, timeout=timeout)
                log(f"localcluster: {name} ready ({time.monotonic() - started:.1f}s)")
            self._create_nodes()
            want = self.gpu_nodes + self.cpu_nodes + len(self.nodes)
            self._wait(lambda: self._ready_nodes() == want, "kwok", timeout, f"{want} nodes Ready")
            self._wait(
                self._default_sa_exists,
                "kube-controller-manager",
                timeout,
                "the default ServiceAccount (serviceaccount controller)",
            )
        except BaseException:
            self.down(remove=False)
            raise
        log(f"localcluster: all ready in {time.monotonic() - started:.1f}s; KUBECONFIG={self.kubeconfig}")

    def down(self, remove: bool = True) -> None:
        """Stop every process this cluster started (by pid), newest first; with real nodes,
        kill their pods and put the host back as it was (node.RealNode.teardown, node 0's last); remove
        its data."""
        for name in reversed(self.components):
            kind, node = self.split_component(name)
            if kind == "containerd" and node is not None:
                node.stop_workloads()  # kubelet is stopped: nothing restarts them now
            self.stop_component(name, grace=10.0 if kind in NODE_ORDER else 3.0)
        if self.real_node:
            self.node.teardown()  # node 0's: every other node's first, then the host's
        if remove and self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)

    def start_component(self, name: str, timeout: float = 60.0) -> None:
        argv, check, what = self._component(name)
        logf = (self.root / "logs" / f"{name}.log").open("ab")
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        kind, node = self.split_component(name)
        if node is not None:
            env.update(node.env(kind))
        proc = subprocess.Popen(
            argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            cwd=self.root,
        )
        logf.close()
        self.pids[name] = proc.pid
        self._save_state()
        self._wait(check, name, timeout, what, proc)

    def stop_component(self, name: str, grace: float = 3.0, first: signal.Signals = signal.SIGTERM) -> None:
        """`first` to the component's process, then SIGKILL if it still runs after `grace` seconds."""
        pid = self.pids.pop(name, None)
        if pid is None or not self._pid_is(name, pid):
            self._save_state()
            return
        try:
            os.kill(pid, first)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and self._pid_is(name, pid):
                _reap(pid)
                time.sleep(0.05)
            if self._pid_is(name, pid):
                os.kill(pid, signal.SIGKILL)
            _reap(pid)
        except ProcessLookupError:
            pass
        self._save_state()

    def restart_node_runtime(self, timeout: float = 300.0, index: int = 0) -> None:
        """Restart real node `index`'s kubelet and containerd processes, as after a node agent's crash or
        upgrade (the containers live on in their shims)."""
        node = self.nodes[index]
        for name in ("kubelet", "containerd"):
            self.stop_component(node.suffixed(name), grace=10.0)
        self.start_component(node.suffixed("containerd"), timeout)
        self._start_kubelet(node, timeout)

    def _start_kubelet(self, node: RealNode, timeout: float) -> None:
        """A kubelet started before containerd's CRI has initialized exits ("server is not initialized
        yet"); like a service manager's restart policy, it is started again until it stays."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.start_component(node.suffixed("kubelet"), timeout)
                return
            except ClusterError as exc:
                if "exited" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def crash_node(self, index: int) -> None:
        """Real node `index` (>= 1: node 0 is the host's namespace, with the cluster's DNS) stops as a
        crashed machine does: every one of its processes (its agents, its pods' processes and their
        shims) SIGKILLed at once, nothing told, and what a stopped machine loses of its network state
        forgotten. Its namespace and link stay, as a machine's cable does; `boot_node` starts it again."""
        if index < 1:
            raise ClusterError("node 0 is the host's own namespace and runs the cluster's DNS: crash another")
        node = self.nodes[index]
        for name in reversed(self.node_components(node)):
            self.stop_component(name, grace=0.0, first=signal.SIGKILL)
        node.stop_workloads()
        node.forget_network_state()

    def boot_node(self, index: int, timeout: float = 300.0) -> None:
        """Start real node `index`'s components again after `crash_node` (containerd finds its pods'
        containers dead; kubelet starts them again or the controllers have replaced them)."""
        node = self.nodes[index]
        for name in self.node_components(node):
            if self.split_component(name)[0] == "kubelet":
                self._start_kubelet(node, timeout)
            else:
                self.start_component(name, timeout)

    # ----- clients ---------------------------------------------------------------------

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.bin("kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        res = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout)
        if check and res.returncode != 0:
            raise subprocess.CalledProcessError(res.returncode, cmd, res.stdout, res.stderr)
        return res

    def apply(self, manifest: dict | list[dict], *extra: str) -> None:
        docs = manifest if isinstance(manifest, list) else [manifest]
        self.kubectl("apply", "-f", "-", *extra, input=yaml.safe_dump_all(docs))

    # ----- internals -------------------------------------------------------------------

    def _component(self, name: str) -> Component:
        """How to start `name` and know it is ready (COMPONENTS, NODE_COMPONENTS). A component's side
        effects (KubeRay's CRDs, containerd's pause image) happen when it is started, not in the table."""
        if name not in self.components:
            raise KeyError(f"unknown component {name!r}; known: {self.components}")
        kind, node = self.split_component(name)
        if node is None:
            return self.COMPONENTS[kind](self)
        return NODE_COMPONENTS[kind](self, node)

    def _etcd(self) -> Component:
        p = self.ports
        return Component(
            [
                self.bin("etcd"),
                "--data-dir",
                str(self.root / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{p['etcd']}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{p['etcd']}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{p['etcd-peer']}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{p['etcd-peer']}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{p['etcd-peer']}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes",
                str(4 << 30),
                "--log-level",
                "warn",
            ],
            lambda: b'"health":"true"' in _get(f"http://127.0.0.1:{p['etcd']}/health"),
            "GET /health",
        )

    def _apiserver(self) -> Component:
        p, pki = self.ports, self.root / "pki"
        return Component(
            [
                self.bin("kube-apiserver"),
                "--etcd-servers",
                f"http://127.0.0.1:{p['etcd']}",
                "--bind-address",
                self.api_host,
                "--advertise-address",
                self.api_host,
                "--secure-port",
                str(p["apiserver"]),
                "--cert-dir",
                str(pki),
                "--tls-cert-file",
                str(pki / "apiserver.crt"),
                "--tls-private-key-file",
                str(pki / "apiserver.key"),
                "--client-ca-file",
                str(pki / "ca.crt"),
                "--service-account-issuer",
                f"{self.server}/",
                "--service-account-key-file",
                str(pki / "sa.pub"),
                "--service-account-signing-key-file",
                str(pki / "sa.key"),
                "--service-cluster-ip-range",
                SERVICE_CIDR,
                "--authorization-mode",
                "RBAC",
                "--allow-privileged=true",
                # with a real node, the `kubernetes` Service gets the apiserver as endpoint
                # (pods reach it); without one there is no pod to reach it
                "--endpoint-reconciler-type",
                "lease" if self.real_node else "none",
                "--enable-admission-plugins",
                "ExtendedResourceToleration",
                # logs/exec: dial the node's InternalIP (its name resolves nowhere), as
                # a client of the cluster's CA (kubelet trusts it)
                "--kubelet-preferred-address-types",
                "InternalIP",
                "--kubelet-client-certificate",
                str(pki / "admin.crt"),
                "--kubelet-client-key",
                str(pki / "admin.key"),
                "--profiling=false",
            ],
            self._apiserver_ready,
            "GET /readyz",
        )

    def _controller_manager(self) -> Component:
        pki = self.root / "pki"
        extra = [
            "--root-ca-file",
            str(pki / "ca.crt"),
            "--service-account-private-key-file",
            str(pki / "sa.key"),
            "--authorization-always-allow-paths",
            "/healthz,/readyz,/livez,/metrics",
            "--controllers",
            "*",
            "--concurrent-gc-syncs",
            "5",
        ]
        return self._control_loop("kube-controller-manager", self.ports["kcm"], extra)

    def _scheduler(self) -> Component:
        return self._control_loop("kube-scheduler", self.ports["scheduler"], [])

    def _control_loop(self, name: str, port: int, extra: list[str]) -> Component:
        """kube-controller-manager or kube-scheduler: the flags they share, then `extra`."""
        kc = str(self.kubeconfig)
        return Component(
            [
                self.bin(name),
                "--kubeconfig",
                kc,
                "--authentication-kubeconfig",
                kc,
                "--authorization-kubeconfig",
                kc,
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(port),
                "--leader-elect=false",
                *extra,
            ],
            lambda: _get(f"https://127.0.0.1:{port}/healthz", insecure=True) == b"ok",
            "GET /healthz",
        )

    def _kwok(self) -> Component:
        p = self.ports
        return Component(
            [
                self.bin("kwok"),
                "--kubeconfig",
                str(self.kubeconfig),
                "--config",
                str(self.root / "kwok-stages.yaml"),
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector",
                "kwok.x-k8s.io/node=fake",
                # pod and node IPs on loopback: anything that dials a fake pod (the
                # autoscaler's scrape, the apiserver's service proxy for KubeRay) stays on
                # this machine and is refused, instead of leaving it for a private range
                "--cidr",
                FAKE_POD_CIDR,
                "--node-ip",
                FAKE_NODE_IP,
                # renew node leases; without it the node controller marks the nodes NotReady
                "--node-lease-duration-seconds",
                "40",
                "--server-address",
                f"127.0.0.1:{p['kwok']}",
            ],
            lambda: _get(f"http://127.0.0.1:{p['kwok']}/healthz") == b"ok",
            "GET /healthz",
        )

    def _kuberay(self) -> Component:
        p = self.ports
        # its CRDs first, as it starts (the apiserver is up by then)
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(self.toolchain.kuberay_crds))
        return Component(
            [
                self.bin("kuberay-operator"),
                "--enable-leader-election=false",
                "--metrics-addr",
                f"127.0.0.1:{p['kuberay-metrics']}",
                "--health-probe-bind-address",
                f"127.0.0.1:{p['kuberay-health']}",
                "--use-kubernetes-proxy",
            ],
            lambda: _get(f"http://127.0.0.1:{p['kuberay-health']}/readyz") == b"ok",
            "GET /readyz",
        )

    # name -> how to start it (the order they start in is START_ORDER: `components`)
    COMPONENTS: ClassVar[dict[str, Callable[[LocalCluster], Component]]] = {
        "etcd": _etcd,
        "kube-apiserver": _apiserver,
        "kube-controller-manager": _controller_manager,
        "kube-scheduler": _scheduler,
        "kwok": _kwok,
        "kuberay": _kuberay,
    }

    def _wait(
        self,
        check: Callable[[], bool],
        name: str,
        timeout: float,
        what: str,
        proc: subprocess.Popen | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with code {proc.returncode} while starting.\n{self._log_tail(name)}"
                )
            try:
                ready = check()
            except (OSError, subprocess.SubprocessError, ValueError):
                ready = False
            if ready and proc is not None and proc.poll() is not None:
                raise ClusterError(  # another process answered on its port
                    f"{name} exited with code {proc.returncode} while starting; its readiness check was "
                    f"answered by another process.\n{self._log_tail(name)}"
                )
            if ready:
                return
            time.sleep(0.1)
        raise ClusterError(
            f"{name} not ready after {timeout:.0f}s (waited for {what}).\n{self._log_tail(name)}"
        )

    def _log_tail(self, name: str, lines: int = 30) -> str:
        log = self.root / "logs" / f"{name}.log"
        try:
            tail = log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"(no log at {log})"
        return f"last {len(tail)} lines of {log}:\n" + "\n".join(tail)

    def _apiserver_ready(self) -> bool:
        pki = self.root / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return _get(f"{self.server}/readyz", context=ctx) == b"ok"

    def _ready_nodes(self, name: str | None = None) -> int:
        out = self.kubectl("get", "nodes", "-o", "json", check=False)
        if out.returncode:
            return 0
        return sum(
            1
            for n in json.loads(out.stdout)["items"]
            for c in n.get("status", {}).get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True" and name in (None, n["metadata"]["name"])
        )

    def _default_sa_exists(self) -> bool:
        return self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0

    def _create_nodes(self) -> None:
        nodes = [
            node_manifest(f"gpu-node-{i}", GPUS_PER_NODE, taint=self.real_node) for i in range(self.gpu_nodes)
        ]
        nodes += [node_manifest(f"cpu-node-{i}", 0) for i in range(self.cpu_nodes)]
        self.apply(nodes)

    def _write_kubeconfig(self, pki: dict[str, Path]) -> None:
        import base64

        def b64(name: str) -> str:
            return base64.b64encode(pki[name].read_bytes()).decode()

        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "toolrl-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64("ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": "toolrl-admin",
                    "user": {
                        "client-certificate-data": b64("admin.crt"),
                        "client-key-data": b64("admin.key"),
                    },
                }
            ],
            "contexts": [
                {"name": "toolrl-local", "context": {"cluster": "toolrl-local", "user": "toolrl-admin"}}
            ],
            "current-context": "toolrl-local",
        }
        self.kubeconfig.write_text(yaml.safe_dump(cfg))
        self.kubeconfig.chmod(0o600)

    def _link_binaries(self) -> None:
        """`<root>/bin/` puts the version-matched kubectl and helm at the user's hand."""
        bindir = self.root / "bin"
        bindir.mkdir(exist_ok=True)
        for name in ("kubectl", "helm"):
            (bindir / name).symlink_to(self.bin(name))

    def _save_state(self) -> None:
        if not self.root.exists() or self.toolchain is None:
            return
        self.state_file.write_text(
            json.dumps(
                {
                    "pids": self.pids,
                    "ports": self.ports,
                    "binDir": str(self.toolchain.bin_dir),
                    "gpuNodes": self.gpu_nodes,
                    "cpuNodes": self.cpu_nodes,
                    "nodeBinDir": str(self.node_bin_dir) if self.real_node else None,
                    "realNodes": self.real_nodes,
                    "kubeRouter": str(self.kube_router) if self.network_policy else None,
                },
                indent=1,
            )
        )

    def _alive(self, name: str) -> bool:
        pid = self.pids.get(name)
        return pid is not None and self._pid_is(name, pid)

    def _pid_is(self, name: str, pid: int) -> bool:
        """True if `pid` still runs this component's binary (not a recycled pid)."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            status = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except OSError:
            return False
        kind, _ = self.split_component(name)
        binary = "kuberay-operator" if kind == "kuberay" else kind
        return status != "Z" and Path(cmdline).name == binary


# ----- each real node's components (node.RealNode.argv), in its network namespace -------------------


def _containerd(cluster: LocalCluster, node: RealNode) -> Component:
    def containerd_ready() -> bool:
        try:
            node.ctr("version")
        except NodeError:
            return False  # not listening yet
        node.import_image(node.pause_archive(), PAUSE_IMAGE)
        return True

    return Component(
        node.argv("containerd", cluster.kubeconfig), containerd_ready, "its socket, the pause image imported"
    )


def _kubelet(cluster: LocalCluster, node: RealNode) -> Component:
    # its own /healthz first: after a restart the node is still Ready in the API (its last
    # heartbeat is up to 40 s old) while the new kubelet may be exiting (a CRI not initialised
    # yet): seen in a whole run, the node NotReady for good and the job's pods stuck Terminating
    healthz = f"http://{node.local_ip}:{cluster.ports[node.suffixed('kubelet-healthz')]}/healthz"
    return Component(
        node.argv("kubelet", cluster.kubeconfig),
        lambda: _get(healthz) == b"ok" and cluster._ready_nodes(node.name) == 1,
        f"GET /healthz and node {node.name} Ready",
    )


def _kube_proxy(cluster: LocalCluster, node: RealNode) -> Component:
    healthz = f"http://{node.local_ip}:{cluster.ports[node.suffixed('kube-proxy-healthz')]}/healthz"
    return Component(
        node.argv("kube-proxy", cluster.kubeconfig), lambda: _get(healthz).startswith(b"{"), "GET /healthz"
    )


def _coredns(cluster: LocalCluster, node: RealNode) -> Component:
    ready = f"http://127.0.0.1:{cluster.ports[DNS_READY_PORT]}/ready"
    return Component(node.argv("coredns", cluster.kubeconfig), lambda: _get(ready) == b"OK", "GET /ready")


def _kube_router(cluster: LocalCluster, node: RealNode) -> Component:
    assert cluster.kube_router is not None, "no kube-router binary; call up()"
    return Component(
        in_netns(node.netns, *kube_router_argv(cluster.kube_router, cluster.kubeconfig, node.name)),
        lambda: firewall_synced(node.netns),
        "its first sync in the filter table (FORWARD -> KUBE-ROUTER-FORWARD, its ACCEPT rule)",
    )


# kind -> how to start it on a node (the order they start in is NODE_ORDER, KUBE_ROUTER: `node_components`)
NODE_COMPONENTS: dict[str, Callable[[LocalCluster, RealNode], Component]] = {
    "containerd": _containerd,
    "kubelet": _kubelet,
    "kube-proxy": _kube_proxy,
    CLUSTER_DNS: _coredns,
    KUBE_ROUTER: _kube_router,
}


# How long a cluster waits for another's real node (the machine has one) to go: a whole e2e run of another
# checkout may hold it.
CLAIM_WAIT = 1800.0


@contextlib.contextmanager
def real_node_cluster(
    root: Path,
    claimed: Callable[[LocalCluster], None] = lambda _: None,
    claim_wait: float = CLAIM_WAIT,
    network_policy: bool = False,
    real_nodes: int = 1,
) -> Iterator[LocalCluster]:
    """A cluster with `real_nodes` real nodes, up for the block and down after it, also when it fails.
    `claimed` runs once the machine's real nodes are this cluster's, before `up` changes the host.
    `network_policy`: the nodes enforce NetworkPolicies (kube-router's firewall)."""
    problems = missing_requirements(network_policy)
    if problems:
        raise ClusterError(
            "this machine cannot host the real node (`make setup` installs it):\n" + "\n".join(problems)
        )
    cluster = LocalCluster(root, real_node=True, network_policy=network_policy, real_nodes=real_nodes)
    cluster.node_bin_dir = ensure_node_built()
    if network_policy:
        cluster.kube_router = ensure_kube_router_built()
    cluster.node.claim(wait=claim_wait, is_alive=cluster_alive)
    try:
        claimed(cluster)
        cluster.up(claim_wait=claim_wait)
        yield cluster
    finally:
        cluster.down()


def cluster_alive(root: Path) -> bool:
    """True if the cluster recorded under `root` still runs (a claim of a dead one is stale)."""
    recorded = LocalCluster.recorded(root)
    return recorded is not None and recorded.is_running()


def _reap(pid: int) -> None:
    """Collect a child that has exited so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _get(url: str, insecure: bool = False, context: ssl.SSLContext | None = None) -> bytes:
    if insecure:
        context = ssl._create_unverified_context()
    with urllib.request.urlopen(url, timeout=2, context=context) as resp:
        return resp.read().strip()


# KubeRay's submitter (K8sJobMode) runs `ray job submit` and follows the job's log until the Ray job
# ends. kwok's stock pod-complete stage ends every Job's pod at once, and KubeRay then ends the RayJob
# (seen: every fake-node job ended before its trainer phase was read). On a fake node the submitter
# stays Running, as it does on a real node until the Ray job ends. The name is KubeRay's, and the
# operator's submitter template keeps it (a unit test checks they agree).
SUBMITTER_CONTAINER = "ray-job-submitter"


def fake_node_stages(stock: str) -> str:
    """kwok's stock stages (a multi-document YAML) with the pod-complete stage leaving KubeRay's
    submitter pods Running."""
    stages = [doc for doc in yaml.safe_load_all(stock) if doc]
    [complete] = [s for s in stages if s["metadata"]["name"] == "pod-complete"]
    complete["spec"]["selector"]["matchExpressions"].append(
        {"key": ".spec.containers.[].name", "operator": "NotIn", "values": [SUBMITTER_CONTAINER]}
    )
    return yaml.safe_dump_all(stages, sort_keys=False)
