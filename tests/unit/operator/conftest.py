"""Fixtures: the CRD as shipped, and jobs with the CRD's defaults applied as the apiserver would, parsed
as the operator's sync parses them (toolrl_operator.job: the object plus its typed spec)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from toolrl_api.defaulting import apply_defaults
from toolrl_operator.job import Job, parse_job

ROOT = Path(__file__).resolve().parents[3]
CRD_PATH = ROOT / "crds" / "toolrl.dev_toolrljobs.yaml"
EXAMPLE_PATH = ROOT / "examples" / "toolrljob.yaml"


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture(scope="session")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="session")
def example() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE_PATH.read_text())


@pytest.fixture
def make_job_object(schema: dict[str, Any], example: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """`make_job_object(**spec_changes)`: the example job, changed, defaulted, with server metadata,
    as the API server returns it (a dict)."""

    def make(status: dict[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
        job = copy.deepcopy(example)
        job["spec"].update(copy.deepcopy(changes))
        job["metadata"].update({"namespace": "rl", "uid": "uid-1234", "generation": 3})
        apply_defaults(schema["properties"]["spec"], job["spec"])
        if status is not None:
            job["status"] = status
        return job

    return make


@pytest.fixture
def make_job(make_job_object: Callable[..., dict[str, Any]]) -> Callable[..., Job]:
    """`make_job(**spec_changes)`: `make_job_object`'s job, parsed (as the sync hands it to builders)."""
    return lambda status=None, **changes: parse_job(make_job_object(status, **changes))


@pytest.fixture
def separate_async_cpu_job(make_job: Callable[..., Job]) -> Job:
    """A separate-async job on CPU workers: one trainer worker, one rollout worker (engine hf)."""
    return make_job(
        rollout={"engine": "hf"},
        trainer={"mode": "separate-async"},
        cluster={
            "workers": {"replicas": 1, "gpusPerWorker": 0},
            "rolloutWorkers": {"replicas": 1, "gpusPerWorker": 0},
        },
    )
