"""e2e fixtures: a real local control plane (reused if `make cluster-up` left one running,
else started for this session and torn down after it), fresh namespaces, and Prometheus."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness.localcluster import LocalCluster
from harness.localcluster.__main__ import DEFAULT_ROOT
from harness.localcluster.prometheus import Prometheus, scrape_config
from harness.operator_process import (
    EXAMPLE_VOLUMES_LABEL,
    OperatorProcess,
    delete_jobs,
    example_volumes,
    install_crd,
)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """kwok's fake nodes only (4 GPU, 2 CPU), as these tests expect: `make cluster-up`'s cluster
    if it runs without a real node, else a private one."""
    shared = LocalCluster.recorded(DEFAULT_ROOT)
    reuse = shared and not shared.real_node and not os.environ.get("TOOLRL_E2E_FRESH_CLUSTER")
    if reuse and shared.is_running():
        yield shared
        return
    private = LocalCluster(tmp_path_factory.mktemp("cluster"))
    private.up()
    try:
        yield private
    finally:
        private.down()


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # examples/toolrljob.yaml mounts claims (its data and checkpoints): bound ones, so its pods schedule
    cluster.kubectl("apply", "-f", "-", input=json.dumps(example_volumes(name)))
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    cluster.kubectl("delete", "pv", "-l", f"{EXAMPLE_VOLUMES_LABEL}={name}", "--wait=false", check=False)


@pytest.fixture
def operator_env() -> dict[str, str]:
    """Extra environment of the `operator` fixture's process; a test sets it with
    `@pytest.mark.parametrize("operator_env", [{...}])`."""
    return {}


@pytest.fixture
def operator(
    cluster: LocalCluster, namespace: str, tmp_path: Path, operator_env: dict[str, str]
) -> Iterator[OperatorProcess]:
    """The real operator watching `namespace`; its jobs are deleted while it still runs."""
    install_crd(cluster)
    log = tmp_path / "operator.log"
    with OperatorProcess(cluster.kubeconfig, namespaces=[namespace], log_path=log, env=operator_env) as op:
        yield op
        delete_jobs(cluster, namespace)
    print(op.log_tail(80))


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    """`prometheus({"job": ["127.0.0.1:port"]}, labels=..., rule_files=[...])` starts one."""
    started: list[Prometheus] = []

    def start(
        targets: dict[str, list[str]],
        labels: dict[str, dict[str, str]] | None = None,
        rule_files: list[Path] | None = None,
    ) -> Prometheus:
        prom = Prometheus(
            tmp_path / f"prometheus-{len(started)}", scrape_config(targets, labels), rule_files or []
        )
        started.append(prom)
        return prom.start()

    yield start
    for prom in started:
        prom.stop()
