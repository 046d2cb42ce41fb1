"""Warmed tiny models cached by their inputs: a second request copies the first's model and result
without warming up again; a warm-up cut short by its time bound is not kept; other inputs, other key."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from harness import tiny_models

from trainer_entry import tiny_model


class WarmUps:
    """Stands in for the minutes-long build and warm-up: records each warm-up, writes a model file."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.goal_met = True
        self.seconds = 0.0

    def build(self, root: Path, name: str, hidden: int, layers: int) -> Path:
        (root / name).mkdir(parents=True)
        return root / name

    def warm(self, path: Path, protocol: str, seconds: float, tools: object) -> tiny_model.WarmUp:
        self.calls.append(protocol)
        time.sleep(self.seconds)
        (path / "model.safetensors").write_text(f"weights {len(self.calls)}")
        return tiny_model.WarmUp(50, 1.0, 0.5, 0.4, 0.8, self.goal_met)


@pytest.fixture
def warm_ups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> WarmUps:
    monkeypatch.setenv("TOOLRL_CACHE", str(tmp_path / "cache"))
    fake = WarmUps()
    monkeypatch.setattr(tiny_model, "build_tiny_model", fake.build)
    monkeypatch.setattr(tiny_model, "warm_up", fake.warm)
    return fake


def test_a_second_request_copies_the_cached_model_and_result(tmp_path: Path, warm_ups: WarmUps) -> None:
    first, result = tiny_models.warmed_model(tmp_path / "a", "python-tags")
    second, cached = tiny_models.warmed_model(tmp_path / "b", "python-tags")
    assert warm_ups.calls == ["python-tags"], "the second request warmed up again"
    assert cached == result and cached.goal_met
    assert second == tmp_path / "b" / tiny_models.MODEL_NAME
    assert (second / "model.safetensors").read_text() == (first / "model.safetensors").read_text()
    tiny_models.warmed_model(tmp_path / "c", "hermes")
    assert warm_ups.calls == ["python-tags", "hermes"], "another protocol is another model"


def test_requests_at_once_warm_up_once(tmp_path: Path, warm_ups: WarmUps) -> None:
    """make test's two streams ask for the same model at the same time: the second waits for the
    first's warm-up (a file lock per key) and copies it."""
    warm_ups.seconds = 0.5
    with ThreadPoolExecutor(2) as pool:
        made = list(pool.map(lambda d: tiny_models.warmed_model(tmp_path / d, "python-tags"), "ab"))
    assert warm_ups.calls == ["python-tags"], "both warmed up"
    assert [(path / "model.safetensors").read_text() for path, _ in made] == ["weights 1"] * 2


def test_a_warm_up_stopped_by_its_time_bound_is_not_kept(tmp_path: Path, warm_ups: WarmUps) -> None:
    warm_ups.goal_met = False
    _, result = tiny_models.warmed_model(tmp_path / "a", "python-tags")
    assert not result.goal_met
    tiny_models.warmed_model(tmp_path / "b", "python-tags")
    assert warm_ups.calls == ["python-tags", "python-tags"], "a warm-up short of its goal was reused"


def test_the_key_follows_the_tools_schemas_and_the_model_shape() -> None:
    base = tiny_models.warm_up_key("hermes", None, 64, 2)
    assert base == tiny_models.warm_up_key("hermes", [tiny_model.TOY_TOOL], 64, 2)
    other_tool = {"name": "search", "type": "search"}
    assert base != tiny_models.warm_up_key("hermes", [other_tool], 64, 2)
    assert base != tiny_models.warm_up_key("hermes", None, 32, 2)
    assert base != tiny_models.warm_up_key("python-tags", None, 64, 2)
