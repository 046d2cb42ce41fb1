"""Least privilege, proven: the real operator runs a job's whole life (create, children, status,
an autoscaler reading, re-creating a deleted child, suspend, delete) with nothing but the chart's RBAC for its
ServiceAccount, and the API server refuses none of its requests; and without any single one of
the chart's rules, that run fails.

The operator talks to the API server through a small proxy that swaps in the ServiceAccount's
token and records every 403, so a refused request is seen even where the operator only logs it.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from chartgen.helm import chart_with_stub_dependencies, template
from harness import REPO
from harness.localcluster.build import KUBERNETES
from harness.localcluster.cluster import free_port
from harness.operator_process import OperatorProcess, drop_finalizers, install_crd, small_job, wait_until

EXAMPLE = REPO / "examples" / "toolrljob.yaml"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
HOP_HEADERS = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "host",
    "authorization",
    "accept-encoding",
    "upgrade",
    "proxy-authorization",
    "te",
    "trailer",
}
STAGE_TIMEOUT = 90.0


@dataclass
class TokenProxy:
    """Plain-HTTP front of the API server that authenticates every request with `token` and
    records the requests the API server refused with 403 Forbidden."""

    server: str
    ca_data: bytes
    token: str
    port: int = field(default_factory=free_port)
    denials: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> TokenProxy:
        self._thread.start()
        assert self._ready.wait(10), "the API proxy did not start"
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
                    "users": [{"name": "operator", "user": {}}],
                    "contexts": [{"name": "operator", "context": {"cluster": "proxy", "user": "operator"}}],
                    "current-context": "operator",
                }
            )
        )
        return path

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._startup())
        self._ready.set()
        self._loop.run_forever()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    async def _startup(self) -> None:
        context = ssl.create_default_context(cadata=self.ca_data.decode())
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _shutdown(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        headers["Authorization"] = f"Bearer {self.token}"
        body = await request.read()
        async with self._session.request(
            request.method, self.server + request.path_qs, headers=headers, data=body or None
        ) as upstream:
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
            if upstream.status == 403:
                text = await upstream.read()
                reason = text.decode(errors="replace")[:300]
                self.denials.append(f"{request.method} {request.path_qs}: {reason}")
                return web.Response(status=403, body=text, headers=out_headers)
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            try:
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except ConnectionResetError:
                pass  # the operator closed a watch; nothing left to forward
            return response


def _rbac_denials(denials: list[str]) -> list[str]:
    """403s that RBAC gave: missing permissions, or a Role granting more than the operator holds
    (not, say, a write into a namespace being terminated)."""
    return [d for d in denials if "is being terminated" not in d]


@dataclass
class Setup:
    cluster: Any
    namespace: str
    rbac: list[dict[str, Any]]
    lease: str  # the operator's leader-election Lease, namespace/name, as the chart sets it
    proxy: TokenProxy
    kubeconfig: Path
    workdir: Path


@pytest.fixture
def setup(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Setup]:
    install_crd(cluster)
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    chart = chart_with_stub_dependencies(tmp_path)
    objs = template(
        cluster.bin("helm"),
        chart,
        {"watchNamespaces": [namespace]},
        namespace=namespace,
        kube_version=KUBERNETES,
        release=release,
    )
    rbac = [o for o in objs if o["kind"] in RBAC_KINDS]
    assert {o["kind"] for o in rbac} == set(RBAC_KINDS)
    [deployment] = [o for o in objs if o["kind"] == "Deployment"]
    [lease] = [
        e["value"]
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "TOOLRL_LEADER_ELECTION_LEASE"
    ]
    cluster.apply(rbac)
    [sa] = [o for o in rbac if o["kind"] == "ServiceAccount"]
    token = cluster.kubectl(
        "create", "token", sa["metadata"]["name"], "-n", namespace, "--duration=3600s"
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]
    proxy = TokenProxy(admin["server"], base64.b64decode(admin["certificate-authority-data"]), token).start()
    try:
        kubeconfig = proxy.kubeconfig(tmp_path / "operator.kubeconfig")
        yield Setup(cluster, namespace, rbac, lease, proxy, kubeconfig, tmp_path)
    finally:
        proxy.stop()
        cluster.kubectl(
            "delete",
            "clusterrole,clusterrolebinding",
            "-l",
            f"app.kubernetes.io/instance={release}",
            check=False,
        )


def lifecycle(s: Setup, job_name: str) -> str | None:
    """One job's life under the operator with the proxy's credentials. None if every stage was
    reached with no RBAC refusal, else what went wrong first."""
    s.proxy.denials.clear()
    cluster, ns = s.cluster, s.namespace
    pool = ("deployment", f"{job_name}-tools", "-n", ns)

    def trj() -> dict[str, Any] | None:
        found = cluster.kubectl("get", "trj", job_name, "-n", ns, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else None

    def current(phase: str | None = None) -> Any:
        job = trj()
        status = (job or {}).get("status") or {}
        if not job or status.get("observedGeneration") != job["metadata"]["generation"]:
            return None
        return job if phase is None or status.get("phase") == phase else None

    def pool_uid() -> str:
        return cluster.kubectl("get", *pool, "-o", "jsonpath={.metadata.uid}", check=False).stdout

    def children() -> bool:
        return all(
            cluster.kubectl("get", kind, name, "-n", ns, check=False).returncode == 0
            for kind, name in (
                ("rayjob", job_name),
                ("deployment", f"{job_name}-tools"),
                ("role", f"{job_name}-trainer"),
                ("configmap", f"{job_name}-config"),
            )
        )

    def autoscaler_reported() -> bool:
        conditions = ((trj() or {}).get("status") or {}).get("conditions", [])
        return any(c.get("type") == "AutoscalerHealthy" for c in conditions)

    uids: list[str] = []
    stages: list[tuple[str, Any, Any]] = [  # (what, action, until)
        ("status written", lambda: cluster.apply(small_job(job_name), "-n", ns), current),
        ("children created", None, children),
        ("autoscaler read the pool and reported", None, autoscaler_reported),
        (
            "deleted tool pool re-created",
            lambda: (uids.append(pool_uid()), cluster.kubectl("delete", *pool, "--wait=false")),
            lambda: pool_uid() not in ("", *uids),
        ),
        (
            "phase Suspended",
            lambda: cluster.kubectl(
                "patch", "trj", job_name, "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}'
            ),
            lambda: current("Suspended"),
        ),
        (
            "job deleted",
            lambda: cluster.kubectl("delete", "trj", job_name, "-n", ns, "--wait=false"),
            lambda: trj() is None,
        ),
    ]
    # each lifecycle a fresh install: the operator creates its Lease (the last one released it)
    lease_ns, lease_name = s.lease.split("/")
    cluster.kubectl("delete", "lease", lease_name, "-n", lease_ns, "--ignore-not-found")
    operator = OperatorProcess(
        s.kubeconfig,
        namespaces=[ns],
        log_path=s.workdir / f"operator-{job_name}.log",
        env={"TOOLRL_LEADER_ELECTION_LEASE": s.lease},
    )
    try:
        operator.start()
    except RuntimeError as err:
        return f"operator did not start: {err}; refused: {_rbac_denials(s.proxy.denials)}"
    try:
        for what, action, until in stages:
            if action:
                action()
            try:
                wait_until(lambda until=until: _rbac_denials(s.proxy.denials) or until(), STAGE_TIMEOUT, what)
            except AssertionError:
                return f"{what}: not reached; operator log:\n{operator.log_tail(15)}"
            if _rbac_denials(s.proxy.denials):
                break
    finally:
        operator.stop()
        drop_finalizers(cluster, ns, job_name)
        cluster.kubectl(
            "delete", "trj", job_name, "-n", ns, "--wait=false", "--ignore-not-found", check=False
        )
    refused = _rbac_denials(s.proxy.denials)
    return f"refused: {refused}" if refused else None


def _without_rule(role: dict[str, Any], index: int) -> dict[str, Any]:
    reduced = copy.deepcopy(role)
    del reduced["rules"][index]
    return reduced


def test_operator_needs_every_rule_and_nothing_more(setup: Setup) -> None:
    assert lifecycle(setup, "full-rbac") is None

    roles = [o for o in setup.rbac if o["kind"] in ("Role", "ClusterRole")]
    dead_weight = []
    for number, role in enumerate(roles):
        for index, rule in enumerate(role["rules"]):
            setup.cluster.kubectl("replace", "-f", "-", input=json.dumps(_without_rule(role, index)))
            try:
                failure = lifecycle(setup, f"without-{role['kind'].lower()}{number}-{index}")
            finally:
                setup.cluster.kubectl("replace", "-f", "-", input=json.dumps(role))
            if failure is None:
                dead_weight.append(f"{role['kind']} {role['metadata']['name']} rule {rule}")
    assert not dead_weight, f"the operator ran its whole lifecycle without: {dead_weight}"


def test_proxy_records_a_refusal(setup: Setup) -> None:
    """The detector itself: a request outside the chart's rules is recorded as refused."""
    url = f"http://127.0.0.1:{setup.proxy.port}/api/v1/namespaces/{setup.namespace}/secrets"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=10)
    assert refused.value.code == 403
    assert any("secrets" in d for d in _rbac_denials(setup.proxy.denials))
