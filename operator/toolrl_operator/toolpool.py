"""The tool pool: a hardened Deployment of tool_sandbox, its Service, PDB and NetworkPolicy.

The pool's size, the Deployment's `spec.replicas`, has one writer in each situation, kept apart by
server-side apply's field ownership:
- `toolPool.autoscaler: keda`: KEDA's HPA; the operator leaves the field out.
- otherwise the autoscaler's field manager (AUTOSCALER_FIELD_MANAGER), through the Deployment's
  `scale` subresource as HPA writes it: the autoscaler loop (scale_loop.py) within [min, max] while
  the job runs; the sync (reconcile.py, `resize`) where the size must change whatever the loop
  decides: 0 while the job is suspended or finished (the loop leaves those alone), back within
  [min, max] when it resumes or its bounds are edited.
- a pool the autoscaler's manager does not own yet (a new one, created at `min`; one sized by an
  earlier version of the operator or scaled by someone else): the operator's own apply
  (`manifest_replicas`), until the sync hands the field over with a Scale of the same size. A field
  that its only manager stops applying is removed (a Deployment's replicas then default to 1), so
  the operator's apply leaves it out only once the autoscaler's manager owns it too.
"""

from __future__ import annotations

import copy
import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from toolrl_api.spec_types import Spec, Tool, ToolMcp
from toolrl_api.tool_types import TOOL_TYPES

from .apply import Kube
from .configmap import TOOLS_KEY, function_source, tools_checksum
from .job import Job
from .keda import uses_keda
from .naming import (
    AUTOSCALER_FIELD_MANAGER,
    COMPONENT_TOOL_POOL,
    COMPONENT_TRAINER,
    CONFIG_MOUNT,
    DATA_MOUNT,
    TOOL_POOL_METRICS_PORT,
    TOOL_POOL_METRICS_PORT_NAME,
    TOOL_POOL_PORT,
    child_metadata,
    config_name,
    labels,
    metrics_peers,
    namespace_selector,
    selector_labels,
    tool_pool_name,
)
from .scale_decision import Policy
from .settings import Settings
from .status import pool_stopped

SANDBOX_UID = 10001  # the tool-sandbox image's user (images/tool-sandbox/Dockerfile)
CHECKSUM_ANNOTATION = "toolrl.dev/tools-checksum"
TMP_HEADROOM_MIB = 256  # /tmp beyond the calls' own budgets: workers' leases, search indexes, slack
# The pool pod's pids budget: Kubernetes has no pod field for one (the kubelet's podPidsLimit is node
# configuration), so tool_sandbox enforces it (--max-tasks) over all its sandboxed processes and
# threads; one call alone is bounded by its tool's maxProcesses.
TASKS_PER_SLOT = 64  # per call or session a replica holds at once
MAX_POOL_TASKS = 16384  # at most, whatever the capacity: well below a node's pid_max (32768 by default)
# On SIGTERM the pool answers nothing new (503) and gives calls in flight this long to end, then
# answers the rest as its own failure; the pod's grace period leaves it time to write them.
DRAIN_SECONDS = 20
TERMINATION_GRACE_SECONDS = DRAIN_SECONDS + 10


def sandboxed(tool: Tool) -> bool:
    """The tool's calls run code in the pool's sandbox (its type's `runs_code`, toolrl_api.tool_types)."""
    return TOOL_TYPES[tool.type].runs_code


def tmp_size_mib(spec: Spec) -> int:
    """The pool's /tmp: every call and session may keep its sandboxed tool's diskLimitMiB (the
    server kills it past that), so the volume holds them all and the kubelet never evicts the pod
    for a tool call's files."""
    pool = spec.tool_pool
    budget = max((t.disk_limit_mib for t in spec.tools if sandboxed(t)), default=0)
    return budget * (pool.capacity_per_replica + pool.max_sessions_per_replica) + TMP_HEADROOM_MIB


