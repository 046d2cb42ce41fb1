"""verl's placement on a real Ray cluster whose nodes declare the GPUs of the examples' shapes (issue 32).

A local `ray.cluster_utils.Cluster`: one raylet per Ray node, each with the Ray CPUs the operator gives
that node (`build_rayjob`'s rayStartParams) and logical GPUs (Ray accepts declared GPUs without any).
On it a plain actor, as verl's TaskRunner is, runs what verl 0.9.1 runs before CUDA is touched:
TransferQueue's real `init` (its controller, then its storage units hard-pinned round-robin by its own
bootstrap; each of the two actor classes stood in for by a light actor created with the real class's Ray
options, see `StandIn`), verl's own `ResourcePoolManager.create_resource_pool` +
`RayResourcePool.get_placement_groups` (the STRICT_PACK groups of {CPU 3, GPU 1}, awaited with no
timeout), and one actor per rollout replica with the options verl's `vLLMReplica.launch_servers` gives its
server actors (a plain actor hard-pinned to the group's node; the server class itself needs CUDA). The
same replay on the shape the operator built before issue 32 (24 CPUs for 8 GPUs) leaves the group
pending: the driver's PlacementWatch ends that attempt.
"""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
import yaml
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "toolrljob.yaml"
OBJECT_STORE = 80 * 1024 * 1024  # Ray's floor is 75 MiB: nothing here stores objects
READY_SECONDS = 120  # a placement that works is ready in seconds; this machine is shared and loaded
VERL_GROUPS_8_8 = "global_poolverl_group_8_8:"  # verl's names: pool name, verl_group_, GPUs per node
OLD_WORKER_CPUS = 24  # KubeRay's --num-cpus for a 24-CPU request before issue 32 (3 per GPU)
OPEN_MODULE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build  (dvs-builder)\n"


def example(**workers) -> dict:
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    doc["metadata"]["namespace"] = "rl"
    doc["spec"]["cluster"]["workers"].update(workers)
    return doc


@ray.remote
class StandIn:
    """TransferQueue's controller or one of its storage units, placed as the real one and without its body.

    TransferQueue's `init` creates them (its `TransferQueueController` and its bootstrap's
    `SimpleStorageUnit` swapped for `stand_in_for(the real class)` in the TaskRunner's process): the same
    calls, names, scheduling strategies (the units' hard round-robin affinity) and the real classes' own
    Ray options (`num_cpus=1`, held), so Ray places what the real actors ask for. Left out: the bodies,
    which import torch and tensordict (~10 s of CPU an actor, 11 actors here) and serve ZMQ, placing
    nothing; and the driver's in-process client (ZMQ sockets, no Ray resources)."""

    def __init__(self) -> None:
        self.conf = None

    def get_zmq_server_info(self) -> str:  # what init waits on for each actor: placed and answering
        return ray.get_runtime_context().get_node_id()

    def store_config(self, conf) -> None:
        self.conf = conf

    def get_config(self):
        return self.conf

    def shutdown(self) -> None:  # what close asks each storage unit before killing it
        pass


