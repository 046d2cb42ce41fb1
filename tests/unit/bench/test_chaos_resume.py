"""bench/chaos reads the step a restarted trainer resumed at from the newest trainer pod's log, the way
the trainer's own metrics read verl's step lines (trainer_entry.metrics.console_steps)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from bench.chaos import run as chaos

RESUMED = "\n".join(
    [
        "(_ToolRLTaskRunner pid=7) Loaded checkpoint global_step_4",
        "(_ToolRLTaskRunner pid=7) step:5 - actor/grad_norm:np.float64(0.5) - timing_s/step:3.0",
        "(_ToolRLTaskRunner pid=7) step:6 - actor/grad_norm:0.25 - timing_s/step:2.9",
    ]
)


class FakeTrainingCluster:
    cluster = object()
    namespace = "bench-chaos"

    def __init__(self, logs: dict[str, str]) -> None:
        self.logs = logs

    def kubectl(self, *args: str, check: bool = True) -> Any:
        assert args[0] == "logs", args
        return SimpleNamespace(stdout=self.logs[args[1]])


def pods(*named: tuple[str, str]) -> dict[str, Any]:
    return {"items": [{"metadata": {"name": n, "creationTimestamp": t}} for n, t in named]}


def test_the_newest_trainers_first_step_is_where_it_resumed(monkeypatch: pytest.MonkeyPatch) -> None:
    listed = pods(("chaos-a", "2026-01-01T00:00:00Z"), ("chaos-b", "2026-01-01T00:05:00Z"))
    monkeypatch.setattr(chaos, "get_json", lambda *args: listed)
    tc = FakeTrainingCluster({"chaos-a": "(_ToolRLTaskRunner pid=3) step:1 - a:1.0", "chaos-b": RESUMED})
    assert chaos.first_step_of_newest_trainer(tc) == 5  # type: ignore[arg-type]


def test_no_step_yet_or_no_trainer_pod_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chaos, "get_json", lambda *args: pods(("chaos-a", "2026-01-01T00:00:00Z")))
    assert chaos.first_step_of_newest_trainer(FakeTrainingCluster({"chaos-a": "starting Ray"})) is None  # type: ignore[arg-type]
    monkeypatch.setattr(chaos, "get_json", lambda *args: pods())
    assert chaos.first_step_of_newest_trainer(FakeTrainingCluster({})) is None  # type: ignore[arg-type]
