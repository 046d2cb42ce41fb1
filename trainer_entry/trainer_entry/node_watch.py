"""Ends a run whose Ray cluster lost a node mid-training.

verl places its actors (the training and rollout workers, the agent-loop workers) once, and does not
replace those that die with their node: measured on the real node (bench/chaos), a deleted Ray worker
pod left verl's sampling loop waiting on its lost agent-loop worker forever ("running: 4, finished: 0"
each minute), the RayJob Running and `kubectl get trj` Running at the same step for as long as one
cared to watch. KubeRay brings a new worker pod up, but nothing of the run uses it.

So the driver watches Ray's own view of its nodes (`ray.nodes()`, public API): once a node that was
alive dies, the run ends with a message saying which and why. The Ray job fails, KubeRay ends the
attempt, and with `runPolicy.backoffLimit` the next attempt resumes from the newest checkpoint. (A lost
head is another matter: the driver and the GCS go with it, and KubeRay submits the trainer again.)

The same thread mechanism bounds placement (`PlacementWatch`): verl waits on its placement groups with no
timeout (`RayResourcePool.get_placement_groups`), so one that stays PENDING — the nodes changed after the
start-up check (trainer_entry.placement), or something else holds their resources — would hold the GPUs
forever. Past `spec.runPolicy.placementTimeoutSeconds` (600 s by default) the attempt ends with what is
pending, what the nodes have and what to change, read from Ray's public `placement_group_table()` and
`nodes()`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainer_entry.placement import worker_cpus

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 10.0  # between looks; Ray itself marks a node dead after its health checks fail
# the bound's field (its default, 600 s, is the CRD's): verl's placement groups are ready in seconds once the
# nodes have joined (a RayJob starts the trainer when its RayCluster is ready)
PLACEMENT_TIMEOUT_FIELD = "spec.runPolicy.placementTimeoutSeconds"


def alive(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The alive nodes of `ray.nodes()`: node id -> address."""
    return {n["NodeID"]: str(n.get("NodeManagerAddress", "?")) for n in nodes if n.get("Alive")}


def lost_message(lost: Mapping[str, str]) -> str:
    names = ", ".join(f"{address} (node {node_id[:8]})" for node_id, address in sorted(lost.items()))
    return (
        f"the Ray cluster lost {names} mid-training (its pod deleted or evicted, or its machine gone): "
        "verl does not replace the actors that ran there, so this attempt ends instead of waiting on them "
        "forever. With runPolicy.backoffLimit > 0 the job's next attempt resumes from the newest "
        "checkpoint (spec.checkpoint: a volume and saveFreq); see the Ray head's log for why the node died"
    )


class Watch:
    """A daemon thread that calls `find()` every `interval` seconds; the first message it returns goes to
    `on_found(message)`, once, and the thread stops (the driver's main thread is blocked in verl)."""

    thread_name = "ray-watch"

    def __init__(self, on_found: Callable[[str], None], interval: float) -> None:
        self.on_found, self.interval = on_found, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def find(self) -> str | None:
        raise NotImplementedError

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                message = self.find()
            except Exception as exc:  # the GCS unreachable: the head is gone, and the driver with it
                log.warning("%s: could not ask Ray: %s", self.thread_name, exc)
                continue
            if message:
                self.on_found(message)
                return


