"""The real node's pure parts: its network stays inside 198.18.0.0/15 with no way out, the
configs carry the settings this machine needs, a missing package is named, and images are
rebuilt exactly when their inputs change."""

from __future__ import annotations

import ipaddress
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


def test_pods_and_services_live_in_the_benchmarking_range_and_have_no_default_route(
    real: node.RealNode,
) -> None:
    assert ipaddress.ip_network(addresses.NODE_POD_CIDR).subnet_of(NETWORK)
    assert ipaddress.ip_network(addresses.SERVICE_CIDR).subnet_of(NETWORK)
    assert ipaddress.ip_address(node.BRIDGE_IP) in ipaddress.ip_network(addresses.NODE_POD_CIDR)
    bridge, _ = real._cni_config()["plugins"]
    assert bridge["isGateway"] is False and bridge["ipMasq"] is False
    assert bridge["ipam"]["routes"] == [{"dst": str(NETWORK), "gw": node.BRIDGE_IP}]  # nothing else
    assert Path(bridge["ipam"]["dataDir"]).is_relative_to(real.root)  # not /var/lib/cni


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
    assert kubelet["cgroupRoot"] == f"/{node.CGROUP_ROOT}" and kubelet["address"] == node.BRIDGE_IP
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
