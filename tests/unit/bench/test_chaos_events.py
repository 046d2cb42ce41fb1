"""bench/chaos counts the job's Events per fault: a reason posted again as a new Event object counts."""

from __future__ import annotations

from typing import Any

from bench.chaos.run import event_keys


class FakeCluster:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._events = events

    def events(self, name: str) -> list[dict[str, Any]]:
        return self._events


def test_a_reason_posted_again_as_a_new_event_object_is_counted() -> None:
    before = [{"type": "Normal", "reason": "PhaseProvisioning", "count": 1}]
    # the operator posts "Running -> Provisioning: attempt 1 failed" as a second Event object
    after = [*before, {"type": "Normal", "reason": "PhaseProvisioning"}]
    assert event_keys(FakeCluster(before)) == {"Normal PhaseProvisioning": 1}  # type: ignore[arg-type]
    assert event_keys(FakeCluster(after)) == {"Normal PhaseProvisioning": 2}  # type: ignore[arg-type]


def test_an_event_repeated_by_its_count_is_counted() -> None:
    events = [{"type": "Normal", "reason": "ReplicasReady", "count": 3}, {"type": "Warning", "reason": "X"}]
    assert event_keys(FakeCluster(events)) == {"Normal ReplicasReady": 3, "Warning X": 1}  # type: ignore[arg-type]
