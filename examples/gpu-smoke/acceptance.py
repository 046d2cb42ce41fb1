"""The verdict of a smoke run (run.sh), from what the run's own processes wrote.

Inputs: the trainer's exit code, its log, and the tool pool's /metrics text (the pool counts every call
it ran). In the log, verl's console logger writes one line `step:N - key:value - ...` per step from
trainer_entry's task runner, a Ray actor, so Ray prefixes it with `(_ToolRLTaskRunner pid=P)`; only
such lines count (other actors' lines carry their own names, and the sandboxed tool code's output is
never printed). Checks, each printed with its numbers:

- exit: the trainer exited 0;
- steps: exactly one step line for each step 1..N, N = the job's totalTrainingSteps;
- tool calls: the pool ran at least one call (any outcome);
- log-prob agreement: every step compared the rollout engine's log-probs of the sampled tokens with
  the actor's (`training/rollout_probs_diff_valid` 1), their mean absolute probability difference is at
  most --max-prob-diff and their Pearson correlation at least --min-correlation;
- weights synced: every step pushed the actor's weights into the rollout engine
  (`timing_s/update_weights`) after a real update (`actor/grad_norm` finite and > 0). The agreement
  from step 2 on is what shows the engine sampled from the updated weights: with the smoke job's
  learning rate a stale engine disagrees with the actor far beyond the thresholds;
- vLLM served (`--engine vllm`): verl's vLLM server actor (`vLLMHttpServer`, as Ray prefixes its lines)
  logged vLLM's own engine statistics with a generation throughput above 0 at least once: a line only
  vLLM's stat logger writes, and only after it generated tokens (run.sh turns the statistics on with
  `actor_rollout_ref.rollout.disable_log_stats=false`; verl's default is off). The other checks pass
  with the hf engine too;
- critic trained (`--estimator gae`): every step updated verl's critic, the value model GAE needs: its
  value loss (`critic/vf_loss`) finite and its grad norm (`critic/grad_norm`) finite and > 0. verl logs
  these only for a job with a critic; its `critic/score/...`, `critic/rewards/...` are the reward's, logged
  by every job, and do not count.

`python acceptance.py --log trainer.log --pool-metrics pool.txt --exit-code 0 --steps 3 [--engine vllm]
[--estimator gae]`;
exits 0 when every check passes, 1 when one fails, 2 on bad arguments or unreadable inputs.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from trainer_entry.metrics import console_steps

# trainer_entry.runner's task runner class, as Ray names the actor in the lines it forwards
TASK_RUNNER = "_ToolRLTaskRunner"
STEP_LINE = re.compile(
    rf"^\({TASK_RUNNER} pid=(?P<pid>\d+)(?:, ip=[^)]*)?\) step:(?P<step>\d+) - (?P<rest>.*)$"
)
COLOR = re.compile(r"\x1b\[[0-9;]*m")
POOL_CALLS = re.compile(r"^toolrl_tool_calls_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
OUTCOME = re.compile(r'outcome="([^"]*)"')
PROB_DIFF_VALID = "training/rollout_probs_diff_valid"
PROB_DIFF_MEAN = "training/rollout_probs_diff_mean"
CORRELATION = "training/rollout_actor_probs_pearson_corr"
UPDATE_WEIGHTS = "timing_s/update_weights"
GRAD_NORM = "actor/grad_norm"
# the critic's update (verl.workers.utils.losses.value_loss, verl.workers.engine_workers), logged only when
# the job has a critic (verl.trainer.ppo.utils.need_critic: adv_estimator gae), and its fit to the returns
CRITIC_LOSS = "critic/vf_loss"
CRITIC_GRAD_NORM = "critic/grad_norm"
CRITIC_EXPLAINED_VAR = "critic/vf_explained_var"
ESTIMATORS = ("grpo", "gae")
# vLLM's stat logger (vllm/v1/metrics/loggers.py), in a line Ray forwards from verl's server actor
# (verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer, or a subclass of it)
VLLM_SERVER_LINE = re.compile(r"^\((?:\w*)vLLMHttpServer pid=\d+(?:, ip=[^)]*)?\) (?P<rest>.*)$")
VLLM_GENERATION = re.compile(r"Avg generation throughput: (?P<rate>[0-9.]+) tokens/s")


class InputError(ValueError):
    """An input that cannot be read as what it should be."""


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


def parse_steps(log: str) -> dict[int, dict[str, float]]:
    """verl's per-step metrics from the console log (trainer_entry.metrics.console_steps reads the task
    runner's step lines); a step printed twice is an error."""
    lines: list[str] = []
    logged: set[int] = set()
    runners = set()
    for line in log.splitlines():
        match = STEP_LINE.match(COLOR.sub("", line).rstrip("\r"))
        if not match:
            continue
        step = int(match["step"])
        runners.add(match["pid"])
        if step in logged or len(runners) > 1:
            raise InputError(
                f"step {step} is logged twice (task runners {sorted(runners)}): the log is not one run's"
            )
        logged.add(step)
        lines.append(match.group(0))
    return console_steps("\n".join(lines))


