"""trainer_entry.placement: what verl asks Ray for, against the nodes' resources (issue 32, 1)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from trainer_entry.placement import Node, await_fit, demand, shortfall, storage_units, worker_cpus
from trainer_entry.spec import parse_job
from trainer_entry.translate import translate

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "toolrljob.yaml"


def example(**cluster) -> dict:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = "rl"
    doc["spec"]["cluster"].update(cluster)
    return doc


@pytest.fixture
def cluster_nodes(operator_nodes) -> Callable[[dict], list[Node]]:
    """The Ray nodes KubeRay starts for the job as the operator builds it (conftest's operator_nodes)."""

    def nodes(job_doc: dict) -> list[Node]:
        (head_cpus, head_gpus), *workers = operator_nodes(job_doc)
        return [
            Node("0-head", "head", head_cpus, head_gpus, driver=True),
            *(Node(f"{i + 1}-worker", f"worker-{i}", cpus, gpus) for i, (cpus, gpus) in enumerate(workers)),
        ]

    return nodes


def check(job_doc: dict, nodes: list[Node]) -> str | None:
    job = parse_job(job_doc)
    return shortfall(demand(job, storage_units(translate(job, "http://pool").overrides)), nodes)


def test_the_examples_shape_before_issue_32_waits_forever_and_the_message_says_what_to_change():
    """2 x 8 GPUs with 24 CPUs each and verl's 8 storage units (round-robin 3/3/2 over head and workers):
    the placement group of 24 CPUs never fits. The old check (3 CPUs per GPU, totals only) passed it."""
    job = parse_job(example())
    nodes = [
        Node("a", "10.0.0.1", 4, 0, driver=True),
        Node("b", "10.0.0.2", 24, 8),
        Node("c", "10.0.0.3", 24, 8),
    ]
    problem = shortfall(demand(job, 8), nodes)
    assert problem is not None
    assert (
        "node 10.0.0.2 (8 GPUs) has 24 Ray CPUs and needs 28 = 24 for verl's training placement group "
        in problem
    )
    assert "set cluster.workers.resources.requests.cpu (and its limit, if set) to 28 or more" in problem
    assert "node 10.0.0.3 (8 GPUs) has 24 Ray CPUs and needs 27 = " in problem  # it holds 2 units
    # even at 3 CPUs per GPU plus its one storage unit: the vLLM server actors find no free CPU
    problem = shortfall(
        demand(job, 3), [*nodes[:1], Node("b", "10.0.0.2", 25, 8), Node("c", "10.0.0.3", 25, 8)]
    )
    assert problem is not None and "1 free for the vLLM server actors to be placed" in problem


@pytest.mark.parametrize(("replicas", "gpus"), [(1, 1), (1, 8), (2, 8)])
def test_the_example_fits_the_cluster_the_operator_builds_for_it(replicas, gpus, cluster_nodes):
    doc = example(
        workers={"replicas": replicas, "gpusPerWorker": gpus, "resources": {"requests": {"memory": "8Gi"}}}
    )
    nodes = cluster_nodes(doc)
    assert [n.cpus for n in nodes[1:]] == [worker_cpus(gpus)] * replicas, "the operator's num-cpus: the need"
    assert check(doc, nodes) is None
    assert storage_units(translate(parse_job(doc), "http://pool").overrides) == replicas + 1


def test_the_shipped_example_fits_and_names_the_true_requirement(cluster_nodes):
    doc = example()
    nodes = cluster_nodes(doc)
    assert check(doc, nodes) is None
    assert [n.cpus for n in nodes] == [4, worker_cpus(8), worker_cpus(8)] == [4, 26, 26]
    # one CPU fewer on a worker than the operator gives it (a Ray cluster not built by the operator)
    short = [*nodes[:2], Node("2-worker", "worker-1", 25, 8)]
    assert check(doc, short) == (
        "verl cannot place this job on the Ray cluster and would wait forever: node worker-1 (8 GPUs) has 25 "
        "Ray CPUs and needs 26 = 24 for verl's training placement group (3 CPUs x 8 GPUs) + 1 for "
        "TransferQueue storage unit(s) pinned to it + 1 free for the vLLM server actors to be placed: set "
        "cluster.workers.resources.requests.cpu (and its limit, if set) to 26 or more."
    )


def test_too_few_gpus_on_a_node_or_no_cpu_on_the_head_are_named():
    job = parse_job(example())
    problem = shortfall(demand(job, 3), [Node("a", "h", 0, 0, driver=True), Node("b", "w", 30, 4)])
    assert problem is not None
    assert "needs 8 GPUs on one node and the largest node has 4" in problem
    assert (
        "node h has 0 Ray CPUs and needs 2 = 2 for TransferQueue storage unit(s) pinned to it: raise "
        "cluster.head.resources.requests.cpu to 2 or more" in problem
    )


def test_storage_units_follow_the_overrides_last_one_winning():
    assert storage_units([]) == 8  # verl's default
    assert storage_units(["transfer_queue.backend.SimpleStorage.num_data_storage_units=3", "x=1"]) == 3
    assert (
        storage_units(
            [
                "transfer_queue.backend.SimpleStorage.num_data_storage_units=3",
                "+transfer_queue.backend.SimpleStorage.num_data_storage_units=5",
            ]
        )
        == 5
    )


def test_nodes_come_from_ray_nodes_alive_only_with_the_driver_marked():
    from trainer_entry.placement import nodes_from_ray

    head = {"NodeID": "h", "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 4.0}}
    gone = {
        "NodeID": "g",
        "Alive": False,
        "NodeManagerAddress": "10.0.0.3",
        "Resources": {"CPU": 1.0, "GPU": 8.0},
    }
    gpu = {
        "NodeID": "w",
        "Alive": True,
        "NodeManagerAddress": "10.0.0.4",
        "Resources": {"CPU": 26.0, "GPU": 8.0},
    }
    assert nodes_from_ray([head, gone, gpu], "h") == [
        Node("h", "10.0.0.1", 4.0, 0.0, driver=True),
        Node("w", "10.0.0.4", 26.0, 8.0),
    ]


class Looks:
    """`look()` for await_fit: scripted (shortfall, alive nodes) pairs, with a clock that each sleep moves."""

    def __init__(self, *looks: tuple[str | None, int]) -> None:
        self.looks, self.now, self.slept, self.said = list(looks), 0.0, 0, []

    def look(self) -> tuple[str | None, int]:
        return self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += 1

    def fit(self, expected: int, timeout: float = 600) -> str | None:
        return await_fit(self.look, expected, timeout, lambda: self.now, self.sleep, self.said.append)


def test_workers_still_joining_are_waited_for_and_then_it_fits() -> None:
    """The head restarted within an attempt: the trainer starts again while its workers reconnect."""
    looks = Looks(("the largest node has 0 GPUs", 1), ("the largest node has 0 GPUs", 2), (None, 3))
    assert looks.fit(expected=3) is None
    assert looks.slept == 2
    assert looks.said == ["waiting for the job's Ray nodes to join (1 of 3 alive)"]


def test_a_shortfall_with_every_node_joined_fails_at_once() -> None:
    looks = Looks(("node x has 24 Ray CPUs and needs 26", 3))
    assert looks.fit(expected=3) == "node x has 24 Ray CPUs and needs 26"
    assert looks.slept == 0 and looks.said == []


def test_nodes_that_never_join_fail_at_the_placement_bound_saying_so() -> None:
    looks = Looks(("the largest node has 0 GPUs", 2))
    assert looks.fit(expected=3, timeout=30) == (
        "the largest node has 0 GPUs (only 2 of the job's 3 Ray nodes joined within 30 s, "
        "spec.runPolicy.placementTimeoutSeconds)"
    )
    assert looks.now >= 30 and looks.slept == 15
