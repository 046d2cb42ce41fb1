"""verl's real GRPO/PPO loop on the CPU, through the RayJob's own entry point.

`python -m trainer_entry run --spec job.json` with `gpusPerWorker: 0` and `rollout.engine: hf` or `vllm`
(vLLM's CPU build behind verl's own vLLM server), the tiny model warmed up to call tools, a real
tool_sandbox process as the pool, and the job's `J-trainer` ServiceAccount on the real local apiserver
for `status.progress`: rollouts call the pool, the reward varies within groups, the actor's gradients
are non-zero, the rollout engine generates with the actor's updated weights at every step (its
log-probs agree with the actor's), and the trainer's metrics (:9400) expose tool latency and reward
while it runs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from harness.localcluster.cluster import free_port
from harness.operator_process import get_json, mount_service_account, wait_until
from harness.sandbox_process import SandboxProcess
from harness.tiny_models import warmed_model
from toolrl_operator import naming
from trainer_entry.metrics import console_steps
from trainer_entry.tiny_model import write_toy_data

STEPS = 3
# verl's start-up dominates a run (4-8 min on a loaded 2-core machine: imports, Ray, ~30 actors);
# pytest's default of 900 s is for the rest of the suite.
pytestmark = pytest.mark.timeout(3600)
GRAD_NORM = "actor/grad_norm"
ADVANTAGES = ("critic/advantages/max", "critic/advantages/min")  # verl's, of the batch an update trains on
WEIGHTS = re.compile(r"L2 distance from the initial weights ([\d.eE+-]+)")
# verl's rollout-vs-actor log-prob metrics (calculate_log_probs, on by default): the rollout engine's
# log-probs of the sampled tokens against the actor's, recomputed on the actor's current weights.
# Measured with vLLM's CPU build (bf16) on the tiny model: |diff| max 0.005-0.016, Pearson > 0.9999
# at every step; with the weight sync after step 1 skipped (a stale engine, the actor moved by
# grad_norm 0.37 at lr 1e-3): max 0.57 and 0.75, Pearson 0.94 and 0.93 at steps 2 and 3.
MAX_LOG_PROB_DIFF = 0.1
MIN_LOG_PROB_PEARSON = 0.99


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model (heads of 32, what vLLM's CPU attention takes), warmed up to write python-tags
    calls (cached across runs by its inputs: harness.tiny_models), and the toy task's data."""
    root = tmp_path_factory.mktemp("toy")
    model, result = warmed_model(root, "python-tags")
    assert result.call_rate >= 0.2, f"the warm-up did not teach the tool-call format: {result}"
    return {"model": model, "data": write_toy_data(root / "data")}


# A function tool (issue 21): the user's source in a ConfigMap; a model warmed up to call it by name
# (hermes) gives it the answer and reads it back.
FUNCTION_SOURCE = "def echo_number(n: int) -> int:\n    return n\n"
FUNCTION_TOOL = {
    "name": "echo_number",
    "type": "function",
    "description": "Give back the number it is called with.",
    "function": {"configMap": {"name": "cpu-tools", "key": "tools.py"}},
    "parameters": {
        "type": "object",
        "properties": {"n": {"type": "integer", "description": "the number"}},
        "required": ["n"],
    },
    "timeoutSeconds": 5,
}


