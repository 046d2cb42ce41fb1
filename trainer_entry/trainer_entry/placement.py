"""Will verl's placement fit the Ray cluster? Checked in seconds, before verl waits forever.

What verl 0.9.1 and TransferQueue 0.1 ask Ray for, in the order they ask (read from their source):

1. `TaskRunner` (a plain `@ray.remote` actor: 1 CPU to be placed, none held) and TransferQueue's
   controller (`@ray.remote(num_cpus=1)`, held, no affinity: Ray's default policy puts it on the
   driver's node while that node has a free CPU) — `verl/trainer/main_ppo.py`,
   `transfer_queue/interface.py:init`.
2. `num_data_storage_units` SimpleStorageUnits (`num_cpus=1` each, held), pinned with *hard* node
   affinity round-robin over every alive node sorted by node id —
   `transfer_queue/utils/common.py:get_node_round_robin_scheduling_strategies`.
3. The training resource pool: per node one STRICT_PACK placement group of `n_gpus_per_node` bundles
   of {CPU: 3, GPU: 1} (`ResourcePoolManager.max_colocate_count`), awaited with no timeout —
   `verl/single_controller/ray/base.py:RayResourcePool.get_placement_groups`. separate-async adds a
   pool per rollout replica of {CPU: 2, GPU: 1} bundles (`verl/workers/rollout/replica.py`).
4. The vLLM server actors, one per rollout replica and node, hard-pinned to their node, plain actors:
   each needs 1 free CPU on that node to be placed (it holds none) —
   `verl/workers/rollout/vllm_rollout/vllm_async_server.py:launch_servers`.
5. Agent-loop and reward workers: plain actors, soft affinity: 1 free CPU on some node.

`shortfall` replays that against the nodes' resources and says, per node, what is missing and what to
change. A pure function: the trainer runs it before verl starts, and `python -m trainer_entry
placement-check --ray-address ...` runs it against any Ray cluster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trainer_entry.spec import SEPARATE_TRAINER_MODE, Job
from trainer_entry.translate import (
    STORAGE_UNITS_KEY,
    VERL_CPUS_PER_GPU,
    gpus_per_node,
    rollout_gpus_per_node,
)

# verl's standalone rollout pool (separate-async): ResourcePoolManager(max_colocate_count=2).
VERL_ROLLOUT_CPUS_PER_GPU = 2
# TransferQueue's controller and each storage unit hold one CPU; a plain actor needs one to be placed.
CONTROLLER_CPUS = 1
STORAGE_UNIT_CPUS = 1
PLACEMENT_CPUS = 1
# verl's own default (its trainer/config/transfer_queue yaml), when no override names the count
VERL_DEFAULT_STORAGE_UNITS = 8


@dataclass(frozen=True)
class Node:
    node_id: str
    address: str
    cpus: float
    gpus: float
    driver: bool = False  # the node the trainer (Ray driver) runs on: the head


@dataclass(frozen=True)
class Group:
    """One STRICT_PACK placement group: `gpus` bundles of {CPU: cpus_per_gpu, GPU: 1} on one node."""

    what: str
    gpus: int
    cpus_per_gpu: int
    field: str  # the spec's worker group whose nodes host it

    @property
    def cpus(self) -> int:
        return self.gpus * self.cpus_per_gpu


@dataclass(frozen=True)
class Demand:
    storage_units: int
    groups: tuple[Group, ...]


def worker_cpus(gpus: int, cpus_per_gpu: int = VERL_CPUS_PER_GPU, storage_units: int = 1) -> int:
    """Ray CPUs a GPU worker node needs: its placement group, the storage units pinned to it, and one
    free for the vLLM server actors to be placed."""
    return cpus_per_gpu * gpus + storage_units * STORAGE_UNIT_CPUS + PLACEMENT_CPUS


def head_cpus(storage_units: int = 1) -> int:
    """Ray CPUs the head (the driver's node, no GPUs) needs: TransferQueue's controller and its
    storage units."""
    return CONTROLLER_CPUS + storage_units * STORAGE_UNIT_CPUS


def storage_units(overrides: Iterable[str]) -> int:
    """TransferQueue's storage-unit count as the overrides set it (the last one wins, as in Hydra)."""
    count = VERL_DEFAULT_STORAGE_UNITS
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key == STORAGE_UNITS_KEY:
            count = int(value)
    return count


def demand(job: Job, units: int) -> Demand:
    """What verl asks Ray for to run `job`, with `units` TransferQueue storage units."""
    spec = job.spec
    groups = [
        Group("verl's training placement group", gpus_per_node(job), VERL_CPUS_PER_GPU, "cluster.workers")
        for _ in range(spec["cluster"]["workers"]["replicas"])
    ]
    if spec["trainer"]["mode"] == SEPARATE_TRAINER_MODE:
        tp = spec["rollout"]["tensorParallelSize"]
        per_node = rollout_gpus_per_node(job)
        replicas = spec["cluster"]["rolloutWorkers"]["replicas"] * max(1, per_node // tp)
        groups += [
            Group(
                "a rollout replica's placement group",
                min(tp, per_node),
                VERL_ROLLOUT_CPUS_PER_GPU,
                "cluster.rolloutWorkers",
            )
            for _ in range(replicas)
        ]
    return Demand(storage_units=units, groups=tuple(groups))


def nodes_from_ray(nodes: Iterable[Mapping[str, Any]], driver_node_id: str | None) -> list[Node]:
    """The alive nodes of `ray.nodes()`."""
    return [
        Node(
            node_id=n["NodeID"],
            address=str(n.get("NodeManagerAddress", "?")),
            cpus=float((n.get("Resources") or {}).get("CPU", 0)),
            gpus=float((n.get("Resources") or {}).get("GPU", 0)),
            driver=n["NodeID"] == driver_node_id,
        )
        for n in nodes
        if n.get("Alive")
    ]


def shortfall(need: Demand, nodes: list[Node]) -> str | None:
    """None when verl's requests fit `nodes`; else what keeps them from fitting and what to change."""
    if not nodes:
        return "the Ray cluster has no alive node"
    free = {n.node_id: n.cpus for n in nodes}
    free_gpus = {n.node_id: n.gpus for n in nodes}
    units = {n.node_id: 0 for n in nodes}
    hosted: dict[str, list[Group]] = {n.node_id: [] for n in nodes}
    by_id = {n.node_id: n for n in nodes}
    problems: list[str] = []

    driver = next((n for n in nodes if n.driver), None)
    # 1. the TaskRunner and TransferQueue's controller: the driver's node first, as Ray's default policy
    home = (
        driver
        if driver and free[driver.node_id] >= CONTROLLER_CPUS
        else max(nodes, key=lambda n: free[n.node_id])
    )
    if free[home.node_id] < CONTROLLER_CPUS:
        problems.append("no node has a free CPU for TransferQueue's controller")
    else:
        free[home.node_id] -= CONTROLLER_CPUS
    controller = home.node_id
    # 2. storage units, hard-pinned round-robin over the nodes sorted by id
    order = sorted(free)
    for rank in range(need.storage_units):
        node_id = order[rank % len(order)]
        units[node_id] += 1
        free[node_id] -= STORAGE_UNIT_CPUS  # may go below 0: that unit would never be placed
    # 3. the placement groups, one node each (first fit, fewest spare GPUs first)
    unplaced: list[Group] = []
    for group in need.groups:
        fits = [
            node_id
            for node_id in order
            if free_gpus[node_id] >= group.gpus and free[node_id] >= group.cpus + PLACEMENT_CPUS
        ]
        if not fits:
            fits = [
                node_id
                for node_id in order
                if free_gpus[node_id] >= group.gpus and free[node_id] >= group.cpus
            ]
        if fits:
            node_id = min(fits, key=lambda i: (free_gpus[i], i))
            free_gpus[node_id] -= group.gpus
            free[node_id] -= group.cpus
            hosted[node_id].append(group)
        else:
            unplaced.append(group)

    def breakdown(node_id: str, groups: list[Group]) -> tuple[int, str]:
        parts = [f"{g.cpus} for {g.what} ({g.cpus_per_gpu} CPUs x {g.gpus} GPUs)" for g in groups]
        if units[node_id]:
            parts.append(f"{units[node_id]} for TransferQueue storage unit(s) pinned to it")
        if node_id == controller:
            parts.append(f"{CONTROLLER_CPUS} for TransferQueue's controller")
        if groups:
            parts.append(f"{PLACEMENT_CPUS} free for the vLLM server actors to be placed")
        total = (
            sum(g.cpus for g in groups)
            + units[node_id] * STORAGE_UNIT_CPUS
            + (CONTROLLER_CPUS if node_id == controller else 0)
            + (PLACEMENT_CPUS if groups else 0)
        )
        return total, " + ".join(parts)

    # storage units or the controller beyond a node's CPUs (a GPU-less node: the head)
    for node_id in order:
        node = by_id[node_id]
        if free[node_id] < 0 and not hosted[node_id]:
            total, parts = breakdown(node_id, [])
            where = "cluster.head.resources.requests.cpu" if node.driver or not node.gpus else "its CPUs"
            problems.append(
                f"node {node.address} has {node.cpus:g} Ray CPUs and needs {total} = {parts}: "
                f"raise {where} to {total} or more"
            )
    reported: set[str] = set()
    for group in unplaced:
        candidates = [n for n in nodes if n.gpus >= group.gpus]
        if not candidates:
            most = max(n.gpus for n in nodes)
            problems.append(
                f"{group.what} needs {group.gpus} GPUs on one node and the largest node has {most:g}: "
                f"give {group.field}.gpusPerWorker's GPUs to each Ray node (or lower it)"
            )
            continue
        for node in candidates:
            total, parts = breakdown(node.node_id, [*hosted[node.node_id], group])
            if node.cpus < total and node.node_id not in reported:
                reported.add(node.node_id)
                problems.append(
                    f"node {node.address} ({node.gpus:g} GPUs) has {node.cpus:g} Ray CPUs and needs "
                    f"{total} = {parts}: set {group.field}.resources.requests.cpu (and its limit, if set) to "
                    f"{total} or more"
                )
                break
    # 4. the vLLM server actors: one free CPU on every node that hosts a placement group
    for node_id in order:
        if hosted[node_id] and free[node_id] < PLACEMENT_CPUS:
            node = by_id[node_id]
            total, parts = breakdown(node_id, hosted[node_id])
            field = hosted[node_id][0].field
            problems.append(
                f"node {node.address} ({node.gpus:g} GPUs) has {node.cpus:g} Ray CPUs and needs {total} = "
                f"{parts}: set {field}.resources.requests.cpu (and its limit, if set) to {total} or more"
            )
    # 5. agent-loop and reward workers: one free CPU somewhere
    if not problems and max(free.values()) < PLACEMENT_CPUS:
        problems.append(
            "no node keeps a free CPU for verl's agent-loop and reward workers: give the head 1 more CPU"
        )
    if not problems:
        return None
    return (
        "verl cannot place this job on the Ray cluster and would wait forever: " + "; ".join(problems) + "."
    )


JOIN_POLL_SECONDS = 2.0


def await_fit(
    look: Callable[[], tuple[str | None, int]],
    expected_nodes: int,
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    waiting: Callable[[str], None] = lambda message: None,
) -> str | None:
    """The shortfall that stands (None: it fits), looked at (`look()`: the shortfall on the nodes as they
    are, and how many are alive) until it fits, or all `expected_nodes` have joined, or `timeout` passed.

    A RayJob starts the trainer once its Ray cluster was ready, but not every start is the first: when
    the head's container restarts within an attempt, KubeRay submits the trainer again while the workers
    are still reconnecting to the new GCS (seen on a loaded node: no worker alive for the check, the
    attempt failed on "the largest node has 0 GPUs"). Nodes that have not joined yet are waited for;
    once all the job's nodes are there, a shortfall is final at once."""
    deadline = clock() + timeout
    announced = False
    while True:
        problem, alive = look()
        if problem is None:
            return None
        if alive >= expected_nodes:
            return problem
        if clock() >= deadline:
            return (
                f"{problem} (only {alive} of the job's {expected_nodes} Ray nodes joined within "
                f"{timeout:.0f} s, spec.runPolicy.placementTimeoutSeconds)"
            )
        if not announced:
            waiting(f"waiting for the job's Ray nodes to join ({alive} of {expected_nodes} alive)")
            announced = True
        sleep(JOIN_POLL_SECONDS)


def summary(need: Demand, nodes: list[Node]) -> str:
    """One line a successful check prints."""
    shape = ", ".join(
        f"{n.address} ({n.cpus:g} CPUs, {n.gpus:g} GPUs{', driver' if n.driver else ''})" for n in nodes
    )
    groups = ", ".join(f"{g.gpus} x {{CPU {g.cpus_per_gpu}, GPU 1}}" for g in need.groups)
    return (
        f"placement check passed: {len(need.groups)} placement group(s) [{groups}], "
        f"{need.storage_units} TransferQueue storage unit(s), the controller and the vLLM server actors fit "
        f"{len(nodes)} node(s): {shape}"
    )


def check_cluster(job: Job, overrides: Iterable[str], address: str | None) -> str:
    """Join the Ray cluster at `address` (as a driver on the node it runs on), check, leave.
    Returns the summary; raises PlacementError with the shortfall."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise PlacementError("no Ray cluster to check: give --ray-address (or set RAY_ADDRESS)")
    ray.init(address=address, include_dashboard=False, logging_level="ERROR")
    try:
        nodes = nodes_from_ray(ray.nodes(), ray.get_runtime_context().get_node_id())
    finally:
        ray.shutdown()
    need = demand(job, storage_units(overrides))
    problem = shortfall(need, nodes)
    if problem:
        raise PlacementError(problem)
    return summary(need, nodes)


class PlacementError(RuntimeError):
    """verl's requests do not fit the Ray cluster; the message says what to change."""
