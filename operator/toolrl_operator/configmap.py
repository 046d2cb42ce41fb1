"""The job's ConfigMap: the job spec the trainer reads and the tool config the tool pool reads."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from .naming import API_VERSION, COMPONENT_CONFIG, KIND, child_metadata, config_name

JOB_KEY = "job.json"
TOOLS_KEY = "tools.yaml"


def job_document(job: dict[str, Any]) -> dict[str, Any]:
    """The trainer's view of the job: identity plus the spec with CRD defaults applied."""
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "generation": meta.get("generation", 1),
        },
        "spec": job["spec"],
    }


def tools_yaml(spec: dict[str, Any]) -> str:
    """The job's `spec.tools` verbatim, as the tool pool reads it."""
    return yaml.safe_dump({"tools": spec["tools"]}, sort_keys=True)


def tools_checksum(spec: dict[str, Any]) -> str:
    """Changes whenever the tool config does, so the pool's pods roll to pick it up."""
    return hashlib.sha256(tools_yaml(spec).encode()).hexdigest()[:16]


def build_configmap(job: dict[str, Any]) -> dict[str, Any]:
    name = job["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(job, config_name(name), COMPONENT_CONFIG),
        "data": {
            JOB_KEY: json.dumps(job_document(job), indent=2, sort_keys=True),
            TOOLS_KEY: tools_yaml(job["spec"]),
        },
    }
