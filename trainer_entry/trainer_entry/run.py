"""`python -m trainer_entry run`: the job spec becomes a verl run on the Ray cluster this pod is in.

Steps: translate the spec, write the generated files into a Ray working_dir (so every node sees
them), compose and check verl's config, wait for the tool pool, start the metrics hub on this node,
and hand the config to verl's `run_ppo` with our task runner.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainer_entry.pool_client import PoolClient
from trainer_entry.spec import Job, SpecError
from trainer_entry.translate import (
    AGENT_LOOPS_FILE,
    CUSTOM_REWARD_FILE,
    TOOL_CONFIG_FILE,
    Translation,
    translate,
)

CUSTOM_REWARD_DIR = Path("/etc/toolrl/reward")
DEFAULT_METRICS_PORT = 9400
DEFAULT_POOL_WAIT_SECONDS = 600.0


@dataclass(frozen=True)
class Environment:
    """What the operator puts in the Ray head's environment (docs/contracts.md)."""

    pool_url: str
    job_name: str
    namespace: str
    metrics_port: int
    pool_wait_seconds: float

    @classmethod
    def from_env(cls, job: Job) -> Environment:
        url = os.environ.get("TOOLRL_TOOL_POOL_URL", "")
        if not url:
            raise SpecError("TOOLRL_TOOL_POOL_URL is not set: the trainer needs the tool pool's Service URL")
        return cls(
            pool_url=url,
            job_name=os.environ.get("TOOLRL_JOB_NAME", job.name),
            namespace=os.environ.get("TOOLRL_JOB_NAMESPACE", job.namespace),
            metrics_port=_env_number("TOOLRL_METRICS_PORT", DEFAULT_METRICS_PORT, int, 1, 65535),
            pool_wait_seconds=_env_number("TOOLRL_POOL_WAIT_SECONDS", DEFAULT_POOL_WAIT_SECONDS, float, 0),
        )


def _env_number(name: str, default: float, kind: type, low: float, high: float | None = None) -> Any:
    """A numeric environment variable, or a SpecError that names it and says what it must be."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return kind(default)
    what = "an integer" if kind is int else "a number"
    bounds = f" in [{low}, {high}]" if high is not None else f" >= {low}"
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value != value or value < low or (high is not None and value > high):
        raise SpecError(
            f"environment variable {name}={raw!r}: must be {what}{bounds} (unset it for {default})"
        )
    return value


def generated_files(job: Job, translation: Translation) -> dict[str, str]:
    """Name → text of every file the run writes for verl."""
    return {
        TOOL_CONFIG_FILE: yaml.safe_dump(translation.tool_config, sort_keys=False),
        AGENT_LOOPS_FILE: yaml.safe_dump(translation.agent_loops, sort_keys=False),
    }


def write_workdir(
    job: Job, translation: Translation, workdir: Path, reward_dir: Path = CUSTOM_REWARD_DIR
) -> None:
    """Write the generated files (and the custom reward from its ConfigMap) into `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name, text in generated_files(job, translation).items():
        (workdir / name).write_text(text)
    if job.spec["reward"]["preset"] == "custom":
        key = job.spec["reward"]["custom"]["key"]
        source = reward_dir / key
        if not source.is_file():
            raise SpecError(
                f"spec.reward.custom: {source} not found; the ConfigMap "
                f"{job.spec['reward']['custom']['configMap']!r} must hold the key {key!r}"
            )
        shutil.copyfile(source, workdir / CUSTOM_REWARD_FILE)


def describe(job: Job, translation: Translation, spec_path: str) -> str:
    """The dry-run text: the exact verl call with its overrides, and the generated files."""
    lines = [
        "# entrypoint: verl.trainer.main_ppo.run_ppo(config,"
        " task_runner_class=trainer_entry.runner.ToolRLTaskRunner)",
        "# config: verl's ppo_trainer composed with these overrides (equivalent command line):",
        "python -m verl.trainer.main_ppo \\",
    ]
    lines += [f"  {shlex.quote(o)} \\" for o in translation.overrides[:-1]]
    lines.append(f"  {shlex.quote(translation.overrides[-1])}")
    for name, text in generated_files(job, translation).items():
        lines += ["", f"# --- {name} (in the Ray working_dir) ---", text.rstrip()]
    lines += ["", f"# spec: {spec_path}; job {job.namespace}/{job.name}"]
    return "\n".join(lines)


async def wait_for_pool(url: str, timeout: float, interval: float = 2.0) -> None:
    """Return when the pool answers `/readyz`; raise after `timeout` seconds with what to check."""
    client = PoolClient(url)
    deadline = time.monotonic() + timeout
    try:
        while not await client.ready():
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"tool pool at {url} not ready after {timeout:.0f}s: check the J-tools Deployment "
                    "(kubectl get deploy,pods -l app.kubernetes.io/component=tool-pool) and its /readyz"
                )
            await asyncio.sleep(interval)
    finally:
        await client.close()


def run(job: Job, env: Environment, workdir: Path) -> None:
    """Train: everything from here on runs on the Ray cluster (RAY_ADDRESS)."""
    import ray
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
    from verl.trainer.main_ppo import run_ppo

    from trainer_entry import verl_config
    from trainer_entry.hub import HubSettings, start_hub
    from trainer_entry.runner import ToolRLTaskRunner

    translation = translate(job, env.pool_url)
    write_workdir(job, translation, workdir)
    config = verl_config.compose(translation.overrides)
    verl_config.check(config)
    asyncio.run(wait_for_pool(env.pool_url, env.pool_wait_seconds))

    runtime_env = dict(get_ppo_ray_runtime_env(config))
    runtime_env["working_dir"] = str(workdir)
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), runtime_env=runtime_env)
    algo = job.spec["algorithm"]
    hub = start_hub(
        HubSettings(
            port=env.metrics_port,
            trajectories_per_step=algo["trainBatchSize"] * algo["rolloutsPerPrompt"],
            expected_calls_per_trajectory=float(job.spec["rollout"]["maxToolTurns"]),
            job_name=env.job_name,
            namespace=env.namespace,
            report_progress=True,
        )
    )
    try:
        run_ppo(config, task_runner_class=ToolRLTaskRunner)
    finally:
        ray.get(hub.finish.remote())
