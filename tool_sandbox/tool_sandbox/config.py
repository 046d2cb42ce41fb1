"""The pool's configuration as data: a `tools.yaml` entry (an item of the job's `spec.tools`, verbatim)
and the server settings, with their defaults (the CRD's).

Below the tools, which take these dataclasses, it imports none of them. tools.parse_tools reads
tools.yaml and checks it against the CRD's own schema and rules of `spec.tools` (toolrl_api.validation:
the pool keeps no bound or rule of its own), then `entry_values` turns each entry into ToolConfig's
fields and its type's class checks what only the pool needs (a function tool's source file)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from toolrl_api.crd_defaults import DEFAULTS_WHEN_PRESENT, SPEC_DEFAULTS


class ConfigError(ValueError):
    """The tool configuration is invalid; the message says where and how to fix it."""


_CRD = DEFAULTS_WHEN_PRESENT["tools[]"]  # the CRD's defaults of a tools[] entry (generated from it)


@dataclass(frozen=True)
class ToolConfig:
    """One entry of `spec.tools` (field names as in the ToolRLJob CRD; defaults the CRD's, so a
    hand-written tools.yaml means what the same entries mean in a job)."""

    name: str
    type: str
    description: str = ""
    timeout_seconds: float = float(_CRD["timeoutSeconds"])
    memory_limit_mib: int = _CRD["memoryLimitMiB"]
    max_output_bytes: int = _CRD["maxOutputBytes"]
    corpus: str = ""
    top_k: int = _CRD["topK"]
    url: str = ""
    function: dict[str, Any] = field(default_factory=dict)  # a function tool's {configMap, name}
    parameters: dict[str, Any] = field(default_factory=dict)  # a function tool's argument schema
    mcp: dict[str, Any] = field(default_factory=dict)  # an mcp tool's server: {url, tools?}
    file_size_limit_mib: int = _CRD["fileSizeLimitMiB"]
    disk_limit_mib: int = _CRD["diskLimitMiB"]  # bytes a call (or a session) may keep in its directory
    max_open_files: int = _CRD["maxOpenFiles"]
    max_processes: int = _CRD["maxProcesses"]  # tasks of a call as root (RLIMIT_NPROC of its own uid)
    max_retries: int = _CRD["maxRetries"]
    retry_delay_seconds: float = float(_CRD["retryDelaySeconds"])
    rate_limit_per_second: float = float(_CRD["rateLimitPerSecond"])
    source: str = ""  # a function tool's Python file: where the operator mounts its ConfigMap key
    # a python tool's (the CRD's enum, no default: absent is the trainer's `default`): what the *trainer*
    # shows its model of a call and whether it unwraps fenced code; the pool answers the same either way
    observation_format: str = "default"


_FIELDS = {
    "name": ("name", str),
    "type": ("type", str),
    "description": ("description", str),
    "timeoutSeconds": ("timeout_seconds", float),
    "memoryLimitMiB": ("memory_limit_mib", int),
    "maxOutputBytes": ("max_output_bytes", int),
    "corpus": ("corpus", str),
    "topK": ("top_k", int),
    "url": ("url", str),
    "function": ("function", dict),
    "parameters": ("parameters", dict),
    "mcp": ("mcp", dict),
    "source": ("source", str),
    "fileSizeLimitMiB": ("file_size_limit_mib", int),
    "diskLimitMiB": ("disk_limit_mib", int),
    "maxOpenFiles": ("max_open_files", int),
    "maxProcesses": ("max_processes", int),
    "maxRetries": ("max_retries", int),
    "retryDelaySeconds": ("retry_delay_seconds", float),
    "rateLimitPerSecond": ("rate_limit_per_second", float),
    "observationFormat": ("observation_format", str),
}


@dataclass(frozen=True)
class ServerSettings:
    """How the server runs; one home for every default."""

    host: str = "0.0.0.0"
    port: int = 8080  # the tool API (every protocol), /healthz and /readyz
    # /metrics alone, on a port of its own: whoever may read the metrics (Prometheus, the operator's
    # autoscaler) reaches no tool through it, and a NetworkPolicy can tell the two apart
    metrics_port: int = 9090
    workers: int = 2  # warm worker processes (zygotes)
    # calls executing at once across all workers, and live sessions: a job's pool replica's by default
    capacity: int = SPEC_DEFAULTS["toolPool"]["capacityPerReplica"]
    queue_size: int = 256  # calls waiting for capacity before 429
    max_sessions: int = SPEC_DEFAULTS["toolPool"]["maxSessionsPerReplica"]
    session_idle_seconds: float = 300.0
    session_cpu_seconds: int = 600
    spares_per_worker: int = 4
    # A request body: SandboxFusion has no limit; verl sends test files inline. Kept well under
    # the worker frame (wire.MAX_FRAME, 64 MiB) that carries the request on.
    max_body_bytes: int = 32 << 20
    # Pool maxima for what a /run_code request may ask (SandboxFusion's run_timeout and
    # memory_limit_MB); a request that says nothing gets SandboxFusion's defaults (10 s; no
    # memory limit of its own, i.e. this maximum). Output: SandboxFusion returns all of it.
    max_timeout_seconds: float = 60.0
    max_memory_mib: int = 4096
    max_output_bytes: int = 1 << 20  # per stream, for /run_code
    # Slow clients: a connection must deliver a request's headers within this (after connecting
    # or after its last answer), a body within body_timeout_seconds; beyond max_connections the
    # longest-idle connections are closed.
    header_timeout_seconds: float = 15.0
    body_timeout_seconds: float = 60.0
    max_connections: int = 512
    # OpenEnv's /ws: the server pings every this many seconds and closes a socket whose client has not
    # answered within half of it (a trainer pod gone without closing frees its slot).
    ws_heartbeat_seconds: float = 20.0
    # SIGTERM: calls in flight get this long to end, then answer as the pool's failure (below the
    # pod's terminationGracePeriodSeconds, which the operator sets from it).
    drain_seconds: float = 20.0
    workdir: str = field(
        default_factory=lambda: os.path.join(os.environ.get("TMPDIR", "/tmp"), "tool-sandbox")
    )
    sandbox_uid_base: int = 200000  # children run as uid base+slot when the server is root
    # Tasks (processes and threads) sandboxed code may run in all, split evenly between the
    # workers: the pod's pids budget (Kubernetes has no pod field for one; the kubelet's
    # podPidsLimit is node configuration). A call past it gets "infra"; one call alone is bounded
    # by its tool's maxProcesses.
    max_tasks: int = 4096
    landlock: bool = True
    allow_no_landlock: bool = False  # else /readyz fails when children would run without Landlock


def default_tools() -> tuple[ToolConfig, ...]:
    """Without a config file the pool serves one Python tool with the CRD defaults."""
    return (ToolConfig(name="python", type="python"),)


def entry_values(entry: dict[str, Any], where: str) -> dict[str, Any]:
    """A tools.yaml entry that met the CRD's schema and rules (tools.parse_tools) as ToolConfig's fields;
    a field the CRD does not have, which the apiserver would drop, is an error here (the pool's own
    `source` aside)."""
    unknown = sorted(set(entry) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(_FIELDS)}")
    return {_FIELDS[key][0]: _FIELDS[key][1](raw) for key, raw in entry.items()}
