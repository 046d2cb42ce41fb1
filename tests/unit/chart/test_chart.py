"""The chart lints, renders valid Kubernetes objects with every feature off and on, rejects bad
values with the schema's message, and says what the operator needs (and no more)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chartgen.helm import ALL_FEATURES, HelmError, helm, template, values_args
from chartgen.outputs import CHART, DASHBOARD_JSON
from harness.localcluster.build import KUBERNETES
from toolrl_operator.naming import TOOL_POOL_METRICS_PORT_NAME, TRAINER_METRICS_PORT_NAME

Render = Callable[..., list[dict[str, Any]]]
MONITORING = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
VALUE_SETS = {
    "defaults": None,
    "all-features": ALL_FEATURES,
    "all-features-namespaced": {**ALL_FEATURES, "watchNamespaces": ["rl-a", "rl-b"]},
}


def _kinds(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objs)


def _one(objs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(name_suffix)]
    names = [o["metadata"]["name"] for o in found]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, got {names}"
    return found[0]


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_strict(helm_bin: str, chart: Path, values: dict[str, Any] | None) -> None:
    result = helm(
        helm_bin,
        "lint",
        "--strict",
        "--kube-version",
        KUBERNETES,
        str(chart),
        *values_args(values, chart.parent),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_rendered_objects_are_valid(
    render: Render, values: dict[str, Any] | None, monitoring_crd_schemas: dict[str, dict[str, Any]]
) -> None:
    objs = render(values)
    assert objs
    for obj in objs:
        if obj["kind"] in MONITORING:
            errors = list(jsonschema.Draft7Validator(monitoring_crd_schemas[obj["kind"]]).iter_errors(obj))
            assert not errors, f"{obj['kind']} {obj['metadata']['name']}: {[e.message for e in errors]}"
        else:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_defaults_render_only_the_core_objects(render: Render) -> None:
    assert _kinds(render()) == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    )


def test_the_operator_holds_its_lease_with_a_role_of_its_own(render: Render) -> None:
    """The Lease of leader election lives in the release's namespace, named after the release, and
    the operator's ServiceAccount may create it and read and renew that one Lease only."""
    objs = render(namespace="toolrl")
    deploy = _one(objs, "Deployment")
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    namespace, name = env["TOOLRL_LEADER_ELECTION_LEASE"].split("/")
    assert (namespace, name) == ("toolrl", deploy["metadata"]["name"])
    role = _one(objs, "Role")
    assert role["metadata"]["namespace"] == namespace
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [name],
            "verbs": ["get", "update"],
        },
    ]
    binding = _one(objs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": _one(objs, "ServiceAccount")["metadata"]["name"],
            "namespace": namespace,
        }
    ]


def test_all_features_add_monitoring_dashboard_and_alerts(render: Render) -> None:
    kinds = _kinds(render(ALL_FEATURES))
    for kind, count in {"ServiceMonitor": 1, "PodMonitor": 2, "PrometheusRule": 1, "ConfigMap": 1}.items():
        assert kinds.count(kind) == count, kinds


def test_chart_ships_the_crd_from_crds_dir(render: Render) -> None:
    repo_crd = yaml.safe_load((CHART.parent.parent / "crds" / "toolrl.dev_toolrljobs.yaml").read_text())
    assert _one(render(), "CustomResourceDefinition") == repo_crd


