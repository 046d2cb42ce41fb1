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


def test_every_kind_the_operator_reads_or_writes_has_its_plural_by_the_rule() -> None:
    """naming.plural spells each kind's REST resource name; these are the names the API server
    (KubeRay's and KEDA's CRDs, the operator's own) gives them."""
    from toolrl_operator.children import CHILD_KINDS
    from toolrl_operator.naming import KIND, PLURAL, plural

    assert {child.kind: child.plural for child in CHILD_KINDS} == {
        "ServiceAccount": "serviceaccounts",
        "Role": "roles",
        "RoleBinding": "rolebindings",
        "ConfigMap": "configmaps",
        "Service": "services",
        "PodDisruptionBudget": "poddisruptionbudgets",
        "NetworkPolicy": "networkpolicies",
        "Deployment": "deployments",
        "ScaledObject": "scaledobjects",
        "RayJob": "rayjobs",
    }
    assert (plural(KIND), plural("Event")) == (PLURAL, "events")


class _Response:
    reason: str  # set by the fake transport (_Wire), as urllib3's response has them
    headers: dict[str, str]

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


class _Wire:
    """The urllib3 pool manager under the kubernetes package's REST client: what went on the wire."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, object, dict[str, str]]] = []

    def request(self, method, url, body=None, headers=None, **_):
        self.sent.append((method, url, body, dict(headers or {})))
        response = _Response(200, b'{"metadata": {"resourceVersion": "7", "uid": "u"}}')
        response.reason, response.headers = "OK", {}
        return response


def test_an_apply_goes_through_the_real_client_as_the_manifests_json_without_its_field_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kubernetes package's ApiClient walks a dict body field by field before sending it
    (sanitize_for_serialization: a quarter of a resync's CPU); an apply body is sent as JSON text
    (JSON is YAML), which it passes on as it is."""
    import json

    from kubernetes import client
    from toolrl_operator.apply import Kube

    configuration = client.Configuration()
    configuration.host = "https://apiserver.invalid"
    api = client.ApiClient(configuration)
    wire = _Wire()
    api.rest_client.pool_manager = wire  # type: ignore[assignment]
    walked: list[object] = []
    sanitize = client.ApiClient.sanitize_for_serialization

    def counting(self: client.ApiClient, obj: object) -> object:
        if isinstance(obj, dict) and "apiVersion" in obj:  # a body (headers are dicts too)
            walked.append(obj)
        return sanitize(self, obj)

    monkeypatch.setattr(client.ApiClient, "sanitize_for_serialization", counting)
    manifest = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "j-config", "namespace": "rl"}, "data": {"a": "ü: 1"},
    }  # fmt: skip
    live = Kube(api, "toolrl-operator").apply(manifest)
    assert live["metadata"]["resourceVersion"] == "7"
    status = {"phase": "Pending"}
    Kube(api, "toolrl-operator").apply_status("toolrl.dev/v1alpha1", "ToolRLJob", "rl", "j", status)
    [(method, url, body, headers), (_, status_url, status_body, _)] = wire.sent
    assert method == "PATCH" and headers["Content-Type"] == "application/apply-patch+yaml"
    assert url.endswith("/api/v1/namespaces/rl/configmaps/j-config?fieldManager=toolrl-operator&force=true")
    assert isinstance(body, str) and json.loads(body) == manifest
    assert status_url.split("?")[0].endswith("/toolrljobs/j/status")
    assert isinstance(status_body, str) and json.loads(status_body)["status"] == status
    assert walked == [], "no dict body walked by the client"
