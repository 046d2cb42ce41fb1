"""CPU training benchmark: verl's GRPO loop through `python -m trainer_entry run`, on the toy task,
with each CPU rollout engine: `vllm` (verl's vLLM server on vLLM's CPU build) and `hf` (transformers),
and with each trainer mode asked for (`--modes sync colocate-async separate-async`: the same job, the
same warmed-up model; separate-async adds one CPU rollout worker).

The tiny model (`trainer_entry tiny-model`, warmed up to either call the python tool or guess) trains
with GRPO against a real tool_sandbox process on loopback, the same job and the same warmed-up model
for each engine, one engine after the other. Measured per engine: start-up to the first step,
seconds per steady step, generation tokens/s (the response tokens of a step over its generation
time; observations from the tool count as response tokens for both engines), the peak memory of the
whole process tree (PSS, so shared pages count once), and learning — the mean reward of the first
and the last steps, the reward of every step (the learning curve) and steps per minute after the
first (in the async modes verl's `timing_s/gen` is the wait for sampleable prompts, not generation,
so the generation rows compare engines, not modes). Per trainer mode also (measures.py): the rollout and
the trainer idle fractions our hooks log with each step (means over the steps after the first; what
each is made of in each mode: trainer_entry.metrics.idle_fractions), the largest off-policy lag of a
trained trajectory and the prompt groups dropped as stale. Bounded: `--steps` steps per run, one warm-up
of at most `--warm-up-seconds`.

    .venv/bin/python bench/cpu_training/run.py [--steps 30] [--engines vllm hf] [--modes sync ...]
        [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import generation
import psutil
from harness.localcluster import free_port
from harness.sandbox_process import SandboxProcess
from measures import mode_measures
from trainer_entry.metrics import STEP_LINE, console_steps
from trainer_entry.protocols import get_protocol
from trainer_entry.spec import SEPARATE_TRAINER_MODE, SYNC_TRAINER_MODE, TRAINER_MODES
from trainer_entry.tiny_model import build_tiny_model, warm_up, write_toy_data

WINDOW = 5  # steps averaged at the start and at the end
LEARNING_RATE = 5.0e-4  # 2e-3 was tried first: the reward fell from 0.13 to 0 over 30 steps


ENGINES = ("vllm", "hf")
MODES = TRAINER_MODES  # spec.trainer.mode
POLICY_VERSIONS = 2  # the async modes' staleness bound: samples begun one update earlier
HIDDEN = 64
PROTOCOL = "python-tags"


def job(model: Path, data: Path, steps: int, engine: str, mode: str = SYNC_TRAINER_MODE) -> dict:
    out = {
        "apiVersion": "toolrl.dev/v1alpha1",
        "kind": "ToolRLJob",
        "metadata": {"name": "bench-cpu", "namespace": "default"},
        "spec": {
            "model": {"path": str(model)},
            "data": {"trainFiles": [str(data)], "maxPromptLength": 160, "maxResponseLength": 48},
            "algorithm": {
                "advantageEstimator": "grpo",
                "rolloutsPerPrompt": 8,
                "trainBatchSize": 4,
                "learningRate": LEARNING_RATE,
                "totalTrainingSteps": steps,
                "klLoss": {"enabled": False, "coef": 0.001},
            },
            "rollout": {"engine": engine, "protocol": PROTOCOL, "maxToolTurns": 1},
            "tools": [{"name": "python", "type": "python", "timeoutSeconds": 5}],
            "reward": {"preset": "exact-match"},
            "cluster": {"workers": {"replicas": 1, "gpusPerWorker": 0}},
            "checkpoint": {"saveFreq": -1, "resume": "disable"},
            "trainer": {"mode": mode, "async": {"maxPolicyVersions": POLICY_VERSIONS}},
        },
    }
    if mode == SEPARATE_TRAINER_MODE:  # one more CPU worker (a logical GPU) that only generates
        out["spec"]["cluster"]["rolloutWorkers"] = {"replicas": 1, "gpusPerWorker": 0}
    return out


class PeakMemory:
    """Samples the PSS of a process and all its descendants every second; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peak = 0
        self.processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            total, count = 0, 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for proc in procs:
                try:
                    total += proc.memory_full_info().pss
                    count += 1
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            if total > self.peak:
                self.peak, self.processes = total, count

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_engine(
    engine: str, root: Path, model: Path, data: Path, steps_wanted: int, mode: str = SYNC_TRAINER_MODE
) -> dict | None:
    """One training run with `engine` in trainer `mode`; its measures, or None (with the log's path) if
    it failed."""
    out = root / run_name(engine, mode)
    out.mkdir()
    (out / "job.json").write_text(json.dumps(job(model, data, steps_wanted, engine, mode)))
    with SandboxProcess.start(out / "pool") as pool:
        env = {**os.environ, "TOOLRL_TOOL_POOL_URL": pool.url, "TOOLRL_METRICS_PORT": str(free_port())}
        env.pop("RAY_ADDRESS", None)
        argv = [
            sys.executable,
            "-m",
            "trainer_entry",
            "run",
            "--spec",
            str(out / "job.json"),
            "--workdir",
            str(out / "workdir"),
        ]
        started = time.monotonic()
        first_step_at = last_step_at = None
        lines = []
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        memory = PeakMemory(proc.pid)
        for line in proc.stdout:
            lines.append(line)
            if STEP_LINE.search(line):
                last_step_at = time.monotonic()
                first_step_at = first_step_at or last_step_at
        rc = proc.wait()
        memory.stop()
        total = time.monotonic() - started
    output = "".join(lines)
    (out / "trainer.log").write_text(output)
    steps = console_steps(output)
    if rc != 0 or len(steps) < steps_wanted:
        print(
            f"{engine}: trainer exited {rc} after {len(steps)} steps; log: {out / 'trainer.log'}",
            file=sys.stderr,
        )
        return None
    ordered = [steps[k] for k in sorted(steps)]
    steady = ordered[1:]  # the first step also warms up the engine
    measured = mode_measures(steps, mode)
    reward = measured["reward_per_step"]
    return {
        "load_average_at_end": os.getloadavg(),
        "steps": len(ordered),
        "startup_to_first_step_s": round(first_step_at - started, 1) if first_step_at else None,
        "run_s": round(total, 1),
        # steps after the first over the time from the first step's line to the last's
        "steps_per_min": round(60 * (len(ordered) - 1) / (last_step_at - first_step_at), 2)
        if len(ordered) > 1 and last_step_at > first_step_at
        else None,
        "step_s_median": round(statistics.median(s["timing_s/step"] for s in steady), 2),
        "generation_s_median": round(statistics.median(s["timing_s/gen"] for s in steady), 2),
        "generation_tokens_per_s_median": round(
            statistics.median(1000 / s["timing_per_token_ms/gen"] for s in steady), 1
        ),
        "step_tokens_per_s_median": round(statistics.median(s["perf/throughput"] for s in steady), 1),
        "peak_pss_gib": round(memory.peak / 2**30, 2),
        "processes_at_peak": memory.processes,
        "rollout_actor_log_prob_diff_max": round(
            max(s.get("training/rollout_probs_diff_max", float("nan")) for s in ordered), 4
        ),
        "reward_first": round(statistics.mean(reward[:WINDOW]), 3),
        "reward_last": round(statistics.mean(reward[-WINDOW:]), 3),
        **measured,
        "grad_norm_per_step": [round(s.get("actor/grad_norm", float("nan")), 4) for s in ordered],
    }