class NodeWatch(Watch):
    """Looks at `nodes()` every `interval` seconds in a daemon thread; the first time a node seen alive
    is no longer alive (dead, or gone from the list), calls `on_lost(message)` once and stops."""

    thread_name = "ray-node-watch"

    def __init__(
        self,
        nodes: Callable[[], list[dict[str, Any]]],
        on_lost: Callable[[str], None],
        interval: float = INTERVAL_SECONDS,
    ) -> None:
        super().__init__(on_lost, interval)
        self.nodes = nodes
        self.seen: dict[str, str] = {}

    def start(self) -> NodeWatch:
        self.seen = alive(self.nodes())
        super().start()
        return self

    def look(self) -> dict[str, str]:
        """One look: the nodes lost since they were seen alive (and remembers new ones)."""
        now = alive(self.nodes())
        lost = {node_id: address for node_id, address in self.seen.items() if node_id not in now}
        self.seen.update(now)
        return lost

    def find(self) -> str | None:
        lost = self.look()
        return lost_message(lost) if lost else None

    def loss_within(
        self,
        seconds: float,
        poll: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> str | None:
        """The lost-node message if Ray marks a node seen alive dead within `seconds`, else None: for an
        actor call that failed first (its node's processes gone, the socket closed) while Ray's health
        checks have not yet said whether the node died."""
        deadline = clock() + seconds
        while True:
            try:
                message = self.find()
            except Exception as exc:  # the GCS unreachable: nothing to tell
                log.warning("%s: could not ask Ray: %s", self.thread_name, exc)
                return None
            if message or clock() >= deadline:
                return message
            sleep(poll)


def _resources(bundles: Iterable[Mapping[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0.0) + float(amount)
    return total


def _bundles_text(entry: Mapping[str, Any]) -> str:
    """`8 x {CPU 3, GPU 1}` for a group of equal bundles, else each bundle."""
    bundles = [dict(b) for b in (entry.get("bundles") or {}).values()]
    shown = [
        "{" + ", ".join(f"{k} {v:g}" for k, v in sorted(b.items()) if not k.startswith("bundle_group")) + "}"
        for b in bundles
    ]
    if shown and all(s == shown[0] for s in shown):
        return f"{len(shown)} x {shown[0]}"
    return " + ".join(shown)


def held_by_groups(table: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Node id -> the CPUs and GPUs the placed (CREATED) groups of `placement_group_table()` hold there."""
    held: dict[str, dict[str, float]] = {}
    for entry in table.values():
        if entry.get("state") != "CREATED":
            continue
        for index, node_id in (entry.get("bundles_to_node_id") or {}).items():
            bundle = (entry.get("bundles") or {}).get(index) or {}
            into = held.setdefault(node_id, {})
            for name in ("CPU", "GPU"):
                into[name] = into.get(name, 0.0) + float(bundle.get(name, 0.0))
    return held


def pending_message(
    pending: list[Mapping[str, Any]],
    table: Mapping[str, Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]],
    waited: float,
    advice: str | None = None,
) -> str:
    """What is pending, what the nodes have, and what to change (`advice`: trainer_entry.placement's
    shortfall against the nodes as they are now, when it finds one)."""
    groups = "; ".join(
        f"{entry.get('name') or entry.get('placement_group_id', '?')} ({_bundles_text(entry)}, "
        f"{entry.get('strategy', '?')}; Ray: {(entry.get('stats') or {}).get('scheduling_state', 'PENDING')})"
        for entry in pending
    )
    held = held_by_groups(table)
    shown = []
    for node in nodes:
        if not node.get("Alive"):
            continue
        res = node.get("Resources") or {}
        mine = held.get(node["NodeID"], {})
        shown.append(
            f"{node.get('NodeManagerAddress', '?')} ({res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs; "
            f"placed groups hold {mine.get('CPU', 0):g} CPUs, {mine.get('GPU', 0):g} GPUs)"
        )
    need = max(
        (_resources((entry.get("bundles") or {}).values()) for entry in pending),
        key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)),
    )
    fix = (advice or "").rstrip(".") or (
        f"a STRICT_PACK group needs all of it on one node ({need.get('CPU', 0):g} CPUs and "
        f"{need.get('GPU', 0):g} GPUs), and beside it {worker_cpus(0)} CPUs for TransferQueue's storage unit "
        f"and verl's vLLM server actors: give each worker {worker_cpus(1) - worker_cpus(0)} CPUs per GPU + "
        f"{worker_cpus(0)} (cluster.workers.resources.requests.cpu), and run nothing else on this Ray "
        "cluster (`python -m trainer_entry placement-check` checks a cluster)"
    )
    return (
        f"verl's placement group(s) {groups} not placed after {waited:.0f} s, and verl waits on them with no "
        f"timeout; the Ray nodes: {', '.join(shown) or 'none alive'}: {fix}. This attempt ends instead of "
        f"holding the GPUs (if nodes were still joining, raise {PLACEMENT_TIMEOUT_FIELD})"
    )


class PlacementWatch(Watch):
    """Looks at `groups()` (`ray.util.placement_group_table`) every `interval` seconds in a daemon thread;
    the first time a group has been PENDING for `timeout` seconds, calls `on_stuck(message)` once and stops.
    `advice(nodes)` may say what to change for `nodes()` (`ray.nodes()`) as they are then."""

    thread_name = "ray-placement-watch"

    def __init__(
        self,
        groups: Callable[[], Mapping[str, Mapping[str, Any]]],
        nodes: Callable[[], list[dict[str, Any]]],
        on_stuck: Callable[[str], None],
        timeout: float,
        interval: float = INTERVAL_SECONDS,
        advice: Callable[[list[dict[str, Any]]], str | None] = lambda nodes: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(on_stuck, interval)
        self.groups, self.nodes, self.timeout, self.advice, self.clock = groups, nodes, timeout, advice, clock
        self.pending_since: dict[str, float] = {}

    def find(self) -> str | None:
        """One look: the message once a group has been pending `timeout` seconds, else None."""
        now, table = self.clock(), self.groups()
        pending = [gid for gid, entry in table.items() if entry.get("state") == "PENDING"]
        self.pending_since = {gid: self.pending_since.get(gid, now) for gid in pending}
        stuck = [gid for gid, since in self.pending_since.items() if now - since >= self.timeout]
        if not stuck:
            return None
        nodes = self.nodes()
        waited = max(now - self.pending_since[gid] for gid in stuck)
        return pending_message([table[gid] for gid in stuck], table, nodes, waited, self.advice(nodes))