def pool_tasks(spec: Spec) -> int:
    """Processes and threads a pool pod's sandboxed code may run at once (its pids budget)."""
    pool = spec.tool_pool
    return min(TASKS_PER_SLOT * (pool.capacity_per_replica + pool.max_sessions_per_replica), MAX_POOL_TASKS)


def server_args(spec: Spec) -> list[str]:
    """tool_sandbox's command line (after the image's entrypoint) for this job's pool: the ports too, which
    the operator's pod, Service and policies open (an image that cannot serve them fails at its start)."""
    pool = spec.tool_pool
    args = [
        "--port", str(TOOL_POOL_PORT),
        "--metrics-port", str(TOOL_POOL_METRICS_PORT),
        "--config", f"{CONFIG_MOUNT}/{TOOLS_KEY}",
        "--capacity", str(pool.capacity_per_replica),
        "--max-sessions", str(pool.max_sessions_per_replica),
        "--max-tasks", str(pool_tasks(spec)),
        "--drain-seconds", str(DRAIN_SECONDS),
    ]  # fmt: skip
    if not pool.require_landlock:
        args.append("--allow-no-landlock")
    return args


@dataclass(frozen=True)
class Pool:
    """The pool Deployment as its watch last showed it (handlers.deployment_view)."""

    replicas: int  # spec.replicas
    autoscaled: bool  # the autoscaler's field manager owns spec.replicas (apply.owns)


def pool_size(job: Job, current: int | None) -> int:
    """The size the pool must have whatever the autoscaler decides: 0 when suspended or finished (no
    trainer left to serve), else `current` clamped to [min, max] (min for a new pool: None)."""
    if pool_stopped(job):
        return 0
    policy = Policy.from_job_spec(job.spec)
    return policy.min_replicas if current is None else policy.clamp(current)


def manifest_replicas(job: Job, pool: Pool | None) -> int | None:
    """`spec.replicas` in the operator's own apply of the Deployment; None leaves it to its owner
    (KEDA's HPA, or the autoscaler's field manager once that owns it)."""
    if uses_keda(job) or (pool is not None and pool.autoscaled):
        return None
    return pool_size(job, pool.replicas if pool else None)


def resize(job: Job, pool: Pool | None) -> int | None:
    """The size the sync writes through the pool's scale subresource, as the autoscaler's field
    manager: the pool's `pool_size` where the live one differs, or where that manager does not own
    it yet (the hand-over: the same size); None for no write (KEDA's pool, no pool yet)."""
    if uses_keda(job) or pool is None:
        return None
    size = pool_size(job, pool.replicas)
    return size if size != pool.replicas or not pool.autoscaled else None


def scale_pool(kube: Kube, namespace: str, job_name: str, replicas: int) -> None:
    """Write the pool's size as the autoscaler's field manager, through its Deployment's scale
    subresource: the one spelling of that write, the autoscaler loop's and the sync's (`resize`)."""
    kube.apply_scale(
        "apps/v1", "Deployment", namespace, tool_pool_name(job_name), replicas, AUTOSCALER_FIELD_MANAGER
    )


def _needs_data(spec: Spec) -> bool:
    return bool(spec.data.volume) and any(t.type == "search" for t in spec.tools)


def config_sources(job: Job) -> list[dict[str, Any]]:
    """The pool's read-only config volume: tools.yaml from the job's ConfigMap, and each function
    tool's source from the user's ConfigMap (where tools.yaml says it is)."""
    sources: list[dict[str, Any]] = [
        {
            "configMap": {
                "name": config_name(job.name),
                "items": [{"key": TOOLS_KEY, "path": TOOLS_KEY}],
            }
        }
    ]
    for tool in job.spec.tools:
        if tool.type == "function":
            assert tool.function is not None  # the CRD requires it of a function tool
            ref = tool.function.config_map
            item = {"key": ref.key, "path": function_source(tool.name)}
            sources.append({"configMap": {"name": ref.name, "items": [item]}})
    return sources