@ray.remote
class RolloutServer:
    """Stands for verl's vLLMHttpServer (CUDA at import): the same actor options, a plain actor."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


@ray.remote
class TaskRunner:
    """As verl's TaskRunnerV1 (`@ray.remote`, no options): runs verl's placement calls in its process."""

    def __init__(self) -> None:
        # verl and TransferQueue imported (tens of seconds on a loaded machine) while the nodes join
        import transfer_queue  # noqa: F401
        import verl.single_controller.ray.base  # noqa: F401

    def place(self, units: int, gpus_per_node: int, nnodes: int, tensor_parallel: int) -> dict:
        from unittest import mock

        import transfer_queue as tq
        from omegaconf import OmegaConf
        from transfer_queue import interface
        from transfer_queue.storage.bootstrap import simple_storage_bootstrap
        from verl.single_controller.ray.base import ResourcePoolManager

        def stand_in_for(real) -> SimpleNamespace:
            """`real.options(**options).remote(*args, **kwargs)` as TransferQueue calls it: a StandIn with
            the real class's own Ray options (as its `@ray.remote(...)` set them: {"num_cpus": 1}) and the
            call's. The arguments are dropped: the controller's is TransferQueue's sampler class, whose
            import would load TransferQueue (torch) in the stand-in. (A local function: Ray pickles this
            class by value, and a module-level name would be imported by reference on the worker, where
            `tests` is verl's own package.)"""

            def options(**options) -> SimpleNamespace:
                actor = StandIn.options(**{**real._default_options, **options})
                return SimpleNamespace(remote=lambda *args, **kwargs: actor.remote())

            return SimpleNamespace(options=options)

        started = time.monotonic()
        conf = OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": units}}})
        with (
            mock.patch.object(
                interface, "TransferQueueController", stand_in_for(interface.TransferQueueController)
            ),
            mock.patch.object(
                simple_storage_bootstrap,
                "SimpleStorageUnit",
                stand_in_for(simple_storage_bootstrap.SimpleStorageUnit),
            ),
            mock.patch.object(interface, "_maybe_create_tq_client"),
        ):
            tq.init(conf)  # returns once every storage unit answered (it waits on them with no timeout)
        units_at = {  # the storage units are named actors of this job
            rank: ray.get(
                ray.get_actor(f"TransferQueueStorageUnit#{rank}").__ray_call__.remote(
                    lambda self: ray.get_runtime_context().get_node_id()
                )
            )
            for rank in range(units)
        }
        times = {"transfer_queue": time.monotonic() - started}
        manager = ResourcePoolManager(
            resource_pool_spec={"global_pool": [gpus_per_node] * nnodes}, mapping={}
        )
        manager.create_resource_pool()
        pgs = manager.resource_pool_dict["global_pool"].get_placement_groups(device_name="cuda")
        groups = {pg.id.hex(): ray.util.placement_group_table(pg)["bundles_to_node_id"][0] for pg in pgs}
        times["placement_groups"] = time.monotonic() - started
        # vLLMReplica.launch_servers: per replica and node, a server actor hard-pinned to the node of its
        # workers (the group's), with no resource options: 1 CPU to be placed, none held
        self.servers = [
            RolloutServer.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            ).remote()
            for node_id in groups.values()
            for _ in range(gpus_per_node // tensor_parallel)
        ]
        servers_at = ray.get([server.node.remote() for server in self.servers], timeout=READY_SECONDS)
        self.pgs = pgs
        times["servers"] = time.monotonic() - started
        return {"units": units_at, "groups": groups, "servers": servers_at, "seconds": times}

    def close(self) -> None:
        import transfer_queue as tq

        for server in getattr(self, "servers", []):
            ray.kill(server)
        for pg in getattr(self, "pgs", []):
            ray.util.remove_placement_group(pg)
        tq.close()


@ray.remote(num_cpus=0)
class Hub:
    """The calls the driver's end of an attempt makes on the metrics hub (hub.py), recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def placement_pending(self, message: str) -> None:
        self.calls.append(("placement_pending", message))

    def finish(self) -> None:
        self.calls.append(("finish",))

    def reports(self) -> list[tuple]:
        return self.calls


def placement_check(spec: dict, address: str, tmp_path: Path) -> Callable[[], subprocess.CompletedProcess]:
    """Starts `python -m trainer_entry placement-check` against the cluster and returns the call that waits
    for its result. It only reads the nodes, so it runs beside what the test does meanwhile."""
    path = tmp_path / "toolrljob.yaml"
    path.write_text(yaml.safe_dump(spec))
    check = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer_entry",
            "placement-check",
            "--spec",
            str(path),
            "--ray-address",
            address,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def result() -> subprocess.CompletedProcess:
        try:
            stdout, stderr = check.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            check.kill()
            raise
        return subprocess.CompletedProcess(check.args, check.returncode, stdout, stderr)

    return result


class Shape:
    """Worker nodes added to the running cluster for one shape (started side by side, then awaited until
    the alive nodes are exactly the head and these), removed after it."""

    def __init__(self, cluster: Cluster, workers: list[tuple[float, float]]) -> None:
        self.cluster, self.workers = cluster, workers

    def __enter__(self) -> list:
        self.nodes = [
            self.cluster.add_node(num_cpus=cpus, num_gpus=gpus, object_store_memory=OBJECT_STORE, wait=False)
            for cpus, gpus in self.workers
        ]
        expected = {self.cluster.head_node.node_id, *(node.node_id for node in self.nodes)}
        deadline = time.monotonic() + READY_SECONDS
        while {n["NodeID"] for n in ray.nodes() if n["Alive"]} != expected:
            assert time.monotonic() < deadline, f"the Ray nodes are not {expected}: {ray.nodes()}"
            time.sleep(0.2)
        return self.nodes

    def __exit__(self, *exc) -> None:
        for node in self.nodes:
            self.cluster.remove_node(node)


def drivers_read_on_the_gpu_nodes(nodes: list, tmp_path: Path) -> None:
    """The trainer's driver check (run.check_gpu_drivers) on this shape: a task pinned to each GPU node
    reads the driver file there (one of this machine's files standing for /proc/driver/nvidia/version)."""
    from trainer_entry import gpu_driver

    version = tmp_path / "nvidia-version"

    def check() -> str:
        read = functools.partial(gpu_driver.read_drivers, version_file=str(version))
        return gpu_driver.check(nodes, "13.0", read=read)

    version.write_text(OPEN_MODULE.format("580.65.06"))
    assert check() == "NVIDIA driver checked on 2 GPU node(s): CUDA 13.0 needs >= 580"
    version.write_text(OPEN_MODULE.format("550.54.15"))
    with pytest.raises(gpu_driver.DriverError) as old:
        check()
    assert str(old.value).count("runs NVIDIA driver 550.54.15; this image's torch is built for CUDA 13") == 2
    version.unlink()
    with pytest.raises(gpu_driver.DriverError) as absent:
        check()
    assert str(absent.value).count("shows no NVIDIA driver") == 2, absent.value


def test_verls_placement_is_ready_on_the_examples_shapes_and_pends_on_the_old_one(
    tmp_path, monkeypatch, operator_nodes
) -> None:
    # imported here: Ray's workers import this module for its actor classes, and need none of these
    from trainer_entry.node_watch import PlacementWatch
    from trainer_entry.placement import storage_units, worker_cpus
    from trainer_entry.run import EXIT_NODE_LOST, LOCAL_RAY_REGISTER_SECONDS, end_attempt, placement_problem
    from trainer_entry.spec import parse_job
    from trainer_entry.translate import translate

    started = time.monotonic()
    # 1 x 1 GPU, and the shipped example itself (2 x 8; its workers are the 1 x 8 shape's, one more)
    shapes = {(1, 1): example(replicas=1, gpusPerWorker=1, resources={"requests": {"memory": "8Gi"}})}
    shapes[(2, 8)] = example()
    heads = {operator_nodes(doc)[0] for doc in shapes.values()}
    assert heads == {(4.0, 0.0)}, heads  # the example's head: 4 CPUs, no GPU
    # as the trainer's own local Ray: Ray's 30 s for a node to register is missed on a loaded machine
    monkeypatch.setenv("RAY_raylet_start_wait_time_s", str(LOCAL_RAY_REGISTER_SECONDS))
    cluster = Cluster(
        initialize_head=True,
        # no dashboard, no autoscaler monitor: nothing here asks them (the nodes' agents still start)
        head_node_args={
            "num_cpus": 4,
            "num_gpus": 0,
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": False,
            "no_monitor": True,
        },
    )
    try:
        ray.init(address=cluster.address, include_dashboard=False, logging_level="ERROR")
        head_id = ray.get_runtime_context().get_node_id()
        runner = TaskRunner.remote()
        for (replicas, gpus), doc in shapes.items():
            _, *workers = operator_nodes(doc)
            assert workers == [(worker_cpus(gpus), gpus)] * replicas, workers  # the CPUs the operator gives
            job = parse_job(doc)
            units = storage_units(translate(job, "http://pool").overrides)
            with Shape(cluster, workers) as nodes:
                assert placement_problem(job, units, ray.nodes()) is None
                check = (
                    placement_check(doc, cluster.address, tmp_path) if (replicas, gpus) == (2, 8) else None
                )
                placed = ray.get(
                    runner.place.remote(units, gpus, replicas, doc["spec"]["rollout"]["tensorParallelSize"]),
                    timeout=READY_SECONDS * 2,
                )
                ray.get(runner.close.remote())
                if check:
                    checked = check()
                    assert checked.returncode == 0, checked.stderr
                    assert "placement check passed: 2 placement group(s)" in checked.stdout, checked.stdout
                    drivers_read_on_the_gpu_nodes(ray.nodes(), tmp_path)
            worker_ids = {node.node_id for node in nodes}
            assert sorted(placed["units"].values()) == sorted([head_id, *worker_ids]), placed  # one a node
            assert sorted(placed["groups"].values()) == sorted(worker_ids), placed  # one group a worker
            assert sorted(placed["servers"]) == sorted(list(worker_ids) * gpus), placed
            at = time.monotonic() - started
            print(f"{replicas} x {gpus} placed at {at:.0f} s: {placed['seconds']}", flush=True)

        # the shape the operator built before issue 32: 24 Ray CPUs for 8 GPUs
        old = example()
        with Shape(cluster, [(OLD_WORKER_CPUS, 8)] * 2):
            check = placement_check(old, cluster.address, tmp_path)

            job = parse_job(old)
            units = storage_units(translate(job, "http://pool").overrides)
            stuck: list[str] = []
            watch = PlacementWatch(
                ray.util.placement_group_table,
                ray.nodes,
                stuck.append,
                timeout=3,
                interval=0.5,
                advice=lambda nodes: placement_problem(job, units, nodes),
            ).start()
            pending = runner.place.remote(units, 8, 2, 1)  # blocks in verl's ray.get(pg.ready()) for ever
            deadline = time.monotonic() + READY_SECONDS
            while not stuck and time.monotonic() < deadline:
                time.sleep(0.5)
            watch.stop()
            assert stuck, "PlacementWatch did not report the pending placement group"
            print(f"PlacementWatch: {stuck[0]}", flush=True)
            ready, _ = ray.wait([pending], timeout=0)
            assert not ready, "verl's placement returned on a shape that cannot hold it"
            table = ray.util.placement_group_table()
            states = [g["state"] for g in table.values() if g["name"].startswith(VERL_GROUPS_8_8)]
            assert sorted(states) == ["PENDING"] * 2 + ["REMOVED"] * 2, states  # the shipped shape's: removed
            assert "global_poolverl_group_8_8:0 (8 x {CPU 3, GPU 1}, STRICT_PACK" in stuck[0], stuck[0]
            assert "(24 CPUs, 8 GPUs; placed groups hold 0 CPUs, 0 GPUs)" in stuck[0], stuck[0]
            assert "set cluster.workers.resources.requests.cpu (and its limit, if set) to 26" in stuck[0]

            hub = Hub.remote()  # what the driver does then: the Event, the status as it stands, the exit
            codes: list[int] = []
            end_attempt(hub, stuck[0], exit=codes.append, event="placement_pending")
            assert ray.get(hub.reports.remote()) == [("placement_pending", stuck[0]), ("finish",)]
            assert codes == [EXIT_NODE_LOST]

            refused = check()
            assert refused.returncode == 1, (refused.stdout, refused.stderr)
            assert "verl cannot place this job on the Ray cluster and would wait forever" in refused.stderr
            assert "has 24 Ray CPUs and needs 26 = 24 for verl's training placement group" in refused.stderr
            assert (
                "set cluster.workers.resources.requests.cpu (and its limit, if set) to 26" in refused.stderr
            )
            ray.kill(runner)
        print(f"all shapes in {time.monotonic() - started:.0f} s")
    finally:
        ray.shutdown()
        cluster.shutdown()
