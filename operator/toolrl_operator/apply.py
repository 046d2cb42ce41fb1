"""The operator's own calls to the API server (kopf's watches aside): server-side apply of the
children, of the job's status and of the tool pool's size (`apply`, `apply_status`, `apply_scale`),
and Events (`create`). Each is one blocking call (the kubernetes package is synchronous): the
runtime's thread pool runs them (handlers.Runtime says how).

Server-side apply makes create-or-update one idempotent call with no read-modify-write race;
`force` takes back fields the operator owns if someone else changed them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from kubernetes import client, config

from .naming import plural

RETRIABLE = frozenset({409, 429, 500, 502, 503, 504})
APPLY_PATCH = "application/apply-patch+yaml"  # server-side apply
# (connect, read) seconds: a hung API server must not hold a job's lock or a worker forever.
REQUEST_TIMEOUT = (5, 30)


class ApiError(RuntimeError):
    """The API server refused a request; `status` and `reason` say how."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def api_error(status: int, payload: bytes | str | None) -> ApiError:
    """The error of a failed call. The body is a metav1.Status as JSON, unless a proxy or a
    load balancer in the way answered (HTML, plain text): then its first line says what happened."""
    text = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else payload or ""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        return ApiError(status, str(data.get("reason", "")), str(data.get("message", data)))
    first = text.strip().splitlines()[0][:200] if text.strip() else "(empty body)"
    return ApiError(status, "", f"the API server answered with a non-JSON body: {first}")


def load_api_client(connections: int) -> client.ApiClient:
    """In-cluster credentials inside a pod, otherwise KUBECONFIG (or ~/.kube/config); at most
    `connections` kept open to the API server."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = connections
    return client.ApiClient(configuration)


def resource_path(api_version: str, kind: str, namespace: str, name: str = "", sub: str = "") -> str:
    """The REST path of a namespaced object (or its collection when `name` is empty)."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural(kind)}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


def owns(obj: Mapping[str, Any], manager: str, *path: str) -> bool:
    """Whether `manager` owns the field at `path` of `obj`, by server-side apply's record
    (metadata.managedFields; a write through a subresource such as `scale` is recorded under the
    object's own path, `spec.replicas`)."""
    for entry in obj.get("metadata", {}).get("managedFields") or []:
        if entry.get("manager") != manager:
            continue
        fields = entry.get("fieldsV1")
        for part in path:
            fields = fields.get(f"f:{part}") if isinstance(fields, dict) else None
        if fields is not None:
            return True
    return False


class Kube:
    """A thin JSON-over-REST client on top of the kubernetes package's authenticated transport."""

    def __init__(self, api_client: client.ApiClient, field_manager: str) -> None:
        self.api_client = api_client
        self.field_manager = field_manager

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        timeout: tuple[float, float] = REQUEST_TIMEOUT,
    ) -> dict[str, Any]:
        """One API call, not retried here: retries have one home per caller, the reconciler's work
        queue (which backs off per job) and the autoscaler's next tick. Retrying inside as well
        multiplied the attempts and held a sync thread through every inner backoff."""
        if query:
            path = f"{path}?{urlencode(query)}"
        if content_type == APPLY_PATCH and body is not None and not isinstance(body, str):
            # JSON is YAML: sent as text, the client passes it on as it is. Given a dict, the client
            # walks every field of it first (sanitize_for_serialization: a quarter of a resync's CPU)
            body = json.dumps(body)
        method_, url, headers, body_, _ = self.api_client.param_serialize(
            method,
            path,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(
            method_, url, header_params=headers, body=body_, _request_timeout=timeout
        )
        response.read()
        if 200 <= response.status < 300:
            answer: dict[str, Any] = json.loads(response.data or b"{}")
            return answer
        raise api_error(response.status, response.data)

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create or update `manifest` by server-side apply; returns the live object."""
        meta = manifest["metadata"]
        path = resource_path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
        return self.request(
            "PATCH",
            path,
            manifest,
            content_type=APPLY_PATCH,
            query={"fieldManager": self.field_manager, "force": "true"},
        )

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """POST `manifest` to its collection (for objects named by the server, like Events)."""
        path = resource_path(manifest["apiVersion"], manifest["kind"], manifest["metadata"]["namespace"])
        return self.request("POST", path, manifest)

    def apply_status(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        status: dict[str, Any],
        field_manager: str = "",
    ) -> dict[str, Any]:
        """Server-side apply of the status fields `field_manager` (default: the operator's) owns.
        Others' fields (the trainer's progress, the autoscaler's desiredReplicas and condition) are
        untouched, also inside `conditions`, a list keyed by type."""
        body = {
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        return self.request(
            "PATCH",
            resource_path(api_version, kind, namespace, name, "status"),
            body,
            content_type=APPLY_PATCH,
            query={"fieldManager": field_manager or self.field_manager, "force": "true"},
        )

    def apply_scale(
        self, api_version: str, kind: str, namespace: str, name: str, replicas: int, field_manager: str
    ) -> dict[str, Any]:
        """Server-side apply of the object's size through its `scale` subresource (autoscaling/v1
        Scale), the way HPA and KEDA size a Deployment: `field_manager` then owns `spec.replicas`, and
        no other field, of the object (a Scale of the same size makes it an owner too)."""
        body = {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas},
        }
        return self.request(
            "PATCH",
            resource_path(api_version, kind, namespace, name, "scale"),
            body,
            content_type=APPLY_PATCH,
            query={"fieldManager": field_manager, "force": "true"},
        )
