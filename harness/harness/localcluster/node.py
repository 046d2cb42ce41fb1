"""Real CPU nodes beside kwok's fake GPU nodes: containerd + runc, kubelet, kube-proxy (and CoreDNS
on the first), in the shape of Kubernetes' own `hack/local-up-cluster.sh`.

Node 0 lives in the host's network namespace, so only one cluster with real nodes runs per machine (a
claim file under /run says whose it is). Node i >= 1 lives in a network namespace of its own (its own
interfaces, routes, iptables, ipsets, loopback), joined to the host by a veth pair the host routes its
pods over (addresses.node_link); its processes share the host's file system and cgroup tree, each node
under roots of its own. Everything the nodes change on the host is recorded first and put back by
`teardown`: sysctls, iptables/ip6tables rules and chains (and nft tables iptables-nft created), the
bridge, the namespaces and their links, cgroups, mounts, files kubelet/containerd put in fixed host paths.

Network rule: pods and Services use 198.18.0.0/15 only. Pods get no default route (only
198.18.0.0/15 via their node's bridge address), no namespace has a default route but the host's, and
an egress guard on the host (iptables chain, installed before the first pod) drops anything from or to
that range leaving through another interface than node 0's bridge, a node's link or loopback: every
packet of a node i >= 1 that leaves its namespace passes the host. `guard_drops()` reads its counters.
Facts behind each setting: shared/docs/real-node-notes.md (measured on this machine kind).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from .addresses import (
    BRIDGE_IP,
    MAX_REAL_NODES,
    NETWORK,
    POD_NETWORK,
    SERVICE_CIDR,
    bridge_address,
    node_ip,
    node_link,
    node_pod_cidr,
    node_pod_range_start,
)
from .oci import single_file_layer, write_oci_archive

# kubelet evicts pods once the node's or its images' file system has less free than this (evictionHard);
# image builds stop short of it (images.min_free)
EVICTION_FREE_PERCENT = 2

NODE_NAME_PREFIX = "cpu-real-"  # node i is cpu-real-<i> (RealNode.name)
NODE_NAME = f"{NODE_NAME_PREFIX}0"
BRIDGE = "toolrl0"  # every node's bridge, each in its own namespace
CNI_NETWORK = "toolrl-node"  # node 0's; node i's has `-i` added (RealNode.suffixed)
GUARD_CHAIN = "TOOLRL-EGRESS"
# node 0's kubelet's --cgroup-root (every pod's cgroup is below it); node i's has `-i` added
CGROUP_ROOT = "toolrl-node"
NETNS_DIR = Path("/run/netns")  # where `ip netns` keeps its namespaces
NETNS_PREFIX = "toolrl-node-"  # node i >= 1's network namespace is toolrl-node-<i>
LINK_PREFIX = "toolrl-n"  # the host's end of node i's link is toolrl-n<i>
UPLINK = "uplink"  # the node's end, in its namespace
# each node's listening ports, by name (node i's with `-i` added: RealNode.port_names); the cluster's DNS's
# readiness port is node 0's alone (RealNode.serves_dns)
NODE_PORTS = ("kubelet", "kubelet-healthz", "kube-proxy-healthz", "kube-proxy-metrics")
DNS_READY_PORT = "coredns-ready"
PAUSE_IMAGE = "localhost/toolrl/pause:1"
NO_REGISTRY = "http://127.0.0.1:9"  # discard port, nothing listens: a pull fails at once, locally
NODE_LABEL = "toolrl.dev/real-node"
CLAIM_DIR = Path("/run/toolrl-localcluster")
# Kubelet sets these (kernel defaults it wants); ip_forward is ours (pod -> ClusterIP -> pod), and so is
# bridge-nf-call-iptables (br_netfilter's default): pod -> pod packets on the bridge pass iptables, where
# kube-proxy's hairpin rules and kube-router's NetworkPolicy chains see them.
# The first two are each network namespace's own: a second node sets them in its namespace too.
NETWORK_SYSCTLS = {"net.ipv4.ip_forward": "1", "net.bridge.bridge-nf-call-iptables": "1"}
SYSCTLS = {
    **NETWORK_SYSCTLS,
    "vm.overcommit_memory": "1",
    "kernel.panic": "10",
    "kernel.panic_on_oops": "1",
}
# Fixed host paths containerd 1.6 and kubelet write to whatever their configured roots
# (netns bind mounts, CNI's result cache, shim sockets, the container-log symlinks).
HOST_PATHS = [str(NETNS_DIR), "/var/lib/cni", "/run/containerd", "/var/log/containers", "/opt/containerd"]
IPTABLES_TABLES = ["filter", "nat", "mangle", "raw"]
# Debian package of each command the node needs (the error names what to install)
REQUIRED = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "ip6tables": "iptables",
    "iptables-restore": "iptables",
    "nft": "nftables",
    "ip": "iproute2",
    "conntrack": "conntrack",
    "nfacct": "nfacct",
    "nsenter": "util-linux",  # a second node's processes start in its network namespace
    "sysctl": "procps",
}
# what the NetworkPolicy enforcer (kube-router's firewall, `network_policy` clusters) needs besides
REQUIRED_FOR_NETWORK_POLICY = {"ipset": "ipset"}
# the Services' NodePort range: the apiserver's default, which kube-router must be told (it lets every
# pod reach the node's own addresses on these ports whatever the policies: kube-router's INPUT chain
# returns early for them). The cluster's listening ports stay below it (cluster.LISTEN_PORTS).
NODE_PORT_RANGE = (30000, 32767)
# kube-router's netpol ipsets (a policy's source and destination pods: KUBE-SRC-*, KUBE-DST-*); its
# iptables chains (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*) go with the other KUBE- chains
IPSET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-")
CNI_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ["bridge", "host-local", "loopback"]


class NodeError(RuntimeError):
    """The real node cannot start here; the message names what is missing and what to do."""


def archive_digest(archive: Path) -> str:
    """The manifest digest an OCI archive's index names."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        return json.load(member)["manifests"][0]["digest"]


