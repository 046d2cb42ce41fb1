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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 10.0  # between looks; Ray itself marks a node dead after its health checks fail


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


class NodeWatch:
    """Looks at `nodes()` every `interval` seconds in a daemon thread; the first time a node seen alive
    is no longer alive (dead, or gone from the list), calls `on_lost(message)` once and stops."""

    def __init__(
        self,
        nodes: Callable[[], list[dict[str, Any]]],
        on_lost: Callable[[str], None],
        interval: float = INTERVAL_SECONDS,
    ) -> None:
        self.nodes, self.on_lost, self.interval = nodes, on_lost, interval
        self.seen: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ray-node-watch", daemon=True)

    def start(self) -> NodeWatch:
        self.seen = alive(self.nodes())
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def look(self) -> dict[str, str]:
        """One look: the nodes lost since they were seen alive (and remembers new ones)."""
        now = alive(self.nodes())
        lost = {node_id: address for node_id, address in self.seen.items() if node_id not in now}
        self.seen.update(now)
        return lost

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                lost = self.look()
            except Exception as exc:  # the GCS unreachable: the head is gone, and the driver with it
                log.warning("could not list Ray's nodes: %s", exc)
                continue
            if lost:
                self.on_lost(lost_message(lost))
                return
