"""LocalCluster's table of components (cluster.LocalCluster.COMPONENTS): one entry for every
component it may start, an unknown name refused with the names it knows, and looking a component
up runs nothing but what starting it needs then (KubeRay's CRDs, applied as KubeRay starts)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from harness.localcluster.build import Toolchain
from harness.localcluster.cluster import (
    KUBE_ROUTER,
    NODE_COMPONENTS,
    NODE_ORDER,
    START_ORDER,
    ClusterError,
    LocalCluster,
)


def cluster(root: Path, **kwargs: Any) -> LocalCluster:
    ports: dict[str, int] = defaultdict(lambda: 20000)
    return LocalCluster(root, toolchain=Toolchain(root / "bin", root / "crds"), ports=ports, **kwargs)


def test_the_tables_hold_every_component_in_start_order() -> None:
    assert list(LocalCluster.COMPONENTS) == START_ORDER
    assert list(NODE_COMPONENTS) == [*NODE_ORDER, KUBE_ROUTER]


def test_each_real_node_has_its_own_components_and_the_cluster_one_dns(tmp_path: Path) -> None:
    c = cluster(
        tmp_path, real_node=True, node_bin_dir=tmp_path / "node-bin", network_policy=True, real_nodes=2
    )
    node_components = ["containerd", "kubelet", "kube-proxy", KUBE_ROUTER]
    assert c.components == [
        *START_ORDER,
        *NODE_ORDER,
        KUBE_ROUTER,
        *(f"{n}-1" for n in node_components),
    ]
    assert c.split_component("kube-proxy-1") == ("kube-proxy", c.nodes[1])
    assert c.split_component("kube-proxy") == ("kube-proxy", c.nodes[0])
    assert c.split_component("kube-apiserver") == ("kube-apiserver", None)
    with pytest.raises(KeyError, match="unknown component 'kubelet-2'"):
        c._component("kubelet-2")
    with pytest.raises(KeyError, match="unknown component 'coredns-1'"):
        c._component("coredns-1")


@pytest.mark.parametrize("real_nodes", [1, 2])
def test_every_component_of_a_cluster_looks_up_and_only_kuberay_runs_something(
    tmp_path: Path, real_nodes: int
) -> None:
    c = cluster(
        tmp_path,
        real_node=True,
        node_bin_dir=tmp_path / "node-bin",
        network_policy=True,
        real_nodes=real_nodes,
    )
    c.kube_router = tmp_path / "kube-router"
    applied: list[tuple[str, ...]] = []
    c.kubectl = lambda *args, **_: applied.append(args)  # type: ignore[assignment,method-assign,return-value]
    for name in c.components:
        applied.clear()
        component = c._component(name)
        assert component.argv and callable(component.ready) and component.waits_for, name
        if name == "kuberay":
            [apply] = applied
            assert apply[:3] == ("apply", "--server-side", "--force-conflicts")
        else:
            assert applied == [], name
    assert not (tmp_path / "logs").exists()  # nothing started, nothing written


def test_an_unknown_component_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    c = cluster(tmp_path)
    with pytest.raises(KeyError, match=r"unknown component 'nope'; known: \['etcd'"):
        c._component("nope")
    # kube-router is a component only of a cluster that enforces NetworkPolicies
    with pytest.raises(KeyError, match="unknown component 'kube-router'"):
        c._component(KUBE_ROUTER)


def test_a_kubelet_is_ready_only_when_it_answers_itself_not_when_the_api_still_says_ready(
    tmp_path: Path,
) -> None:
    """After restart_node_runtime the node is still Ready in the API (its last heartbeat is recent) while
    a new kubelet may be exiting (its CRI not initialised yet): its own /healthz decides."""
    import http.server
    import threading

    class Healthz(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Healthz)
    port = server.server_address[1]
    c = cluster(tmp_path, real_node=True, node_bin_dir=tmp_path / "node-bin")
    c.ports["kubelet-healthz"] = port
    c._ready_nodes = lambda name: 1  # type: ignore[method-assign]  # the API's stale view: Ready
    check = c._component("kubelet").ready

    def ready() -> bool:  # as LocalCluster._wait reads a check: an OSError is "not yet"
        try:
            return check()
        except OSError:
            return False

    assert not ready()  # nothing answers on the kubelet's healthz port yet
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert ready()
        c._ready_nodes = lambda name: 0  # type: ignore[method-assign]
        assert not ready()  # and the node must be Ready too
    finally:
        server.shutdown()
        server.server_close()


def test_the_first_node_is_not_crashed_it_is_the_hosts(tmp_path: Path) -> None:
    c = cluster(tmp_path, real_node=True, node_bin_dir=tmp_path / "node-bin", real_nodes=2)
    c.pids = {"kubelet": 1, "containerd": 1}  # never signalled: the refusal comes first
    with pytest.raises(ClusterError, match="node 0 is the host's own namespace"):
        c.crash_node(0)
    assert c.pids == {"kubelet": 1, "containerd": 1}
