"""The driver ends a run whose Ray cluster lost a node (verl would wait on the lost actors forever)."""

from __future__ import annotations

import threading

import ray
from harness.operator_process import wait_until
from ray.cluster_utils import Cluster
from trainer_entry.node_watch import NodeWatch, alive, lost_message
from trainer_entry.run import EXIT_NODE_LOST, actor_lost, end_attempt


@ray.remote(num_cpus=0)
class Hub:
    """The calls the driver's end of an attempt makes on the metrics hub (hub.py), recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def node_lost(self, message: str) -> None:
        self.calls.append(("node_lost", message))

    def finish(self) -> None:
        self.calls.append(("finish",))

    def reports(self) -> list[tuple]:
        return self.calls


def node(node_id: str, address: str, is_alive: bool = True) -> dict:
    return {"NodeID": node_id, "NodeManagerAddress": address, "Alive": is_alive}


def test_a_node_seen_alive_then_dead_or_gone_is_lost_and_a_new_one_is_not() -> None:
    looks = iter(
        [
            [node("head", "10.0.0.1"), node("w1", "10.0.0.2")],  # at start
            [node("head", "10.0.0.1"), node("w1", "10.0.0.2"), node("w2", "10.0.0.3")],  # w2 joined
            [node("head", "10.0.0.1"), node("w1", "10.0.0.2", False), node("w2", "10.0.0.3")],
            [node("head", "10.0.0.1")],  # w2 gone from the list
        ]
    )
    watch = NodeWatch(lambda: next(looks), on_lost=lambda _: None)
    watch.seen = alive(next(looks))
    assert watch.look() == {}
    assert watch.look() == {"w1": "10.0.0.2"}
    assert watch.look() == {"w1": "10.0.0.2", "w2": "10.0.0.3"}


def test_a_failed_actor_call_waits_for_ray_to_say_whether_its_node_died() -> None:
    """The call failed first (the node's processes killed, their sockets closed); Ray marks the node dead
    only after its health checks: the driver looks until then, and names the node; nothing lost, None."""
    now = [0.0]
    looks = iter([[node("head", "a"), node("w1", "b")]] * 3 + [[node("head", "a"), node("w1", "b", False)]])
    watch = NodeWatch(lambda: next(looks), on_lost=lambda _: None)
    watch.seen = alive([node("head", "a"), node("w1", "b")])
    message = watch.loss_within(
        90, poll=2, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
    )
    assert message == lost_message({"w1": "b"}) and now[0] == 6.0, (message, now)
    now[0] = 0.0
    steady = NodeWatch(lambda: [node("head", "a")], on_lost=lambda _: None)
    steady.seen = alive([node("head", "a")])
    assert (
        steady.loss_within(10, poll=2, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
        is None
    )
    assert now[0] == 10.0


def test_an_actor_lost_is_told_as_raised_and_as_the_cause_of_an_actors_task() -> None:
    unavailable = ray.exceptions.ActorUnavailableError("RPC error: Socket closed", None)
    assert actor_lost(unavailable)
    inside = ray.exceptions.RayTaskError("run", "traceback", unavailable)  # verl's task runner's task
    assert actor_lost(inside) and actor_lost(inside.as_instanceof_cause())
    assert not actor_lost(ray.exceptions.RayTaskError("run", "traceback", ValueError("boom")))
    assert not actor_lost(ValueError("boom"))


def test_the_message_names_the_node_and_what_the_job_does_next() -> None:
    message = lost_message({"0123456789abcdef": "198.18.0.14"})
    assert "198.18.0.14 (node 01234567)" in message
    assert "runPolicy.backoffLimit" in message and "newest checkpoint" in message


def test_a_ray_node_removed_mid_run_ends_it_with_the_message() -> None:
    """A real two-node Ray cluster (head + worker node, each its own raylet): the worker node is removed
    as a deleted pod's raylet would go, and the watch reports it."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    worker = cluster.add_node(num_cpus=1)
    reported: list[str] = []
    done = threading.Event()
    try:
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        watch = NodeWatch(ray.nodes, lambda m: (reported.append(m), done.set()), interval=0.5).start()
        assert len(watch.seen) == 2, watch.seen
        assert not done.wait(2), f"a healthy cluster reported a loss: {reported}"
        cluster.remove_node(worker)
        wait_until(done.is_set, 120, "the watch to report the removed node", interval=0.5)
        assert len(reported) == 1 and f"(node {worker.node_id[:8]})" in reported[0], reported
        watch.stop()

        hub = Hub.remote()  # what the driver does then: the Event, the status as it stands, the exit
        codes: list[int] = []
        end_attempt(hub, reported[0], exit=codes.append)
        assert ray.get(hub.reports.remote()) == [("node_lost", reported[0]), ("finish",)]
        assert codes == [EXIT_NODE_LOST]
    finally:
        ray.shutdown()
        cluster.shutdown()
