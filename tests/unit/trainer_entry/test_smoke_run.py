"""A CPU smoke run of a user's job calls its tools (issue 38): `tiny-model --spec job.json` warms the
tiny model up on the job's own prompts and measures it as the job's training will sample it, and the
two-step run that follows calls the job's tool in most prompt groups. The data is our own GSM8K-style
sample (examples/gsm8k), in hermes, the job the CPU example with its paths and protocol changed: no toy
task anywhere. Before the warm-up sampled as training does, it promised a third of the answers and the
run that followed called the tool in 2 of 32 trajectories.

One verl run: `make test` runs this module in its node stream, beside the other verl runs
(harness/harness/test_streams.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import mean

import pytest
import requests
import yaml
from harness.localcluster import free_port
from harness.sandbox_process import SandboxProcess
from trainer_entry.__main__ import main
from trainer_entry.data import prepare
from trainer_entry.metrics import console_steps
from transformers import AutoTokenizer

from trainer_entry import tiny_model as tm

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "examples" / "gsm8k" / "sample.jsonl"
CPU_EXAMPLE = REPO / "examples" / "toolrljob-cpu.yaml"
GROUPS_CALLING = "toolrl/groups_calling_tools"  # runner.GROUPS_CALLING_METRIC (runner imports verl)
CALLING = "toolrl/trajectories_calling_tools"  # runner.CALLING_METRIC
STEPS = 2
pytestmark = pytest.mark.timeout(1800)  # verl's start-up on a loaded 2-core machine


def _job(tmp_path: Path) -> Path:
    """The CPU example as a user would point it at their own data and model: hermes, 2 steps, a prompt
    length that holds the hermes system prompt with the tool's schema (~200 tokens here). Written as
    the user applies it (YAML, for tiny-model) and as the operator mounts it (job.json, for the run)."""
    job = yaml.safe_load(CPU_EXAMPLE.read_text())
    spec = job["spec"]
    spec["model"]["path"] = str(tmp_path / "model")
    spec["data"].update(trainFiles=[str(tmp_path / "data" / "train.parquet")], maxPromptLength=256)
    spec["data"].pop("volume")
    spec["rollout"]["protocol"] = "hermes"
    spec["algorithm"]["totalTrainingSteps"] = STEPS
    job["metadata"]["namespace"] = "default"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    (tmp_path / "job.json").write_text(json.dumps(job))  # what the operator mounts for the trainer
    return path


def test_a_two_step_smoke_of_a_job_calls_its_tools_in_most_prompt_groups(tmp_path, capsys):
    prepare(
        "gsm8k",
        [SAMPLE],
        tmp_path / "data",
        split=False,
        train_ratio=1.0,
        max_samples=None,
        seed=0,
        tool="python",
        protocol="hermes",
    )
    job_file = _job(tmp_path)
    job = yaml.safe_load(job_file.read_text())
    rollouts = job["spec"]["algorithm"]["rolloutsPerPrompt"]

    model = str(tmp_path / "model")
    assert main(["tiny-model", model, "--spec", str(job_file), "--warm-up-seconds", "600"]) == 0
    out = capsys.readouterr()
    print(out.out)
    assert f"warm-up on the job's prompts ({tmp_path / 'data' / 'train.parquet'}), protocol hermes" in out.out
    # measured as training samples: the job's group size and response length, and the groups' share
    assert f"sampled as the job's training will ({rollouts} answers each, up to 48 tokens" in out.out
    rate = int(out.out.split("call the tool ")[1].split("%")[0])
    groups = int(out.out.split("of the time, in ")[1].split("%")[0])
    assert rate >= 25 and groups >= 75, out.out
    assert "spec.data.maxPromptLength" not in out.err, out.err  # no prompt is cut
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    question = tm.job_prompts(tmp_path / "data" / "train.parquet")[0].messages[1]["content"]
    assert len(tokenizer.encode(question)) < len(question) / 2, "the tokenizer learnt the job's words"

    with SandboxProcess.start(tmp_path / "pool", tools=job["spec"]["tools"]) as pool:
        env = {**os.environ, "TOOLRL_TOOL_POOL_URL": pool.url, "TOOLRL_METRICS_PORT": str(free_port())}
        env.pop("RAY_ADDRESS", None)
        workdir = tmp_path / "trainer"
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainer_entry",
                "run",
                "--spec",
                str(tmp_path / "job.json"),
                "--workdir",
                str(workdir),
            ],
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=1500,
            check=False,
        )
        served = requests.get(pool.metrics_url, timeout=10).text
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    steps = console_steps(output)
    assert sorted(steps) == list(range(1, STEPS + 1)), output[-3000:]
    shares = [steps[s][GROUPS_CALLING] for s in sorted(steps)]
    calling = [steps[s][CALLING] for s in sorted(steps)]
    print(f"prompt groups calling the tool, by step: {shares}; trajectories: {calling}")
    assert mean(shares) > 0.5, f"the tool was called in {shares} of the prompt groups, by step"
    assert "the run made no tool call" not in output  # job_status.no_tool_calls_message
    per_step = rollouts * job["spec"]["algorithm"]["trainBatchSize"]
    calls = sum(
        float(line.rsplit(" ", 1)[1])
        for line in served.splitlines()
        if line.startswith("toolrl_tool_calls_total{") and 'tool="python"' in line
    )
    # the pool served the run's calls; not one a trajectory, as a call with bad arguments is answered by
    # the trainer without a round trip (tools.PoolTool.run: "invalid") and still counts as calling
    # (ci16: 21 trajectories calling, 20 calls served): at least one call for half of them
    assert calls > 0 and calls >= round(sum(calling) * per_step) * 0.5, (calls, served)
