"""The real node's pure parts: its network stays inside 198.18.0.0/15 with no way out, the
configs carry the settings this machine needs, a missing package is named, and images are
rebuilt exactly when their inputs change."""

from __future__ import annotations

import ipaddress
import os
import tarfile
from pathlib import Path

import pytest
from harness.localcluster import addresses, images, node
from harness.localcluster.oci import single_file_layer, write_oci_archive

NETWORK = ipaddress.ip_network("198.18.0.0/15")
PORTS = {
    n: 1000 + i
    for i, n in enumerate(
        ["kubelet", "kubelet-healthz", "kube-proxy-healthz", "kube-proxy-metrics", "coredns-ready"]
    )
}


@pytest.fixture
def real(tmp_path: Path) -> node.RealNode:
    return node.RealNode(tmp_path, tmp_path / "bin")


@pytest.mark.parametrize("index", range(addresses.MAX_REAL_NODES))
def test_pods_and_services_live_in_the_benchmarking_range_and_have_no_default_route(
    tmp_path: Path, index: int
) -> None:
    real = node.RealNode(tmp_path, tmp_path / "bin", index=index)
    assert ipaddress.ip_network(addresses.node_pod_cidr(index)).subnet_of(NETWORK)
    assert ipaddress.ip_network(addresses.SERVICE_CIDR).subnet_of(NETWORK)
    bridge, _ = real._cni_config()["plugins"]
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert bridge["ipam"]["routes"] == [{"dst": str(NETWORK), "gw": real.ip}]  # nothing else
    assert Path(bridge["ipam"]["dataDir"]).is_relative_to(real.root)  # not /var/lib/cni


def test_a_second_node_shares_nothing_with_the_first_and_runs_in_its_own_namespace(tmp_path: Path) -> None:
    first, second = (node.RealNode(tmp_path, tmp_path / "bin", index=i) for i in (0, 1))
    ports = {**PORTS, **{f"{n}-1": port + 100 for n, port in PORTS.items()}}
    assert (first.name, second.name) == (node.NODE_NAME, "cpu-real-1")
    assert not first.root.is_relative_to(second.root) and not second.root.is_relative_to(first.root)
    assert first.before_file == second.before_file  # the host's one record, node 0's to write
    configs = {}
    for real in (first, second):
        kubelet = real._kubelet_config(tmp_path / "ca.crt", ports)
        proxy = real._kube_proxy_config(tmp_path / "kubeconfig", ports)
        bridge, _ = real._cni_config()["plugins"]
        configs[real.index] = {
            "cgroupRoot": kubelet["cgroupRoot"],
            "kubeletPort": kubelet["port"],
            "healthz": (kubelet["healthzBindAddress"], proxy["healthzBindAddress"].split(":")[0]),
            "network": real._cni_config()["name"],
            "bridge": bridge["bridge"],
            "socket": real.socket,
        }
    assert configs[0]["healthz"] == ("127.0.0.1", "127.0.0.1")
    # the second node's loopback is its namespace's: its health endpoints listen on its address
    assert configs[1]["healthz"] == (second.ip, second.ip)
    for key in ("cgroupRoot", "kubeletPort", "network", "socket"):
        assert configs[0][key] != configs[1][key], key
    assert configs[0]["bridge"] == configs[1]["bridge"] == node.BRIDGE  # each in its own namespace
    assert first.argv("kubelet", tmp_path / "kc")[0].endswith("kubelet")  # the host's namespace
    entered = second.argv("kubelet", tmp_path / "kc")
    assert entered[:3] == ["nsenter", f"--net={node.NETNS_DIR}/toolrl-node-1", "--"]
    assert entered[3].endswith("kubelet") and entered[entered.index("--node-ip") + 1] == second.ip
    assert "-o toolrl-n+ -j RETURN" in " ".join(node.guard_rules())  # the links' host ends
    assert second.link.startswith(node.LINK_PREFIX)
    with pytest.raises(KeyError):
        second.argv("coredns", tmp_path / "kc")  # the cluster's DNS is node 0's alone


