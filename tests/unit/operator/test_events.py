"""The Kubernetes Events the operator writes about a job."""

from __future__ import annotations

import datetime as dt

import pytest
from toolrl_operator.apply import resource_path
from toolrl_operator.events import MAX_MESSAGE, event_manifest


def test_event_manifest_refers_to_the_job_and_cuts_long_messages() -> None:
    job = {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "metadata": {"name": "j", "namespace": "rl", "uid": "u1", "generation": 2},
    }
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    event = event_manifest(job, "Warning", "AutoscalerHolding", "x" * 2000, now)
    assert event["involvedObject"] == {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "name": "j",
        "namespace": "rl",
        "uid": "u1",
    }
    assert event["metadata"] == {"generateName": "j.", "namespace": "rl"}
    assert (event["type"], event["reason"], event["source"]) == (
        "Warning",
        "AutoscalerHolding",
        {"component": "toolrl-operator"},
    )
    assert len(event["message"]) <= MAX_MESSAGE and "..." in event["message"]
    assert event["lastTimestamp"] == "2026-01-02T03:04:05+00:00"
    with pytest.raises(ValueError, match="use Normal or Warning"):
        event_manifest(job, "Info", "R", "m", now)
    assert resource_path("v1", "Event", "rl") == "/api/v1/namespaces/rl/events"
