"""Training metrics: verl's step metrics, tool calls and phases in Prometheus form."""

import sys
import threading
import urllib.request

import pytest
from harness.localcluster import free_port
from prometheus_client import generate_latest
from trainer_entry.hub import Sink, TrackingBackend, use_sink
from trainer_entry.metrics import TrainerMetrics


def value(m, name, labels=None):
    return m.registry.get_sample_value(name, labels or {})


def test_step_metrics_from_verl_keys():
    m = TrainerMetrics(trajectories_per_step=4)
    m.observe_tool_call("python", "ok", 0.2)
    m.observe_tool_call("python", "timeout", 1.5)
    m.observe_tool_call("search", "ok", 0.01)
    m.observe_reward({"correct": 1.0, "format": 1.0})
    m.observe_reward({"correct": 0.0, "format": 1.0})
    m.record_step(
        {
            "critic/score/mean": 0.5,
            "response_length/mean": 321.0,
            "timing_s/step": 12.5,
            "training/global_step": 3,
        },
        step=3,
    )
    assert value(m, "toolrl_trainer_step") == 3
    assert value(m, "toolrl_trainer_reward_mean") == 0.5
    assert value(m, "toolrl_trainer_response_length_mean") == 321.0
    assert value(m, "toolrl_trainer_step_duration_seconds") == 12.5
    assert value(m, "toolrl_trainer_tool_calls_per_trajectory") == 0.75  # 3 calls / 4 trajectories
    assert value(m, "toolrl_trainer_reward_component", {"component": "correct"}) == 0.5
    assert value(m, "toolrl_trainer_tool_failures_total", {"tool": "python", "reason": "timeout"}) == 1
    assert (
        value(m, "toolrl_trainer_tool_call_duration_seconds_count", {"tool": "python", "outcome": "ok"}) == 1
    )


def test_verls_tool_call_counts_win_and_validation_logs_are_ignored():
    m = TrainerMetrics(trajectories_per_step=4)
    m.record_step({"val-core/gsm8k/acc/mean@1": 0.2}, step=0)
    assert value(m, "toolrl_trainer_step") == 0
    m.record_step({"timing_s/step": 1.0, "tool_call_counts/mean": 2.5}, step=1)
    assert value(m, "toolrl_trainer_tool_calls_per_trajectory") == 2.5


def test_phases_and_expected_calls():
    m = TrainerMetrics(trajectories_per_step=10)
    m.set_expected_calls_per_trajectory(3)
    m.set_phase("generating")
    assert value(m, "toolrl_trainer_expected_tool_calls") == 30
    m.set_phase("training")
    assert [
        value(m, "toolrl_trainer_rollout_phase", {"phase": p}) for p in ("generating", "scoring", "training")
    ] == [0, 0, 1]
    m.record_step({"timing_s/step": 1.0, "tool_call_counts/mean": 1.5}, step=1)
    m.set_phase("generating")
    assert value(m, "toolrl_trainer_expected_tool_calls") == 15
    with pytest.raises(ValueError, match="unknown rollout phase"):
        m.set_phase("sleeping")


def test_tracking_backend_feeds_the_sink():
    m = TrainerMetrics()
    use_sink(Sink(local=m))
    TrackingBackend().log({"timing_s/step": 2.0, "critic/score/mean": 0.25}, step=5)
    assert value(m, "toolrl_trainer_reward_mean") == 0.25 and value(m, "toolrl_trainer_step") == 5


def test_served_on_http():
    port = free_port()
    m = TrainerMetrics()
    m.set_total_steps(100)
    m.serve(port, addr="127.0.0.1")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "toolrl_trainer_total_steps 100.0" in body
    assert 'toolrl_trainer_rollout_phase{phase="generating"} 1.0' in body


PHASE = "toolrl_trainer_rollout_phase"


def test_a_scrape_never_sees_two_phases_or_none() -> None:
    """The autoscaler takes the phase at 1; a scrape between two label updates used to show two
    (or none). Scrape while the phase flips, with thread switches as frequent as they go."""
    metrics = TrainerMetrics(trajectories_per_step=4)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for phase in ("generating", "scoring", "training"):
                metrics.set_phase(phase)

    flipper = threading.Thread(target=flip, daemon=True)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    flipper.start()
    try:
        for _ in range(3000):
            scrape = generate_latest(metrics.registry).decode()
            values = [line.rsplit(" ", 1)[1] for line in scrape.splitlines() if line.startswith(PHASE + "{")]
            assert sorted(values) == ["0.0", "0.0", "1.0"], values
    finally:
        stop.set()
        flipper.join()
        sys.setswitchinterval(interval)


def test_excluded_trajectories_are_counted_by_reason_with_the_steps_fraction():
    m = TrainerMetrics()
    m.observe_trajectories(["rejected", "unreachable", "rejected"])
    m.observe_trajectories([None] * 5)
    m.record_step({"timing_s/step": 1.0}, step=1)
    assert value(m, "toolrl_trajectories_excluded_total", {"reason": "rejected"}) == 2
    assert value(m, "toolrl_trajectories_excluded_total", {"reason": "unreachable"}) == 1
    assert value(m, "toolrl_trajectories_total") == 8
    assert value(m, "toolrl_trainer_excluded_fraction") == pytest.approx(3 / 8)
    m.observe_trajectories([None] * 4)
    m.record_step({"timing_s/step": 1.0}, step=2)
    assert value(m, "toolrl_trainer_excluded_fraction") == 0.0


def test_infra_tainted_counts_trajectories_with_an_infra_call():
    from trainer_entry.runner import infra_tainted

    fields = [{"tool_faults": ["code", "infra"]}, {"tool_faults": ["code"]}, {"tool_faults": []}, {}, None]
    assert infra_tainted(fields) == 1
