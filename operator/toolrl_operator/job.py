"""A ToolRLJob as the builders read it: the object from the API, its `spec` parsed once into the
typed classes generated from the CRD (toolrl_api.spec_types: the CRD's defaults, enums and bounds).

The sync (reconcile.py) parses a job once at its top and hands the `Job` to every builder. A job
the API server admitted always parses (it defaulted and validated it); one that does not (an object
stored under an older CRD, a hand-made test object) raises `SpecError`, which names the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from toolrl_api.errors import field_errors
from toolrl_api.spec_types import Spec

SHOWN_ERRORS = 3  # a message names at most this many fields (then says how many more)


class SpecError(ValueError):
    """The job's spec does not fit the CRD's schema; retrying will not help, a spec change will."""


@dataclass(frozen=True)
class Job:
    """`body`: the object as read (metadata, spec, status); `spec`: its spec, typed."""

    body: Mapping[str, Any]
    spec: Spec

    @property
    def metadata(self) -> Mapping[str, Any]:
        metadata: Mapping[str, Any] = self.body["metadata"]
        return metadata

    @property
    def status(self) -> Mapping[str, Any]:
        return self.body.get("status") or {}

    @property
    def name(self) -> str:
        name: str = self.metadata["name"]
        return name

    @property
    def namespace(self) -> str:
        namespace: str = self.metadata["namespace"]
        return namespace


def parse_spec(spec: Mapping[str, Any]) -> Spec:
    """`spec` (a job's, CRD defaults applied or not: missing defaults are filled in) as a `Spec`;
    SpecError naming each field that does not fit."""
    try:
        return Spec.model_validate(spec)
    except ValidationError as err:
        problems = field_errors(err)
        more = len(problems) - SHOWN_ERRORS
        shown = "; ".join(problems[:SHOWN_ERRORS]) + (f"; and {more} more" if more > 0 else "")
        raise SpecError(
            f"the job's spec does not fit the ToolRLJob CRD: {shown}. Fix the field(s) and apply the "
            "job again (the API server then validates and defaults it)"
        ) from None


def parse_job(body: Mapping[str, Any]) -> Job:
    """A ToolRLJob object from the API as a `Job` (SpecError when its spec does not parse)."""
    return Job(body, parse_spec(body.get("spec") or {}))
