"""The pure autoscaling decision: windows, delay, clamping, rollout awareness, holding on bad metrics."""

import itertools

import pytest
import yaml
from chartgen.crd_defaults import spec_schema
from chartgen.outputs import CRD_SOURCE
from toolrl_operator import scale_decision as a
from toolrl_operator.job import SpecError, parse_spec

SPEC_SCHEMA = spec_schema(yaml.safe_load(CRD_SOURCE.read_text()))
REQUIRED = {"model": {"path": "m"}, "data": {"trainFiles": ["t"]}, "tools": [{"name": "p", "type": "python"}]}


def typed(spec):
    """A job's spec as the operator reads it: parsed into the typed spec (the CRD's defaults filled in)."""
    return parse_spec({**REQUIRED, **spec})


def policy(**over):
    base = dict(
        min_replicas=2,
        max_replicas=20,
        target_concurrency=10,
        scale_down_delay_seconds=60,
        rollout_aware=False,
    )
    return a.Policy(**{**base, **over})


class Pool:
    """Feeds ticks every `tick` seconds and follows the decisions, as the handler does."""

    def __init__(self, pol, replicas=2, tick=2.0):
        self.pol, self.replicas, self.tick, self.now, self.state = pol, replicas, tick, 0.0, a.State()
        self.decisions = []

    def step(self, load, phase=None, expected=None, ready=None, problem=""):
        self.now += self.tick
        sig = a.Signals(
            now=self.now,
            current_replicas=self.replicas,
            ready_replicas=self.replicas if ready is None else ready,
            load=load,
            problem=problem,
            phase=phase,
            expected_calls=expected,
        )
        d = a.decide(self.pol, self.state, sig)
        self.state, self.replicas = d.state, d.replicas
        self.decisions.append(d)
        return d

    def run(self, seconds, load, **kw):
        for _ in range(int(seconds / self.tick)):
            d = self.step(load, **kw)
        return d


def test_steady_load_sizes_pool_by_target_concurrency():
    pool = Pool(policy(), replicas=2)
    d = pool.run(120, 45)
    assert d.replicas == 5 and d.reason == "stable"


def test_burst_triggers_panic_within_one_tick():
    pool = Pool(policy(), replicas=2)
    pool.run(60, 5)
    d = pool.step(150)
    assert d.reason == "panic"
    # The 6 s panic window holds three 2 s samples: (5 + 5 + 150) / 3 = 53.3 -> 6 replicas.
    assert d.replicas == 6
    assert [pool.step(150).replicas for _ in range(2)] == [11, 15]


def test_never_beyond_max_nor_below_min():
    pool = Pool(policy(min_replicas=3, max_replicas=7), replicas=3)
    assert pool.run(30, 10_000).replicas == 7
    assert pool.run(400, 0).replicas == 3
    assert all(3 <= d.replicas <= 7 for d in pool.decisions)


def test_panic_never_scales_down():
    pool = Pool(policy(), replicas=2)
    pool.step(200)
    peak = pool.step(200).replicas
    for d in [pool.step(0) for _ in range(20)]:
        assert d.replicas == peak


def test_scale_down_waits_for_the_delay():
    pool = Pool(policy(scale_down_delay_seconds=60), replicas=2)
    pool.run(120, 100)
    assert pool.replicas == 10
    t_drop = pool.now
    while pool.step(0).replicas == 10:
        assert pool.now - t_drop <= 200
    # The stable window (60 s) has to forget the load, then the delay (60 s) has to pass.
    assert pool.now - t_drop > 60
    assert pool.decisions[-2].reason in ("scale-down-delay", "panic")


def test_oscillating_load_does_not_flap():
    pool = Pool(policy(scale_down_delay_seconds=120), replicas=2)
    for _ in range(10):
        pool.run(10, 80)
        pool.run(10, 20)
    sizes = [d.replicas for d in pool.decisions[10:]]
    changes = sum(1 for x, y in itertools.pairwise(sizes) if x != y)
    assert changes <= 2


def test_missing_metrics_hold_the_current_size():
    pool = Pool(policy(), replicas=6)
    d = pool.step(None, problem="Prometheus at http://p:9090 unreachable")
    assert (d.replicas, d.reason) == (6, "metrics-unavailable")
    assert "unreachable" in d.message
    # Long outage: never drifts.
    assert {pool.step(None).replicas for _ in range(100)} == {6}