@pytest.fixture(scope="module")
def toy_function(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model warmed up to call FUNCTION_TOOL in hermes, and the toy task prompted for it."""
    root = tmp_path_factory.mktemp("toy-function")
    model, result = warmed_model(root, "hermes", tools=[FUNCTION_TOOL])
    assert result.call_rate >= 0.2, f"the warm-up did not teach the function call: {result}"
    return {"model": model, "data": write_toy_data(root / "data", tool="echo_number", protocol="hermes")}


def pool_tools(cluster, namespace: str, name: str, tmp_path: Path) -> list[dict[str, Any]]:
    """The tools.yaml the operator wrote for the job's pool, each function tool's source fetched from
    its ConfigMap to where this local pool (standing in for the pool's pod, which mounts it at
    `source`) reads it."""
    wanted = naming.config_name(name)

    def written() -> str | None:
        found = get_json(cluster, "configmap", "-n", namespace)["items"]
        return next((c["data"]["tools.yaml"] for c in found if c["metadata"]["name"] == wanted), None)

    text = wait_until(written, 60, f"the operator's ConfigMap {wanted}", interval=0.5)
    tools = yaml.safe_load(text)["tools"]
    for tool in tools:
        if tool["type"] == "function":
            ref = tool["function"]["configMap"]
            source = get_json(cluster, "configmap", ref["name"], "-n", namespace)["data"][ref["key"]]
            local = tmp_path / "functions" / Path(tool["source"]).name
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(source)
            tool["source"] = str(local)
    return tools


def cpu_job(
    name: str,
    toy: dict[str, Path],
    steps: int = STEPS,
    engine: str = "hf",
    protocol: str = "python-tags",
    **algorithm: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"path": str(toy["model"])},
            "data": {"trainFiles": [str(toy["data"])], "maxPromptLength": 160, "maxResponseLength": 48},
            "algorithm": {
                "advantageEstimator": "grpo",
                "rolloutsPerPrompt": 4,
                "trainBatchSize": 2,
                "learningRate": 1.0e-3,
                "totalTrainingSteps": steps,
                "klLoss": {"enabled": False, "coef": 0.001},
                **algorithm,
            },
            "rollout": {
                "engine": engine,
                "protocol": protocol,
                "maxToolTurns": 1,
                "toolCall": {"timeoutSeconds": 20, "maxRetries": 2, "retryDelaySeconds": 0.5},
            },
            "tools": [{"name": "python", "type": "python", "timeoutSeconds": 5}],
            "toolPool": {"replicas": {"min": 1, "max": 2}},
            "reward": {"preset": "exact-match"},
            "cluster": {"workers": {"replicas": 1, "gpusPerWorker": 0}},
            "checkpoint": {"saveFreq": -1, "resume": "disable"},
        },
    }


class MetricsWatch:
    """Scrapes the trainer's /metrics every second while it runs; keeps every answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(requests.RequestException):
                self.samples.append(requests.get(self.url, timeout=2).text)
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def max_value(self, series: str) -> float | None:
        """The largest value any scrape showed for a series (name with labels, as exposed)."""
        values = [
            float(line.rsplit(" ", 1)[1])
            for text in self.samples
            for line in text.splitlines()
            if line.startswith(series)
        ]
        return max(values) if values else None


def check_rollouts_use_the_actors_weights(output: str, steps: int) -> None:
    """At every step the rollout engine's log-probs agree with the actor's (so it generated with the
    actor's weights), and an update moved the actor before the last step (so a later step's agreement
    shows the moved weights reached the engine)."""
    logged = console_steps(output)
    assert sorted(logged) == list(range(1, steps + 1)), f"steps logged: {sorted(logged)}"
    for step, values in logged.items():
        diff = values.get("training/rollout_probs_diff_max", float("nan"))
        pearson = values.get("training/rollout_actor_probs_pearson_corr", float("nan"))
        assert values.get("training/rollout_probs_diff_valid") == 1, f"step {step}: no rollout log-probs"
        assert diff <= MAX_LOG_PROB_DIFF and pearson >= MIN_LOG_PROB_PEARSON, (
            f"step {step}: the rollout engine's log-probs differ from the actor's (max |diff| {diff}, "
            f"Pearson {pearson}): it did not generate with the actor's current weights"
        )
    moved = [step for step, values in logged.items() if values.get(GRAD_NORM, 0) > 0]
    assert moved and moved[0] < steps, f"no update before the last step moved the actor: {logged}"


def pool_calls(pool: SandboxProcess, outcome: str = "", tool: str = "") -> float:
    """Calls the pool counted (with `outcome`, `tool`: only those), from its own /metrics."""
    text = requests.get(pool.metrics_url, timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("toolrl_tool_calls_total{")
        and f'outcome="{outcome}' in line
        and f'tool="{tool}' in line
    )


def apply_job(cluster, namespace: str, tmp_path: Path, job: dict[str, Any]) -> tuple[Path, dict[str, str]]:
    """Apply the job; once the operator made its trainer ServiceAccount, write its job.json (with the uid
    the operator writes) and return it with the trainer's environment for the API (not yet the pool's)."""
    name = job["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
    wait_until(
        lambda: get_json(cluster, "trj", name, "-n", namespace).get("status", {}).get("phase"),
        120,
        f"the operator reconciled {name} (its trainer ServiceAccount and Role exist)",
        interval=0.5,
    )
    host, port = mount_service_account(cluster, namespace, tmp_path / "sa", name)
    spec_file = tmp_path / "job.json"
    uid = get_json(cluster, "trj", name, "-n", namespace)["metadata"]["uid"]  # as the operator writes it
    spec_file.write_text(json.dumps({**job, "metadata": {"name": name, "namespace": namespace, "uid": uid}}))
    env = {
        **os.environ,
        "TOOLRL_JOB_NAME": name,
        "TOOLRL_JOB_NAMESPACE": namespace,
        "TOOLRL_SERVICE_ACCOUNT_DIR": str(tmp_path / "sa"),
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": port,
    }
    env.pop("RAY_ADDRESS", None)
    return spec_file, env


def run_trainer(
    spec_file: Path, env: dict[str, str], tmp_path: Path, timeout: float = 1800
) -> tuple[int, str]:
    """`python -m trainer_entry run` as the RayJob runs it; returns its exit code and output."""
    log = tmp_path / "trainer.log"
    argv = [
        sys.executable,
        "-m",
        "trainer_entry",
        "run",
        "--spec",
        str(spec_file),
        "--workdir",
        str(tmp_path / "workdir"),
    ]
    with log.open("wb") as out:
        rc = subprocess.run(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        ).returncode
    return rc, log.read_text(errors="replace")


def train(
    cluster,
    namespace: str,
    operator,
    tmp_path: Path,
    toy: dict[str, Path],
    name: str,
    spec: dict[str, Any] | None = None,
    pool_args: tuple[str, ...] = (),
    tool_call: dict[str, Any] | None = None,
    load: Callable[[SandboxProcess], contextlib.AbstractContextManager[Any]] | None = None,
    steps: int = STEPS,
    engine: str = "hf",
    protocol: str = "python-tags",
    min_calls: int | None = None,
    **algorithm: Any,
) -> tuple[str, MetricsWatch, float]:
    """Run the job to its end; returns the trainer's output, its scraped metrics and the calls the
    pool rejected. `load(pool)` is entered around the trainer's run (other traffic on the pool, faults).
    The pool must serve at least `min_calls` calls (default: one per step)."""
    job = cpu_job(name, toy, steps, engine, protocol, **algorithm)
    job["spec"].update(spec or {})
    job["spec"]["rollout"]["toolCall"].update(tool_call or {})
    spec_file, env = apply_job(cluster, namespace, tmp_path, job)
    metrics_port = free_port()
    tools = pool_tools(cluster, namespace, name, tmp_path)
    with SandboxProcess.start(tmp_path / "pool", *pool_args, tools=tools) as pool:
        calls_before = pool_calls(pool)
        env.update(TOOLRL_TOOL_POOL_URL=pool.url, TOOLRL_METRICS_PORT=str(metrics_port))
        watch = MetricsWatch(f"http://127.0.0.1:{metrics_port}/metrics")
        with load(pool) if load else contextlib.nullcontext():
            rc, output = run_trainer(spec_file, env, tmp_path)
        watch.stop()
        assert rc == 0, f"trainer exited {rc}:\n{output[-6000:]}"
        served = pool_calls(pool) - calls_before
        rejected = pool_calls(pool, "rejected")
        for tool in job["spec"]["tools"]:  # each tool's calls are counted by name
            if tool["type"] == "function":
                assert pool_calls(pool, "ok", tool["name"]) > 0, f"the pool ran no call of {tool['name']}"

    updates = [values for values in console_steps(output).values() if GRAD_NORM in values]
    assert len(updates) >= steps, f"verl logged {len(updates)} actor updates:\n{output[-3000:]}"
    # an update whose batch carried a learning signal (an advantage not 0) moves the actor; one whose
    # every group scored alike (GRPO: advantages all 0, seen in one of four runs of the 4-step
    # separate-async job of the tiny model) has nothing to move it by, whatever the code does
    assert all(ADVANTAGES[0] in v and ADVANTAGES[1] in v for v in updates), updates[0].keys()
    signal = [v[GRAD_NORM] for v in updates if any(v[key] != 0 for key in ADVANTAGES)]
    grad_norms = [v[GRAD_NORM] for v in updates]
    assert not signal or max(signal) > 0, f"no step with a learning signal moved the actor: {grad_norms}"
    if not signal:
        print(f"\n{name}: no batch carried a learning signal (advantages all 0); grad_norm {grad_norms}")
    if engine == "hf":  # its server logs how far the weights it received are from the initial ones
        distances = [float(v) for v in WEIGHTS.findall(output)]
        assert distances and distances[-1] > 0, f"the rollout engine never got changed weights: {distances}"
    if job["spec"].get("trainer", {}).get("mode", "sync") == "sync":  # async trains on older weights' samples
        check_rollouts_use_the_actors_weights(output, steps)
    least = steps if min_calls is None else min_calls
    assert served >= least, f"the pool served {served} calls for {steps} steps of tool-using rollouts"

    status = get_json(cluster, "trj", name, "-n", namespace)["status"]
    assert status["progress"]["step"] == steps and status["progress"]["totalSteps"] == steps, status
    assert "rewardMean" in status["progress"]
    assert (watch.max_value("toolrl_trainer_tool_call_duration_seconds_count") or 0) > 0, "no tool latency"
    assert watch.max_value("toolrl_trainer_reward_mean") is not None, "no reward exposed"
    assert (watch.max_value("toolrl_trainer_step") or 0) >= 1
    return output, watch, rejected


# DAPO's knobs (issue 38), trained through on the vLLM run: clip-higher, a loss aggregation other than verl's
# default, and an overlong penalty whose buffer penalises every response past 4 tokens: verl's dapo manager
# penalises the tokens past maxResponseLength - bufferLength, so the buffer is 124 of the run's 128 tokens
# (a wrong answer scores 0 by exact-match, and any of more than 4 tokens then scores below 0).
DAPO_KNOBS = {
    "clipRatio": {"low": 0.2, "high": 0.28},
    "lossAggregation": "seq-mean-token-mean",
    # the group filter runs in the sampler; its dropping and bound are tested in verl's own sampling loop
    # (tests/unit/trainer_entry/test_reward_failure.py): here the run trains through with it on
    "dynamicSampling": {"enabled": True},
}
PPO_RESPONSE_LENGTH = 128
DYNAMIC_SAMPLING_LOG = "dynamic sampling: groups whose rollouts all scored alike on 'reward' are dropped"
OVERLONG_PENALTY = {"enabled": True, "bufferLength": PPO_RESPONSE_LENGTH - 4, "penaltyFactor": 1.0}


def test_ppo_with_critic_kl_loss_and_dapo_knobs_on_vllms_cpu_build_calls_a_function_tool_and_checkpoints(
    cluster, namespace, operator, tmp_path, toy_function
) -> None:
    """PPO on `rollout.engine: vllm` on CPUs, in one run (verl's start-up is most of a run's time):

    - GAE (a critic) and a KL loss (a reference model), checkpointing at the last step: the actor's and
      the critic's checkpoints are written where the RayJob mounts the checkpoint volume, here a local
      directory;
    - the model calls a function tool (hermes, verl's tool agent loop) whose source is a ConfigMap,
      through the pool as the operator configured it (`train` checks the pool counted its calls);
    - verl's own vLLM server and replica (AsyncLLM, hybrid mode) on vLLM's CPU build (CPUvLLMHttpServer,
      no HFRolloutServer), and verl's weight sync from the FSDP actor into vLLM after every step (over
      shared memory): everything of the GPU path but the CUDA kernels. `train` checks the rollout
      engine's log-probs agree with the actor's at every step (it generated with the actor's weights);
    - DAPO's clip-higher, seq-mean-token-mean loss, overlong penalty and dynamic sampling as spec fields:
      verl's config (which its TaskRunner prints) has them, the job's sampler filters groups on the
      metric, and the penalty reached the scores (exact-match gives 0 or 1; only the penalty makes one
      negative);
    - `train` checks the rest of a run: grad_norm, status.progress and the trainer's metrics.

    The hf engine (its server's weights moving from the initial ones) is covered by this file's other
    runs: the infrastructure-failure (sync GRPO), colocate-async and separate-async tests."""
    started = time.monotonic()
    checkpoints = tmp_path / "checkpoints"
    cluster.kubectl(
        "create", "configmap", "cpu-tools", "-n", namespace, "--from-literal", f"tools.py={FUNCTION_SOURCE}"
    )
    output, _, _ = train(
        cluster,
        namespace,
        operator,
        tmp_path,
        toy_function,
        "cpu-ppo-vllm",
        spec={
            # a volume is what allows saving (the RayJob mounts it; this run writes to extraArgs' dir)
            "checkpoint": {"saveFreq": STEPS, "resume": "disable", "volume": {"emptyDir": {}}},
            "trainer": {"extraArgs": [f"trainer.default_local_dir={checkpoints}"]},
            "tools": [FUNCTION_TOOL],
            "data": {
                "trainFiles": [str(toy_function["data"])],
                "maxPromptLength": 512,
                "maxResponseLength": PPO_RESPONSE_LENGTH,
            },
            "reward": {"preset": "exact-match", "overlongPenalty": OVERLONG_PENALTY},
        },
        engine="vllm",
        protocol="hermes",
        # The penalty rewards short answers, and the actor learns to stop calling within the run (measured
        # with 2 rollouts per prompt: 2, 1 and 0 of 4 trajectories called at steps 1-3), so the calls come
        # from steps 1-2: 8 trajectories a step at the warmed model's call rate of ~0.4-0.5 make a run with
        # none < 0.3 % likely (`train` also checks the function tool's own calls)
        min_calls=1,
        advantageEstimator="gae",
        rolloutsPerPrompt=4,
        klLoss={"enabled": True, "coef": 0.01},
        **DAPO_KNOBS,
    )
    saved = checkpoints / f"global_step_{STEPS}"
    assert (saved / "actor").is_dir() and (saved / "critic").is_dir(), sorted(checkpoints.rglob("*"))[:20]
    assert any((saved / "actor").iterdir()), "the actor's checkpoint is empty"
    assert "CPUvLLMHttpServer" in output, "verl's vLLM server (trainer_entry.vllm_on_cpu) did not run"
    assert "HFRolloutServer" not in output
    for setting in (  # lines of verl's config as its TaskRunner pprints it
        "'adv_estimator': 'gae'",
        "'use_kl_loss': True",
        "'clip_ratio_high': 0.28,",
        "'loss_agg_mode': 'seq-mean-token-mean',",
        "'overlong_buffer_cfg': {'enable': True,",
        "'name': 'dapo',",  # reward.reward_manager's: nothing else in the config is named so
        DYNAMIC_SAMPLING_LOG,
    ):
        assert setting in output, f"verl's config has no {setting}"
    # pprint's next line, which Ray prefixes with the actor's name and pid
    filter_groups = r"'filter_groups': \{'_target_': '[\w.]+FilterGroupsConfig',[^']*'enable': True,"
    assert re.search(filter_groups, output), "verl's config does not enable algorithm.filter_groups"
    lowest = [values["critic/score/min"] for values in console_steps(output).values()]
    assert lowest and min(lowest) < 0, f"no score was penalised for length: critic/score/min by step {lowest}"
    print(f"PPO with vLLM's CPU build: {STEPS} steps in {time.monotonic() - started:.0f}s")


ASYNC_STEPS = 3
POLICY_VERSIONS = 2  # the tightest bound colocate-async allows: samples begun one update earlier
BATCH = 2 * 4  # trainBatchSize x rolloutsPerPrompt
# Infrastructure failures injected into the async runs as into the sync one (`FirstStepHog`): a pool of
# one slot and one queue place, kept busy by other traffic until step 1 is trained, rejects (429) a
# trainer call that arrives while another waits; no retry. The breaker lets a step train on what is left
# (it holds only a step left with nothing): these runs check exclusion under overlap, the sync run checks
# the breaker's hold. (With the hog on all the run, nearly every trajectory that called the tool was
# excluded: rewards all 0, grad_norm 0 at every step.)
SATURATED_POOL = ("--capacity", "1", "--queue-size", "1", "--workers", "1")
NO_RETRY_NO_BREAKER = {"maxRetries": 0, "maxInfraFailureRatio": 1.0}


def check_rejected_calls_were_excluded(
    cluster,
    namespace: str,
    name: str,
    output: str,
    watch: MetricsWatch,
    rejected: float,
    hog: FirstStepHog,
    steps: int,
) -> list[int]:
    """The trainer calls the pool rejected (its own count, less the hog's) are excluded: the trainer's
    status and metrics count them, no update trained on one, and the updates trained on fewer
    trajectories than their batches asked for, by no more than were excluded. Returns the trajectories
    trained per step."""
    injected = rejected - hog.rejected
    assert hog.calls > 0 and injected > 0, (
        f"the pool rejected no trainer call ({rejected}, hog {hog.rejected})"
    )
    excluded = get_json(cluster, "trj", name, "-n", namespace)["status"]["progress"]["trajectoriesExcluded"]
    assert 0 < excluded.get("rejected", 0) <= injected, (
        f"excluded {excluded}, trainer calls rejected {injected}"
    )
    # the metrics showed them while the run went on (a rollout still under way may add some after the
    # last scrape: the status is written once more at the end)
    scraped = watch.max_value('toolrl_trajectories_excluded_total{reason="rejected"}') or 0
    assert 0 < scraped <= excluded["rejected"], f"scraped {scraped}, status {excluded}"
    trained = per_step(output, TRAINED)
    tainted = per_step(output, TAINTED)
    assert len(trained) == len(tainted) == steps, f"updates logged: {trained}, {tainted}"
    assert tainted == [0] * steps, f"trajectories with an infrastructure failure were trained on: {tainted}"
    lost = sum(BATCH - count for count in trained)
    assert 0 < lost <= sum(excluded.values()), f"trained {trained} of {BATCH} per step, excluded {excluded}"
    return trained


def test_colocate_async_overlaps_rollouts_with_updates_within_the_staleness_bound(
    cluster, namespace, operator, tmp_path, toy
) -> None:
    """`trainer.mode: colocate-async`: verl's colocated asynchronous trainer with our hooks, on engine hf.
    A warm-up batch runs generation a batch ahead; after each step's sample verl pauses generation (the
    hf server aborts the request it samples and holds the rest), updates the weights and resumes it, so
    later steps train on samples begun (or wholly made) by older weights, never more than
    maxPolicyVersions apart. Until step 1 is trained the pool is saturated (`FirstStepHog`): the
    trajectories whose call it rejected are excluded from verl's async replay buffer, none is trained on
    (`check_rejected_calls_were_excluded`). `train` checks the rest of a run: the pool's calls, grad_norm,
    the rollout engine's weights moving, status.progress and the trainer's metrics."""
    started = time.monotonic()
    hog = FirstStepHog(cluster, namespace, "cpu-async")
    output, watch, rejected = train(
        cluster,
        namespace,
        operator,
        tmp_path,
        toy,
        "cpu-async",
        spec={"trainer": {"mode": "colocate-async", "async": {"maxPolicyVersions": POLICY_VERSIONS}}},
        pool_args=SATURATED_POOL,
        tool_call=NO_RETRY_NO_BREAKER,
        load=hog.run,
        steps=ASYNC_STEPS,
    )
    assert "Added 2 warmup prompts" in output, "verl sent no warm-up batch (trainBatchSize 2)"
    pauses = output.count("hf rollout: generation paused")
    assert pauses >= ASYNC_STEPS, f"verl paused generation {pauses} times for {ASYNC_STEPS} updates"
    logged = console_steps(output)
    assert sorted(logged) == list(range(1, ASYNC_STEPS + 1)), f"steps logged: {sorted(logged)}"
    spans = [values["training/off_policy/trajectory_spans/max"] for values in logged.values()]
    # policy versions between the weights that began a trained sample and the trainer's
    lag = [values["training/off_policy/trajectory_staleness_worst/max"] for values in logged.values()]
    assert max(spans) <= POLICY_VERSIONS and max(lag) <= POLICY_VERSIONS - 1, (spans, lag)
    assert max(lag) >= 1, f"every step trained on its own weights' samples: nothing overlapped ({lag})"
    trained = check_rejected_calls_were_excluded(
        cluster, namespace, "cpu-async", output, watch, rejected, hog, ASYNC_STEPS
    )
    print(
        f"colocate-async: {ASYNC_STEPS} steps in {time.monotonic() - started:.0f}s, lag per step {lag}, "
        f"trained {trained} of {BATCH}, {rejected - hog.rejected:.0f} trainer calls rejected"
    )


# 4, not 2: until step 1 the pool rejects the trainer's calls (FirstStepHog), so its tool-latency
# histogram fills only after step 1; with 2 steps the trainer once exited before a scrape saw it. Not 3:
# samples of steps 2 and 3 are begun while the pool is saturated (async), and once (2026-12-06) every
# group trained in all three had one reward (grad_norm 0, 0, 0); a step after them costs ~1 s
SEPARATE_STEPS = 4
SYNCED = re.compile(
    r"gloo checkpoint engine: rollout worker 1 received \d+ tensors \(\d+ bytes\) of step (\d+)"
)


def test_separate_async_generates_on_its_own_worker_group_and_syncs_weights_to_it(
    cluster, namespace, operator, tmp_path, toy
) -> None:
    """`trainer.mode: separate-async`: verl's separate_async trainer with our hooks, on engine hf, two
    worker groups of logical GPUs: the training worker (no rollout on it: hybrid_engine false) and
    `cluster.rolloutWorkers` (verl's standalone rollout pool). Rollouts run all the time there; after each
    step the actor's weights reach the rollout worker through our gloo checkpoint engine, once at start-up
    (step 0) and after every step. Until step 1 is trained the pool is saturated (`FirstStepHog`): the
    trajectories whose call it rejected are excluded, none is trained on
    (`check_rejected_calls_were_excluded`). `train` checks the rest: the pool's calls, grad_norm, the hf
    server's weights moving, status.progress and the trainer's metrics."""
    started = time.monotonic()
    hog = FirstStepHog(cluster, namespace, "cpu-separate")
    output, watch, rejected = train(
        cluster,
        namespace,
        operator,
        tmp_path,
        toy,
        "cpu-separate",
        spec={
            "trainer": {"mode": "separate-async", "async": {"maxPolicyVersions": POLICY_VERSIONS}},
            "cluster": {
                "workers": {"replicas": 1, "gpusPerWorker": 0},
                "rolloutWorkers": {"replicas": 1, "gpusPerWorker": 0},
            },
        },
        pool_args=SATURATED_POOL,
        tool_call=NO_RETRY_NO_BREAKER,
        load=hog.run,
        steps=SEPARATE_STEPS,
    )
    assert "rollout served by 1 standalone replicas only" in output, "verl colocated a rollout on the trainer"
    synced = [int(s) for s in SYNCED.findall(output)]
    assert synced == list(range(SEPARATE_STEPS + 1)), f"weight syncs to the rollout worker, by step: {synced}"
    logged = console_steps(output)
    assert sorted(logged) == list(range(1, SEPARATE_STEPS + 1)), f"steps logged: {sorted(logged)}"
    lag = [values["training/off_policy/trajectory_staleness_worst/max"] for values in logged.values()]
    assert max(lag) <= POLICY_VERSIONS - 1, lag
    trained = check_rejected_calls_were_excluded(
        cluster, namespace, "cpu-separate", output, watch, rejected, hog, SEPARATE_STEPS
    )
    print(
        f"separate-async: {SEPARATE_STEPS} steps in {time.monotonic() - started:.0f}s, lag per step {lag}, "
        f"trained {trained} of {BATCH}, {rejected - hog.rejected:.0f} trainer calls rejected"
    )


class Hog:
    """Other traffic: one 1-second call after another, until stopped."""

    def __init__(self) -> None:
        self.calls = self.rejected = 0
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, pool: SandboxProcess) -> None:
        def loop() -> None:
            while not self.stopped.is_set():
                body = {"tool": "python", "input": "import time\ntime.sleep(1.0)"}
                with contextlib.suppress(requests.RequestException):
                    answer = pool.post("/v1/execute", body, timeout=60)
                    self.calls += 1
                    self.rejected += answer.status_code == 429
                    if answer.status_code == 429:
                        self.stopped.wait(0.2)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self._thread is not None:
            self._thread.join()

    @contextlib.contextmanager
    def run(self, pool: SandboxProcess) -> Iterator[None]:
        self.start(pool)
        try:
            yield
        finally:
            self.stop()


class FirstStepHog(Hog):
    """`Hog` from the trainer's start until the job's status.progress shows step 1 trained (read through
    the API, as a user would), so the updates after it may learn from rollouts whose calls succeed."""

    def __init__(self, cluster, namespace: str, name: str) -> None:
        super().__init__()
        self.cluster, self.namespace, self.name = cluster, namespace, name

    def _progress_step(self) -> int:
        with contextlib.suppress(subprocess.SubprocessError, KeyError, ValueError):
            status = get_json(self.cluster, "trj", self.name, "-n", self.namespace).get("status") or {}
            return int((status.get("progress") or {}).get("step") or 0)
        return 0

    def _stop_after_first_step(self) -> None:
        while not self.stopped.wait(1.0):
            if self._progress_step() >= 1:
                self.stopped.set()  # the hog's loop ends after its call in flight

    @contextlib.contextmanager
    def run(self, pool: SandboxProcess) -> Iterator[None]:
        self.start(pool)
        watcher = threading.Thread(target=self._stop_after_first_step, daemon=True)
        watcher.start()
        try:
            yield
        finally:
            self.stop()
            watcher.join()


TRAINED = "toolrl/trajectories_trained"  # runner.TRAINED_METRIC (runner imports verl)
TAINTED = "toolrl/infra_failures_in_update"  # runner.TAINTED_METRIC
REGENERATED = "toolrl/batches_regenerated"  # breaker.REGENERATIONS_METRIC


def per_step(output: str, key: str) -> list[int]:
    """`key`'s value at each step whose console line has it (metrics.console_steps), by step."""
    return [int(values[key]) for _, values in sorted(console_steps(output).items()) if key in values]


FAULT_STEPS = 5


def degraded(cluster, namespace: str, name: str) -> dict[str, Any]:
    """The job's ToolPoolDegraded condition ({} before the trainer first wrote it)."""
    status = get_json(cluster, "trj", name, "-n", namespace).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "ToolPoolDegraded"), {})