GENERATION_ROWS = ("engine_start_s", "sequences_per_batch", "tokens_per_batch", "tokens_per_s_median")
ROWS = (
    "startup_to_first_step_s",
    "steps_per_min",
    "rollout_idle_fraction_mean",
    "trainer_idle_fraction_mean",
    "off_policy_lag_max",
    "stale_groups_dropped",
    "step_s_median",
    "generation_s_median",
    "generation_tokens_per_s_median",
    "step_tokens_per_s_median",
    "peak_pss_gib",
    "processes_at_peak",
    "rollout_actor_log_prob_diff_max",
    "steps",
    "reward_first",
    "reward_last",
    "load_average_at_end",
)


def run_name(engine: str, mode: str) -> str:
    return engine if mode == SYNC_TRAINER_MODE else f"{engine}-{mode}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=[SYNC_TRAINER_MODE],
        help="trainer modes to compare, each with every engine (separate-async adds a rollout worker)",
    )
    parser.add_argument("--warm-up-seconds", type=float, default=300)
    parser.add_argument("--out", type=Path, default=Path("bench/results/cpu_training.json"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-cpu-training-"))
    model = build_tiny_model(root, "tiny-qwen2", hidden=HIDDEN, layers=2)
    warm = warm_up(model, PROTOCOL, seconds=args.warm_up_seconds)
    data = write_toy_data(root / "data")
    stop = list(get_protocol(PROTOCOL).stop)
    generated = generation.measure(job(model, data, args.steps, "vllm"), model, data, stop, args.engines)
    runs = [(engine, mode) for mode in args.modes for engine in args.engines]
    results = {
        run_name(engine, mode): run_engine(engine, root, model, data, args.steps, mode)
        for engine, mode in runs
    }
    result = {
        "machine": f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "model": f"tiny Qwen2, 2 layers x {HIDDEN}",
        "warm_up": warm.__dict__,
        "generation": generated,
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"{result['machine']}; {result['model']}")
    names = list(results)
    print("| measure | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for key in GENERATION_ROWS:
        cells = [str(generated[engine][key]) for engine, _ in runs]
        print(f"| generation: {key} | " + " | ".join(cells) + " |")
    for key in ROWS:
        cells = [str(results[n][key]) if results[n] else "failed" for n in names]
        print(f"| {key} | " + " | ".join(cells) + " |")
    print(
        f"| warm-up | {warm.steps} steps, {warm.seconds:.0f} s, calls {warm.call_rate:.0%}, "
        f"copies {warm.copy_rate:.0%} |"
    )
    print("\nlearning curve (reward per step):")
    for name in names:
        curve = results[name]["reward_per_step"] if results[name] else "failed"
        print(f"- {name}: {curve}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