def build_deployment(job: Job, settings: Settings, live: Pool | None = None) -> dict[str, Any]:
    """The pool's Deployment; `live`: the one in the cluster, None before it exists (manifest_replicas)."""
    name = job.name
    spec = job.spec
    pool = spec.tool_pool
    probe = {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3}
    container: dict[str, Any] = {
        "name": "tool-sandbox",
        "image": pool.image or settings.tool_sandbox_image,
        "args": server_args(spec),
        "ports": [
            {"name": "http", "containerPort": TOOL_POOL_PORT},
            {"name": TOOL_POOL_METRICS_PORT_NAME, "containerPort": TOOL_POOL_METRICS_PORT},
        ],
        "readinessProbe": probe,
        "livenessProbe": {**probe, "httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
        "resources": copy.deepcopy(pool.resources or {}),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "tools-config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    volumes: list[dict[str, Any]] = [
        {"name": "tools-config", "projected": {"sources": config_sources(job)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": f"{tmp_size_mib(spec)}Mi"}},
    ]
    if _needs_data(spec):
        volumes.append({"name": "data", **copy.deepcopy(spec.data.volume or {})})
        container["volumeMounts"].append({"name": "data", "mountPath": DATA_MOUNT, "readOnly": True})

    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": SANDBOX_UID,
            "runAsGroup": SANDBOX_UID,
            "fsGroup": SANDBOX_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    # Placement: pool pods need no GPU; without these they may land on (and crowd) GPU nodes.
    placement = {
        "runtimeClassName": pool.runtime_class_name,
        "imagePullSecrets": pool.image_pull_secrets,
        "nodeSelector": pool.node_selector,
        "tolerations": pool.tolerations,
        "affinity": pool.affinity,
        "topologySpreadConstraints": pool.topology_spread_constraints,
    }
    pod_spec.update({field: copy.deepcopy(value) for field, value in placement.items() if value})

    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(job.body, tool_pool_name(name), COMPONENT_TOOL_POOL),
        "spec": {
            "selector": {"matchLabels": selector_labels(name, COMPONENT_TOOL_POOL)},
            "template": {
                "metadata": {
                    "labels": labels(name, COMPONENT_TOOL_POOL),
                    "annotations": {CHECKSUM_ANNOTATION: tools_checksum(job.body["spec"])},
                },
                "spec": pod_spec,
            },
        },
    }
    replicas = manifest_replicas(job, live)
    if replicas is not None:
        deployment["spec"]["replicas"] = replicas
    return deployment


def build_service(job: Job) -> dict[str, Any]:
    name = job.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(job.body, tool_pool_name(name), COMPONENT_TOOL_POOL),
        "spec": {
            "selector": selector_labels(name, COMPONENT_TOOL_POOL),
            "ports": [{"name": "http", "port": TOOL_POOL_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_pdb(job: Job) -> dict[str, Any]:
    name = job.name
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(job.body, tool_pool_name(name), COMPONENT_TOOL_POOL),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(name, COMPONENT_TOOL_POOL)},
        },
    }


# Host names resolve to any address, but never to the link-local range: cloud metadata services
# (169.254.169.254) hand out node credentials. (IPv4 only: NetworkPolicy matches no host names.)
ANY_BUT_LINK_LOCAL = {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}}


def _http_egress(url: str) -> dict[str, Any]:
    """Egress to one http tool's endpoint. NetworkPolicy matches IPs, not host names: an IP
    literal is pinned to that address, a host name opens its port to every IPv4 address but the
    link-local range (cloud metadata)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": port}]}
    try:
        address = ipaddress.ip_address(parts.hostname or "")
    except ValueError:
        rule["to"] = [copy.deepcopy(ANY_BUT_LINK_LOCAL)]
        return rule
    suffix = 32 if address.version == 4 else 128
    rule["to"] = [{"ipBlock": {"cidr": f"{address}/{suffix}"}}]
    return rule


def service_namespace(host: str, namespace: str) -> str | None:
    """The namespace of the Service a host name names (`svc` in the job's own, `svc.ns.svc` and
    `svc.ns.svc.<cluster domain>`), or None for another name (`svc.ns` is not told apart from an
    outside host such as example.com: write the Service's full name)."""
    labels = host.split(".")
    if len(labels) == 1 and labels[0]:
        return namespace
    if len(labels) >= 3 and labels[2] == "svc":
        return labels[1]
    return None


def _mcp_egress(server: ToolMcp, namespace: str) -> dict[str, Any]:
    """Egress to one MCP server (an mcp tool's `mcp`). A Service's host name admits the server's
    pods in the Service's namespace, those of mcp.podSelector (else every pod there), on
    mcp.targetPort or the URL's port: NetworkPolicy matches the traffic after the Service has
    mapped it to a pod's port. An IP literal or an outside host name: as an http tool's endpoint."""
    parts = urlsplit(server.url)
    home = service_namespace(parts.hostname or "", namespace)
    if home is None:
        return _http_egress(server.url)
    port = server.target_port or parts.port or (443 if parts.scheme == "https" else 80)
    peer = namespace_selector(home)
    if server.pod_selector:
        peer["podSelector"] = {"matchLabels": dict(server.pod_selector)}
    return {"ports": [{"protocol": "TCP", "port": port}], "to": [peer]}


# Where a tool whose type needs egress (toolrl_api.tool_types) sends its calls: the field of its entry
# that holds the address. A `url` is an endpoint (_http_egress), an `mcp` a server (_mcp_egress).
EGRESS_ADDRESS = {"http": "url", "mcp": "mcp"}


def egress_addresses(tools: list[Tool]) -> dict[str, list[Any]]:
    """The addresses the pool's calls go to, by the field that holds them (EGRESS_ADDRESS's values),
    in the order of the tools: those of every tool whose type needs egress."""
    found: dict[str, list[Any]] = {field: [] for field in EGRESS_ADDRESS.values()}
    for tool in tools:
        if not TOOL_TYPES[tool.type].needs_egress:
            continue
        field = EGRESS_ADDRESS.get(tool.type)
        if field is None:
            raise ValueError(
                f"tool type {tool.type!r} needs egress, but the operator knows no field of its entry that"
                " holds the address: add it to toolpool.EGRESS_ADDRESS"
            )
        address = getattr(tool, field)
        if address:
            found[field].append(address)
    return found


def build_network_policy(job: Job, settings: Settings) -> dict[str, Any]:
    """Only this job's Ray pods reach the pool's tool API, and only the monitoring namespace and the
    operator's (its autoscaler scrapes the pods without Prometheus) its /metrics port; the pool's egress is
    denied except DNS and the addresses of the tools whose type needs egress (the endpoints of
    `http` tools, the servers of `mcp` tools)."""
    name = job.name
    addresses = egress_addresses(job.spec.tools)
    http_urls = sorted(set(addresses["url"]))
    servers: list[ToolMcp] = addresses["mcp"]
    egress: list[dict[str, Any]] = []
    if http_urls or servers:
        egress.append({"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]})
        egress.extend(_http_egress(url) for url in http_urls)
        for rule in (_mcp_egress(server, job.namespace) for server in servers):
            if rule not in egress:
                egress.append(rule)
    metrics_from = metrics_peers(settings.metrics_namespaces(), settings.metrics_cidrs)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_metadata(job.body, tool_pool_name(name), COMPONENT_TOOL_POOL),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(name, COMPONENT_TOOL_POOL)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": selector_labels(name, COMPONENT_TRAINER)}}],
                    "ports": [{"protocol": "TCP", "port": TOOL_POOL_PORT}],
                },
                {"from": metrics_from, "ports": [{"protocol": "TCP", "port": TOOL_POOL_METRICS_PORT}]},
            ],
            # No rules with Egress in policyTypes denies all egress; an empty list would not
            # survive the API server's round trip, so each apply would change the object again.
            **({"egress": egress} if egress else {}),
        },
    }
