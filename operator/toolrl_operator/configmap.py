"""The job's ConfigMap: the job spec the trainer reads and the tool config the tool pool reads.

Both are copies of the job's spec as the API server holds it (CRD defaults applied), not of the typed
`Spec`: the trainer and the tool pool parse them with their own copies of the CRD's defaults."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import yaml

from .job import Job
from .naming import (
    API_VERSION,
    COMPONENT_CONFIG,
    CONFIG_MOUNT,
    FUNCTIONS_DIR,
    KIND,
    child_metadata,
    config_name,
)

JOB_KEY = "job.json"
TOOLS_KEY = "tools.yaml"


def job_document(job: Job) -> dict[str, Any]:
    """The trainer's view of the job: identity plus the spec with CRD defaults applied."""
    meta = job.metadata
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "generation": meta.get("generation", 1),
        },
        "spec": job.body["spec"],
    }


def function_source(tool: str) -> str:
    """Where a function tool's source lies in a pool pod, relative to the config volume."""
    return f"{FUNCTIONS_DIR}/{tool}.py"


def tools_yaml(spec: Mapping[str, Any]) -> str:
    """The job's `spec.tools` (`spec`: as the API server holds it) as the tool pool reads it: verbatim,
    plus where each function tool's source is mounted (`source`, see toolpool.build_deployment)."""
    return _tools_yaml(json.dumps(spec["tools"], sort_keys=True))


def tools_checksum(spec: Mapping[str, Any]) -> str:
    """Changes whenever the tool config does, so the pool's pods roll to pick it up."""
    return _tools_checksum(json.dumps(spec["tools"], sort_keys=True))


# PyYAML's emitter is pure Python (~2 ms for a job's tools, twice a build: most of a build's CPU);
# both are pure functions of the tools, which jobs often share, so a few hundred are remembered.
@functools.lru_cache(maxsize=256)
def _tools_yaml(tools_json: str) -> str:
    tools = [
        {**tool, "source": f"{CONFIG_MOUNT}/{function_source(tool['name'])}"}
        if tool["type"] == "function"
        else tool
        for tool in json.loads(tools_json)
    ]
    return yaml.safe_dump({"tools": tools}, sort_keys=True)


@functools.lru_cache(maxsize=256)
def _tools_checksum(tools_json: str) -> str:
    return hashlib.sha256(_tools_yaml(tools_json).encode()).hexdigest()[:16]


def build_configmap(job: Job) -> dict[str, Any]:
    name = job.name
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(job.body, config_name(name), COMPONENT_CONFIG),
        "data": {
            JOB_KEY: json.dumps(job_document(job), indent=2, sort_keys=True),
            TOOLS_KEY: tools_yaml(job.body["spec"]),
        },
    }