# ----- what the host must have -------------------------------------------------------------


def missing_requirements(network_policy: bool = False) -> list[str]:
    """Everything the host lacks for a real node (with its NetworkPolicy enforcer if
    `network_policy`), each with what to do; empty if nothing."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the real node needs root (kubelet, containerd, iptables); run as root")
    by_package: dict[str, list[str]] = {}
    required = {**REQUIRED, **(REQUIRED_FOR_NETWORK_POLICY if network_policy else {})}
    for cmd, pkg in required.items():
        if shutil.which(cmd) is None:
            by_package.setdefault(pkg, []).append(cmd)
    absent = [p for p in CNI_PLUGINS if not (CNI_DIR / p).is_file()]
    if absent:
        by_package.setdefault("containernetworking-plugins", []).extend(f"{CNI_DIR}/{p}" for p in absent)
    for pkg, what in sorted(by_package.items()):
        problems.append(f"missing {', '.join(what)}: install the Debian package `{pkg}` (make setup does)")
    filesystems = Path("/proc/filesystems").read_text()
    if "overlay" not in filesystems:
        problems.append("the kernel has no overlay filesystem (containerd's overlayfs snapshotter)")
    if not Path("/proc/sys/net/bridge").is_dir():
        problems.append("the kernel has no bridge netfilter (br_netfilter): pod -> Service -> pod needs it")
    if not Path("/sys/fs/cgroup").is_dir() or not _cgroup_hierarchies():
        problems.append("no cgroup filesystem is mounted under /sys/fs/cgroup")
    return problems


def check_host(network_policy: bool = False) -> None:
    problems = missing_requirements(network_policy)
    if problems:
        raise NodeError("cannot start the real node:\n  - " + "\n  - ".join(problems))


def _cgroup_hierarchies() -> list[Path]:
    """Mounted cgroup hierarchies (v1: one per controller set; v2: the single root)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        fstype, mountpoint = fields[sep + 1], fields[4]
        if fstype in ("cgroup", "cgroup2") and mountpoint.startswith("/sys/fs/cgroup"):
            found.append(Path(mountpoint))
    return found


# ----- a snapshot of what the node may change on the host ----------------------------------


def _run(*cmd: str, check: bool = True, input: str | None = None) -> str:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, input=input)
    except FileNotFoundError as err:
        raise NodeError(
            f"`{cmd[0]}` is not installed: {err} (`make setup` installs what the node needs)"
        ) from None
    if check and res.returncode:
        raise NodeError(f"`{' '.join(cmd)}` failed (exit {res.returncode}): {res.stderr.strip()}")
    return res.stdout


def in_netns(netns: str | None, *cmd: str) -> list[str]:
    """`cmd` run in network namespace `netns` (nsenter execs it: its pid is the command's), or as is."""
    return ["nsenter", f"--net={NETNS_DIR / netns}", "--", *cmd] if netns else list(cmd)


def iptables_rules(family: str = "ip", netns: str | None = None) -> dict[str, list[str]]:
    """Per table, its chain declarations (without counters) and rules, as iptables-save prints
    them, of the host or of network namespace `netns`; tables that do not exist are absent."""
    save = "iptables-save" if family == "ip" else "ip6tables-save"
    out: dict[str, list[str]] = {}
    table = None
    for line in _run(*in_netns(netns, save)).splitlines():
        if line.startswith("*"):
            table = line[1:]
            out[table] = []
        elif line.startswith(":") and table:
            out[table].append(line.split()[0] + " " + line.split()[1])
        elif line.startswith("-A") and table:
            out[table].append(line)
    return out


def nfacct_objects() -> list[str]:
    """netfilter accounting objects (kube-proxy makes two for its metrics), by name."""
    return sorted(
        line.rsplit("=", 1)[1].strip(" ;") for line in _run("nfacct", "list").splitlines() if "=" in line
    )


def nft_tables() -> list[str]:
    return sorted(line.strip() for line in _run("nft", "list", "tables").splitlines() if line.strip())


def ipsets() -> list[str]:
    """The host's ipsets, by name (none without the `ipset` command: then nothing made any)."""
    if shutil.which("ipset") is None:
        return []
    return sorted(line.strip() for line in _run("ipset", "list", "-n").splitlines() if line.strip())


def mounts() -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def cgroup_dirs() -> list[str]:
    """Every cgroup directory at the top level of each hierarchy (kubelet makes `kubepods`
    there unless --cgroup-root moves it)."""
    return sorted(str(d) for h in _cgroup_hierarchies() for d in h.iterdir() if d.is_dir())