class Faults:
    """The injected faults, in order: (1) a saturated pool, as in `Hog`: one call at a time and one in
    the queue, other traffic keeping the slot busy, so trainer calls arriving while another waits are
    rejected (429; the client does not retry), until step 1 is done or the breaker first holds a step;
    (2) the tool_sandbox process stopped (SIGSTOP: calls time out at the client, its /readyz does not
    answer) until the job has shown ToolPoolDegraded True for HELD_SECONDS without a break (the breaker
    holds a step and waits for the stopped pool), then continued (SIGCONT). Its controller reads the job
    through the API, as a user would."""

    HELD_SECONDS = 20.0

    def __init__(self, cluster, namespace: str, name: str) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.hog = Hog()
        self.held: dict[str, Any] = {}
        self.rejected_before_stop = 0.0
        self.continued_at = ""
        self.errors: list[BaseException] = []

    def _progress_step(self) -> int:
        status = get_json(self.cluster, "trj", self.name, "-n", self.namespace).get("status") or {}
        return int((status.get("progress") or {}).get("step") or 0)

    def _held_long_enough(self, since: list[float]) -> dict[str, Any] | None:
        """The condition once it has been True for HELD_SECONDS (since[0]: when it was seen turn True)."""
        condition = degraded(self.cluster, self.namespace, self.name)
        if condition.get("status") != "True":
            since.clear()
            return None
        since[:] = since or [time.monotonic()]
        return condition if time.monotonic() - since[0] >= self.HELD_SECONDS else None

    def _control(self, pool: SandboxProcess) -> None:
        try:
            wait_until(
                lambda: (
                    self._progress_step() >= 1
                    or degraded(self.cluster, self.namespace, self.name).get("status") == "True"
                ),
                1800,  # verl's start-up on a loaded machine
                "step 1 trained, or the breaker holding it",
            )
            self.hog.stop()
            self.rejected_before_stop = pool_calls(pool, "rejected")
            os.kill(pool.process.pid, signal.SIGSTOP)
            try:
                since: list[float] = []
                self.held = wait_until(
                    lambda: self._held_long_enough(since),
                    480,  # the breaker fails the run after 600 s (TOOLRL_POOL_WAIT_SECONDS) of holding
                    f"ToolPoolDegraded True for {self.HELD_SECONDS:.0f}s with the pool stopped",
                    interval=1.0,
                )
            finally:
                os.kill(pool.process.pid, signal.SIGCONT)
                self.continued_at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        except BaseException as err:  # reported by the test, after the run
            self.errors.append(err)

    @contextlib.contextmanager
    def run(self, pool: SandboxProcess) -> Iterator[None]:
        self.hog.start(pool)
        controller = threading.Thread(target=self._control, args=(pool,), daemon=True)
        controller.start()
        try:
            yield
        finally:
            self.hog.stop()
            controller.join(60)  # it gives up by itself: it waits for the job with deadlines
            with contextlib.suppress(ProcessLookupError):
                os.kill(pool.process.pid, signal.SIGCONT)