def test_containerd_config_is_private_and_pulls_from_nowhere(real: node.RealNode) -> None:
    text = real._containerd_config()
    assert "restrict_oom_score_adj = true" in text  # runc fails every sandbox here without it
    for key in ("root", "state"):
        assert f'{key} = "{real.root}/containerd/' in text
    assert f'conf_dir = "{real.root}/cni"' in text  # never /etc/cni/net.d (podman's 10.88.0.0/16)
    assert f'config_path = "{real.root}/certs.d"' in text
    assert "io.containerd.internal.v1.opt" in text  # the plugin that writes /opt/containerd


def test_kubelet_and_kube_proxy_change_no_host_setting_they_need_not(
    real: node.RealNode, tmp_path: Path
) -> None:
    kubelet = real._kubelet_config(tmp_path / "ca.crt", PORTS)
    assert kubelet["failCgroupV1"] is False and kubelet["cgroupDriver"] == "cgroupfs"
    assert kubelet["cgroupRoot"] == f"/{node.CGROUP_ROOT}" and kubelet["address"] == addresses.BRIDGE_IP
    assert all(Path(kubelet[k]).is_relative_to(real.root) for k in ("podLogsDir", "volumePluginDir"))
    proxy = real._kube_proxy_config(tmp_path / "kubeconfig", PORTS)
    assert proxy["conntrack"]["maxPerCore"] == 0 and proxy["conntrack"]["min"] == 0
    assert proxy["iptables"]["localhostNodePorts"] is False  # else route_localnet=1


def test_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = node.shutil.which
    monkeypatch.setattr(node.shutil, "which", lambda cmd: None if cmd in ("runc", "nft") else real_which(cmd))
    problems = "\n".join(node.missing_requirements())
    assert "missing runc: install the Debian package `runc`" in problems
    assert "missing nft: install the Debian package `nftables`" in problems
    with pytest.raises(node.NodeError, match="cannot start the real node"):
        node.check_host()


def test_oci_archive_names_the_image_and_its_digest(tmp_path: Path) -> None:
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF")
    layer = single_file_layer(binary, "pause", tmp_path / "layer.tar")
    out = write_oci_archive(layer, {"Entrypoint": ["/pause"]}, "localhost/x/pause:1", tmp_path / "img.tar")
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert {"oci-layout", "index.json"} <= set(names)
    assert node.archive_digest(out).startswith("sha256:")
    assert f"blobs/sha256/{node.archive_digest(out).split(':')[1]}" in names


def test_an_image_key_changes_with_its_copied_sources_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    (repo / "images" / "app").mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "other").mkdir()
    (repo / "images" / "app" / "Dockerfile").write_text(
        "ARG BASE_IMAGE=x\nFROM ${BASE_IMAGE} AS b\nCOPY src /src\n"
        "FROM ${BASE_IMAGE}\nCOPY --from=b /src /src\n"
    )
    (repo / "src" / "a.py").write_text("1")
    (repo / "other" / "b.py").write_text("1")
    (repo / ".dockerignore").write_text("**/__pycache__\n")  # images.py reads the repository's list
    monkeypatch.setattr(images, "REPO", repo)
    monkeypatch.setattr(images, "IMAGES_DIR", repo / "images")
    base = tmp_path / "base-abc.tar"
    key = images.image_key("app", base, {})
    (repo / "other" / "b.py").write_text("2")
    assert images.image_key("app", base, {}) == key  # not an input
    (repo / "src" / "a.py").write_text("2")
    changed = images.image_key("app", base, {})
    assert changed != key
    assert images.image_key("app", base, {"VARIANT": "cpu"}) != changed
    assert images.image_key("app", tmp_path / "base-def.tar", {}) != changed


def test_kube_router_runs_its_firewall_alone_and_opens_no_port(tmp_path: Path) -> None:
    argv = node.kube_router_argv(tmp_path / "kube-router", tmp_path / "kubeconfig")
    flags = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    assert flags["--run-firewall"] == "true"
    for off in ("--run-router", "--run-service-proxy", "--run-loadbalancer", "--enable-cni", "--enable-ipv6"):
        assert flags[off] == "false", off  # no BGP, IPVS, routes or CNI config of its own
    assert flags["--health-port"] == "0" and flags["--metrics-port"] == "0"  # would bind every address

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert value("--kubeconfig") == str(tmp_path / "kubeconfig")
    assert value("--hostname-override") == node.NODE_NAME
    assert value("--service-cluster-ip-range") == addresses.SERVICE_CIDR  # not its 10.96.0.0/12
    assert value("--service-node-port-range") == "30000-32767"  # the apiserver's


