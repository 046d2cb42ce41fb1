"""Pure builders: spec -> manifests, checked field by field without a cluster."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from toolrl_api.defaulting import apply_defaults
from toolrl_operator.children import build_children
from toolrl_operator.configmap import build_configmap
from toolrl_operator.job import Job, parse_job
from toolrl_operator.keda import uses_keda
from toolrl_operator.rayjob import (
    ENTRYPOINT,
    GPU_RESOURCE,
    LOGICAL_CPUS_PER_CPU_WORKER,
    LOGICAL_GPUS_PER_CPU_WORKER,
    ROLLOUT_WORKER_GROUP,
    SUBMITTER_BACKOFF_LIMIT,
    WORKER_GROUP,
    build_ray_network_policy,
    build_rayjob,
    trainer_env,
)
from toolrl_operator.rbac import build_role, build_role_binding, build_service_account
from toolrl_operator.settings import Settings
from toolrl_operator.status import pool_stopped, waiting_queue
from toolrl_operator.toolpool import (
    CHECKSUM_ANNOTATION,
    Pool,
    build_deployment,
    build_network_policy,
    build_pdb,
    build_service,
    pool_size,
    resize,
)

SETTINGS = Settings(trainer_image="trainer:test", tool_sandbox_image="sandbox:test")


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_every_child_is_owned_labelled_and_named_per_contract(make_job) -> None:
    job = make_job()
    children = build_children(job, SETTINGS)
    names = {(c["kind"], c["metadata"]["name"]) for c in children}
    assert names == {
        ("ServiceAccount", "gsm8k-python-trainer"),
        ("Role", "gsm8k-python-trainer"),
        ("RoleBinding", "gsm8k-python-trainer"),
        ("ConfigMap", "gsm8k-python-config"),
        ("Service", "gsm8k-python-tools"),
        ("PodDisruptionBudget", "gsm8k-python-tools"),
        ("NetworkPolicy", "gsm8k-python-tools"),
        ("NetworkPolicy", "gsm8k-python-ray"),
        ("Deployment", "gsm8k-python-tools"),
        ("RayJob", "gsm8k-python"),
    }
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "rl"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "toolrl-operator"
        assert meta["labels"]["toolrl.dev/job"] == "gsm8k-python"
        assert meta["labels"]["app.kubernetes.io/component"] in {"tool-pool", "trainer", "config"}
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "toolrl.dev/v1alpha1",
                "kind": "ToolRLJob",
                "name": "gsm8k-python",
                "uid": "uid-1234",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    assert children[-1]["kind"] == "RayJob", "the RayJob comes last: what its pods mount exists first"


def test_configmap_carries_the_defaulted_spec_and_the_tools_verbatim(make_job) -> None:
    job = make_job()
    cm = build_configmap(job)
    doc = json.loads(cm["data"]["job.json"])
    assert doc["apiVersion"] == "toolrl.dev/v1alpha1"
    assert doc["kind"] == "ToolRLJob"
    assert doc["metadata"] == {"name": "gsm8k-python", "namespace": "rl", "uid": "uid-1234", "generation": 3}
    assert doc["spec"] == job.body["spec"]
    assert doc["spec"]["rollout"]["toolCall"]["maxConcurrency"] == 256
    assert yaml.safe_load(cm["data"]["tools.yaml"]) == {"tools": job.body["spec"]["tools"]}
    assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "config"


def test_rayjob_runs_trainer_entry_with_the_contract_environment(make_job) -> None:
    rj = build_rayjob(make_job(), SETTINGS)
    spec = rj["spec"]
    assert rj["apiVersion"] == "ray.io/v1"
    assert spec["entrypoint"] == ENTRYPOINT == "python -m trainer_entry run --spec /etc/toolrl/job.json"
    assert spec["submissionMode"] == "K8sJobMode"
    assert "restartPolicy" not in spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 300  # issue 32: 3600 kept 16 GPUs idle for an hour
    assert spec["backoffLimit"] == 0
    assert spec["suspend"] is False
    assert "activeDeadlineSeconds" not in spec, "0 means no deadline; KubeRay rejects 0"
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    container = head["containers"][0]
    assert container["image"] == "trainer:test"
    assert _env(container) == {
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "eth0",
        "HF_HOME": "/models/huggingface",  # the example's model.cache
        "TOOLRL_JOB_SPEC": "/etc/toolrl/job.json",
        "TOOLRL_TOOL_POOL_URL": "http://gsm8k-python-tools.rl.svc:8080",
        "TOOLRL_JOB_NAME": "gsm8k-python",
        "TOOLRL_JOB_NAMESPACE": "rl",
        "TOOLRL_METRICS_PORT": "9400",
    }
    assert head["serviceAccountName"] == "gsm8k-python-trainer"
    assert {"name": "trainer-metrics", "containerPort": 9400} in container["ports"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/etc/toolrl"] == "toolrl-config"
    assert mounts["/data"] == "data"
    assert mounts["/checkpoints"] == "checkpoints"
    assert mounts["/models"] == "model-cache"
    volumes = {v["name"]: v for v in head["volumes"]}
    assert volumes["toolrl-config"]["projected"]["sources"] == [
        {"configMap": {"name": "gsm8k-python-config"}}
    ]
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "gsm8k-data"}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "gsm8k-checkpoints"}
    assert container["resources"] == {"requests": {"cpu": "4", "memory": "16Gi"}}


def test_rayjob_worker_group_gets_the_gpus(make_job) -> None:
    job = make_job(
        cluster={"workers": {"replicas": 3, "gpusPerWorker": 4, "resources": {"limits": {"cpu": "16"}}}}
    )
    group = build_rayjob(job, SETTINGS)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 3, 3)
    worker = group["template"]["spec"]["containers"][0]
    assert worker["resources"] == {
        "limits": {"cpu": "16", GPU_RESOURCE: "4"},
        "requests": {GPU_RESOURCE: "4"},
    }
    assert group["template"]["spec"]["automountServiceAccountToken"] is False
    assert group["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "trainer"


# the job's Ray pods on different machines where they can be (examples/toolrljob-cpu.yaml's)
SPREAD_RAY_PODS = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "trainer"}},
                    "matchLabelKeys": ["toolrl.dev/job"],
                },
            }
        ]
    }
}


def test_rayjob_passes_run_policy_node_placement_and_volumes(make_job) -> None:
    job = make_job(
        runPolicy={"backoffLimit": 2, "activeDeadlineSeconds": 600, "ttlSecondsAfterFinished": 60},
        checkpoint={"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
        reward={"preset": "custom", "custom": {"configMap": "my-reward"}},
        cluster={
            "image": "custom:1",
            "head": {"affinity": SPREAD_RAY_PODS},
            "workers": {
                "nodeSelector": {"pool": "a100"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "affinity": SPREAD_RAY_PODS,
            },
        },
    )
    rj = build_rayjob(job, SETTINGS)
    spec = rj["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (
        2,
        600,
        60,
    )
    worker = spec["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["nodeSelector"] == {"pool": "a100"}
    assert worker["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert worker["affinity"] == head["affinity"] == SPREAD_RAY_PODS
    assert worker["containers"][0]["image"] == "custom:1"
    mounts = {m["mountPath"]: m["name"] for m in worker["containers"][0]["volumeMounts"]}
    assert mounts["/checkpoints"] == "checkpoints"
    volumes = {v["name"]: v for v in worker["volumes"]}
    assert volumes["toolrl-config"]["projected"]["sources"][1] == {
        "configMap": {"name": "my-reward", "items": [{"key": "reward.py", "path": "reward/reward.py"}]}
    }
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpt"}


def _ray_pods(rayjob: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = rayjob["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"]["spec"]] + [
        group["template"]["spec"] for group in cluster["workerGroupSpecs"]
    ]


def test_a_model_cache_volume_is_every_ray_pods_hf_home(make_job, separate_async_cpu_job) -> None:
    """Weights downloaded once into the shared volume, read by every pod (the rollout workers' too)
    and every attempt after; cluster.env may still point HF_HOME elsewhere."""
    claim = {"persistentVolumeClaim": {"claimName": "hf-cache"}}
    separate = separate_async_cpu_job.body["spec"]
    job = make_job(**{**separate, "model": {"path": "Qwen/Qwen2.5-3B-Instruct", "cache": {"volume": claim}}})
    pods = _ray_pods(build_rayjob(job, SETTINGS))
    assert len(pods) == 3
    for pod in pods:
        container = pod["containers"][0]
        assert {"name": "model-cache", **claim} in pod["volumes"]
        assert {"name": "model-cache", "mountPath": "/models"} in container["volumeMounts"]
        assert _env(container)["HF_HOME"] == "/models/huggingface"
        assert "ephemeral-storage" not in container["resources"].get("requests", {})  # the volume holds them
    submitter = build_rayjob(job, SETTINGS)["spec"]["submitterPodTemplate"]["spec"]
    assert "volumes" not in submitter  # it runs `ray job submit` only
    overridden = make_job(
        model={"path": "/models/mine", "cache": {"volume": claim}},
        cluster={"env": [{"name": "HF_HOME", "value": "/models/elsewhere"}]},
    )
    env = build_rayjob(overridden, SETTINGS)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert [e for e in env["containers"][0]["env"] if e["name"] == "HF_HOME"] == [
        {"name": "HF_HOME", "value": "/models/elsewhere"}
    ]


def test_a_model_cache_size_is_an_emptydir_the_node_must_have_room_for(make_job) -> None:
    job = make_job(
        model={"path": "Qwen/Qwen2.5-3B-Instruct", "cache": {"size": "20Gi"}},
        cluster={
            "head": {"resources": {"requests": {"cpu": "4", "ephemeral-storage": "50Gi"}}},
            "workers": {"replicas": 2, "gpusPerWorker": 8, "resources": {"requests": {"cpu": "26"}}},
        },
    )
    head, workers = _ray_pods(build_rayjob(job, SETTINGS))
    for pod in (head, workers):
        assert {"name": "model-cache", "emptyDir": {"sizeLimit": "20Gi"}} in pod["volumes"]
        assert _env(pod["containers"][0])["HF_HOME"] == "/models/huggingface"
    assert head["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "50Gi"  # the user's own
    assert workers["containers"][0]["resources"]["requests"] == {
        "cpu": "26",
        "nvidia.com/gpu": "8",
        "ephemeral-storage": "20Gi",
    }
    plain = _ray_pods(build_rayjob(make_job(model={"path": "Qwen/Qwen2.5-3B-Instruct"}), SETTINGS))
    for pod in plain:
        assert all(v["name"] != "model-cache" for v in pod["volumes"])
        assert "HF_HOME" not in _env(pod["containers"][0])


@pytest.mark.parametrize(
    ("spec_suspend", "queue", "current", "expected"),
    [
        (False, "", None, False),
        (True, "", None, True),
        (True, "", False, True),
        (False, "", True, False),
        (False, "gpu", None, True),  # Kueue admits it: created suspended
        (False, "gpu", False, False),  # admitted by Kueue: left running
        (False, "gpu", True, True),  # still queued: left suspended
        (True, "gpu", False, True),  # the user suspends it
    ],
)
def test_rayjob_suspend_with_and_without_kueue(make_job, spec_suspend, queue, current, expected) -> None:
    job = make_job(suspend=spec_suspend, cluster={"queueName": queue})
    rj = build_rayjob(job, SETTINGS, current_suspend=current)
    assert rj["spec"]["suspend"] is expected
    assert (rj["metadata"]["labels"].get("kueue.x-k8s.io/queue-name") == "gpu") is bool(queue)


def test_tool_pool_pod_is_restricted_and_probed(make_job) -> None:
    dep = build_deployment(make_job(toolPool={"runtimeClassName": "gvisor"}), SETTINGS)
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsUser"] == 10001, "the tool-sandbox image's user"
    container = pod["containers"][0]
    assert container["image"] == "sandbox:test"
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # the tool API and /metrics on ports of their own (a policy admits metrics readers to the latter only)
    assert container["ports"] == [
        {"name": "http", "containerPort": 8080},
        {"name": "metrics", "containerPort": 9090},
    ]
    assert {"name": "tools-config", "mountPath": "/etc/toolrl", "readOnly": True} in container["volumeMounts"]
    assert dep["spec"]["selector"]["matchLabels"] == {
        "toolrl.dev/job": "gsm8k-python",
        "app.kubernetes.io/component": "tool-pool",
    }
    assert "runtimeClassName" not in build_deployment(make_job(), SETTINGS)["spec"]["template"]["spec"]


def test_the_pools_command_line_serves_the_ports_its_pod_opens(make_job) -> None:
    """The image's entrypoint and the operator's args, as tool_sandbox parses them (the separate image's
    own parser): the tool API and /metrics on the ports the container, Service and policies name."""
    from tool_sandbox.__main__ import parse_args, serve_settings

    container = build_deployment(make_job(), SETTINGS)["spec"]["template"]["spec"]["containers"][0]
    dockerfile = (Path(__file__).parents[3] / "images" / "tool-sandbox" / "Dockerfile").read_text()
    line = next(line for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT "))
    _python, module, package, *entrypoint = json.loads(line.removeprefix("ENTRYPOINT "))
    assert (module, package) == ("-m", "tool_sandbox"), line
    settings, config = serve_settings(parse_args([*entrypoint, *container["args"]]))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (settings.port, settings.metrics_port) == (ports["http"], ports["metrics"]) == (8080, 9090)
    assert config == "/etc/toolrl/tools.yaml"


def test_tool_pool_server_flags_follow_the_spec(make_job) -> None:
    def args(**pool: object) -> list[str]:
        pod = build_deployment(make_job(toolPool=pool), SETTINGS)["spec"]["template"]["spec"]
        return pod["containers"][0]["args"]

    assert args() == [
        "--port", "8080", "--metrics-port", "9090",
        "--config", "/etc/toolrl/tools.yaml", "--capacity", "32", "--max-sessions", "64",
        "--max-tasks", "6144", "--drain-seconds", "20",
    ]  # fmt: skip
    assert args(capacityPerReplica=8, maxSessionsPerReplica=4, requireLandlock=False) == [
        "--port", "8080", "--metrics-port", "9090",
        "--config", "/etc/toolrl/tools.yaml", "--capacity", "8", "--max-sessions", "4", "--max-tasks", "768",
        "--drain-seconds", "20", "--allow-no-landlock",
    ]  # fmt: skip
    # The pod's pids budget (enforced by the server: no pod field holds one) stays below a node's pid_max.
    pids = args(capacityPerReplica=1024, maxSessionsPerReplica=4096)
    assert pids[pids.index("--max-tasks") + 1] == "16384"


def test_tool_pool_drains_within_its_grace_period(make_job) -> None:
    """On SIGTERM the pool gives calls in flight --drain-seconds, then answers the rest as its own
    failure: the pod's grace period must leave it the time to, or the kubelet kills it first."""
    pod = build_deployment(make_job(), SETTINGS)["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    drain = float(args[args.index("--drain-seconds") + 1])
    assert drain + 5 <= pod["terminationGracePeriodSeconds"]


def test_tool_pool_tmp_holds_every_call_and_sessions_disk_budget(make_job) -> None:
    """The sandbox kills a call past its diskLimitMiB; /tmp must hold all of them at once, or the
    kubelet evicts the pod (and every call in flight) before the sandbox's own limit bites."""

    def tmp(job: dict) -> str:
        volumes = build_deployment(job, SETTINGS)["spec"]["template"]["spec"]["volumes"]
        return next(v["emptyDir"]["sizeLimit"] for v in volumes if v["name"] == "tmp")

    assert tmp(make_job()) == f"{32 * (32 + 64) + 256}Mi"
    tools = [
        {"name": "python", "type": "python", "diskLimitMiB": 8},
        {"name": "scratch", "type": "python", "diskLimitMiB": 100},
    ]
    job = make_job(tools=tools, toolPool={"capacityPerReplica": 4, "maxSessionsPerReplica": 2})
    assert tmp(job) == f"{100 * (4 + 2) + 256}Mi"


def test_tool_pool_rolls_when_the_tools_change(make_job) -> None:
    before = build_deployment(make_job(), SETTINGS)["spec"]["template"]["metadata"]["annotations"]
    tools = [
        {
            "name": "python",
            "type": "python",
            "timeoutSeconds": 20,
            "memoryLimitMiB": 512,
            "maxOutputBytes": 4096,
        }
    ]
    after = build_deployment(make_job(tools=tools), SETTINGS)["spec"]["template"]["metadata"]["annotations"]
    assert before[CHECKSUM_ANNOTATION] != after[CHECKSUM_ANNOTATION]


def test_search_tools_get_the_data_volume_read_only(make_job) -> None:
    tools = [
        {"name": "search", "type": "search", "corpus": "/data/c.jsonl"},
        {"name": "python", "type": "python"},
    ]
    container = build_deployment(make_job(tools=tools), SETTINGS)["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in container["volumeMounts"]
    container = build_deployment(make_job(), SETTINGS)["spec"]["template"]["spec"]["containers"][0]
    assert all(m["name"] != "data" for m in container["volumeMounts"])


@pytest.mark.parametrize(
    ("suspend", "status", "current", "expected"),
    [
        (False, None, None, 2),  # a new pool: min
        (True, None, None, 0),
        (False, None, 7, 7),
        (False, None, 100, 16),  # max edited below the size
        (False, None, 0, 2),  # resumed
        (True, None, 7, 0),
        (False, {"phase": "Succeeded"}, 7, 0),
        (False, {"phase": "Failed"}, None, 0),
        (False, {"phase": "Running"}, None, 2),
    ],
)
def test_pool_size_is_0_when_suspended_or_finished_else_within_min_and_max(
    make_job, suspend, status, current, expected
) -> None:
    assert pool_size(make_job(suspend=suspend, status=status), current) == expected


def test_the_operators_apply_sizes_the_pool_only_until_the_autoscalers_manager_owns_it(make_job) -> None:
    """A field its only manager stops applying is removed (replicas would default to 1): the
    operator's apply keeps the size until the autoscaler's field manager owns it too."""
    job, stopped = make_job(), make_job(suspend=True)

    def replicas(job: Job, live: Pool | None) -> int | None:
        return build_deployment(job, SETTINGS, live)["spec"].get("replicas")

    assert replicas(job, None) == 2, "a new pool starts at min"
    assert replicas(stopped, None) == 0
    assert replicas(job, Pool(5, autoscaled=False)) == 5, "sized by an earlier version, or kubectl"
    assert replicas(job, Pool(100, autoscaled=False)) == 16
    assert replicas(stopped, Pool(5, autoscaled=False)) == 0
    assert replicas(job, Pool(5, autoscaled=True)) is None, "the autoscaler's"
    assert replicas(stopped, Pool(5, autoscaled=True)) is None, "the sync resizes it (resize)"


def test_the_sync_resizes_where_the_autoscaler_must_not_decide_or_to_hand_the_size_over(make_job) -> None:
    job = make_job()
    assert resize(job, None) is None, "no pool yet: its apply creates it at min"
    assert resize(job, Pool(5, autoscaled=True)) is None, "within bounds: the autoscaler's"
    assert resize(job, Pool(5, autoscaled=False)) == 5, "the hand-over: the same size"
    assert resize(job, Pool(100, autoscaled=True)) == 16, "bounds edited: clamped at once"
    assert resize(job, Pool(0, autoscaled=True)) == 2, "resumed"
    assert resize(make_job(suspend=True), Pool(5, autoscaled=True)) == 0
    assert resize(make_job(suspend=True), Pool(0, autoscaled=True)) is None
    assert resize(make_job(status={"phase": "Succeeded"}), Pool(3, autoscaled=True)) == 0
    assert resize(make_job(toolPool={"autoscaler": "keda"}), Pool(5, autoscaled=False)) is None


def test_service_and_pdb_select_the_pool(make_job) -> None:
    job = make_job()
    selector = {"toolrl.dev/job": "gsm8k-python", "app.kubernetes.io/component": "tool-pool"}
    svc = build_service(job)
    assert svc["spec"]["selector"] == selector
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    pdb = build_pdb(job)
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}


def test_network_policy_admits_only_the_jobs_ray_pods_and_denies_egress(make_job) -> None:
    np = build_network_policy(make_job(), SETTINGS)["spec"]
    assert np["policyTypes"] == ["Ingress", "Egress"]
    assert "egress" not in np and "Egress" in np["policyTypes"], "no egress rule: all egress denied"
    trainer = {"toolrl.dev/job": "gsm8k-python", "app.kubernetes.io/component": "trainer"}
    assert np["ingress"][0]["from"] == [{"podSelector": {"matchLabels": trainer}}]
    assert np["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8080}]
    monitoring = np["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"]
    assert monitoring == {"kubernetes.io/metadata.name": "monitoring"}
    assert np["ingress"][1]["ports"] == [{"protocol": "TCP", "port": 9090}], "metrics readers: /metrics only"
    assert len(np["ingress"]) == 2


def test_network_policy_opens_egress_to_http_tools_only(make_job) -> None:
    tools = [
        {"name": "python", "type": "python"},
        {"name": "bench", "type": "http", "url": "http://stabletoolbench:8000/api"},
        {"name": "pinned", "type": "http", "url": "https://10.1.2.3/x"},
    ]
    egress = build_network_policy(make_job(tools=tools), SETTINGS)["spec"]["egress"]
    assert egress[0] == {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    assert {
        "ports": [{"protocol": "TCP", "port": 8000}],
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}}],
    } in egress, "a host name opens its port, but not to cloud metadata (169.254.169.254)"
    assert {
        "ports": [{"protocol": "TCP", "port": 443}],
        "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}],
    } in egress
    assert len(egress) == 3


def test_trainer_role_may_only_patch_its_own_status_and_post_events(make_job) -> None:
    job = make_job()
    assert build_service_account(job)["metadata"]["name"] == "gsm8k-python-trainer"
    assert build_role(job)["rules"] == [
        {
            "apiGroups": ["toolrl.dev"],
            "resources": ["toolrljobs/status"],
            "resourceNames": ["gsm8k-python"],
            "verbs": ["patch"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ]
    binding = build_role_binding(job)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "gsm8k-python-trainer",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gsm8k-python-trainer", "namespace": "rl"}
    ]


def test_builders_are_deterministic(make_job) -> None:
    assert build_children(make_job(), SETTINGS) == build_children(make_job(), SETTINGS)


def test_settings_come_from_the_environment() -> None:
    settings = Settings.from_env({"TOOLRL_TRAINER_IMAGE": "t:2", "TOOLRL_MONITORING_NAMESPACE": "obs"})
    assert settings.trainer_image == "t:2"
    assert settings.monitoring_namespace == "obs"
    assert settings.tool_sandbox_image == Settings().tool_sandbox_image


def test_keda_jobs_get_a_scaled_object_and_leave_replicas_to_it(make_job) -> None:
    from toolrl_operator.keda import KedaConfigError

    job = make_job(toolPool={"autoscaler": "keda"})
    keda_settings = Settings(prometheus_url="http://prometheus.monitoring:9090")
    kinds = [c["kind"] for c in build_children(job, keda_settings)]
    assert kinds[-2:] == ["ScaledObject", "RayJob"]
    for live in (None, Pool(3, autoscaled=False), Pool(3, autoscaled=True)):
        assert "replicas" not in build_deployment(job, keda_settings, live)["spec"]
    with pytest.raises(KedaConfigError, match="TOOLRL_PROMETHEUS_URL"):
        build_children(job, SETTINGS)
    assert "ScaledObject" not in [c["kind"] for c in build_children(make_job(), keda_settings)]


def test_bad_autoscaler_interval_is_rejected_with_the_variable_name() -> None:
    from toolrl_operator.settings import SettingsError

    assert Settings.from_env({"TOOLRL_AUTOSCALER_INTERVAL_SECONDS": "2.5"}).autoscaler_interval_seconds == 2.5
    assert Settings.from_env({"TOOLRL_PROMETHEUS_URL": "http://p:9090/"}).prometheus_url == "http://p:9090"
    for bad in ("0", "soon"):
        with pytest.raises(SettingsError, match="TOOLRL_AUTOSCALER_INTERVAL_SECONDS"):
            Settings.from_env({"TOOLRL_AUTOSCALER_INTERVAL_SECONDS": bad})


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_job_gets_no_rayjob_so_its_training_never_runs_again(make_job, phase) -> None:
    kinds = [c["kind"] for c in build_children(make_job(status={"phase": phase}), SETTINGS)]
    assert "RayJob" not in kinds
    assert "Deployment" in kinds
    assert "RayJob" in [c["kind"] for c in build_children(make_job(status={"phase": "Running"}), SETTINGS)]


def test_ray_pods_admit_only_their_job_kuberay_and_metrics_readers(make_job) -> None:
    settings = Settings(operator_namespace="toolrl-system", kuberay_namespace="ray-system")
    np = build_ray_network_policy(make_job(), settings)
    assert np["metadata"]["name"] == "gsm8k-python-ray"
    assert np["metadata"]["labels"]["app.kubernetes.io/component"] == "trainer"
    ray = {"toolrl.dev/job": "gsm8k-python", "app.kubernetes.io/component": "trainer"}
    spec = np["spec"]
    assert spec["podSelector"] == {"matchLabels": ray}
    assert spec["policyTypes"] == ["Ingress"]
    own, kuberay, metrics = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": ray}}]}, "the job's Ray pods: all ports"
    assert kuberay == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}}}],
        "ports": [{"protocol": "TCP", "port": 8265}],
    }
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert [
        p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in metrics["from"]
    ] == [
        "monitoring",
        "toolrl-system",
    ]
    default = build_ray_network_policy(make_job(), Settings())["spec"]["ingress"]
    labelled = {"namespaceSelector": {"matchLabels": {"toolrl.dev/ray-dashboard-access": "true"}}}
    assert default[1]["from"] == [labelled]
    assert len(default[2]["from"]) == 1, "no operator namespace known: only monitoring"


