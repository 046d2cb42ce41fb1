"""The local cluster's address plan (harness.localcluster.addresses): every range stays inside
198.18.0.0/15 (the fake pods on loopback), none overlaps another, each holds the objects of
`JOBS` jobs at once, and every component reads its range from the plan, not a copy of it."""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from pathlib import Path

import pytest
from harness.localcluster import addresses, node
from harness.localcluster.build import Toolchain
from harness.localcluster.cluster import LocalCluster

# the workplace's network rule (shared/docs/real-node-notes.md): restated here, not read from the plan
ALLOWED = ipaddress.ip_network("198.18.0.0/15")
PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]


def net(cidr: str) -> ipaddress.IPv4Network:
    return ipaddress.ip_network(cidr)  # type: ignore[return-value]


NODES = range(addresses.MAX_REAL_NODES)


def test_pods_and_services_stay_inside_the_allowed_range_and_apart() -> None:
    assert net(addresses.NETWORK) == ALLOWED
    links = [ipaddress.ip_interface(addresses.node_link(i)[0]).network for i in NODES[1:]]
    node_ranges = [net(addresses.node_pod_cidr(i)) for i in NODES]
    ranges = [*node_ranges, *links, net(addresses.SERVICE_CIDR)]
    for cidr in [net(addresses.POD_NETWORK), net(addresses.NODE_LINKS), *ranges]:
        assert cidr.subnet_of(ALLOWED), cidr
        assert not any(cidr.overlaps(p) for p in PRIVATE), cidr
    assert all(not a.overlaps(b) for i, a in enumerate(ranges) for b in ranges[i + 1 :]), ranges
    assert all(r.subnet_of(net(addresses.POD_NETWORK)) for r in node_ranges)
    assert not net(addresses.POD_NETWORK).overlaps(net(addresses.SERVICE_CIDR))
    assert all(link.subnet_of(net(addresses.NODE_LINKS)) for link in links)
    assert net(addresses.FAKE_POD_CIDR).is_loopback
    assert ipaddress.ip_address(addresses.FAKE_NODE_IP).is_loopback
    assert addresses.node_ip(0) == addresses.BRIDGE_IP
    assert ipaddress.ip_address(addresses.kubernetes_service_ip()) in net(addresses.SERVICE_CIDR)
    for i in NODES:
        start = ipaddress.ip_address(addresses.node_pod_range_start(i))
        assert ipaddress.ip_address(addresses.node_ip(i)) in node_ranges[i]
        assert start in node_ranges[i] and start > ipaddress.ip_address(addresses.node_ip(i))
    for i in NODES[1:]:
        host_end, node_end = (ipaddress.ip_interface(a) for a in addresses.node_link(i))
        assert host_end.network == node_end.network and host_end.ip != node_end.ip
    with pytest.raises(ValueError, match="holds nodes 0-2"):
        addresses.node_pod_cidr(addresses.MAX_REAL_NODES)
    with pytest.raises(ValueError, match="node 0 is the host's own namespace"):
        addresses.node_link(0)


def test_the_ranges_hold_the_objects_of_2000_jobs() -> None:
    """A /24 Service range (254 addresses) ran full in a 1000-job burst: every job has two
    Services (its pool's, its Ray head's), and the 254th was refused (`range is full`)."""
    assert addresses.JOBS >= 2000
    services = addresses.JOBS * addresses.SERVICES_PER_JOB + 1  # + the `kubernetes` Service
    assert addresses.usable(addresses.SERVICE_CIDR) >= services, addresses.SERVICE_CIDR
    assert addresses.usable(addresses.FAKE_POD_CIDR) >= addresses.JOBS * addresses.FAKE_PODS_PER_JOB
    # a real node runs at most kubelet's maxPods at once; its range is not what limits it
    for i in NODES:
        first = int(ipaddress.ip_address(addresses.node_pod_range_start(i)))
        assert int(net(addresses.node_pod_cidr(i)).broadcast_address) - first >= addresses.JOBS


@pytest.fixture
def cluster(tmp_path: Path) -> LocalCluster:
    ports: dict[str, int] = defaultdict(lambda: 20000)
    return LocalCluster(tmp_path, toolchain=Toolchain(tmp_path / "bin", tmp_path / "crds"), ports=ports)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_control_plane_and_kwok_take_their_ranges_from_the_plan(cluster: LocalCluster) -> None:
    apiserver, _, _ = cluster._component("kube-apiserver")
    assert flag(apiserver, "--service-cluster-ip-range") == addresses.SERVICE_CIDR
    kwok, _, _ = cluster._component("kwok")
    assert flag(kwok, "--cidr") == addresses.FAKE_POD_CIDR
    assert flag(kwok, "--node-ip") == addresses.FAKE_NODE_IP
    controller_manager, _, _ = cluster._component("kube-controller-manager")
    # no node gets a podCIDR: a fake node with one would make kwok give its pods addresses off loopback
    assert not any(a.startswith("--allocate-node-cidrs") or a == "--cluster-cidr" for a in controller_manager)


def test_the_apiservers_certificate_names_the_kubernetes_service_ip(tmp_path: Path) -> None:
    from cryptography import x509
    from harness.localcluster.certs import write_pki

    write_pki(tmp_path)
    cert = x509.load_pem_x509_certificate((tmp_path / "apiserver.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address(addresses.kubernetes_service_ip()) in sans.get_values_for_type(x509.IPAddress)


@pytest.mark.parametrize("index", NODES)
def test_each_real_node_takes_its_ranges_from_the_plan(tmp_path: Path, index: int) -> None:
    real = node.RealNode(tmp_path, tmp_path / "bin", index=index)
    ip = addresses.node_ip(index)
    bridge, _ = real._cni_config()["plugins"]
    [[pod_range]] = bridge["ipam"]["ranges"]
    assert pod_range == {
        "subnet": addresses.node_pod_cidr(index),
        "rangeStart": addresses.node_pod_range_start(index),
        "gateway": ip,
    }
    assert bridge["ipam"]["routes"] == [{"dst": addresses.NETWORK, "gw": ip}]
    assert addresses.bridge_address(index) == f"{ip}/{net(addresses.node_pod_cidr(index)).prefixlen}"
    ports: dict[str, int] = defaultdict(lambda: 20000)
    proxy = real._kube_proxy_config(tmp_path / "kubeconfig", ports)
    assert proxy["clusterCIDR"] == addresses.POD_NETWORK and proxy["bindAddress"] == ip
    kubelet = real._kubelet_config(tmp_path / "ca.crt", ports)
    # every node's pods ask node 0's CoreDNS
    assert kubelet["clusterDNS"] == [addresses.BRIDGE_IP] and kubelet["address"] == ip
    assert f"bind {addresses.BRIDGE_IP}" in real._corefile(tmp_path / "kubeconfig", ports)
    assert node.guard_rules()[-2:] == [
        f"-A {node.GUARD_CHAIN} -s {addresses.NETWORK} -j DROP",
        f"-A {node.GUARD_CHAIN} -d {addresses.NETWORK} -j DROP",
    ]