def host_path_entries() -> dict[str, list[str] | None]:
    """For each of HOST_PATHS: its entries, or None if it does not exist."""
    out: dict[str, list[str] | None] = {}
    for p in HOST_PATHS:
        path = Path(p)
        out[p] = sorted(os.listdir(path)) if path.is_dir() else None
    return out


def sysctl(name: str) -> str:
    return Path("/proc/sys", *name.split(".")).read_text().strip()


def set_sysctl(name: str, value: str) -> None:
    Path("/proc/sys", *name.split(".")).write_text(value)


def host_snapshot() -> dict:
    """What a node changes on this machine, in a comparable form (see teardown)."""
    return {
        "iptables": iptables_rules("ip"),
        "ip6tables": iptables_rules("ip6"),
        "nft": nft_tables(),
        "nfacct": nfacct_objects(),
        "ipsets": ipsets(),
        "links": sorted(os.listdir("/sys/class/net")),
        "mounts": mounts(),
        "cgroups": cgroup_dirs(),
        "hostPaths": host_path_entries(),
        "sysctls": {k: sysctl(k) for k in SYSCTLS},
    }


# ----- the machine-wide claim --------------------------------------------------------------


_lock_depth = threading.local()  # the claim lock held by this thread (flock would block on a second fd)


@contextlib.contextmanager
def _claim_lock() -> Iterator[None]:
    """The machine-wide lock of the claim; re-entrant within a thread (a stale claim's teardown, which
    releases the claim under it, runs with it held)."""
    depth = getattr(_lock_depth, "n", 0)
    if depth:
        _lock_depth.n = depth + 1
        try:
            yield
        finally:
            _lock_depth.n = depth
        return
    CLAIM_DIR.mkdir(parents=True, exist_ok=True)
    with (CLAIM_DIR / "real-node.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        _lock_depth.n = 1
        try:
            yield
        finally:
            _lock_depth.n = 0
            fcntl.flock(fh, fcntl.LOCK_UN)


CLAIM = CLAIM_DIR / "real-node.json"


def claim_owner() -> Path | None:
    """The cluster root whose real node holds this machine, if any."""
    try:
        return Path(json.loads(CLAIM.read_text())["root"])
    except (OSError, ValueError, KeyError):
        return None


# ----- the node ------------------------------------------------------------------------------


def guard_rules() -> list[str]:
    """The egress guard (iptables-restore lines of table mangle): mangle POSTROUTING sees every
    packet about to leave by any interface, forwarded or local, after kube-proxy's DNAT, and
    kube-proxy's ACCEPT rules (filter) do not skip it. What is from or to NETWORK leaves only by
    loopback, node 0's bridge or a link to another node's namespace (which has no other way out)."""
    return [
        f":{GUARD_CHAIN} - [0:0]",
        f"-A POSTROUTING -j {GUARD_CHAIN}",
        f"-A {GUARD_CHAIN} -o lo -j RETURN",
        f"-A {GUARD_CHAIN} -o {BRIDGE} -j RETURN",
        f"-A {GUARD_CHAIN} -o {LINK_PREFIX}+ -j RETURN",
        f"-A {GUARD_CHAIN} -s {NETWORK} -j DROP",
        f"-A {GUARD_CHAIN} -d {NETWORK} -j DROP",
    ]


def kube_router_argv(binary: Path | str, kubeconfig: Path, node_name: str = NODE_NAME) -> list[str]:
    """kube-router as the node's NetworkPolicy enforcer and nothing else: its firewall (the netpol
    controller: iptables chains and ipsets), not its router (BGP, routes, a CNI config of its own) nor
    its service proxy (IPVS; kube-proxy serves the Services) nor its load-balancer allocator. No
    listener: its health port would bind every address of the host (cluster.py reads readiness from
    the rules it programs, `firewall_synced`); metrics off. TEST-ONLY (build.KUBE_ROUTER)."""
    low, high = NODE_PORT_RANGE
    return [
        str(binary),
        "--kubeconfig",
        str(kubeconfig),
        "--hostname-override",
        node_name,
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--run-loadbalancer=false",
        "--enable-cni=false",
        "--enable-ipv4=true",
        "--enable-ipv6=false",
        "--service-cluster-ip-range",
        SERVICE_CIDR,
        "--service-node-port-range",
        f"{low}-{high}",
        "--health-port=0",
        "--metrics-port=0",
        "--v=1",  # one line per sync ("sync iptables took ...")
    ]


# the rule kube-router appends to KUBE-ROUTER-FORWARD (and its other top chains) at the end of a full sync
KUBE_ROUTER_SYNCED = "--mark 0x20000/0x20000 -j ACCEPT"


def firewall_synced(netns: str | None = None) -> bool:
    """True once kube-router's first full sync is in the filter table of the host (or of network
    namespace `netns`): FORWARD jumps to its chain and the chain ends with its ACCEPT of traffic the
    policies let through."""
    rules = iptables_rules("ip", netns).get("filter", [])
    hooked = any(ln.startswith("-A FORWARD ") and ln.endswith("-j KUBE-ROUTER-FORWARD") for ln in rules)
    return hooked and any(
        ln.startswith("-A KUBE-ROUTER-FORWARD ") and ln.endswith(KUBE_ROUTER_SYNCED) for ln in rules
    )


def remove_namespace(netns: str, link: str) -> None:
    """A node's network namespace and the host's end of its link, with whatever still runs in it (a
    process left inside keeps a namespace alive, unnamed, with its interfaces and rules): killed first."""
    if (NETNS_DIR / netns).exists():
        for pid in _run("ip", "netns", "pids", netns, check=False).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    if link in os.listdir("/sys/class/net"):
        _run("ip", "link", "del", link)  # both ends of the veth pair, at once
    if (NETNS_DIR / netns).exists():
        _run("ip", "netns", "del", netns)
    if link in os.listdir("/sys/class/net") or (NETNS_DIR / netns).exists():
        raise NodeError(f"{netns} or its link {link} is still there")


@dataclass
class RealNode:
    """Real node `index` of the cluster rooted at `cluster_root`; its files live in `<root>/node`
    (node 0) or `<root>/node-<index>`. Node 0 is in the host's network namespace and holds what is the
    host's (the claim, the sysctls, the egress guard, the record of the host before); node i >= 1 is in
    namespace `toolrl-node-<i>`."""

    cluster_root: Path
    bin_dir: Path
    network_policy: bool = False  # kube-router's firewall enforces NetworkPolicies (kube_router_argv)
    index: int = 0
    sharing: int = 1  # the real nodes that share this machine: each offers the scheduler its share of it

    def suffixed(self, name: str) -> str:
        """`name` for this node: as is for node 0, with `-<index>` after it for the others (component
        names, ports, cgroup root, CNI network)."""
        return name if self.index == 0 else f"{name}-{self.index}"

    @property
    def name(self) -> str:
        return f"{NODE_NAME_PREFIX}{self.index}"

    @property
    def root(self) -> Path:
        return self.cluster_root / self.suffixed("node")

    @property
    def netns(self) -> str | None:
        """Its network namespace's name; None for node 0 (the host's)."""
        return None if self.index == 0 else f"{NETNS_PREFIX}{self.index}"

    @property
    def link(self) -> str:
        """The host's end of its link (node i >= 1)."""
        return f"{LINK_PREFIX}{self.index}"

    @property
    def serves_dns(self) -> bool:
        """Node 0 runs the cluster's DNS (CoreDNS on its address), for every node's pods."""
        return self.index == 0

    def port_names(self) -> list[str]:
        """The names of the ports its components listen on (LocalCluster.up picks them)."""
        return [self.suffixed(n) for n in NODE_PORTS] + ([DNS_READY_PORT] if self.serves_dns else [])

    @property
    def ip(self) -> str:
        return node_ip(self.index)

    @property
    def local_ip(self) -> str:
        """Where its health and metrics endpoints listen: loopback on node 0; a node in a namespace of
        its own has a loopback of its own, so there its address (the harness checks them from the host)."""
        return "127.0.0.1" if self.index == 0 else self.ip

    @property
    def cgroup_root(self) -> str:
        return self.suffixed(CGROUP_ROOT)

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def before_file(self) -> Path:
        """The host as it was before node 0 changed it (every node's teardown reads it)."""
        return self.cluster_root / "node" / "host-before.json"

    def run(self, *cmd: str, check: bool = True) -> str:
        """`cmd` in the node's network namespace."""
        return _run(*in_netns(self.netns, *cmd), check=check)

    def bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    # --- claim, host network, guard (before the apiserver: it listens on the bridge) ---

    def claim(self, wait: float = 0.0, is_alive: Callable[[Path], bool] | None = None) -> None:
        """Take the machine's one real-node slot. A stale claim (its cluster is gone) is
        cleaned up first; a live one is waited for up to `wait` seconds, then an error."""
        deadline = time.monotonic() + wait
        while True:
            with _claim_lock():
                owner = claim_owner()
                if owner not in (None, self.cluster_root) and is_alive is not None and not is_alive(owner):
                    # a crashed cluster's node, cleaned up under the lock: another cluster waiting for the
                    # claim would otherwise tear down the host's bridge and chains as this one sets them up
                    RealNode(owner, self.bin_dir).teardown()
                    owner = claim_owner()
                if owner is None or owner == self.cluster_root:
                    self.root.mkdir(parents=True, exist_ok=True)
                    CLAIM.write_text(json.dumps({"root": str(self.cluster_root), "pid": os.getpid()}))
                    return
            if time.monotonic() >= deadline:
                raise NodeError(
                    f"another local cluster's real node holds this machine (cluster at {owner}); "
                    "one real node runs per machine (it owns the host's iptables chains and bridge). "
                    "Stop it first: `make cluster-down` or "
                    f"`python -m harness.localcluster down --root {owner}`."
                )
            time.sleep(2)

    def prepare_host(self) -> None:
        """Node 0: record the host, then: sysctls, the bridge, the egress guard. Before any pod."""
        assert self.index == 0, "the host is node 0's to prepare"
        check_host(self.network_policy)
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.before_file.exists():
            self.before_file.write_text(json.dumps(host_snapshot(), indent=1))
        for name, value in SYSCTLS.items():
            set_sysctl(name, value)
        self._make_cgroup_root()
        if BRIDGE not in os.listdir("/sys/class/net"):
            _run("ip", "link", "add", BRIDGE, "type", "bridge")
            _run("ip", "addr", "add", bridge_address(), "dev", BRIDGE)
            _run("ip", "link", "set", BRIDGE, "up")
        self._install_guard()

    def prepare_namespace(self) -> None:
        """Node i >= 1, after node 0's prepare_host: its namespace (a stale one of a crashed cluster is
        replaced), the link to the host and the routes both ways, its bridge, forwarding and bridge
        netfilter (per namespace), its cgroup root. Its only route is NETWORK via the host."""
        assert self.index > 0 and self.netns, "node 0 is the host's namespace"
        self._remove_namespace()  # a crashed cluster's
        _run("ip", "netns", "add", self.netns)
        host_end, node_end = node_link(self.index)
        _run("ip", "link", "add", self.link, "type", "veth", "peer", "name", UPLINK, "netns", self.netns)
        _run("ip", "addr", "add", host_end, "dev", self.link)
        _run("ip", "link", "set", self.link, "up")
        # each side's packets leave with its node's address (the host's is node 0's), as a machine's
        # packets carry its primary address: a NetworkPolicy sees which node sent them
        node_hop, host_hop = node_end.split("/")[0], host_end.split("/")[0]
        _run(
            "ip",
            "route",
            "add",
            node_pod_cidr(self.index),
            "via",
            node_hop,
            "dev",
            self.link,
            "src",
            BRIDGE_IP,
        )
        self.run("ip", "link", "set", "lo", "up")
        self.run("ip", "addr", "add", node_end, "dev", UPLINK)
        self.run("ip", "link", "set", UPLINK, "up")
        self.run("ip", "link", "add", BRIDGE, "type", "bridge")
        self.run("ip", "addr", "add", bridge_address(self.index), "dev", BRIDGE)
        self.run("ip", "link", "set", BRIDGE, "up")
        self.run("ip", "route", "add", NETWORK, "via", host_hop, "dev", UPLINK, "src", self.ip)
        for name, value in NETWORK_SYSCTLS.items():
            self.run("sysctl", "-q", "-w", f"{name}={value}")
        self._make_cgroup_root()

    def _make_cgroup_root(self) -> None:
        """kubelet requires --cgroup-root to exist in every hierarchy; a v1 cpuset cgroup
        takes no task until its cpus and mems are set (copied from the parent)."""
        for h in _cgroup_hierarchies():
            top = h / self.cgroup_root
            top.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (h / knob).exists() and not (top / knob).read_text().strip():
                    (top / knob).write_text((h / knob).read_text())

    def _install_guard(self) -> None:
        if f":{GUARD_CHAIN}" in " ".join(iptables_rules("ip").get("mangle", [])):
            return
        _run("iptables-restore", "--noflush", input="*mangle\n" + "\n".join(guard_rules()) + "\nCOMMIT\n")

    def guard_drops(self) -> int:
        """Packets the egress guard dropped (each would have left the machine)."""
        out = _run("iptables", "-t", "mangle", "-L", GUARD_CHAIN, "-v", "-x", "-n")
        return sum(int(line.split()[0]) for line in out.splitlines()[2:] if "DROP" in line)

    # --- the components ---

    def write_configs(self, kubeconfig: Path, ca: Path, ports: dict[str, int]) -> None:
        r = self.root
        for d in ("cni", "cni-ipam", "kubelet", "pod-logs", "volume-plugins", "containerd"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "containerd.toml").write_text(self._containerd_config())
        (r / "certs.d" / "_default").mkdir(parents=True, exist_ok=True)
        (r / "certs.d" / "_default" / "hosts.toml").write_text(f'server = "{NO_REGISTRY}"\n')
        (r / "cni" / "10-toolrl.conflist").write_text(json.dumps(self._cni_config(), indent=1))
        (r / "kubelet.yaml").write_text(yaml.safe_dump(self._kubelet_config(ca, ports)))
        (r / "kube-proxy.yaml").write_text(yaml.safe_dump(self._kube_proxy_config(kubeconfig, ports)))
        if self.serves_dns:
            (r / "Corefile").write_text(self._corefile(kubeconfig, ports))
        # pods with dnsPolicy Default get this, not the host's (no upstream resolver: nothing
        # outside the cluster resolves, by the network rule)
        (r / "resolv.conf").write_text(f"nameserver {BRIDGE_IP}\n")

    def _containerd_config(self) -> str:
        r = self.root
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{r}/containerd/root"
state = "{r}/containerd/state"
# the opt plugin would create /opt/containerd
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{r}/containerd.ttrpc.sock"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # root here lacks CAP_SYS_RESOURCE: without this every sandbox fails in runc
  # ("nsexec: failed to update /proc/self/oom_score_adj: Permission denied")
  restrict_oom_score_adj = true
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        Root = "{r}/runc"
        SystemdCgroup = false
  # every registry resolves to a closed loopback port: the node pulls nothing from anywhere
  # (images are imported); containerd's proxy settings (env) make sure of it
  [{cri}.registry]
    config_path = "{r}/certs.d"
  [{cri}.cni]
    bin_dir = "{CNI_DIR}"
    conf_dir = "{r}/cni"
    max_conf_num = 1
"""

    def _cni_config(self) -> dict:
        pod_range = {
            "subnet": node_pod_cidr(self.index),
            "rangeStart": node_pod_range_start(self.index),
            "gateway": self.ip,
        }
        return {
            "cniVersion": "1.0.0",
            "name": self.suffixed(CNI_NETWORK),
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.root / "cni-ipam"),
                        "ranges": [[pod_range]],
                        # no default route: a pod reaches 198.18.0.0/15 (pods, Services, the
                        # host's bridge address) and nothing else
                        "routes": [{"dst": NETWORK, "gw": self.ip}],
                    },
                },
                {"type": "loopback"},
            ],
        }

    def _kubelet_config(self, ca: Path, ports: dict[str, int]) -> dict:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "port": ports[self.suffixed("kubelet")],
            "readOnlyPort": 0,
            "healthzBindAddress": self.local_ip,
            "healthzPort": ports[self.suffixed("kubelet-healthz")],
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_root}",
            "failSwapOn": False,
            "failCgroupV1": False,  # 1.36 refuses cgroup v1 otherwise; this VM has v1
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "podLogsDir": str(self.root / "pod-logs"),
            "volumePluginDir": str(self.root / "volume-plugins"),
            "resolvConf": str(self.root / "resolv.conf"),
            "clusterDNS": [BRIDGE_IP],
            "clusterDomain": "cluster.local",
            "maxPods": 40,
            "serializeImagePulls": False,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(ca)},
            },
            # the apiserver authenticates with a cert from the cluster's CA (logs/exec)
            "authorization": {"mode": "AlwaysAllow"},
            "evictionHard": {
                "memory.available": "200Mi",
                "nodefs.available": f"{EVICTION_FREE_PERCENT}%",
                "imagefs.available": f"{EVICTION_FREE_PERCENT}%",
                "nodefs.inodesFree": f"{EVICTION_FREE_PERCENT}%",
            },
            # 100: never collect images. They are imported, no registry can give them back, and
            # at 99 a disk filled by an image build made kubelet delete the pause image: every
            # pod then failed to start (FailedCreatePodSandBox, seen here)
            **self._machine_share(),
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "protectKernelDefaults": False,
            "nodeStatusReportFrequency": "10s",
        }

    def _machine_share(self) -> dict:
        """With several real nodes on one machine, each kubelet would offer the scheduler the whole
        machine (its CPUs and memory, read from the host): the rest is reserved, so the nodes together
        offer what the machine has, as machines of 1/`sharing` of its size would. Only the scheduler's
        accounting: the pods' cgroups are not held to it (enforceNodeAllocatable none), as the machine's
        memory is not cut in parts."""
        if self.sharing == 1:
            return {}
        cpu_milli = (os.cpu_count() or 1) * 1000
        memory_mi = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
        others = (self.sharing - 1) / self.sharing
        return {
            "systemReserved": {
                "cpu": f"{int(cpu_milli * others)}m",
                "memory": f"{int(memory_mi * others)}Mi",
            },
            "enforceNodeAllocatable": ["none"],
        }

    def _kube_proxy_config(self, kubeconfig: Path, ports: dict[str, int]) -> dict:
        return {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": self.name,
            "mode": "iptables",
            "clusterCIDR": POD_NETWORK,
            "bindAddress": self.ip,
            "healthzBindAddress": f"{self.local_ip}:{ports[self.suffixed('kube-proxy-healthz')]}",
            "metricsBindAddress": f"{self.local_ip}:{ports[self.suffixed('kube-proxy-metrics')]}",
            "nodePortAddresses": [f"{self.ip}/32"],
            # 0 = leave the host's conntrack sysctls as they are
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            # true would set net.ipv4.conf.all.route_localnet=1
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
        }

    def _corefile(self, kubeconfig: Path, ports: dict[str, int]) -> str:
        return f""".:53 {{
    bind {BRIDGE_IP}
    errors
    ready 127.0.0.1:{ports[DNS_READY_PORT]}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} toolrl-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
}}
"""

    def env(self, name: str) -> dict[str, str]:
        """What a component's environment adds to the host's. containerd sends every registry
        request to a proxy that is the closed NO_REGISTRY port: a pull of an image that was not
        imported fails at once and resolves no name. hosts.toml alone did not do it: containerd
        1.6 ignores its `_default` for docker.io and looked up registry-1.docker.io through the
        host's resolver. (Loopback addresses never go through a proxy: nothing local breaks.)"""
        if name != "containerd":
            return {}
        proxy = {"HTTPS_PROXY": NO_REGISTRY, "HTTP_PROXY": NO_REGISTRY, "NO_PROXY": ""}
        return {**proxy, **{key.lower(): value for key, value in proxy.items()}}

    def argv(self, name: str, kubeconfig: Path) -> list[str]:
        """Component `name`'s command line (NODE_ORDER's names), in the node's network namespace."""
        return in_netns(self.netns, *self._argv(name, kubeconfig))

    def _argv(self, name: str, kubeconfig: Path) -> list[str]:
        r = self.root
        if name == "containerd":
            return ["containerd", "--config", str(r / "containerd.toml"), "--log-level", "warn"]
        if name == "kubelet":
            return [
                self.bin("kubelet"),
                "--config",
                str(r / "kubelet.yaml"),
                "--kubeconfig",
                str(kubeconfig),
                "--root-dir",
                str(r / "kubelet"),
                "--hostname-override",
                self.name,
                "--node-ip",
                self.ip,
                "--node-labels",
                f"{NODE_LABEL}=true,node.kubernetes.io/instance-type=real-cpu",
                "--v",
                "1",
            ]
        if name == "kube-proxy":
            return [self.bin("kube-proxy"), "--config", str(r / "kube-proxy.yaml"), "--v", "1"]
        if name == "coredns" and self.serves_dns:
            return [self.bin("coredns"), "-conf", str(r / "Corefile")]
        raise KeyError(name)

    # --- images ---

    def ctr(self, *args: str) -> str:
        return _run("ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args)

    def images(self) -> dict[str, str]:
        """Image name -> manifest digest, as the node's containerd has them."""
        rows = [line.split() for line in self.ctr("images", "ls").splitlines()[1:] if line.strip()]
        return {row[0]: row[2] for row in rows}

    def import_image(self, archive: Path, ref: str) -> None:
        """Import an OCI archive into the node's containerd (kubelet then pulls nothing),
        unless the node has that very image (same manifest digest) already."""
        if self.images().get(ref) == archive_digest(archive):
            return
        self.ctr("images", "import", str(archive))
        if self.images().get(ref) != archive_digest(archive):
            raise NodeError(f"importing {archive} did not yield the image {ref}: {self.images()}")

    def pause_archive(self) -> Path:
        out = self.bin_dir / "pause-image.tar"
        if not out.is_file():
            layer = single_file_layer(self.bin_dir / "pause", "pause", self.bin_dir / "pause-layer.tar")
            write_oci_archive(layer, {"Entrypoint": ["/pause"], "User": "65535:65535"}, PAUSE_IMAGE, out)
            layer.unlink()
        return out

    # --- teardown ---

    def owns_machine(self) -> bool:
        """True unless another cluster's node holds the claim (its pods are not ours to kill)."""
        return claim_owner() in (None, self.cluster_root)

    def stop_workloads(self) -> None:
        """After kubelet stopped: kill every pod process (all below our cgroup root), then the
        containerd shims serving our socket (they outlive containerd by design)."""
        if not self.owns_machine():
            return
        for _ in range(50):
            pids = self._cgroup_pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for pid in self._shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self._shim_pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for h in _cgroup_hierarchies():
            top = h / self.cgroup_root
            # os.walk, not rglob: a pod's cgroup removed mid-walk is skipped (rglob raised
            # FileNotFoundError and `down` stopped half-way, seen after a killed test run)
            for directory, _, files in os.walk(top):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError):
                        pids.update(int(p) for p in (Path(directory) / "cgroup.procs").read_text().split())
        return pids

    def _shim_pids(self) -> list[int]:
        found = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(self.socket).encode() in argv:
                found.append(int(d.name))
        return found

    def teardown(self) -> None:
        """Put the host back as `host-before.json` recorded it: node i >= 1 removes what is its own (its
        pods, mounts, cgroups, namespace and link); node 0 also every other node's leftovers (a crashed
        cluster's), then what is the host's. Idempotent; processes must be stopped first
        (LocalCluster.down does)."""
        if not self.owns_machine():
            return
        try:
            before = json.loads(self.before_file.read_text())
        except (OSError, ValueError):
            before = None
        errors: list[str] = []
        if self.index:
            self._teardown_own(before, errors)
            if errors:
                raise NodeError(f"real node {self.index}'s teardown left:\n" + "\n".join(errors))
            return
        for index in range(1, MAX_REAL_NODES):
            RealNode(self.cluster_root, self.bin_dir, index=index)._teardown_own(before, errors)
        self.stop_workloads()
        if before is not None:
            for step in (
                self._unmount,
                self._remove_cgroups,
                self._restore_iptables,
                self._restore_ipsets,
                self._restore_host_paths,
            ):
                try:
                    step(before)
                except (OSError, NodeError) as exc:
                    errors.append(f"{step.__name__}: {exc}")
            if BRIDGE in os.listdir("/sys/class/net") and BRIDGE not in before["links"]:
                _run("ip", "link", "del", BRIDGE, check=False)
            for name, value in before["sysctls"].items():
                with contextlib.suppress(OSError):
                    set_sysctl(name, value)
        with _claim_lock():
            if claim_owner() == self.cluster_root:
                CLAIM.unlink(missing_ok=True)
        if errors:
            raise NodeError("the real node's teardown left something behind:\n" + "\n".join(errors))
        self.before_file.unlink(missing_ok=True)

    def _teardown_own(self, before: dict | None, errors: list[str]) -> None:
        """Node i >= 1: its pods and shims, mounts, cgroups, link and namespace (its iptables, ipsets
        and interfaces go with the namespace)."""
        self.stop_workloads()
        if before is not None:
            for step in (self._unmount, self._remove_cgroups):
                try:
                    step(before)
                except (OSError, NodeError) as exc:
                    errors.append(f"{step.__name__}: {exc}")
        try:
            self._remove_namespace()
        except NodeError as exc:
            errors.append(f"_remove_namespace: {exc}")

    def _remove_namespace(self) -> None:
        """Node i >= 1's namespace and link, with whatever still runs in it (a process left inside keeps
        a namespace alive, unnamed, with its interfaces and rules): killed first."""
        assert self.netns, "node 0 is the host's namespace"
        remove_namespace(self.netns, self.link)

    def forget_network_state(self) -> None:
        """Node i >= 1, its processes dead: what a machine that stops loses of its network (its
        firewall's and service proxy's rules and sets, its connection tracking), so the agents that
        start again sync from nothing, as after a reboot (their readiness then means their own sync)."""
        assert self.netns, "node 0 is the host's namespace: its rules are the host's"
        for table in IPTABLES_TABLES:
            for family in ("iptables", "ip6tables"):
                self.run(family, "-t", table, "-F")
                self.run(family, "-t", table, "-X")
        if shutil.which("ipset"):
            self.run("ipset", "destroy")
        self.run("conntrack", "-F", check=False)  # exit 1 when the table was empty

    def _unmount(self, before: dict) -> None:
        # node 0 also the namespaces' and containerd's fixed paths (every node's; it is torn down last);
        # `ip netns add` makes /run/netns a mount point of its own (a shared bind mount of itself)
        ours = (f"{self.root}/",) + ((str(NETNS_DIR), "/run/containerd/") if self.index == 0 else ())
        for _ in range(3):
            new = [m for m in mounts() if m not in before["mounts"] and m.startswith(ours)]
            if not new:
                return
            for m in reversed(new):
                subprocess.run(["umount", "--lazy", m], capture_output=True)
        raise NodeError(f"still mounted: {new}")

    def _remove_cgroups(self, before: dict) -> None:
        for h in _cgroup_hierarchies():
            top = h / self.cgroup_root
            if not top.is_dir() or str(top) in before["cgroups"]:
                continue
            dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
            for d in [*dirs, top]:
                deadline = time.monotonic() + 10
                while True:
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)

    @staticmethod
    def remove_leftover_rules() -> None:
        """Remove the KUBE-* and guard chains and the other nodes' namespaces and links of a cluster whose
        processes were killed without its teardown (no cluster is recorded and no node claimed, so none
        of them is in use)."""
        for index in range(1, MAX_REAL_NODES):
            remove_namespace(f"{NETNS_PREFIX}{index}", f"{LINK_PREFIX}{index}")
        RealNode._restore_iptables(
            {"iptables": {}, "ip6tables": {}, "nft": nft_tables(), "nfacct": nfacct_objects()}
        )
        RealNode._restore_ipsets({"ipsets": []})

    @staticmethod
    def _restore_iptables(before: dict) -> None:
        ours = ("KUBE-", GUARD_CHAIN)
        for family, key in (("ip", "iptables"), ("ip6", "ip6tables")):
            now, then = iptables_rules(family), before[key]
            for table, lines in now.items():
                old = set(then.get(table, []))
                new_chains = [ln.split()[0][1:] for ln in lines if ln.startswith(":") and ln not in old]
                ours_new = [c for c in new_chains if c.startswith(ours)]
                deletes = [
                    "-D" + ln[2:]
                    for ln in lines
                    if ln.startswith("-A")
                    and ln not in old
                    and ln.split()[1] not in ours_new
                    and any(o in ln for o in ours)
                ]
                script = [f"*{table}", *deletes]
                script += [f"-F {c}" for c in ours_new] + [f"-X {c}" for c in ours_new] + ["COMMIT", ""]
                if len(script) > 3:
                    restore = "iptables-restore" if family == "ip" else "ip6tables-restore"
                    _run(restore, "--noflush", input="\n".join(script))
        # iptables-nft created tables the host did not have: drop them once they hold no rule
        for table in nft_tables():
            if table in before["nft"]:
                continue
            _, fam, name = table.split()
            listing = json.loads(_run("nft", "--json", "list", "table", fam, name))["nftables"]
            if not any("rule" in item for item in listing):
                _run("nft", "delete", "table", fam, name)
        for name in set(nfacct_objects()) - set(before["nfacct"]):
            _run("nfacct", "delete", name)  # unreferenced now that the rules are gone
        left = [
            f"{key} {table}: {ln}"
            for family, key in (("ip", "iptables"), ("ip6", "ip6tables"))
            for table, lines in iptables_rules(family).items()
            for ln in lines
            if ln not in before[key].get(table, []) and any(o in ln for o in ours)
        ]
        if left:
            raise NodeError("iptables still has: " + "; ".join(left[:10]))

    @staticmethod
    def _restore_ipsets(before: dict) -> None:
        """Destroy the ipsets kube-router made (IPSET_PREFIXES) that the host did not have; after
        _restore_iptables, which removed the rules that referenced them. Not kube-router's own
        `--cleanup-config`: in v2.1.0 it runs its netpol cleanup on a controller it never set up (no
        iptables or ipset handlers: it removes nothing), then its service proxy's, which flushes every
        IPVS definition of the host and panics (nil pointer dereference; tried in a scratch network
        namespace: the KUBE-ROUTER-INPUT chain and a KUBE-SRC- set were left)."""
        new = [
            name
            for name in ipsets()
            if name.startswith(IPSET_PREFIXES) and name not in before.get("ipsets", [])
        ]
        # a deleted rule's reference to its set is released after the commit (nft frees rules
        # deferred): a set still "in use" is tried again for a while
        deadline = time.monotonic() + 10
        while True:
            for name in new:
                _run("ipset", "destroy", name, check=False)
            left = [name for name in ipsets() if name in new]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if left:
            raise NodeError("ipsets still there: " + ", ".join(left[:10]))

    def _restore_host_paths(self, before: dict) -> None:
        for p, entries in before["hostPaths"].items():
            path = Path(p)
            if not path.exists():
                continue
            if entries is None:
                shutil.rmtree(path, ignore_errors=True)
                if path.exists():
                    raise NodeError(f"cannot remove {path}")
                continue
            for name in set(os.listdir(path)) - set(entries):
                child = path / name
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
