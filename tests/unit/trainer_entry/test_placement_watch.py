"""A placement group of verl's that stays PENDING ends the attempt with what to change (issue 32): the
driver's PlacementWatch on `ray.util.placement_group_table()` as Ray writes it, here a fake table."""

from __future__ import annotations

import pytest
from trainer_entry.node_watch import PLACEMENT_TIMEOUT_FIELD, PlacementWatch
from trainer_entry.spec import SpecError, parse_job


def group(gid: str, state: str, node: str = "", gpus: int = 8, scheduling: str = "NO_RESOURCES") -> dict:
    """One entry of `placement_group_table()` (Ray 2.60's keys)."""
    return {
        "placement_group_id": gid,
        "name": f"global_poolverl_group_{gpus}:{gid}",
        "bundles": {i: {"CPU": 3.0, "GPU": 1.0} for i in range(gpus)},
        "bundles_to_node_id": {i: node for i in range(gpus)},
        "strategy": "STRICT_PACK",
        "state": state,
        "stats": {"scheduling_state": "FINISHED" if state == "CREATED" else scheduling},
    }


NODES = [
    {"NodeID": "h", "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 4.0}},
    {"NodeID": "a", "Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 26.0, "GPU": 8.0}},
    {"NodeID": "b", "Alive": True, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 24.0, "GPU": 8.0}},
    {"NodeID": "x", "Alive": False, "NodeManagerAddress": "10.0.0.9", "Resources": {"CPU": 26.0, "GPU": 8.0}},
]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watch(tables: list[dict], clock: Clock, advice=lambda nodes: None) -> PlacementWatch:
    looks = iter(tables)
    return PlacementWatch(lambda: next(looks), lambda: NODES, lambda _: None, 600, advice=advice, clock=clock)


def test_a_group_pending_past_the_bound_ends_the_attempt_saying_what_is_pending_and_what_the_nodes_have():
    clock = Clock()
    placed, pending = group("g0", "CREATED", node="a"), group("g1", "PENDING")
    w = watch([{"g0": placed, "g1": pending}] * 3, clock)
    assert w.find() is None  # first seen pending now
    clock.now += 599
    assert w.find() is None
    clock.now += 1
    message = w.find()
    assert message is not None
    assert message.startswith(
        "verl's placement group(s) global_poolverl_group_8:g1 (8 x {CPU 3, GPU 1}, STRICT_PACK; Ray: "
        "NO_RESOURCES) not placed after 600 s, and verl waits on them with no timeout; the Ray nodes: "
        "10.0.0.1 (4 CPUs, 0 GPUs; placed groups hold 0 CPUs, 0 GPUs), "
        "10.0.0.2 (26 CPUs, 8 GPUs; placed groups hold 24 CPUs, 8 GPUs), "
        "10.0.0.3 (24 CPUs, 8 GPUs; placed groups hold 0 CPUs, 0 GPUs): "
    ), message
    assert "10.0.0.9" not in message  # a dead node is not offered
    # no shortfall to quote: the generic advice, with the true need and the check to run
    assert "a STRICT_PACK group needs all of it on one node (24 CPUs and 8 GPUs)" in message
    assert "give each worker 3 CPUs per GPU + 2 (cluster.workers.resources.requests.cpu)" in message
    assert "python -m trainer_entry placement-check" in message
    assert f"raise {PLACEMENT_TIMEOUT_FIELD}" in message


def test_the_placement_checks_shortfall_on_the_nodes_as_they_are_is_the_advice():
    clock = Clock()
    seen: list[list] = []

    def advice(nodes):
        seen.append(nodes)
        # as placement.shortfall ends its message
        return "set cluster.workers.resources.requests.cpu (and its limit, if set) to 26 or more."

    w = watch([{"g1": group("g1", "PENDING")}] * 2, clock, advice)
    w.find()
    clock.now += 600
    message = w.find()
    assert message is not None and message.endswith(
        ": set cluster.workers.resources.requests.cpu (and its limit, if set) to 26 or more. This attempt "
        f"ends instead of holding the GPUs (if nodes were still joining, raise {PLACEMENT_TIMEOUT_FIELD})"
    )
    assert seen == [NODES]


def test_a_group_placed_in_time_or_removed_is_forgotten_and_a_new_one_gets_its_own_bound():
    clock = Clock()
    tables = [
        {"g1": group("g1", "PENDING")},
        {"g1": group("g1", "CREATED", node="a")},  # placed after 500 s
        {"g1": group("g1", "CREATED", node="a"), "g2": group("g2", "PENDING")},
        {"g2": group("g2", "PENDING")},  # g1 removed
        {"g2": group("g2", "PENDING")},
    ]
    w = watch(tables, clock)
    assert w.find() is None
    clock.now += 500
    assert w.find() is None and w.pending_since == {}
    assert w.find() is None and w.pending_since == {"g2": 1500.0}
    clock.now += 599
    assert w.find() is None
    clock.now += 1
    assert "global_poolverl_group_8:g2" in (w.find() or "")


def test_the_bound_is_a_field_of_the_job_600_s_by_default():
    def job(**run_policy):
        spec = {
            "model": {"path": "m"},
            "data": {"trainFiles": ["/d/t.parquet"]},
            "algorithm": {"totalEpochs": 1},
            "tools": [{"name": "python", "type": "python"}],
            "runPolicy": run_policy,
        }
        return parse_job({"metadata": {"name": "j", "namespace": "rl"}, "spec": spec})

    assert PLACEMENT_TIMEOUT_FIELD == "spec.runPolicy.placementTimeoutSeconds"
    assert job().spec["runPolicy"]["placementTimeoutSeconds"] == 600  # the CRD's default
    assert job(placementTimeoutSeconds=1800).spec["runPolicy"]["placementTimeoutSeconds"] == 1800
    with pytest.raises(SpecError, match=r"spec\.runPolicy\.placementTimeoutSeconds: must be >= 10, got 0"):
        job(placementTimeoutSeconds=0)
