"""`helm install charts/toolrl-operator` (from the repository, nothing fetched), every optional
feature on, into the local control plane: the objects exist and the operator pod is admitted
under Pod Security "restricted"; NOTES say what to do next; `helm uninstall` removes the objects
and leaves the CRD (as Helm documents)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import yaml
from chartgen.helm import ALL_FEATURES, helm, values_args
from chartgen.monitoring import crd_files
from harness import REPO
from harness.operator_process import CRD_NAME


def _install_monitoring_crds(cluster: Any) -> None:
    for path in crd_files().values():
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for path in crd_files().values():
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


def _exists(cluster: Any, obj: dict[str, Any], namespace: str) -> bool:
    ns = ["-n", obj["metadata"].get("namespace", namespace)]
    kind = (
        f"{obj['kind'].lower()}.{obj['apiVersion'].split('/')[0]}"
        if "/" in obj["apiVersion"]
        else obj["kind"].lower()
    )
    found = cluster.kubectl(
        "get", kind, obj["metadata"]["name"], *ns, "--ignore-not-found", "-o", "name", check=False
    )
    return found.returncode == 0 and bool(found.stdout.strip())


def test_install_then_uninstall(cluster: Any, namespace: str, tmp_path: Path) -> None:
    _install_monitoring_crds(cluster)
    cluster.kubectl(
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    chart = REPO / "charts" / "toolrl-operator"  # as checked out: it installs offline
    release = f"inst-{uuid.uuid4().hex[:6]}"
    base = ["--kubeconfig", str(cluster.kubeconfig), "--namespace", namespace]

    installed = helm(
        cluster.bin("helm"),
        "install",
        release,
        str(chart),
        *base,
        "--wait",
        "--timeout",
        "180s",
        *values_args(ALL_FEATURES, tmp_path),
    )
    try:
        notes = installed.stdout.split("NOTES:", 1)[1]
        assert f"rollout status deployment/{release}-toolrl-operator" in notes
        assert "kubectl apply -n <namespace> -f toolrljob.yaml" in notes
        assert "grafana_dashboard=1" in notes

        manifest = helm(cluster.bin("helm"), "get", "manifest", release, *base).stdout
        objects = [o for o in yaml.safe_load_all(manifest) if o]
        kinds = {o["kind"] for o in objects}
        assert {
            "Deployment",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Service",
            "ServiceMonitor",
            "PodMonitor",
            "PrometheusRule",
            "ConfigMap",
        } <= kinds
        missing = [
            f"{o['kind']}/{o['metadata']['name']}" for o in objects if not _exists(cluster, o, namespace)
        ]
        assert not missing, f"not in the cluster after install: {missing}"

        # --wait saw the Deployment available: its pod passed "restricted" admission and became ready.
        ready = cluster.kubectl(
            "get",
            "deployment",
            f"{release}-toolrl-operator",
            "-n",
            namespace,
            "-o",
            "jsonpath={.status.readyReplicas}",
        ).stdout
        assert ready == "1"
        assert cluster.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
    finally:
        helm(cluster.bin("helm"), "uninstall", release, *base, "--wait", "--timeout", "120s")

    left = [f"{o['kind']}/{o['metadata']['name']}" for o in objects if _exists(cluster, o, namespace)]
    assert not left, f"still in the cluster after uninstall: {left}"
    assert cluster.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0, "the CRD must stay"