def pool_calls(metrics: str) -> dict[str, float]:
    """Calls the pool ran, by outcome, from its Prometheus text."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        match = POOL_CALLS.match(line.strip())
        if match:
            outcome = OUTCOME.search(match["labels"])
            key = outcome.group(1) if outcome else ""
            out[key] = out.get(key, 0.0) + float(match["value"])
    return out


def vllm_generation(log: str) -> list[float]:
    """The generation throughputs vLLM's stat logger reported from verl's vLLM server actors."""
    rates = []
    for line in log.splitlines():
        match = VLLM_SERVER_LINE.match(COLOR.sub("", line).rstrip("\r"))
        found = VLLM_GENERATION.search(match["rest"]) if match else None
        if found:
            rates.append(float(found["rate"]))
    return rates


def _each(steps: dict[int, dict[str, float]], key: str) -> list[float | None]:
    return [steps[s].get(key) for s in sorted(steps)]


def _show(values: list[float | None]) -> str:
    return "[" + ", ".join("missing" if v is None else f"{v:.4g}" for v in values) + "]"


def verdict(
    exit_code: int,
    log: str,
    metrics: str,
    total_steps: int,
    max_prob_diff: float,
    min_correlation: float,
    engine: str = "hf",
    estimator: str = "grpo",
) -> list[Check]:
    steps = parse_steps(log)
    wanted = list(range(1, total_steps + 1))
    calls = pool_calls(metrics)
    by_outcome = ", ".join(f"{k}: {v:g}" for k, v in sorted(calls.items())) or "none"
    checks = [
        Check("exit", exit_code == 0, f"the trainer exited {exit_code}"),
        Check("steps", sorted(steps) == wanted, f"steps logged {sorted(steps)}, wanted {wanted}"),
        Check(
            "tool calls",
            sum(calls.values()) > 0,
            f"the pool ran {sum(calls.values()):g} calls ({by_outcome})",
        ),
    ]
    valid, diff, corr = (_each(steps, k) for k in (PROB_DIFF_VALID, PROB_DIFF_MEAN, CORRELATION))
    agree = bool(steps) and all(
        v == 1 and d is not None and d <= max_prob_diff and c is not None and c >= min_correlation
        for v, d, c in zip(valid, diff, corr, strict=True)
    )
    checks.append(
        Check(
            "log-prob agreement",
            agree,
            f"per step: compared {_show(valid)}, mean |p_rollout - p_actor| {_show(diff)} (max "
            f"{max_prob_diff:g}), correlation {_show(corr)} (min {min_correlation:g})",
        )
    )
    synced, norms = _each(steps, UPDATE_WEIGHTS), _each(steps, GRAD_NORM)
    updated = bool(steps) and all(
        s is not None and g is not None and math.isfinite(g) and g > 0
        for s, g in zip(synced, norms, strict=True)
    )
    checks.append(
        Check(
            "weights synced",
            updated,
            f"per step: weight sync seconds {_show(synced)}, actor grad norm {_show(norms)}",
        )
    )
    if engine == "vllm":
        rates = vllm_generation(log)
        checks.append(
            Check(
                "vLLM served",
                any(rate > 0 for rate in rates),
                f"verl's vLLM server logged {len(rates)} engine statistics, generation throughput "
                f"{_show(list(rates)) if rates else 'never'} tokens/s (wanted one above 0)",
            )
        )
    if estimator == "gae":
        losses, critic_norms = _each(steps, CRITIC_LOSS), _each(steps, CRITIC_GRAD_NORM)
        trained = bool(steps) and all(
            v is not None and math.isfinite(v) and g is not None and math.isfinite(g) and g > 0
            for v, g in zip(losses, critic_norms, strict=True)
        )
        checks.append(
            Check(
                "critic trained",
                trained,
                f"per step: value loss {_show(losses)}, critic grad norm {_show(critic_norms)}, explained "
                f"variance {_show(_each(steps, CRITIC_EXPLAINED_VAR))}",
            )
        )
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="acceptance.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, required=True, help="the trainer's output")
    parser.add_argument("--pool-metrics", type=Path, required=True, help="the tool pool's /metrics text")
    parser.add_argument("--exit-code", type=int, required=True, help="the trainer's exit code")
    parser.add_argument("--steps", type=int, required=True, help="the job's totalTrainingSteps")
    parser.add_argument("--max-prob-diff", type=float, default=0.05)
    parser.add_argument("--min-correlation", type=float, default=0.9)
    parser.add_argument(
        "--engine", choices=("vllm", "hf"), default="hf", help="the job's engine (vllm: check that it served)"
    )
    parser.add_argument(
        "--estimator",
        choices=ESTIMATORS,
        default="grpo",
        help="the job's advantage estimator (gae: check that its critic trained every step)",
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if not 0 < args.max_prob_diff <= 1 or not -1 <= args.min_correlation <= 1:
        parser.error("--max-prob-diff must be in (0, 1] and --min-correlation in [-1, 1]")
    try:
        log = args.log.read_text(errors="replace")
        metrics = args.pool_metrics.read_text(errors="replace")
        checks = verdict(
            args.exit_code,
            log,
            metrics,
            args.steps,
            args.max_prob_diff,
            args.min_correlation,
            args.engine,
            args.estimator,
        )
    except (OSError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for check in checks:
        print(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.detail}")
    passed = all(c.passed for c in checks)
    print("smoke run: " + ("accepted" if passed else "NOT accepted"))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
