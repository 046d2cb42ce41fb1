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


def test_pods_and_services_stay_inside_the_allowed_range_and_apart() -> None:
    assert net(addresses.NETWORK) == ALLOWED
    for cidr in (addresses.NODE_POD_CIDR, addresses.SERVICE_CIDR):
        assert net(cidr).subnet_of(ALLOWED), cidr
        assert not any(net(cidr).overlaps(p) for p in PRIVATE), cidr
    assert not net(addresses.NODE_POD_CIDR).overlaps(net(addresses.SERVICE_CIDR))
    assert net(addresses.FAKE_POD_CIDR).is_loopback
    assert ipaddress.ip_address(addresses.FAKE_NODE_IP).is_loopback
    assert ipaddress.ip_address(addresses.BRIDGE_IP) in net(addresses.NODE_POD_CIDR)
    assert ipaddress.ip_address(addresses.kubernetes_service_ip()) in net(addresses.SERVICE_CIDR)
    start = ipaddress.ip_address(addresses.node_pod_range_start())
    assert start in net(addresses.NODE_POD_CIDR) and start > ipaddress.ip_address(addresses.BRIDGE_IP)


def test_the_ranges_hold_the_objects_of_2000_jobs() -> None:
    """A /24 Service range (254 addresses) ran full in a 1000-job burst: every job has two
    Services (its pool's, its Ray head's), and the 254th was refused (`range is full`)."""
    assert addresses.JOBS >= 2000
    services = addresses.JOBS * addresses.SERVICES_PER_JOB + 1  # + the `kubernetes` Service
    assert addresses.usable(addresses.SERVICE_CIDR) >= services, addresses.SERVICE_CIDR
    assert addresses.usable(addresses.FAKE_POD_CIDR) >= addresses.JOBS * addresses.FAKE_PODS_PER_JOB
    # the real node runs at most kubelet's maxPods at once; its range is not what limits it
    first = int(ipaddress.ip_address(addresses.node_pod_range_start()))
    assert int(net(addresses.NODE_POD_CIDR).broadcast_address) - first >= addresses.JOBS


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


def test_the_real_node_takes_its_ranges_from_the_plan(tmp_path: Path) -> None:
    real = node.RealNode(tmp_path, tmp_path / "bin")
    bridge, _ = real._cni_config()["plugins"]
    [[pod_range]] = bridge["ipam"]["ranges"]
    assert pod_range == {
        "subnet": addresses.NODE_POD_CIDR,
        "rangeStart": addresses.node_pod_range_start(),
        "gateway": addresses.BRIDGE_IP,
    }
    assert bridge["ipam"]["routes"] == [{"dst": addresses.NETWORK, "gw": addresses.BRIDGE_IP}]
    assert addresses.bridge_address() == f"{addresses.BRIDGE_IP}/{net(addresses.NODE_POD_CIDR).prefixlen}"
    ports: dict[str, int] = defaultdict(lambda: 20000)
    proxy = real._kube_proxy_config(tmp_path / "kubeconfig", ports)
    assert proxy["clusterCIDR"] == addresses.NODE_POD_CIDR and proxy["bindAddress"] == addresses.BRIDGE_IP
    kubelet = real._kubelet_config(tmp_path / "ca.crt", ports)
    assert kubelet["clusterDNS"] == [addresses.BRIDGE_IP] and kubelet["address"] == addresses.BRIDGE_IP
    assert f"bind {addresses.BRIDGE_IP}" in real._corefile(tmp_path / "kubeconfig", ports)
    assert node.guard_rules()[-2:] == [
        f"-A {node.GUARD_CHAIN} -s {addresses.NETWORK} -j DROP",
        f"-A {node.GUARD_CHAIN} -d {addresses.NETWORK} -j DROP",
    ]