def test_the_cluster_listens_below_the_ports_kube_router_leaves_open_to_pods() -> None:
    """kube-router lets any pod reach the node's addresses on NodePorts whatever the policies: the
    apiserver, kubelet and the rest never listen there."""
    from harness.localcluster.cluster import LISTEN_PORTS

    assert LISTEN_PORTS[1] < node.NODE_PORT_RANGE[0]


def test_kube_router_synced_is_read_from_its_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    hooked = '-A FORWARD -m comment --comment "kube-router netpol - X" -j KUBE-ROUTER-FORWARD'
    accept = (
        '-A KUBE-ROUTER-FORWARD -m comment --comment "rule to explicitly ACCEPT traffic that comply to '
        'network policies" -m mark --mark 0x20000/0x20000 -j ACCEPT'
    )
    for rules, synced in (([], False), ([hooked], False), ([accept], False), ([hooked, accept], True)):
        monkeypatch.setattr(node, "iptables_rules", lambda family="ip", netns=None, r=rules: {"filter": r})
        assert node.firewall_synced() is synced, rules


def test_the_network_policy_enforcer_needs_ipset(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = node.shutil.which
    monkeypatch.setattr(node.shutil, "which", lambda cmd: None if cmd == "ipset" else real_which(cmd))
    assert not any("ipset" in p for p in node.missing_requirements())  # a node without the enforcer
    assert "missing ipset: install the Debian package `ipset`" in "\n".join(
        node.missing_requirements(network_policy=True)
    )


def test_teardown_destroys_only_the_ipsets_kube_router_made(monkeypatch: pytest.MonkeyPatch) -> None:
    sets = ["KUBE-DST-AAA", "KUBE-SRC-BBB", "KUBE-SRC-OLD", "other-tool-set"]
    destroyed: list[str] = []

    def run(*cmd: str, check: bool = True, input: str | None = None) -> str:
        assert cmd[:2] == ("ipset", "destroy")
        destroyed.append(cmd[2])
        sets.remove(cmd[2])
        return ""

    monkeypatch.setattr(node, "ipsets", lambda: sorted(sets))
    monkeypatch.setattr(node, "_run", run)
    node.RealNode._restore_ipsets({"ipsets": ["KUBE-SRC-OLD", "other-tool-set"]})
    assert sorted(destroyed) == ["KUBE-DST-AAA", "KUBE-SRC-BBB"]
    assert sets == ["KUBE-SRC-OLD", "other-tool-set"]


def test_a_set_still_in_use_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "ipsets", lambda: ["KUBE-SRC-STUCK"])
    monkeypatch.setattr(node, "_run", lambda *cmd, check=True, input=None: "")
    monkeypatch.setattr(node.time, "sleep", lambda _: None)
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(node.time, "monotonic", lambda: next(clock))
    with pytest.raises(node.NodeError, match="ipsets still there: KUBE-SRC-STUCK"):
        node.RealNode._restore_ipsets({"ipsets": []})


def test_nodes_sharing_the_machine_offer_the_scheduler_its_size_between_them(tmp_path: Path) -> None:
    alone = node.RealNode(tmp_path, tmp_path / "bin")._kubelet_config(tmp_path / "ca.crt", PORTS)
    assert "systemReserved" not in alone and "enforceNodeAllocatable" not in alone
    cpus, memory_mi = os.cpu_count() or 1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    ports = {**PORTS, **{f"{n}-1": port for n, port in PORTS.items()}}
    offered_cpu, offered_memory = 0, 0
    for index in (0, 1):
        real = node.RealNode(tmp_path, tmp_path / "bin", index=index, sharing=2)
        kubelet = real._kubelet_config(tmp_path / "ca.crt", ports)
        reserved = kubelet["systemReserved"]
        offered_cpu += cpus * 1000 - int(reserved["cpu"].removesuffix("m"))
        offered_memory += memory_mi - int(reserved["memory"].removesuffix("Mi"))
        assert kubelet["enforceNodeAllocatable"] == ["none"]  # accounting only: no cgroup cut in half
    assert offered_cpu == cpus * 1000 and abs(offered_memory - memory_mi) <= 1