def test_missing_metrics_hold_the_deployments_size_within_the_jobs_bounds():
    """The loop writes each decision to the Deployment itself, so its size is the last decision (or
    one the sync set: a suspended job's 0, a clamp): held while the load is unknown, within bounds."""
    sig = a.Signals(now=1.0, current_replicas=5, ready_replicas=3, load=None)
    d = a.decide(policy(), a.State(), sig)
    assert (d.replicas, d.reason) == (5, "metrics-unavailable")
    assert "holding 5 replicas" in d.message
    assert a.decide(policy(max_replicas=4), a.State(), sig).replicas == 4


def test_hold_after_restart_before_scaling_down():
    pool = Pool(policy(scale_down_delay_seconds=60), replicas=12)
    assert pool.step(0).replicas == 12
    assert pool.run(58, 0).replicas == 12
    assert pool.run(10, 0).replicas == 2


def test_rollout_aware_prescales_at_generation_start():
    pool = Pool(policy(rollout_aware=True, burst_cap=300), replicas=2)
    pool.run(20, 0, phase="training", expected=1200)
    d = pool.step(0, phase="generating", expected=1200)
    assert (d.replicas, d.reason) == (20, "rollout-prescale")  # min(1200, cap 300) / 10, clamped to 20


def test_reactive_ignores_the_phase():
    pool = Pool(policy(rollout_aware=False, burst_cap=300), replicas=2)
    pool.run(20, 0, phase="training", expected=1200)
    assert pool.step(0, phase="generating", expected=1200).replicas == 2


def test_training_drops_to_min_without_the_delay_once_its_length_is_known():
    pool = Pool(policy(rollout_aware=True, scale_down_delay_seconds=600, prewarm_seconds=5), replicas=2)
    pool.run(60, 150, phase="generating", expected=150)
    assert pool.replicas == 15
    pool.step(0, phase="scoring")
    assert pool.replicas == 15  # scoring may run tools (code-execution rewards): normal delay
    pool.run(30, 0, phase="training", expected=150)
    assert (pool.replicas, pool.decisions[-1].reason) == (15, "rollout-training")  # first one: held
    pool.run(60, 150, phase="generating", expected=150)
    pool.run(6, 0, phase="training", expected=150)
    assert (pool.replicas, pool.decisions[-1].reason) == (2, "rollout-training")


def test_prewarm_before_the_expected_end_of_training():
    pol = policy(rollout_aware=True, scale_down_delay_seconds=600, prewarm_seconds=20)
    pool = Pool(pol, replicas=2)
    for _ in range(2):
        pool.run(40, 100, phase="generating", expected=100)
        pool.run(100, 0, phase="training", expected=100)
    # Second training phase: pool at min first, then pre-warmed about 20 s before the 100 s are up.
    training = pool.decisions[-50:]
    first_warm = next(i for i, d in enumerate(training) if d.reason == "rollout-prewarm")
    assert training[3].replicas == 2  # once the panic window has forgotten the generation load
    # The burst learnt from the first generation: peak 100 x (100 / 100 calls expected) x 1.25 headroom.
    assert 38 <= first_warm <= 42 and training[first_warm].replicas == 13
    assert all(d.replicas == 13 for d in training[first_warm:])


def test_unknown_phase_keeps_the_last_known_one():
    pool = Pool(policy(rollout_aware=True), replicas=2)
    pool.run(10, 0, phase="training", expected=100)
    d = pool.step(0, phase=None, expected=100)
    assert d.reason == "rollout-training"


def test_message_names_the_inputs():
    d = Pool(policy(rollout_aware=True), replicas=2).step(37, phase="generating", expected=90)
    for part in ("2 -> ", "load now 37", "target 10", "phase generating", "expected burst 90"):
        assert part in d.message