def test_operator_deployment(render: Render) -> None:
    deploy = _one(render(), "Deployment")
    spec = deploy["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == _one(render(), "ServiceAccount")["metadata"]["name"]
    [container] = pod["containers"]
    assert container["image"] == "toolrl-operator:0.1.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8000, "liveness": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TOOLRL_TRAINER_IMAGE"] == "toolrl-trainer:0.1.0"
    assert env["TOOLRL_TOOL_SANDBOX_IMAGE"] == "toolrl-tool-sandbox:0.1.0"
    assert env["TOOLRL_PROMETHEUS_URL"] == ""
    assert env["TOOLRL_KUBERAY_NAMESPACE"] == "", "Ray dashboards open to labelled namespaces"
    assert "POD_NAMESPACE" in env, "the operator admits its own namespace to pools' /metrics"
    assert "args" not in container  # every namespace


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"kuberayNamespace": "ray-system"}, "ray-system"),
        (None, ""),
    ],
)
def test_kuberay_namespace_reaches_the_operator(render: Render, values: dict, expected: str) -> None:
    deploy = _one(render(values, namespace="toolrl"), "Deployment")
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TOOLRL_KUBERAY_NAMESPACE"] == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [({"metricsFromCIDRs": ["198.18.0.1/32", "2001:db8::/64"]}, "198.18.0.1/32,2001:db8::/64"), (None, "")],
)
def test_metrics_and_kuberay_cidrs_reach_the_operator_as_its_settings_read_them(
    render: Render, values: dict | None, expected: str
) -> None:
    from toolrl_operator.settings import Settings

    deploy = _one(render(values, namespace="toolrl"), "Deployment")
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TOOLRL_METRICS_CIDRS"] == expected
    assert ",".join(Settings.from_env({"TOOLRL_METRICS_CIDRS": expected}).metrics_cidrs) == expected
    kuberay = _one(render({"kuberayFromCIDRs": (values or {}).get("metricsFromCIDRs", [])}), "Deployment")
    env = {e["name"]: e.get("value") for e in kuberay["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TOOLRL_KUBERAY_CIDRS"] == expected
    assert ",".join(Settings.from_env({"TOOLRL_KUBERAY_CIDRS": expected}).kuberay_cidrs) == expected


def test_pods_are_watched_with_or_without_prometheus(render: Render) -> None:
    def pod_verbs(values: dict[str, Any] | None) -> list[list[str]]:
        return [r["verbs"] for r in _one(render(values), "ClusterRole")["rules"] if "pods" in r["resources"]]

    values = {"autoscaler": {"prometheusUrl": "http://prometheus.monitoring:9090"}}
    assert pod_verbs(None) == pod_verbs(values) == [["list", "watch"]], "waiting causes come from pods"
    deploy = _one(render(values), "Deployment")
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TOOLRL_PROMETHEUS_URL"] == "http://prometheus.monitoring:9090"


def test_keda_scaled_objects_are_granted_only_with_keda_enabled(render: Render) -> None:
    def keda_rules(values: dict[str, Any] | None) -> list[dict[str, Any]]:
        return [r for r in _one(render(values), "ClusterRole")["rules"] if "keda.sh" in r["apiGroups"]]

    assert keda_rules(None) == []
    assert keda_rules({"keda": {"enabled": True}}) == [
        {"apiGroups": ["keda.sh"], "resources": ["scaledobjects"], "verbs": ["create", "patch"]}
    ]


def test_watch_namespaces_and_verbose_become_operator_arguments(render: Render) -> None:
    deploy = _one(render({"watchNamespaces": ["rl-a", "rl-b"], "verbose": True}), "Deployment")
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["--namespace=rl-a", "--namespace=rl-b", "--verbose"]


def test_operator_pod_meets_pod_security_restricted(render: Render) -> None:
    pod = _one(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert sc["readOnlyRootFilesystem"] is True
        assert "add" not in sc["capabilities"]
    assert all("hostPath" not in v for v in pod.get("volumes", []))


def test_metrics_service_selects_the_operator(render: Render) -> None:
    objs = render()
    service = _one(objs, "Service", "-metrics")
    pod_labels = _one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    [port] = service["spec"]["ports"]
    assert port == {"name": "metrics", "port": 8000, "targetPort": "metrics", "protocol": "TCP"}


def test_standard_labels_on_every_object(render: Render) -> None:
    for obj in render(ALL_FEATURES):
        if obj["kind"] == "CustomResourceDefinition":
            continue
        labels = obj["metadata"]["labels"]
        for key in (
            "helm.sh/chart",
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
        ):
            assert key in labels, f"{obj['kind']} {obj['metadata']['name']} lacks label {key}"


def test_cluster_wide_by_default_namespaced_roles_with_watch_namespaces(render: Render) -> None:
    def the_jobs(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
        """Roles or RoleBindings of the jobs' namespaces (not the leader election's)."""
        election = "-leader-election"
        return [o for o in objs if o["kind"] == kind and not o["metadata"]["name"].endswith(election)]

    cluster = render()
    role = _one(cluster, "ClusterRole")
    assert any("toolrljobs" in r["resources"] for r in role["rules"])
    assert not the_jobs(cluster, "Role") + the_jobs(cluster, "RoleBinding")

    namespaced = render({"watchNamespaces": ["rl-a", "rl-b"]})
    roles, bindings = the_jobs(namespaced, "Role"), the_jobs(namespaced, "RoleBinding")
    assert sorted(o["metadata"]["namespace"] for o in roles) == ["rl-a", "rl-b"]
    assert sorted(o["metadata"]["namespace"] for o in bindings) == ["rl-a", "rl-b"]
    cluster_rules = _one(namespaced, "ClusterRole")["rules"]
    assert not any("toolrljobs" in r["resources"] for r in cluster_rules)
    # Together they grant exactly what the cluster-wide role grants.
    combined = cluster_rules + roles[0]["rules"]
    assert sorted(map(json.dumps, combined)) == sorted(map(json.dumps, role["rules"]))


def test_rbac_has_no_wildcards_or_secrets(render: Render) -> None:
    for obj in render({"watchNamespaces": ["rl-a"]}) + render():
        for rule in obj.get("rules", []):
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"{obj['kind']}: wildcard in {rule}"
            assert "secrets" not in rule["resources"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_service_monitor_keeps_the_job_labels_of_operator_metrics(render: Render) -> None:
    monitor = _one(render(ALL_FEATURES), "ServiceMonitor")
    service = _one(render(ALL_FEATURES), "Service", "-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True


@pytest.mark.parametrize(("watch", "selector"), [([], {"any": True}), (["rl-a"], {"matchNames": ["rl-a"]})])
def test_pod_monitors_relabel_the_job(render: Render, watch: list[str], selector: dict[str, Any]) -> None:
    monitors = [o for o in render({**ALL_FEATURES, "watchNamespaces": watch}) if o["kind"] == "PodMonitor"]
    ports = {}
    for monitor in monitors:
        spec = monitor["spec"]
        assert spec["namespaceSelector"] == selector
        assert spec["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "toolrl-operator"
        [endpoint] = spec["podMetricsEndpoints"]
        assert {
            "sourceLabels": ["__meta_kubernetes_pod_label_toolrl_dev_job"],
            "targetLabel": "toolrl_job",
        } in endpoint["relabelings"]
        assert {
            "sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
            "targetLabel": "toolrl_component",
        } in endpoint["relabelings"]
        ports[spec["selector"]["matchLabels"]["app.kubernetes.io/component"]] = endpoint["port"]
    # The container port names the operator gives the tool pool and the Ray head.
    assert ports == {"tool-pool": TOOL_POOL_METRICS_PORT_NAME, "trainer": TRAINER_METRICS_PORT_NAME}


def test_dashboard_configmap_carries_the_generated_json(render: Render) -> None:
    cm = _one(render({"dashboard": {"enabled": True, "namespace": "grafana"}}), "ConfigMap", "-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "grafana"
    assert json.loads(cm["data"][DASHBOARD_JSON.name]) == json.loads(DASHBOARD_JSON.read_text())


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"imagee": {"tag": "x"}}, "additional properties 'imagee' not allowed"),
        ({"image": {"repositry": "x"}}, "additional properties 'repositry' not allowed"),
        ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "got string, want boolean"),
        ({"alerts": {"toolFailures": {"ratio": 5}}}, "maximum"),
        ({"alerts": {"toolLatency": {"for": "ten minutes"}}}, "does not match pattern"),
        ({"watchNamespaces": ["Not_A_Namespace"]}, "does not match pattern"),
        ({"verbose": "yes"}, "got string, want boolean"),
        ({"autoscaler": {"prometheusUrl": "prometheus:9090"}}, "does not match pattern"),
    ],
)
def test_bad_values_are_rejected_with_the_schema_message(
    helm_bin: str, chart: Path, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError) as err:
        template(helm_bin, chart, values, kube_version=KUBERNETES)
    assert "values don't meet the specifications of the schema" in str(err.value)
    assert message in str(err.value)


def test_schema_forbids_unknown_keys_everywhere() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], path: str) -> None:
        node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or '/'} allows unknown keys"
            for key, sub in node["properties"].items():
                walk(sub, f"{path}/{key}")

    walk(schema, "")
    jsonschema.validate(values, schema)


def test_monitoring_validation_catches_a_misspelt_field(
    render: Render, monitoring_crd_schemas: dict[str, dict[str, Any]]
) -> None:
    monitor = _one(render(ALL_FEATURES), "PodMonitor", "-tool-pools")
    monitor["spec"]["podMetricsEndpoints"][0]["relabellings"] = monitor["spec"]["podMetricsEndpoints"][0].pop(
        "relabelings"
    )
    errors = list(jsonschema.Draft7Validator(monitoring_crd_schemas["PodMonitor"]).iter_errors(monitor))
    assert any("relabellings" in e.message for e in errors)


def test_the_chart_lints_and_renders_from_the_repository_offline(helm_bin: str) -> None:
    """No `helm dependency build`, no copy: the chart as checked out, with no network."""
    assert not yaml.safe_load((CHART / "Chart.yaml").read_text()).get("dependencies")
    helm(helm_bin, "lint", "--strict", "--kube-version", KUBERNETES, str(CHART))
    objs = template(helm_bin, CHART, kube_version=KUBERNETES)
    assert {"Deployment", "ClusterRole", "CustomResourceDefinition"} <= {o["kind"] for o in objs}
