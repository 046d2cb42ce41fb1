"""Training metrics: verl's step metrics, tool calls and phases in Prometheus form."""

import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from harness.localcluster import free_port
from prometheus_client import generate_latest
from trainer_entry.hub import Sink, TrackingBackend, use_sink
from trainer_entry.metrics import (
    ROLLOUT_IDLE_METRIC,
    TRAINER_IDLE_METRIC,
    TrainerMetrics,
    console_steps,
    idle_fractions,
)


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


class _Remote:
    """A hub actor's method as a worker process holds it: `.remote(...)` records the call."""

    def __init__(self, got: list) -> None:
        self.got = got

    def remote(self, *args) -> None:
        self.got.append(args)


class _Hub:
    def __init__(self) -> None:
        self.calls: list = []
        self.observe_tool_calls = _Remote(self.calls)
        self.observe_rewards = _Remote([])


def test_a_workers_last_calls_reach_the_hub_without_a_next_call():
    """What an agent-loop worker records reaches the hub within a second even if nothing follows it
    (a batch is sent only as the next call comes or a second has passed: with no next call it waited
    for ever)."""
    hub = _Hub()
    sink = Sink(hub=hub)
    sink.flush()  # a flush just now: the next call is not due at once
    sink.tool_call("python", "ok", 0.2)
    sink.tool_call("python", "error", 0.3)
    assert hub.calls == []
    deadline = time.monotonic() + 30
    while not hub.calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub.calls == [([("python", "ok", 0.2), ("python", "error", 0.3)],)]


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


def test_tool_use_counts_trajectories_and_prompt_groups_with_a_call():
    """A group is one prompt's rollouts (its uid); it used the tool when any of them called one."""
    from trainer_entry.runner import CALLING_METRIC, GROUPS_CALLING_METRIC, tool_use

    fields = [
        {"tool_outcomes": ["ok"]},  # a: called
        {},  # a
        {"tool_outcomes": []},  # b: no call
        None,  # b
        {"tool_outcomes": ["error", "ok"]},  # c: called twice
        {"tool_outcomes": ["timeout"]},  # c
    ]
    used = tool_use(fields, ["a", "a", "b", "b", "c", "c"])
    assert used == {CALLING_METRIC: 3 / 6, GROUPS_CALLING_METRIC: 2 / 3}
    assert tool_use([{}], ["a"]) == {CALLING_METRIC: 0.0, GROUPS_CALLING_METRIC: 0.0}


RECORDED = Path(__file__).parent / "recorded"


def recorded_steps(name: str) -> dict[int, dict[str, float]]:
    """verl's console lines of a real run's first steps (sync: bench/cpu_training, hf engine;
    colocate-async: tests/e2e/test_cpu_training.py's overlap run)."""
    return console_steps((RECORDED / name).read_text())


def test_verls_console_lines_are_read_numpy_scalars_included():
    steps = recorded_steps("verl_steps_colocate_async.log")
    assert sorted(steps) == [1, 2, 3]
    step = steps[2]
    assert step["timing_s/gen"] == pytest.approx(0.010769460997835267)
    assert step["toolrl/trajectories_trained"] == 3
    # printed as np.float64(1.0) / np.int64(1): dropped by a plain float() before
    assert step["training/off_policy/trajectory_staleness_worst/mean"] == 1.0
    assert step["training/off_policy/trajectory_staleness_worst/max"] == 1.0


def test_idle_fractions_of_a_recorded_sync_step():
    step = recorded_steps("verl_steps_sync_hf.log")[2]  # gen 2.01 s of a 2.55 s step
    fractions = idle_fractions(step, "sync")
    assert fractions[TRAINER_IDLE_METRIC] == pytest.approx(2.014663713999653 / 2.546769829999903)
    assert fractions[TRAINER_IDLE_METRIC] == pytest.approx(0.791, abs=0.001)
    # rollout and update share the workers: the rollout sleeps whenever it is not sampling
    assert fractions[ROLLOUT_IDLE_METRIC] == pytest.approx(1 - fractions[TRAINER_IDLE_METRIC])


def test_idle_fractions_of_a_recorded_colocate_async_step():
    step = recorded_steps("verl_steps_colocate_async.log")[2]  # gen 0.011 s of a 0.327 s step
    fractions = idle_fractions(step, "colocate-async")
    assert fractions[TRAINER_IDLE_METRIC] == pytest.approx(0.0329, abs=0.0001)
    assert fractions[ROLLOUT_IDLE_METRIC] == pytest.approx(0.9671, abs=0.0001)


def test_separate_async_rollout_is_idle_only_for_the_weight_sync():
    # the recorded timings of an async step, read as separate-async's: the rollout workers generate
    # through the step but for update_weights (0.025 s of 0.327 s)
    step = recorded_steps("verl_steps_colocate_async.log")[2]
    fractions = idle_fractions(step, "separate-async")
    assert fractions[ROLLOUT_IDLE_METRIC] == pytest.approx(0.025026365998201072 / 0.32710557200334733)
    assert fractions[TRAINER_IDLE_METRIC] == pytest.approx(0.0329, abs=0.0001)
    without_sync = {k: v for k, v in step.items() if k != "timing_s/update_weights"}
    assert idle_fractions(without_sync, "separate-async")[ROLLOUT_IDLE_METRIC] == 0.0


def test_idle_fractions_need_the_step_timings_and_a_known_mode():
    assert idle_fractions({"val-core/gsm8k/acc/mean@1": 0.2}, "sync") == {}
    assert idle_fractions({"timing_s/gen": 1.0, "timing_s/step": 0.0}, "sync") == {}
    with pytest.raises(ValueError, match=r"unknown trainer mode 'colocate_async'.*spec.trainer.mode"):
        idle_fractions({"timing_s/gen": 1.0, "timing_s/step": 2.0}, "colocate_async")


def test_idle_fractions_lag_and_stale_drops_reach_the_gauges():
    m = TrainerMetrics()
    step = recorded_steps("verl_steps_colocate_async.log")[2]
    step.update(idle_fractions(step, "colocate-async"))
    step["training/off_policy/evicted_samples"] = 2.0  # two prompt groups dropped past the bound
    m.record_step(step, step=2)
    assert value(m, "toolrl_trainer_idle_fraction") == pytest.approx(0.0329, abs=0.0001)
    assert value(m, "toolrl_trainer_rollout_idle_fraction") == pytest.approx(0.9671, abs=0.0001)
    assert value(m, "toolrl_trainer_off_policy_lag_mean") == 1.0
    assert value(m, "toolrl_trainer_off_policy_lag_max") == 1.0
    assert value(m, "toolrl_trainer_stale_groups_dropped_total") == 2.0
    m.record_step({"timing_s/step": 1.0}, step=3)  # a step that dropped none
    assert value(m, "toolrl_trainer_stale_groups_dropped_total") == 2.0