def test_infrastructure_failures_are_excluded_and_a_degraded_pool_pauses_training(
    cluster, namespace, operator, tmp_path, toy
) -> None:
    """Issue 16 with real faults (see `Faults`): a saturated pool, then a stopped one. Every trajectory
    whose call was rejected or timed out is excluded, the counters match the pool's rejections, and no
    excluded trajectory is in an update. With the default rollout.toolCall.maxInfraFailureRatio (0.2),
    a step whose batch lost more than that is not trained on: the job shows ToolPoolDegraded True with
    the numbers and an Event, the trainer waits for the pool's /readyz while the pool is stopped,
    generates the batch again once it is continued, and resumes (ToolPoolDegraded False, Recovered).
    Five steps: a step in which fewer than two trajectories call the tool does not trip the breaker
    even with the pool stopped.

    It is also the suite's GRPO run: `train` makes every check of a clean run (the pool served the
    calls, grad_norm > 0, the rollout engine's weights moved, status.progress, metrics on :9400);
    a separate fault-free GRPO run would add ~7 minutes to `make test` and check nothing more."""
    name = "cpu-infra"
    faults = Faults(cluster, namespace, name)
    output, watch, rejected = train(
        cluster,
        namespace,
        operator,
        tmp_path,
        toy,
        name,
        pool_args=("--capacity", "1", "--queue-size", "1", "--workers", "1"),
        tool_call={"maxRetries": 0},
        load=faults.run,
        steps=FAULT_STEPS,
    )
    assert not faults.errors, f"the fault controller failed: {faults.errors[0]!r}\n{output[-4000:]}"
    hog = faults.hog
    # the trainer's calls the pool rejected while saturated; once continued, the stopped pool also answers
    # (to closed sockets) the calls that timed out meanwhile, and may reject some of those
    injected = faults.rejected_before_stop - hog.rejected
    stale = rejected - faults.rejected_before_stop
    assert hog.calls > 0 and injected > 0, f"no trainer call was rejected ({rejected}, hog {hog.calls})"
    status = get_json(cluster, "trj", name, "-n", namespace)["status"]
    excluded = status["progress"]["trajectoriesExcluded"]
    assert injected <= excluded.get("rejected", 0) <= injected + stale, (injected, stale, excluded)
    for reason, count in excluded.items():  # the status says what the metrics say
        assert watch.max_value(f'toolrl_trajectories_excluded_total{{reason="{reason}"}}') == count

    # the breaker held a step for the stopped pool, then the step resumed on a regenerated batch
    held = faults.held
    assert held, "the breaker never held a step while the pool was stopped (no step had 2 tool calls?)"
    assert held["reason"] == "InfraFailureRatioExceeded" and "maxInfraFailureRatio 0.2" in held["message"]
    assert re.search(r"step \d+: \d+ of 8 trajectories excluded", held["message"]), held
    final = next(c for c in status["conditions"] if c["type"] == "ToolPoolDegraded")
    assert (final["status"], final["reason"]) == ("False", "Recovered"), final
    assert final["lastTransitionTime"] >= faults.continued_at, "it resumed only once the pool was continued"
    assert watch.max_value("toolrl_trainer_tool_pool_degraded") == 1
    events = json.loads(
        cluster.kubectl(
            "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}", "-o", "json"
        ).stdout
    )["items"]
    reasons = {e["reason"] for e in events if e["source"].get("component") == "toolrl-trainer"}
    assert {"ToolPoolDegraded", "ToolPoolRecovered", "TrajectoriesExcluded"} <= reasons, reasons
    assert all(e["involvedObject"].get("uid") for e in events)

    # no excluded trajectory in any update; every generated trajectory is accounted for
    trained = per_step(output, TRAINED)
    tainted = per_step(output, TAINTED)
    regenerated = sum(per_step(output, REGENERATED))
    assert len(trained) == len(tainted) == FAULT_STEPS, f"updates logged: {trained}, {tainted}"
    assert tainted == [0] * FAULT_STEPS, (
        f"trajectories with an infrastructure failure were trained on: {tainted}"
    )
    assert min(trained) >= 7, f"an update trained on a batch that lost more than 20 % of 8: {trained}"
    assert regenerated >= 1, "the breaker never generated a batch again"
    rollouts = (FAULT_STEPS + regenerated) * 2 * 4  # batches x trainBatchSize x rolloutsPerPrompt
    discarded = status["progress"]["trajectoriesDiscarded"]
    assert sum(trained) + sum(excluded.values()) + discarded == rollouts, (trained, excluded, discarded)
    assert status["progress"]["trajectories"] == rollouts
    assert (watch.max_value("toolrl_trajectories_total") or 0) == rollouts


def test_a_run_that_cannot_start_names_the_cause(tmp_path, toy) -> None:
    """No Ray, no training: the checks before the run say what is wrong, without a traceback."""
    spec = cpu_job("broken", toy)
    spec["metadata"]["namespace"] = "default"
    spec["spec"]["model"]["path"] = str(tmp_path / "no-model")
    (tmp_path / "job.json").write_text(json.dumps(spec))
    env = {
        **os.environ,
        "TOOLRL_TOOL_POOL_URL": f"http://127.0.0.1:{free_port()}",
        "TOOLRL_POOL_WAIT_SECONDS": "3",
    }
    argv = [sys.executable, "-m", "trainer_entry", "run", "--spec", str(tmp_path / "job.json")]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 2
    assert (
        "spec.model.path" in res.stderr and "does not exist" in res.stderr and "Traceback" not in res.stderr
    )

    spec["spec"]["model"]["path"] = str(toy["model"])
    (tmp_path / "job.json").write_text(json.dumps(spec))
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "tool pool at http://127.0.0.1:" in res.stderr and "not ready after 3s" in res.stderr
