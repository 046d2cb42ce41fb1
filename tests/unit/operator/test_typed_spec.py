"""The operator's typed job spec (toolrl_api.spec_types, generated from the CRD; job.py parses a job with it):
it holds every field of the CRD, a defaulted job parses to the same values, and a spec that does not
fit says which field is wrong and what to do."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import BaseModel
from toolrl_api import spec_types
from toolrl_api.spec_types import Spec
from toolrl_operator.job import SHOWN_ERRORS, SpecError, parse_job, parse_spec


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The classes of the typed spec in an annotation (`Cluster`, `list[Tool]`, `Reward | None`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in getattr(annotation, "__args__", ()) for model in _models_in(arg)]


def test_every_property_of_the_crds_spec_has_a_typed_attribute(schema: dict[str, Any]) -> None:
    """One class per object of the CRD's spec, one attribute per property (by its camelCase alias);
    free-form objects (Kubernetes' own types, preserved unknown fields) are plain dicts."""
    missing: list[str] = []
    visited: set[type[BaseModel]] = set()

    def walk(node: dict[str, Any], model: type[BaseModel], path: str) -> None:
        visited.add(model)
        fields = {field.alias: field for field in model.model_fields.values()}
        assert set(fields) <= set(node["properties"]), f"{path}: attributes the CRD lacks"
        for key, prop in node["properties"].items():
            if key not in fields:
                missing.append(f"{path}.{key}")
            for inner in _models_in(fields[key].annotation) if key in fields else []:
                walk(prop["items"] if prop.get("type") == "array" else prop, inner, f"{path}.{key}")

    walk(schema["properties"]["spec"], Spec, "spec")
    assert missing == []
    generated = {c for c in vars(spec_types).values() if isinstance(c, type) and issubclass(c, BaseModel)}
    assert generated - {BaseModel} - visited == {spec_types._Object}, "each class is an object of the CRD"


def test_a_defaulted_job_parses_to_its_values_and_a_bare_one_gets_the_crds_defaults(
    make_job_object, schema
) -> None:
    body = make_job_object()
    job = parse_job(body)
    assert job.name == "gsm8k-python" and job.namespace == "rl"
    assert job.spec.model_dump(by_alias=True, exclude_none=True) == body["spec"]
    bare = {key: copy.deepcopy(body["spec"][key]) for key in schema["properties"]["spec"]["required"]}
    assert parse_spec(bare).rollout.tool_call.max_concurrency == 256  # the CRD's default


def test_a_spec_that_does_not_fit_names_each_field_and_says_what_to_do(make_job_object) -> None:
    spec = make_job_object()["spec"]
    spec["toolPool"]["autoscaler"] = "hpa"
    spec["tools"][0]["memoryLimitMiB"] = "lots"
    spec["rollout"]["protocol"] = "xml"
    spec["trainer"]["async"]["onStale"] = "skip"
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    message = str(caught.value)
    assert "spec.tools[0].memoryLimitMiB: Input should be a valid integer" in message
    assert "spec.toolPool.autoscaler: Input should be 'native' or 'keda'" in message
    assert f"; and {4 - SHOWN_ERRORS} more" in message, "a long list is cut, saying how much is left"
    assert "Fix the field(s) and apply the job again" in message


def test_an_unknown_field_is_named_not_dropped(make_job_object) -> None:
    """The API server prunes fields the CRD does not declare; one that is there anyway (a stored object
    of another CRD version) is reported, not silently ignored."""
    spec = make_job_object()["spec"]
    spec["toolPool"]["replica"] = {"min": 3}
    with pytest.raises(SpecError, match=r"spec\.toolPool\.replica: Extra inputs are not permitted"):
        parse_spec(spec)