def test_ray_containers_are_unprivileged(make_job) -> None:
    """Every pod of the RayJob passes Pod Security `restricted`, KubeRay's submitter included (its
    SidecarMode container cannot be hardened, so the submitter is a Job of our template)."""
    rayjob = build_rayjob(make_job(), SETTINGS)["spec"]
    cluster = rayjob["rayClusterSpec"]
    assert rayjob["submissionMode"] == "K8sJobMode"
    templates = [
        cluster["headGroupSpec"]["template"],
        cluster["workerGroupSpecs"][0]["template"],
        rayjob["submitterPodTemplate"],
    ]
    for template in templates:
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 1000
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert (sc["runAsNonRoot"], sc["runAsUser"]) == (True, 1000)


def test_submitter_is_placed_like_the_head_and_carries_no_data_or_secrets(make_job) -> None:
    job = make_job(
        cluster={
            "head": {
                "nodeSelector": {"pool": "cpu"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            },
            "envFrom": [{"secretRef": {"name": "hf"}}],
            "serviceAccountName": "trainer-sa",
        }
    )
    submitter = build_rayjob(job, SETTINGS)["spec"]["submitterPodTemplate"]
    pod = submitter["spec"]
    assert pod["nodeSelector"] == {"pool": "cpu"} and pod["tolerations"][0]["key"] == "dedicated"
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert "volumes" not in pod and "serviceAccountName" not in pod
    [container] = pod["containers"]
    assert "envFrom" not in container and "volumeMounts" not in container
    assert container["resources"]["requests"]["cpu"] == "50m"
    assert submitter["metadata"]["labels"]["app.kubernetes.io/component"] == "trainer", (
        "the Ray NetworkPolicy admits the job's own trainer pods to the dashboard"
    )


def test_an_attempt_survives_more_lost_heads_than_kuberays_default_submitter_retries(make_job) -> None:
    # KubeRay's default of 2 failed the faulted run's attempt after its second lost head (CI): each lost
    # head costs a submitter pod, and so does each that starts before the new head is up
    spec = build_rayjob(make_job(), SETTINGS)["spec"]
    assert spec["submitterConfig"] == {"backoffLimit": SUBMITTER_BACKOFF_LIMIT}
    assert SUBMITTER_BACKOFF_LIMIT >= 10


def test_pool_admits_the_operators_namespace_for_direct_scraping(make_job) -> None:
    np = build_network_policy(make_job(), Settings(operator_namespace="toolrl-system"))["spec"]
    peers = np["ingress"][1]["from"]
    names = [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in peers]
    assert names == ["monitoring", "toolrl-system"]
    assert np["ingress"][1]["ports"] == [{"protocol": "TCP", "port": 9090}]
    assert Settings.from_env({"POD_NAMESPACE": "ops"}).operator_namespace == "ops"
    assert Settings.from_env({"TOOLRL_KUBERAY_NAMESPACE": "kr"}).kuberay_namespace == "kr"


@pytest.mark.parametrize(
    ("path", "build"),
    [
        (("toolPool", "replicas", "min"), lambda job: pool_size(job, None)),
        (("runPolicy", "ttlSecondsAfterFinished"), lambda job: build_rayjob(job, SETTINGS)),
        (("toolPool", "autoscaler"), uses_keda),
        (("suspend",), lambda job: build_rayjob(job, SETTINGS)),
        (("cluster", "queueName"), lambda job: build_rayjob(job, SETTINGS)),
        (("cluster", "head"), lambda job: build_rayjob(job, SETTINGS)),
        (("reward", "custom", "key"), lambda job: build_rayjob(job, SETTINGS)),
        (("toolPool",), lambda job: build_deployment(job, SETTINGS)),
        (("rollout", "maxParallelCalls"), lambda job: pool_size(job, 100)),
        (("suspend",), pool_stopped),
        (("cluster", "queueName"), waiting_queue),
    ],
)
def test_the_operator_restates_no_crd_default(make_job_object, schema, path, build) -> None:
    """Each of these once had a fallback repeating the CRD's default. The builders now read the typed
    spec, whose only defaults are the CRD's (toolrl_api.spec_types, generated from it; tests/unit/chart/
    test_crd_defaults.py changes one and sees the operator follow): a job stored without the field
    builds exactly as that job defaulted by the API server (the CRD's structural defaulting) does."""
    stored = make_job_object(reward={"preset": "custom", "custom": {"configMap": "my-reward"}})
    parent = stored["spec"]
    for part in path[:-1]:
        parent = parent[part]
    del parent[path[-1]]
    defaulted = copy.deepcopy(stored)
    apply_defaults(schema["properties"]["spec"], defaulted["spec"])
    assert path[-1] in json.dumps(defaulted["spec"]), "the CRD defaults the field"
    assert build(parse_job(stored)) == build(parse_job(defaulted))


def test_cpu_workers_ask_for_no_gpu_and_advertise_one_logical_ray_gpu(make_job) -> None:
    job = make_job(
        rollout={"engine": "hf"},
        cluster={
            "workers": {"replicas": 1, "gpusPerWorker": 0, "resources": {"requests": {"memory": "6Gi"}}}
        },
    )
    group = build_rayjob(job, SETTINGS)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    worker = group["template"]["spec"]["containers"][0]
    assert worker["resources"] == {"requests": {"memory": "6Gi"}}
    assert group["rayStartParams"] == {
        "num-gpus": str(LOGICAL_GPUS_PER_CPU_WORKER),
        "num-cpus": str(LOGICAL_CPUS_PER_CPU_WORKER),
    }
    head = build_rayjob(job, SETTINGS)["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == str(LOGICAL_CPUS_PER_CPU_WORKER)
    gpu = build_rayjob(make_job(), SETTINGS)["spec"]["rayClusterSpec"]
    # GPU workers advertise their real GPUs (KubeRay reads the limit) and the CPUs they ask for
    assert gpu["workerGroupSpecs"][0]["rayStartParams"] == {"num-cpus": "26"}
    assert gpu["headGroupSpec"]["rayStartParams"]["num-cpus"] == "4", "a GPU job's head keeps its real CPUs"


@pytest.mark.parametrize(
    ("resources", "num_cpus"),
    [
        ({}, "26"),  # no CPU asked: KubeRay would let Ray count the machine's; verl's need instead
        ({"requests": {"memory": "8Gi"}}, "26"),
        ({"requests": {"cpu": "40"}}, "40"),
        ({"requests": {"cpu": "4"}, "limits": {"cpu": "26500m"}}, "27"),  # the limit, rounded up, as KubeRay
    ],
)
def test_gpu_workers_give_ray_the_cpus_verl_places_with(make_job, resources, num_cpus) -> None:
    """Issue 32: with no num-cpus KubeRay started Ray with the pod's 24 CPUs; verl's placement group took
    24, a storage unit 1, and the vLLM server actors waited forever. The operator says num-cpus itself,
    never below 3 x GPUs + 2 (trainer_entry.placement.worker_cpus; a test checks they agree)."""
    job = make_job(cluster={"workers": {"replicas": 2, "gpusPerWorker": 8, "resources": resources}})
    group = build_rayjob(job, SETTINGS)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert group["rayStartParams"] == {"num-cpus": num_cpus}


def test_the_operators_worker_cpus_are_the_trainers_placement_need() -> None:
    from toolrl_operator.rayjob import HEAD_CPUS_FOR_VERL, gpu_worker_cpus
    from trainer_entry.placement import head_cpus, worker_cpus

    assert [gpu_worker_cpus(g) for g in (1, 2, 8, 16)] == [worker_cpus(g) for g in (1, 2, 8, 16)]
    assert head_cpus() == HEAD_CPUS_FOR_VERL


def test_separate_async_gets_a_rollout_worker_group_of_its_own(make_job, separate_async_cpu_job) -> None:
    """trainer.mode separate-async: cluster.rolloutWorkers become a second worker group of the RayJob's
    cluster (its replicas, GPUs, resources and scheduling), beside the training workers; other modes
    have the training group only. (The CRD admits separate-async on CPU workers only for now; the
    builder sizes GPU groups the same way.)"""
    rollout = {
        "replicas": 3,
        "gpusPerWorker": 2,
        "resources": {"requests": {"cpu": "8", "memory": "32Gi"}},
        "nodeSelector": {"pool": "inference"},
        "tolerations": [{"key": "inference", "operator": "Exists"}],
        "affinity": SPREAD_RAY_PODS,
    }
    job = make_job(
        trainer={"mode": "separate-async"},
        cluster={"workers": {"replicas": 2, "gpusPerWorker": 8}, "rolloutWorkers": rollout},
    )
    groups = build_rayjob(job, SETTINGS)["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == [WORKER_GROUP, ROLLOUT_WORKER_GROUP]
    trainers, rollouts = groups
    assert (trainers["replicas"], rollouts["replicas"]) == (2, 3)
    assert rollouts["minReplicas"] == rollouts["maxReplicas"] == 3
    pod = rollouts["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi", GPU_RESOURCE: "2"},
        "limits": {GPU_RESOURCE: "2"},
    }
    assert pod["nodeSelector"] == {"pool": "inference"}
    assert pod["tolerations"] == rollout["tolerations"]
    assert pod["affinity"] == SPREAD_RAY_PODS and "affinity" not in trainers["template"]["spec"]
    assert trainers["template"]["spec"]["containers"][0]["resources"]["limits"] == {GPU_RESOURCE: "8"}
    assert rollouts["rayStartParams"] == {"num-cpus": "8"}

    cpu = separate_async_cpu_job
    (_, cpu_rollouts) = build_rayjob(cpu, SETTINGS)["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert cpu_rollouts["rayStartParams"]["num-gpus"] == str(LOGICAL_GPUS_PER_CPU_WORKER)
    assert len(build_rayjob(make_job(), SETTINGS)["spec"]["rayClusterSpec"]["workerGroupSpecs"]) == 1


def test_ray_pods_get_the_users_environment_and_pod_settings(make_job) -> None:
    secret_env = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    job = make_job(
        cluster={
            "env": [secret_env, {"name": "NCCL_SOCKET_IFNAME", "value": "ens5"}],
            "envFrom": [{"secretRef": {"name": "wandb"}}],
            "imagePullSecrets": [{"name": "registry"}],
            "priorityClassName": "training",
            "podLabels": {"team": "rl"},
            "podAnnotations": {"cost-center": "42"},
            "serviceAccountName": "s3-reader",
            "shmSize": "16Gi",
        },
        runPolicy={"pendingDeadlineSeconds": 900},
    )
    spec = build_rayjob(job, SETTINGS)["spec"]
    assert spec["preRunningDeadlineSeconds"] == 900
    groups = [spec["rayClusterSpec"]["headGroupSpec"], *spec["rayClusterSpec"]["workerGroupSpecs"]]
    for group in groups:
        template = group["template"]
        pod, [container] = template["spec"], template["spec"]["containers"]
        env = [e["name"] for e in container["env"]]
        assert secret_env in container["env"]
        assert env.count("NCCL_SOCKET_IFNAME") == 1 and _env(container)["NCCL_SOCKET_IFNAME"] == "ens5"
        assert _env(container)["GLOO_SOCKET_IFNAME"] == "eth0", "the default stays where not overridden"
        assert env[-5:] == [e["name"] for e in trainer_env("gsm8k-python", "rl")], "the contract comes last"
        assert container["envFrom"] == [{"secretRef": {"name": "wandb"}}]
        assert pod["imagePullSecrets"] == [{"name": "registry"}]
        assert pod["priorityClassName"] == "training"
        assert pod["serviceAccountName"] == "s3-reader" and "automountServiceAccountToken" not in pod
        assert template["metadata"]["labels"]["team"] == "rl"
        assert template["metadata"]["labels"]["toolrl.dev/job"] == "gsm8k-python"
        assert template["metadata"]["annotations"] == {"cost-center": "42"}
        shm = {v["name"]: v for v in pod["volumes"]}["dshm"]
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    subjects = [s["name"] for s in build_role_binding(job)["subjects"]]
    assert subjects == ["gsm8k-python-trainer", "s3-reader"], "the workload account may report progress"
    plain = build_rayjob(make_job(), SETTINGS)["spec"]
    assert "preRunningDeadlineSeconds" not in plain
    assert {v["name"]: v for v in plain["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["volumes"]}[
        "dshm"
    ]["emptyDir"] == {"medium": "Memory"}


def test_each_ray_groups_runtime_class_is_its_own(make_job) -> None:
    """GPU nodes whose container runtime is not the cluster's default (the NVIDIA runtime as a
    RuntimeClass) take the GPU groups' pods only: the head (and the submitter placed like it) keeps the
    default unless it names one."""
    job = make_job(
        trainer={"mode": "separate-async"},
        cluster={
            "workers": {"gpusPerWorker": 8, "runtimeClassName": "nvidia"},
            "rolloutWorkers": {"gpusPerWorker": 8, "runtimeClassName": "nvidia-cdi"},
        },
    )
    spec = build_rayjob(job, SETTINGS)["spec"]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    workers, rollouts = (g["template"]["spec"] for g in spec["rayClusterSpec"]["workerGroupSpecs"])
    assert (workers["runtimeClassName"], rollouts["runtimeClassName"]) == ("nvidia", "nvidia-cdi")
    assert "runtimeClassName" not in head
    assert "runtimeClassName" not in spec["submitterPodTemplate"]["spec"]
    spec = build_rayjob(make_job(cluster={"head": {"runtimeClassName": "kata"}}), SETTINGS)["spec"]
    assert spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["runtimeClassName"] == "kata"
    assert spec["submitterPodTemplate"]["spec"]["runtimeClassName"] == "kata"
    assert "runtimeClassName" not in spec["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]


def test_tool_pool_placement_follows_the_spec(make_job) -> None:
    placement = {
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "imagePullSecrets": [{"name": "registry"}],
    }
    pod = build_deployment(make_job(toolPool=placement), SETTINGS)["spec"]["template"]["spec"]
    assert {k: pod[k] for k in placement} == placement
    bare = build_deployment(make_job(), SETTINGS)["spec"]["template"]["spec"]
    assert not set(placement) & set(bare)


FUNCTION_TOOL = {
    "name": "lookup",
    "type": "function",
    "function": {"configMap": {"name": "my-tools", "key": "lookup.py"}, "name": "find"},
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    "diskLimitMiB": 50,
}


def test_function_tools_source_is_mounted_read_only_where_the_pools_config_says(make_job) -> None:
    job = make_job(tools=[{"name": "python", "type": "python"}, FUNCTION_TOOL])
    pod = build_deployment(job, SETTINGS)["spec"]["template"]["spec"]
    config = next(v for v in pod["volumes"] if v["name"] == "tools-config")
    assert config["projected"]["sources"] == [
        {
            "configMap": {
                "name": "gsm8k-python-config",
                "items": [{"key": "tools.yaml", "path": "tools.yaml"}],
            }
        },
        {"configMap": {"name": "my-tools", "items": [{"key": "lookup.py", "path": "functions/lookup.py"}]}},
    ]
    mount = {"name": "tools-config", "mountPath": "/etc/toolrl", "readOnly": True}
    assert mount in pod["containers"][0]["volumeMounts"]
    tools = yaml.safe_load(build_configmap(job)["data"]["tools.yaml"])["tools"]
    assert tools[0] == job.body["spec"]["tools"][0]
    assert tools[1] == {**job.body["spec"]["tools"][1], "source": "/etc/toolrl/functions/lookup.py"}
    # a function call keeps files in the sandbox like a python call: /tmp holds its disk budget
    tmp = next(v["emptyDir"]["sizeLimit"] for v in pod["volumes"] if v["name"] == "tmp")
    assert tmp == f"{50 * (32 + 64) + 256}Mi"


def test_the_function_tools_key_defaults_to_tools_py(make_job) -> None:
    tool = {**FUNCTION_TOOL, "function": {"configMap": {"name": "my-tools"}}}
    pod = build_deployment(make_job(tools=[tool]), SETTINGS)["spec"]["template"]["spec"]
    config = next(v for v in pod["volumes"] if v["name"] == "tools-config")
    assert config["projected"]["sources"][1]["configMap"]["items"] == [
        {"key": "tools.py", "path": "functions/lookup.py"}
    ]


def test_network_policy_admits_exactly_the_mcp_servers(make_job) -> None:
    """A Service's full name admits its namespace's pods (those of mcp.podSelector) on the pods'
    port; a short name is the job's own namespace; an IP or an outside host as an http endpoint."""
    tools = [
        {"name": "python", "type": "python"},
        {
            "name": "docs",
            "type": "mcp",
            "mcp": {"url": "http://docs-mcp.tools.svc:8000/mcp", "podSelector": {"app": "docs-mcp"}},
        },
        {"name": "mine", "type": "mcp", "mcp": {"url": "http://my-mcp/mcp", "targetPort": 9000}},
        {"name": "far", "type": "mcp", "mcp": {"url": "https://mcp.example.com/mcp"}},
        {"name": "pinned", "type": "mcp", "mcp": {"url": "http://10.1.2.3:8000/mcp"}},
    ]
    job = make_job(tools=tools)
    egress = build_network_policy(job, SETTINGS)["spec"]["egress"]
    assert egress[0] == {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    tools_ns = {"matchLabels": {"kubernetes.io/metadata.name": "tools"}}
    assert egress[1] == {
        "ports": [{"protocol": "TCP", "port": 8000}],
        "to": [{"namespaceSelector": tools_ns, "podSelector": {"matchLabels": {"app": "docs-mcp"}}}],
    }
    own_ns = {"matchLabels": {"kubernetes.io/metadata.name": job.namespace}}
    assert egress[2] == {"ports": [{"protocol": "TCP", "port": 9000}], "to": [{"namespaceSelector": own_ns}]}
    assert egress[3] == {
        "ports": [{"protocol": "TCP", "port": 443}],
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}}],
    }
    pinned = {"ports": [{"protocol": "TCP", "port": 8000}], "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}]}
    assert egress[4] == pinned
    assert len(egress) == 5


@pytest.mark.parametrize("phase", ["Pending", "Running", "Succeeded", "Failed", "Suspended"])
@pytest.mark.parametrize("autoscaler", ["native", "keda"])
def test_builders_read_no_status_field_but_those_the_sync_keys_its_cache_by(
    make_job_object, phase, autoscaler
) -> None:
    """The sync builds again only when the job's metadata, spec or `status_read_by_builders` change
    (reconcile.inputs_key): a full status (the operator's, the trainer's progress, the autoscaler's
    condition) must build the same children as those fields alone."""
    from toolrl_operator.children import status_read_by_builders
    from toolrl_operator.scale_loop import condition
    from toolrl_operator.status import compute_status

    body = make_job_object(toolPool={"autoscaler": autoscaler})
    deployment_status = {"Pending": "Initializing", "Succeeded": "Complete"}.get(phase, phase)
    job_status = {"Succeeded": "SUCCEEDED", "Failed": "FAILED"}.get(phase, "RUNNING")
    rayjob = {
        "metadata": {"name": "gsm8k-python"},
        "spec": {"suspend": phase == "Suspended"},
        "status": {"jobDeploymentStatus": deployment_status, "jobStatus": job_status,
                   "rayClusterName": "c1", "startTime": "2026-12-06T00:00:00Z"},
    }  # fmt: skip
    deployment = {"metadata": {"name": "d", "generation": 2}, "spec": {"replicas": 3},
                  "status": {"readyReplicas": 2, "updatedReplicas": 3, "observedGeneration": 2}}  # fmt: skip
    status = compute_status(parse_job(body), rayjob, deployment, 3, "2026-12-06T00:01:00Z")
    assert (status["phase"] in ("Succeeded", "Failed")) == (phase in ("Succeeded", "Failed")), status["phase"]
    status["progress"] = {"step": 7, "totalSteps": 10, "lastUpdateTime": "2026-12-06T00:02:00Z"}
    status["toolPool"]["desiredReplicas"] = 3
    status["conditions"].append(condition(True, "", None, "2026-12-06T00:03:00Z", 3))
    full = {**body, "status": status}
    reduced = {**body, "status": status_read_by_builders(status)}
    settings = Settings(prometheus_url="http://prometheus:9090")
    assert build_children(parse_job(full), settings) == build_children(parse_job(reduced), settings)


def test_metrics_from_cidrs_reach_the_pools_and_the_trainers_metrics_and_nothing_else(make_job) -> None:
    """A Prometheus outside the cluster or on a node's network scrapes from a node's address: the
    CIDRs given are admitted to /metrics of the pool and the Ray pods' trainer metrics only."""
    settings = Settings.from_env({"TOOLRL_METRICS_CIDRS": "198.18.0.1/32, 2001:db8::/64"})
    assert settings.metrics_cidrs == ("198.18.0.1/32", "2001:db8::/64")
    blocks = [{"ipBlock": {"cidr": "198.18.0.1/32"}}, {"ipBlock": {"cidr": "2001:db8::/64"}}]
    pool = build_network_policy(make_job(), settings)["spec"]["ingress"]
    ray = build_ray_network_policy(make_job(), settings)["spec"]["ingress"]
    assert pool[1]["from"][1:] == blocks and pool[1]["ports"] == [{"protocol": "TCP", "port": 9090}]
    assert ray[2]["from"][1:] == blocks and ray[2]["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert all("ipBlock" not in p for rule in (pool[0], ray[0], ray[1]) for p in rule["from"])
    assert Settings.from_env({}).metrics_cidrs == ()
    # the chart's schema cannot tell host bits: they are cleared, not refused at the operator's start
    assert Settings.from_env({"TOOLRL_METRICS_CIDRS": "192.0.2.10/24"}).metrics_cidrs == ("192.0.2.0/24",)


@pytest.mark.parametrize("bad", ["198.18.0.1", "198.18.0.1/33", "1.2.3.4.5/24", "prometheus/32"])
def test_a_metrics_cidr_that_is_not_a_network_is_refused_naming_it(bad: str) -> None:
    from toolrl_operator.settings import SettingsError

    with pytest.raises(SettingsError, match=rf"TOOLRL_METRICS_CIDRS=.*{re.escape(bad)}.* is not a CIDR"):
        Settings.from_env({"TOOLRL_METRICS_CIDRS": f"10.0.0.0/8,{bad}"})


def test_kuberay_cidrs_reach_the_ray_dashboard_only(make_job) -> None:
    """A KubeRay that reads the dashboard through the API server's proxy comes from the API server's
    address: the CIDRs given are admitted to the dashboard, not to GCS, the client port or metrics."""
    settings = Settings.from_env({"TOOLRL_KUBERAY_CIDRS": "198.18.0.1/32"})
    own, dashboard, metrics = build_ray_network_policy(make_job(), settings)["spec"]["ingress"]
    assert dashboard["from"][1:] == [{"ipBlock": {"cidr": "198.18.0.1/32"}}]
    assert dashboard["ports"] == [{"protocol": "TCP", "port": 8265}]
    assert all("ipBlock" not in p for rule in (own, metrics) for p in rule["from"])
    assert len(build_ray_network_policy(make_job(), Settings())["spec"]["ingress"][1]["from"]) == 1
