"""The operator's Kubernetes client (toolrl_operator.apply): REST paths, a timeout on every call,
clear errors, no retries of its own."""

from __future__ import annotations

import pytest
from toolrl_operator.apply import resource_path


def test_resource_paths_for_core_and_group_kinds() -> None:
    assert resource_path("v1", "ConfigMap", "rl", "j-config") == "/api/v1/namespaces/rl/configmaps/j-config"
    assert resource_path("ray.io/v1", "RayJob", "rl", "j") == "/apis/ray.io/v1/namespaces/rl/rayjobs/j"
    assert (
        resource_path("toolrl.dev/v1alpha1", "ToolRLJob", "rl", "j", "status")
        == "/apis/toolrl.dev/v1alpha1/namespaces/rl/toolrljobs/j/status"
    )
    with pytest.raises(ValueError, match="unknown kind 'Secret'"):
        resource_path("v1", "Secret", "rl", "x")


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