def test_policy_from_job_spec_reads_crd_fields_and_caps_the_burst():
    spec = typed(
        {
            "toolPool": {
                "replicas": {"min": 2, "max": 64},
                "targetConcurrencyPerReplica": 16,
                "scaleDownDelaySeconds": 120,
                "rolloutAware": True,
            },
            "algorithm": {"trainBatchSize": 16, "rolloutsPerPrompt": 4},
            "rollout": {"maxParallelCalls": 2, "toolCall": {"maxConcurrency": 256}},
        }
    )
    pol = a.Policy.from_job_spec(spec)
    assert (pol.min_replicas, pol.max_replicas, pol.target_concurrency) == (2, 64, 16)
    assert pol.scale_down_delay_seconds == 120 and pol.rollout_aware
    assert pol.burst_cap == 128  # 16 x 4 x 2 < 256
    assert a.expected_burst(pol, a.State(), 5000) == 128 and a.expected_burst(pol, a.State(), 40) == 40
    assert a.expected_burst(pol, a.State(), None) is None


def test_burst_is_learnt_from_the_previous_generation_and_follows_the_expected_calls():
    pool = Pool(policy(rollout_aware=True, burst_cap=1000, max_replicas=100), replicas=2)
    pool.run(30, 0, phase="training", expected=2000)
    first = pool.step(0, phase="generating", expected=2000)
    assert first.replicas == 100  # no history yet: min(2000 expected, cap 1000) / 10, clamped
    pool.run(30, 200, phase="generating", expected=2000)
    pool.run(30, 0, phase="training", expected=3000)  # the policy learnt to call tools more often
    d = pool.step(0, phase="generating", expected=3000)
    assert (d.replicas, d.reason) == (38, "rollout-prescale")  # 200 x 3000 / 2000 x 1.25 = 375 -> 38


@pytest.mark.parametrize(
    ("pool", "error"),
    [
        ({"replicas": {"min": 2, "max": 0}}, r"spec\.toolPool\.replicas\.max: Input should be greater"),
        ({"replicas": {"min": 5, "max": 2}}, "min <= max"),  # a CEL rule of the CRD: the policy checks it
        ({"targetConcurrencyPerReplica": 0}, r"spec\.toolPool\.targetConcurrencyPerReplica: Input should be"),
        ({"targetConcurrencyPerReplica": "x"}, r"targetConcurrencyPerReplica: Input should be a valid int"),
    ],
)
def test_bad_policy_says_what_to_fix(pool, error):
    with pytest.raises((a.PolicyError, SpecError), match=error):
        a.Policy.from_job_spec(typed({"toolPool": {"rolloutAware": False, **pool}, **TRAINER_SIDE}))


TRAINER_SIDE = {
    "algorithm": {"trainBatchSize": 16, "rolloutsPerPrompt": 4},
    "rollout": {"maxParallelCalls": 1, "toolCall": {"maxConcurrency": 256}},
}


def test_rollout_aware_has_no_fallback_of_its_own():
    """The CRD defaults rolloutAware to true; a second default (false) in the policy contradicted it.
    The policy reads the typed spec, whose only default is the CRD's."""
    pool = {"replicas": {"min": 1, "max": 2}, "targetConcurrencyPerReplica": 4, "scaleDownDelaySeconds": 0}
    crd_default = SPEC_SCHEMA["properties"]["toolPool"]["properties"]["rolloutAware"]["default"]
    unset = typed({"toolPool": pool, **TRAINER_SIDE})
    assert a.Policy.from_job_spec(unset).rollout_aware is crd_default is True
    off = typed({"toolPool": {**pool, "rolloutAware": False}, **TRAINER_SIDE})
    assert not a.Policy.from_job_spec(off).rollout_aware


def test_the_burst_cap_has_no_fallbacks_of_its_own():
    """maxParallelCalls and the rest are the CRD's defaults: a spec without them gets the CRD's."""
    pool = {
        "replicas": {"min": 1, "max": 2},
        "targetConcurrencyPerReplica": 4,
        "scaleDownDelaySeconds": 0,
        "rolloutAware": True,
    }
    rollout = {"toolCall": {"maxConcurrency": 256}}
    parallel = SPEC_SCHEMA["properties"]["rollout"]["properties"]["maxParallelCalls"]["default"]
    spec = typed({"toolPool": pool, "algorithm": TRAINER_SIDE["algorithm"], "rollout": rollout})
    assert a.Policy.from_job_spec(spec).burst_cap == min(256, 16 * 4 * parallel)
