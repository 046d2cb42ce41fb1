"""Small pure pieces of the runtime: REST paths, CLI namespaces, the jobs-by-phase gauge."""

from __future__ import annotations

import datetime as dt

import pytest
from prometheus_client import REGISTRY
from toolrl_operator.__main__ import namespaces, parse_args
from toolrl_operator.apply import resource_path
from toolrl_operator.events import MAX_MESSAGE, event_manifest
from toolrl_operator.handlers import plain
from toolrl_operator.metrics import PhaseBook


def test_resource_paths_for_core_and_group_kinds() -> None:
    assert resource_path("v1", "ConfigMap", "rl", "j-config") == "/api/v1/namespaces/rl/configmaps/j-config"
    assert resource_path("ray.io/v1", "RayJob", "rl", "j") == "/apis/ray.io/v1/namespaces/rl/rayjobs/j"
    assert (
        resource_path("toolrl.dev/v1alpha1", "ToolRLJob", "rl", "j", "status")
        == "/apis/toolrl.dev/v1alpha1/namespaces/rl/toolrljobs/j/status"
    )
    with pytest.raises(ValueError, match="unknown kind 'Secret'"):
        resource_path("v1", "Secret", "rl", "x")


def test_namespaces_from_repeated_and_comma_separated_flags() -> None:
    args = parse_args(["--namespace", "a,b", "--namespace", " c ", "--metrics-port", "9000"])
    assert namespaces(args.namespace) == ["a", "b", "c"]
    assert (args.metrics_port, args.liveness_port) == (9000, 8080)
    assert namespaces(parse_args([]).namespace) == []


def _gauge(namespace: str, phase: str) -> float | None:
    return REGISTRY.get_sample_value("toolrl_operator_jobs", {"namespace": namespace, "phase": phase})


def test_phase_book_counts_jobs_not_transitions() -> None:
    book = PhaseBook()
    book.record("unit-ns", "a", "Running")
    book.record("unit-ns", "a", "Running")
    book.record("unit-ns", "b", "Running")
    assert _gauge("unit-ns", "Running") == 2
    book.record("unit-ns", "a", "Failed")
    assert (_gauge("unit-ns", "Running"), _gauge("unit-ns", "Failed")) == (1, 1)
    book.record("unit-ns", "a", None)
    book.record("unit-ns", "b", None)
    assert (_gauge("unit-ns", "Running"), _gauge("unit-ns", "Failed")) == (0, 0)


def test_plain_copies_nested_views() -> None:
    source = {"a": [{"b": 1}], "c": (2, 3)}
    copied = plain(source)
    assert copied == {"a": [{"b": 1}], "c": [2, 3]}
    copied["a"][0]["b"] = 9
    assert source["a"][0]["b"] == 1


def test_event_manifest_refers_to_the_job_and_cuts_long_messages() -> None:
    job = {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "metadata": {"name": "j", "namespace": "rl", "uid": "u1", "generation": 2},
    }
    now = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    event = event_manifest(job, "Warning", "AutoscalerHolding", "x" * 2000, now)
    assert event["involvedObject"] == {
        "apiVersion": "toolrl.dev/v1alpha1", "kind": "ToolRLJob", "name": "j", "namespace": "rl", "uid": "u1"
    }
    assert event["metadata"] == {"generateName": "j.", "namespace": "rl"}
    assert (event["type"], event["reason"], event["source"]) == (
        "Warning", "AutoscalerHolding", {"component": "toolrl-operator"}
    )
    assert len(event["message"]) <= MAX_MESSAGE and "..." in event["message"]
    assert event["lastTimestamp"] == "2026-01-02T03:04:05+00:00"
    with pytest.raises(ValueError, match="use Normal or Warning"):
        event_manifest(job, "Info", "R", "m", now)
    assert resource_path("v1", "Event", "rl") == "/api/v1/namespaces/rl/events"


class _Response:
    def __init__(self, status: int, data: bytes) -> None:
        self.status, self.data = status, data

    def read(self) -> None:
        return None


class _ApiClient:
    """The two calls Kube makes of the kubernetes package's ApiClient, recorded."""

    def __init__(self, response: _Response) -> None:
        self.response = response
        self.timeouts: list[object] = []

    def param_serialize(self, method, path, header_params, body, auth_settings):
        return method, path, header_params, body, None

    def call_api(self, method, url, header_params, body, _request_timeout=None):
        self.timeouts.append(_request_timeout)
        return self.response


def test_api_calls_have_a_timeout() -> None:
    from toolrl_operator.apply import REQUEST_TIMEOUT, Kube

    api = _ApiClient(_Response(200, b'{"kind": "ConfigMap"}'))
    assert Kube(api, "test").request("GET", "/api/v1/x") == {"kind": "ConfigMap"}  # type: ignore[arg-type]
    assert api.timeouts == [REQUEST_TIMEOUT] == [(5, 30)]


def test_a_non_json_error_body_becomes_a_clear_api_error() -> None:
    from toolrl_operator.apply import ApiError, Kube

    api = _ApiClient(_Response(403, b"<html>\n<h1>Forbidden by proxy</h1></html>"))
    with pytest.raises(ApiError, match="non-JSON body: <html>") as caught:
        Kube(api, "test").request("GET", "/api/v1/x")  # type: ignore[arg-type]
    assert caught.value.status == 403
    api = _ApiClient(_Response(404, b'{"reason": "NotFound", "message": "gone"}'))
    with pytest.raises(ApiError, match="404 NotFound: gone"):
        Kube(api, "test").request("GET", "/api/v1/x")  # type: ignore[arg-type]


def test_a_transient_api_error_is_raised_at_once_for_the_callers_one_retry() -> None:
    """Retries have one home (the work queue's backoff, the autoscaler's next tick): the client
    makes one call and raises, instead of sleeping through retries of its own on a sync thread."""
    from toolrl_operator.apply import ApiError, Kube
    from toolrl_operator.reconcile import classify

    api = _ApiClient(_Response(503, b'{"reason": "ServiceUnavailable", "message": "etcd is slow"}'))
    with pytest.raises(ApiError) as caught:
        Kube(api, "test").request("PATCH", "/api/v1/x")  # type: ignore[arg-type]
    assert len(api.timeouts) == 1, "one call, no retry inside the client"
    assert classify(caught.value) is None, "transient: the work queue retries the key with backoff"
