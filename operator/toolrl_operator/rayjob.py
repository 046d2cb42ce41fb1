"""The KubeRay RayJob (ray.io/v1) that runs trainer_entry on a head + GPU-worker Ray cluster."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from toolrl_api.spec_types import ClusterHead, ClusterRolloutWorkers, ClusterWorkers, ModelCache, Spec

from .configmap import JOB_KEY
from .job import Job
from .naming import (
    CHECKPOINT_MOUNT,
    COMPONENT_TRAINER,
    CONFIG_MOUNT,
    DATA_MOUNT,
    LABEL_KUEUE_QUEUE,
    MODEL_CACHE_MOUNT,
    RAY_CLIENT_PORT,
    RAY_DASHBOARD_ACCESS_LABEL,
    RAY_DASHBOARD_PORT,
    RAY_GCS_PORT,
    REWARD_DIR,
    SUBMITTER_CONTAINER,
    TRAINER_METRICS_PORT,
    TRAINER_METRICS_PORT_NAME,
    child_metadata,
    config_name,
    ip_blocks,
    labels,
    metrics_peers,
    namespace_selector,
    ray_network_policy_name,
    rayjob_name,
    selector_labels,
    tool_pool_url,
    trainer_name,
)
from .settings import Settings

GPU_RESOURCE = "nvidia.com/gpu"
WORKER_GROUP = "gpu-workers"
# trainer.mode separate-async: the workers that only generate (spec.cluster.rolloutWorkers), verl's
# standalone rollout pool. Ray places verl's pools by GPU count alone (verl asks for no custom resource).
ROLLOUT_WORKER_GROUP = "rollout-workers"
# A CPU-only job (gpusPerWorker 0, rollout.engine vllm or hf) runs verl's cpu platform: each worker advertises
# one *logical* Ray GPU, since verl's resource pools always ask Ray for "GPU" bundles. trainer_entry
# sets trainer.n_gpus_per_node to the same number (translate.LOGICAL_GPUS_PER_CPU_WORKER; a test
# checks they agree).
LOGICAL_GPUS_PER_CPU_WORKER = 1
# ... and offers Ray logical CPUs beyond its pod's request: verl's placement groups ask for 3 CPUs
# per GPU bundle plus its agent-loop, reward and storage actors, which would never schedule on a
# 1-CPU worker (translate.LOGICAL_CPUS_PER_CPU_WORKER; a test checks they agree).
LOGICAL_CPUS_PER_CPU_WORKER = 16
# A GPU worker's Ray CPUs: verl's placement group asks each GPU for 3 (ResourcePoolManager's
# max_colocate_count), TransferQueue pins one storage unit to every Ray node (trainer_entry sets one per
# node), and verl's vLLM server actors, hard-pinned to the node, each need 1 free CPU to be placed.
# KubeRay would give Ray the pod's CPU limit, else its request, and nothing else reserves the rest: so
# the operator says `num-cpus` itself, never below that need (trainer_entry.placement.worker_cpus; a
# test checks they agree). The head holds TransferQueue's controller and its own storage unit.
VERL_CPUS_PER_GPU = 3
WORKER_CPUS_BEYOND_GPUS = 2
HEAD_CPUS_FOR_VERL = 2
ENTRYPOINT = f"python -m trainer_entry run --spec {CONFIG_MOUNT}/{JOB_KEY}"
RAY_UID = 1000  # the trainer image's user (images/trainer/Dockerfile)
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
    "runAsNonRoot": True,
    "runAsUser": RAY_UID,
}
POD_SECURITY: dict[str, Any] = {
    # Pod-wide too, for every container of the pod.
    "runAsNonRoot": True,
    "runAsUser": RAY_UID,
    "runAsGroup": RAY_UID,
    "fsGroup": RAY_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}

# `ray job submit` and then following the log: ~150 MiB resident (the Ray CLI), next to no CPU.
# KubeRay's default asks for 500m, a quarter of a 2-CPU node.
SUBMITTER_RESOURCES = {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}

# The submitter pods one attempt may lose before KubeRay fails it (submitterConfig.backoffLimit;
# KubeRay's default is 2). Each lost Ray head costs one (the pod following the trainer's log fails),
# and so does each submitter pod that starts while the new head is still coming up (`ray job submit`
# tries once). With 2, a job survived two head losses an attempt, and on a loaded node a single loss
# failed the attempt when the head took longer to return than the Job's back-off (10 s, then 20 s):
# seen in CI, the faulted run's attempt 2 failed after its second lost head. The Job's back-off
# doubles to 6 min, so 20 pods cover a head absent for over an hour (10 + 20 + ... + 320 s, then
# 6 min each), or 20 losses.
SUBMITTER_BACKOFF_LIMIT = 20

# Which interface NCCL and Gloo use between pods. Left to themselves they may pick one that does
# not route between pods (docker0, a CNI bridge) and hang in init_process_group, a hang verl and
# Ray users report; eth0 is the pod network interface of the common CNIs. cluster.env overrides.
NETWORK_ENV_DEFAULTS = {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
# With spec.model.cache, the Hugging Face libraries (transformers, vLLM's loader, huggingface_hub) keep
# hub downloads under HF_HOME on the cache: a shared volume is downloaded into once. cluster.env overrides.
HF_HOME = f"{MODEL_CACHE_MOUNT}/huggingface"


def trainer_env(name: str, namespace: str) -> list[dict[str, str]]:
    """The environment contract between the operator and trainer_entry."""
    return [
        {"name": "TOOLRL_JOB_SPEC", "value": f"{CONFIG_MOUNT}/{JOB_KEY}"},
        {"name": "TOOLRL_TOOL_POOL_URL", "value": tool_pool_url(name, namespace)},
        {"name": "TOOLRL_JOB_NAME", "value": name},
        {"name": "TOOLRL_JOB_NAMESPACE", "value": namespace},
        {"name": "TOOLRL_METRICS_PORT", "value": str(TRAINER_METRICS_PORT)},
    ]


def ray_env(job: Job) -> list[dict[str, Any]]:
    """The Ray containers' environment: the NCCL/Gloo defaults (and HF_HOME with a model cache), then
    `cluster.env` (which may override them), then the operator's contract (TOOLRL_*, which the CRD
    keeps users from setting)."""
    meta = job.metadata
    user = [copy.deepcopy(e) for e in job.spec.cluster.env or []]
    named = {e["name"] for e in user}
    values = {**NETWORK_ENV_DEFAULTS, **({"HF_HOME": HF_HOME} if job.spec.model.cache else {})}
    defaults = [{"name": k, "value": v} for k, v in values.items() if k not in named]
    return [*defaults, *user, *trainer_env(meta["name"], meta["namespace"])]


def _volumes(job: Job) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volumes of every Ray pod and where the container mounts them. /etc/toolrl is one projected
    volume: the job's ConfigMap, plus a custom reward's file under reward/."""
    spec = job.spec
    sources: list[dict[str, Any]] = [{"configMap": {"name": config_name(job.name)}}]
    custom = spec.reward.custom
    if spec.reward.preset == "custom":
        assert custom is not None  # the CRD requires reward.custom with preset custom
        key = custom.key
        sources.append(
            {
                "configMap": {
                    "name": custom.config_map,
                    "items": [{"key": key, "path": f"{REWARD_DIR}/{key}"}],
                }
            }
        )
    volumes: list[dict[str, Any]] = [
        {"name": "toolrl-config", "projected": {"sources": sources}},
        {"name": "dshm", "emptyDir": _shm(spec)},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "toolrl-config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    cache = spec.model.cache
    for vol_name, source, path in (
        ("data", spec.data.volume, DATA_MOUNT),
        ("checkpoints", spec.checkpoint.volume, CHECKPOINT_MOUNT),
        ("model-cache", _model_cache_source(cache), MODEL_CACHE_MOUNT),
    ):
        if source:
            volumes.append({"name": vol_name, **copy.deepcopy(source)})
            mounts.append({"name": vol_name, "mountPath": path})
    return volumes, mounts


def _model_cache_source(cache: ModelCache | None) -> dict[str, Any] | None:
    """spec.model.cache as a volume source: the user's volume, or an emptyDir of `size` (the CRD
    admits exactly one of them)."""
    if cache is None:
        return None
    if cache.volume:
        return cache.volume
    return {"emptyDir": {"sizeLimit": str(cache.size)}}


def _with_cache_storage(resources: dict[str, Any], cache: ModelCache | None) -> dict[str, Any]:
    """A Ray container's resources asking for the emptyDir cache's size of ephemeral storage (the
    node must have room for the weights), unless the user asked for an amount themselves."""
    if cache is not None and cache.size is not None and not cache.volume:
        resources.setdefault("requests", {}).setdefault("ephemeral-storage", str(cache.size))
    return resources


def _shm(spec: Spec) -> dict[str, Any]:
    size = spec.cluster.shm_size
    return {"medium": "Memory", **({"sizeLimit": str(size)} if size else {})}


def _pod_template(
    job: Job,
    container: dict[str, Any],
    group: ClusterHead | ClusterWorkers | ClusterRolloutWorkers,
    service_account: str | None,
) -> dict[str, Any]:
    name = job.name
    cluster = job.spec.cluster
    volumes, mounts = _volumes(job)
    container = {**container, "volumeMounts": mounts, "securityContext": copy.deepcopy(CONTAINER_SECURITY)}
    if cluster.env_from:
        container["envFrom"] = copy.deepcopy(cluster.env_from)
    pod_spec: dict[str, Any] = {
        "securityContext": copy.deepcopy(POD_SECURITY),
        "containers": [container],
        "volumes": volumes,
    }
    service_account = cluster.service_account_name or service_account
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    else:
        pod_spec["automountServiceAccountToken"] = False
    if cluster.image_pull_secrets:
        pod_spec["imagePullSecrets"] = copy.deepcopy(cluster.image_pull_secrets)
    if cluster.priority_class_name:
        pod_spec["priorityClassName"] = cluster.priority_class_name
    if group.node_selector:
        pod_spec["nodeSelector"] = dict(group.node_selector)
    if group.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(group.tolerations)
    if group.affinity:
        pod_spec["affinity"] = copy.deepcopy(group.affinity)
    if group.runtime_class_name:
        pod_spec["runtimeClassName"] = group.runtime_class_name
    metadata: dict[str, Any] = {"labels": {**(cluster.pod_labels or {}), **labels(name, COMPONENT_TRAINER)}}
    if cluster.pod_annotations:
        metadata["annotations"] = dict(cluster.pod_annotations)
    return {"metadata": metadata, "spec": pod_spec}


def _submitter_template(job: Job, image: str, head: ClusterHead) -> dict[str, Any]:
    """The pod of KubeRay's submitter Job: `ray job submit` in the trainer image, which follows the
    trainer's log to its end (so `kubectl logs job/<rayjob>` shows training), placed like the head,
    hardened like every Ray pod. KubeRay sets its command and the submission's address and id."""
    container = {"name": SUBMITTER_CONTAINER, "image": image, "resources": copy.deepcopy(SUBMITTER_RESOURCES)}
    template = _pod_template(job, container, head, None)
    spec = template["spec"]
    for field in ("volumeMounts", "envFrom"):  # it needs neither the data nor the job's secrets
        spec["containers"][0].pop(field, None)
    spec.pop("volumes")
    spec.pop("serviceAccountName", None)
    spec["automountServiceAccountToken"] = False  # it talks to Ray's dashboard, not the API
    spec["restartPolicy"] = "Never"
    return template


def quantities(resources: dict[str, Any] | None) -> dict[str, Any]:
    """Resource quantities as strings, as KubeRay writes them back: it updates the RayJob (its
    finalizer) from Go structs, which turns 8 into "8", and the operator re-applying 8 would change
    the RayJob again (seen on the local control plane)."""
    return {
        kind: {name: str(value) for name, value in amounts.items()}
        for kind, amounts in (resources or {}).items()
    }


def _worker_resources(workers: ClusterWorkers | ClusterRolloutWorkers) -> dict[str, Any]:
    """The user's resources plus the GPUs; a CPU worker (0 GPUs) asks for no `nvidia.com/gpu`."""
    resources = quantities(workers.resources)
    if workers.gpus_per_worker:
        for kind in ("requests", "limits"):
            resources.setdefault(kind, {})[GPU_RESOURCE] = str(workers.gpus_per_worker)
    return resources


def ray_cpus(resources: Mapping[str, Any] | None) -> int:
    """The Ray CPUs KubeRay gives a pod of these resources: its CPU limit, else its request, rounded
    up (0: neither, and Ray would count the machine's)."""
    for kind in ("limits", "requests"):
        cpu = ((resources or {}).get(kind) or {}).get("cpu")
        if cpu is not None and str(cpu) not in ("0", "0m"):
            text = str(cpu)
            millis = int(text[:-1]) if text.endswith("m") else round(float(text) * 1000)
            return -(-millis // 1000)
    return 0


def gpu_worker_cpus(gpus: int) -> int:
    """The Ray CPUs verl needs on a worker of `gpus` GPUs (see VERL_CPUS_PER_GPU)."""
    return VERL_CPUS_PER_GPU * gpus + WORKER_CPUS_BEYOND_GPUS


def _worker_start_params(workers: ClusterWorkers | ClusterRolloutWorkers) -> dict[str, str]:
    if workers.gpus_per_worker:
        return {"num-cpus": str(max(ray_cpus(workers.resources), gpu_worker_cpus(workers.gpus_per_worker)))}
    return {"num-gpus": str(LOGICAL_GPUS_PER_CPU_WORKER), "num-cpus": str(LOGICAL_CPUS_PER_CPU_WORKER)}


def _head_start_params(head: ClusterHead, workers: ClusterWorkers) -> dict[str, str]:
    params = {"dashboard-host": "0.0.0.0", "num-gpus": "0"}
    if not workers.gpus_per_worker:
        # The head of a CPU job hosts verl's TaskRunner and its data-queue controller and storage
        # unit (1 CPU each, the storage unit pinned round-robin from the head): with the logical
        # CPU that a small CPU request gives, the storage unit never scheduled and the run hung.
        params["num-cpus"] = str(LOGICAL_CPUS_PER_CPU_WORKER)
    elif ray_cpus(head.resources):  # else Ray counts the machine's
        params["num-cpus"] = str(max(ray_cpus(head.resources), HEAD_CPUS_FOR_VERL))
    return params


def build_rayjob(job: Job, settings: Settings, current_suspend: bool | None = None) -> dict[str, Any]:
    """The RayJob for `job`.

    `current_suspend` is the live RayJob's `spec.suspend` (None before it exists). With a Kueue
    queue, Kueue owns admission: the RayJob is created suspended and, unless the user suspends
    the job, the operator keeps whatever Kueue has set.
    """
    name = job.name
    spec = job.spec
    cluster = spec.cluster
    head = cluster.head
    workers = cluster.workers
    run_policy = spec.run_policy
    image = cluster.image or settings.trainer_image
    env = ray_env(job)

    head_container = {
        "name": "ray-head",
        "image": image,
        "env": env,
        "ports": [
            {"name": "gcs-server", "containerPort": RAY_GCS_PORT},
            {"name": "dashboard", "containerPort": RAY_DASHBOARD_PORT},
            {"name": "client", "containerPort": RAY_CLIENT_PORT},
            {"name": TRAINER_METRICS_PORT_NAME, "containerPort": TRAINER_METRICS_PORT},
        ],
        "resources": _with_cache_storage(quantities(head.resources), spec.model.cache),
    }

    def worker_group(group: str, group_workers: ClusterWorkers | ClusterRolloutWorkers) -> dict[str, Any]:
        container = {
            "name": "ray-worker",
            "image": image,
            "env": env,
            "resources": _with_cache_storage(_worker_resources(group_workers), spec.model.cache),
        }
        replicas = group_workers.replicas
        return {
            "groupName": group,
            "replicas": replicas,
            "minReplicas": replicas,
            "maxReplicas": replicas,
            "rayStartParams": _worker_start_params(group_workers),
            "template": _pod_template(job, container, group_workers, None),
        }

    groups = [worker_group(WORKER_GROUP, workers)]
    if cluster.rollout_workers:  # the CRD admits it with trainer.mode separate-async only
        groups.append(worker_group(ROLLOUT_WORKER_GROUP, cluster.rollout_workers))

    queue = cluster.queue_name
    suspend = spec.suspend
    if queue and not suspend:
        suspend = True if current_suspend is None else current_suspend

    metadata = child_metadata(job.body, rayjob_name(name), COMPONENT_TRAINER)
    if queue:
        metadata["labels"][LABEL_KUEUE_QUEUE] = queue

    rayjob_spec: dict[str, Any] = {
        "entrypoint": ENTRYPOINT,
        # The submitter is a Kubernetes Job of our template. KubeRay's SidecarMode builds its
        # container itself, without allowPrivilegeEscalation=false or dropped capabilities, so Pod
        # Security `restricted` forbids the head pod and the job never starts (seen on the local
        # cluster's real node); HTTPMode needs KubeRay to reach the head's Service DNS name.
        "submissionMode": "K8sJobMode",
        "submitterPodTemplate": _submitter_template(job, image, head),
        "submitterConfig": {"backoffLimit": SUBMITTER_BACKOFF_LIMIT},
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": run_policy.ttl_seconds_after_finished,
        "backoffLimit": run_policy.backoff_limit,
        "suspend": suspend,
        "rayClusterSpec": {
            "headGroupSpec": {
                "rayStartParams": _head_start_params(head, workers),
                "template": _pod_template(job, head_container, head, trainer_name(name)),
            },
            "workerGroupSpecs": groups,
        },
    }
    if run_policy.active_deadline_seconds:
        rayjob_spec["activeDeadlineSeconds"] = run_policy.active_deadline_seconds
    if run_policy.pending_deadline_seconds:
        rayjob_spec["preRunningDeadlineSeconds"] = run_policy.pending_deadline_seconds
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": metadata, "spec": rayjob_spec}


def worker_groups(rayjob: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A RayJob's worker groups as the job's status shows them, in the RayJob's order: `name`,
    `replicas` (desired) and `gpusPerWorker` (its Ray container's nvidia.com/gpu limit, as
    build_rayjob sets it; 0 for a CPU worker)."""
    specs = ((rayjob.get("spec") or {}).get("rayClusterSpec") or {}).get("workerGroupSpecs") or []
    groups = []
    for group in specs:
        containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or [{}]
        ray = containers[0]  # KubeRay's Ray container is the first
        gpus = int(str(((ray.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE, 0)))
        replicas = int(group.get("replicas") or 0)
        groups.append({"name": group["groupName"], "replicas": replicas, "gpusPerWorker": gpus})
    return groups


def build_ray_network_policy(job: Job, settings: Settings) -> dict[str, Any]:
    """Who reaches the job's Ray pods: the dashboard (8265) is also Ray's unauthenticated job
    submission API, and GCS (6379) and the client port (10001) run code as well. Admitted: the
    job's own Ray pods (all ports); KubeRay, to the dashboard (its namespace, or namespaces
    labelled RAY_DASHBOARD_ACCESS_LABEL=true); the monitoring namespace and the operator's
    (its autoscaler reads the trainer's phase), to the trainer metrics (9400)."""
    name = job.name
    pods = selector_labels(name, COMPONENT_TRAINER)
    kuberay = (
        namespace_selector(settings.kuberay_namespace)
        if settings.kuberay_namespace
        else {"namespaceSelector": {"matchLabels": {RAY_DASHBOARD_ACCESS_LABEL: "true"}}}
    )
    metrics_from = metrics_peers(settings.metrics_namespaces(), settings.metrics_cidrs)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(job.body, ray_network_policy_name(name), COMPONENT_TRAINER),
        "spec": {
            "podSelector": {"matchLabels": pods},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": pods}}]},
                {
                    "from": [kuberay, *ip_blocks(settings.kuberay_cidrs)],
                    "ports": [{"protocol": "TCP", "port": RAY_DASHBOARD_PORT}],
                },
                {"from": metrics_from, "ports": [{"protocol": "TCP", "port": TRAINER_METRICS_PORT}]},
            ],
        },
    }
