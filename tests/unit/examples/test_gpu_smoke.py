"""examples/gpu-smoke without a GPU: the verdict on a recorded run's log, the run script's arguments,
the lock's torch stack and the offline install from fetched files (issue 23)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SMOKE = REPO / "examples" / "gpu-smoke"
RECORDED = Path(__file__).parent / "data"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, SMOKE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


acceptance = _module("acceptance")
wheelset = _module("wheelset")
LOG = (RECORDED / "cpu-smoke-trainer.log").read_text()
POOL = (RECORDED / "cpu-smoke-pool-metrics.txt").read_text()


def run_acceptance(tmp_path, log=LOG, pool=POOL, exit_code=0, steps=2, *extra):
    (tmp_path / "trainer.log").write_text(log)
    (tmp_path / "pool.txt").write_text(pool)
    argv = [
        "--log",
        str(tmp_path / "trainer.log"),
        "--pool-metrics",
        str(tmp_path / "pool.txt"),
        "--exit-code",
        str(exit_code),
        "--steps",
        str(steps),
        *extra,
    ]
    return acceptance.main(argv)


def test_the_recorded_run_is_accepted(tmp_path, capsys):
    """Recorded with `run.sh --cpu --steps 2` (engine hf, the same verl trainer and metrics): the last
    80 lines of its trainer.log (paths replaced) and the pool's /metrics after the run."""
    assert run_acceptance(tmp_path) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[:5]] == ["PASS"] * 5, out
    assert out.rstrip().endswith("smoke run: accepted")


def _step_line(step: int) -> str:
    return next(
        line for line in LOG.splitlines() if "_ToolRLTaskRunner" in line and f"m step:{step} - " in line
    )


def _replace(line: str, key: str, value: str) -> str:
    parts = [f"{key}:{value}" if p.startswith(f"{key}:") else p for p in line.split(" - ")]
    assert any(p.startswith(f"{key}:") for p in line.split(" - ")), f"{key} not in the recorded line"
    return " - ".join(parts)


@pytest.mark.parametrize(
    ("change", "failed"),
    [
        (lambda log: log.replace(_step_line(2), ""), "steps"),
        (
            lambda log: log.replace(_step_line(2), _replace(_step_line(2), acceptance.PROB_DIFF_MEAN, "0.4")),
            "log-prob agreement",
        ),
        (
            lambda log: log.replace(_step_line(1), _replace(_step_line(1), acceptance.CORRELATION, "0.2")),
            "log-prob agreement",
        ),
        (
            lambda log: log.replace(_step_line(2), _replace(_step_line(2), acceptance.GRAD_NORM, "0.0")),
            "weights synced",
        ),
        (
            lambda log: log.replace(
                _step_line(2),
                " - ".join(
                    p for p in _step_line(2).split(" - ") if not p.startswith(acceptance.UPDATE_WEIGHTS)
                ),
            ),
            "weights synced",
        ),
        (
            lambda log: log.replace(
                _step_line(1), _step_line(1).replace("_ToolRLTaskRunner", "AgentLoopWorkerTQ")
            ),
            "steps",
        ),
    ],
    ids=[
        "a-step-missing",
        "rollout-disagrees",
        "uncorrelated",
        "no-update",
        "no-weight-sync",
        "a-workers-line-is-not-a-step",
    ],
)
def test_each_check_fails_alone(tmp_path, capsys, change, failed):
    assert run_acceptance(tmp_path, log=change(LOG)) == 1
    out = capsys.readouterr().out
    fails = [line.split("  ", 1)[1].split(":")[0] for line in out.splitlines() if line.startswith("FAIL")]
    assert fails == [failed], out
    assert "smoke run: NOT accepted" in out


def test_no_tool_call_and_a_failed_exit_are_failures(tmp_path, capsys):
    no_calls = "\n".join(line for line in POOL.splitlines() if not line.startswith("toolrl_tool_calls_total"))
    assert run_acceptance(tmp_path, pool=no_calls, exit_code=1) == 1
    out = capsys.readouterr().out
    assert "FAIL  exit: the trainer exited 1" in out and "FAIL  tool calls: the pool ran 0 calls" in out


def test_step_values_printed_as_numpy_scalars_are_read(tmp_path, capsys):
    """verl's console prints some values as numpy scalars (`np.float64(0.25)`): trainer_entry's reading of
    a step line (metrics.console_steps) is the verdict's."""
    numpy_line = _replace(_step_line(2), acceptance.GRAD_NORM, "np.float64(0.25)")
    assert run_acceptance(tmp_path, log=LOG.replace(_step_line(2), numpy_line)) == 0, capsys.readouterr().out
    assert acceptance.parse_steps(numpy_line)[2][acceptance.GRAD_NORM] == 0.25


def test_a_step_logged_twice_is_not_one_runs_log(tmp_path, capsys):
    assert run_acceptance(tmp_path, log=LOG + "\n" + _step_line(1) + "\n") == 2
    assert "step 1 is logged twice" in capsys.readouterr().err
    other_runner = re.sub(r"pid=\d+", "pid=1", _step_line(2))
    assert run_acceptance(tmp_path, log=LOG.replace(_step_line(2), other_runner)) == 2
    assert "the log is not one run's" in capsys.readouterr().err


# vLLM's stat logger as Ray forwards it from verl's server actor (vllm/v1/metrics/loggers.py, vllm/logger.py)
VLLM_STATS = (
    "\x1b[36m(vLLMHttpServer pid=4242)\x1b[0m INFO 12-06 04:31:44 [loggers.py:257] Engine 000: Avg prompt "
    "throughput: 61.2 tokens/s, Avg generation throughput: {rate} tokens/s, Running: 4 reqs, Waiting: 0 "
    "reqs, GPU KV cache usage: 1.2%, Prefix cache hit rate: 40.0%"
)


def test_engine_vllm_needs_the_log_of_vllm_having_generated(tmp_path, capsys):
    """The recorded run is the hf engine's: every other check passes, and `--engine vllm` refuses it."""
    assert run_acceptance(tmp_path, LOG, POOL, 0, 2, "--engine", "vllm") == 1
    out = capsys.readouterr().out
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert fails == [
        "FAIL  vLLM served: verl's vLLM server logged 0 engine statistics, generation throughput never "
        "tokens/s (wanted one above 0)"
    ], out
    served = LOG + "\n" + VLLM_STATS.format(rate="0.0") + "\n" + VLLM_STATS.format(rate="143.9") + "\n"
    assert run_acceptance(tmp_path, served, POOL, 0, 2, "--engine", "vllm") == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    "line",
    [
        VLLM_STATS.format(rate="0.0"),  # the engine was idle: nothing generated
        VLLM_STATS.format(rate="143.9").replace("vLLMHttpServer", "AgentLoopWorkerTQ"),  # not the server
        VLLM_STATS.format(rate="143.9").split("\x1b[0m ", 1)[1],  # not from a Ray actor
    ],
    ids=["idle", "another-actor", "not-an-actor"],
)
def test_only_vllms_server_having_generated_counts(tmp_path, capsys, line):
    assert run_acceptance(tmp_path, LOG + "\n" + line + "\n", POOL, 0, 2, "--engine", "vllm") == 1
    assert "FAIL  vLLM served" in capsys.readouterr().out


def test_the_cpu_builds_server_subclass_counts_too():
    """trainer_entry.vllm_on_cpu serves with a subclass of verl's server, CPUvLLMHttpServer."""
    line = VLLM_STATS.format(rate="12.5").replace("vLLMHttpServer", "CPUvLLMHttpServer")
    assert acceptance.vllm_generation(line) == [12.5]


def _with_critic(log: str, step: int = 0, key: str = "", value: str | None = None) -> str:
    """The recorded (GRPO) log with each step's line carrying the critic's metrics as verl logs them for a
    gae job; at `step`, `key` set to `value` (None: not logged)."""
    for n in (1, 2):
        critic = {
            acceptance.CRITIC_LOSS: "0.0123",
            acceptance.CRITIC_GRAD_NORM: "0.5",
            acceptance.CRITIC_EXPLAINED_VAR: "-0.25",
        }
        if n == step:
            critic[key] = value
        extra = "".join(f" - {k}:{v}" for k, v in critic.items() if v is not None)
        log = log.replace(_step_line(n), _step_line(n) + extra)
    return log


def test_estimator_gae_needs_the_critic_to_have_trained(tmp_path, capsys):
    """`--estimator gae`: every other check passes on the recorded run, which has no critic (GRPO: its
    `critic/score/...` are the reward's), and the critic check fails; with the critic's metrics at every
    step it passes."""
    assert run_acceptance(tmp_path, LOG, POOL, 0, 2, "--estimator", "gae") == 1
    out = capsys.readouterr().out
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert fails == [
        "FAIL  critic trained: per step: value loss [missing, missing], critic grad norm [missing, missing], "
        "explained variance [missing, missing]"
    ], out
    assert run_acceptance(tmp_path, _with_critic(LOG), POOL, 0, 2, "--estimator", "gae") == 0
    out = capsys.readouterr().out
    assert (
        "PASS  critic trained: per step: value loss [0.0123, 0.0123], critic grad norm [0.5, 0.5], "
        "explained variance [-0.25, -0.25]"
    ) in out, out
    assert out.rstrip().endswith("smoke run: accepted")
    # grpo (the default) does not look for a critic
    assert run_acceptance(tmp_path, LOG, POOL, 0, 2) == 0
    assert "critic trained" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("step", "key", "value"),
    [
        (2, acceptance.CRITIC_GRAD_NORM, "0.0"),
        (1, acceptance.CRITIC_LOSS, "nan"),
        (2, acceptance.CRITIC_LOSS, "np.float64(inf)"),
        (1, acceptance.CRITIC_LOSS, None),
        (2, acceptance.CRITIC_GRAD_NORM, None),
    ],
    ids=["no-update", "nan-loss", "inf-loss", "no-loss", "no-grad-norm"],
)
def test_a_critic_that_did_not_train_at_every_step_fails(tmp_path, capsys, step, key, value):
    log = _with_critic(LOG, step, key, value)
    assert run_acceptance(tmp_path, log, POOL, 0, 2, "--estimator", "gae") == 1
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("FAIL")] == [
        "FAIL  critic trained"
    ], out


def test_the_task_runner_is_trainer_entrys():
    from trainer_entry.runner import _ToolRLTaskRunner

    assert _ToolRLTaskRunner.__name__ == acceptance.TASK_RUNNER


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps must be at least 1"),
        (["--max-prob-diff", "2"], "--max-prob-diff must be in (0, 1]"),
        (["--estimator", "ppo"], "argument --estimator: invalid choice: 'ppo'"),
    ],
)
def test_acceptance_arguments_are_checked(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        run_acceptance(tmp_path, LOG, POOL, 0, 2, *argv) if argv[0] != "--steps" else run_acceptance(
            tmp_path, LOG, POOL, 0, 0
        )
    assert exited.value.code == 2 and message in capsys.readouterr().err


def run_sh(*args, env=None):
    return subprocess.run(
        ["bash", str(SMOKE / "run.sh"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "two"], "--steps must be a positive integer, got 'two'"),
        (["--port", "70000"], "--port must be a TCP port"),
        (["--protocol", "json"], "--protocol must be hermes, python-tags, tool-tags or react"),
        (
            ["--wheels", "/nonexistent"],
            "--wheels /nonexistent is not a directory (make it with fetch-wheels.sh)",
        ),
        (["--bogus"], "unknown argument '--bogus'"),
        (["--engine", "sglang"], "--engine must be vllm or hf, got 'sglang'"),
        (["--engine", "vllm"], "--cpu runs engine hf"),
        (["--warm-up-seconds", "0"], "--warm-up-seconds must be a positive integer, got '0'"),
        (["--estimator", "ppo"], "--estimator must be grpo or gae, got 'ppo'"),
        (["--estimator", "GAE"], "--estimator must be grpo or gae, got 'GAE'"),
    ],
)
def test_run_sh_refuses_bad_arguments(args, message):
    result = run_sh(*args, "--cpu", "--dry-run")
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_run_sh_dry_run_prints_the_job_it_would_run(tmp_path):
    result = run_sh("--cpu", "--dry-run", "--steps", "5", "--protocol", "react", "--work", str(tmp_path))
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    spec = job["spec"]
    assert spec["model"]["path"] == f"{tmp_path}/model"
    assert spec["data"]["trainFiles"] == [f"{tmp_path}/data/train.parquet"]
    assert spec["algorithm"]["totalTrainingSteps"] == 5
    assert (spec["rollout"]["protocol"], spec["rollout"]["engine"]) == ("react", "hf")
    assert spec["cluster"]["workers"]["gpusPerWorker"] == 0
    from trainer_entry.spec import parse_job

    parse_job(job)  # the trainer takes it as it is
    gpu = json.loads(run_sh("--dry-run", "--cpu", "--work", str(tmp_path)).stdout)["spec"]
    assert gpu["rollout"]["engine"] == "hf"
    template = json.loads((SMOKE / "job.json").read_text())["spec"]
    assert (template["rollout"]["engine"], template["cluster"]["workers"]["gpusPerWorker"]) == ("vllm", 1)


def test_run_sh_estimator_gae_gives_the_job_a_critic(tmp_path):
    """`--estimator gae` sets the job's advantage estimator; verl then trains a critic, a value model loaded
    from the job's model (translate.py), and the run's verdict checks it trained; grpo is the default."""
    result = run_sh("--cpu", "--dry-run", "--estimator", "gae", "--work", str(tmp_path))
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["spec"]["algorithm"]["advantageEstimator"] == "gae"
    from trainer_entry.spec import parse_job
    from trainer_entry.translate import translate

    overrides = translate(parse_job(job), "http://127.0.0.1:18080").overrides
    assert "algorithm.adv_estimator=gae" in overrides
    assert f"critic.model.path={tmp_path}/model" in overrides
    grpo = json.loads(run_sh("--cpu", "--dry-run", "--work", str(tmp_path)).stdout)
    assert grpo["spec"]["algorithm"]["advantageEstimator"] == "grpo"
    assert '--estimator "$estimator"' in (SMOKE / "run.sh").read_text(), "the verdict is told the estimator"


FAKE_GPU = """
import sys
class _NoVllm:  # this machine has vLLM's CPU build; the GPU machine of `--engine hf` has no vLLM at all
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "vllm":
            raise ImportError("no vllm here")
sys.meta_path.insert(0, _NoVllm())
import torch
torch.cuda.is_available = lambda: True
torch.cuda.get_device_name = lambda *args: "Fake GPU"
"""


def test_run_sh_engine_hf_on_a_gpu_needs_no_vllm(tmp_path):
    """`--engine hf` on a GPU: the machine check passes without vLLM, the job trains the actor on one GPU
    with the hf rollout server, and the trainer takes that job; the default engine still needs vLLM."""
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 580.159.04\n")
    smi.chmod(0o755)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(FAKE_GPU)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path / "site")}
    result = run_sh("--engine", "hf", "--dry-run", "--steps", "2", "--work", str(tmp_path / "w"), env=env)
    assert result.returncode == 0, result.stderr
    assert "on Fake GPU, verl 0.9.1, transformers" in result.stdout
    job = json.loads(result.stdout[result.stdout.index("\n{") + 1 :])
    spec = job["spec"]
    assert (spec["rollout"]["engine"], spec["cluster"]["workers"]["gpusPerWorker"]) == ("hf", 1)
    from trainer_entry.spec import parse_job
    from trainer_entry.translate import translate

    overrides = translate(parse_job(job), "http://127.0.0.1:18080").overrides
    assert "actor_rollout_ref.rollout.name=hf" in overrides
    assert "trainer.n_gpus_per_node=1" in overrides
    vllm = run_sh("--dry-run", "--work", str(tmp_path / "v"), env=env)
    assert vllm.returncode == 2 and "the GPU stack does not import" in vllm.stderr, vllm.stderr


def test_run_sh_engine_vllm_turns_vllms_statistics_on(tmp_path):
    """`--engine vllm` (the default) on a GPU: the job asks verl's vLLM server for vLLM's engine statistics,
    the log line acceptance.py's "vLLM served" reads; the hf engine's job does not."""
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 580.159.04\n")
    smi.chmod(0o755)
    (tmp_path / "site").mkdir()
    gpu_only = FAKE_GPU[FAKE_GPU.index("import torch") :]  # this machine's vLLM (its CPU build) imports
    (tmp_path / "site" / "sitecustomize.py").write_text(gpu_only)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(tmp_path / "site")}
    result = run_sh("--dry-run", "--work", str(tmp_path / "w"), env=env)
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout[result.stdout.index("\n{") + 1 :])
    assert job["spec"]["rollout"]["engine"] == "vllm"
    from trainer_entry.spec import parse_job
    from trainer_entry.translate import translate

    overrides = translate(parse_job(job), "http://127.0.0.1:18080").overrides
    assert "actor_rollout_ref.rollout.disable_log_stats=false" in overrides
    hf = json.loads(run_sh("--dry-run", "--cpu", "--work", str(tmp_path / "h")).stdout)
    assert "actor_rollout_ref.rollout.disable_log_stats=false" not in hf["spec"]["trainer"]["extraArgs"]


def test_the_torch_stack_is_what_only_torch_needs():
    packages = wheelset.parse((SMOKE / "requirements.txt").read_text())
    stack = wheelset.torch_stack(packages)
    assert {"torch", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"} <= stack
    assert not {"vllm", "verl", "transformers", "triton", "numpy"} & stack, "others need these too"
    kept = {p.name for p in wheelset.select(packages, without_torch=True, only=None)}
    assert kept == {p.name for p in packages} - stack
    with pytest.raises(wheelset.LockError, match="not in the lock: nonexistent"):
        wheelset.select(packages, without_torch=False, only=["nonexistent"])
    with pytest.raises(wheelset.LockError, match="not a hash-locked requirements file"):
        wheelset.parse("torch==2.11.0\n")


def test_fetched_files_install_offline(tmp_path):
    """fetch-wheels.sh then install-wheels.sh (pip --no-index), on a lock of a few small packages that
    holds one PyPI has no wheel of (antlr4-python3-runtime: its source is built offline). Needs PyPI."""
    lock = tmp_path / "lock.txt"
    names = [
        "setuptools",
        "hatchling",
        "packaging",
        "pathspec",
        "pluggy",
        "trove-classifiers",
        "idna",
        "antlr4-python3-runtime",
    ]
    packages = wheelset.select(wheelset.parse((SMOKE / "requirements.txt").read_text()), False, names)
    lock.write_text("".join(p.lines() for p in packages))
    root = tmp_path / "venv"
    venv.create(root, with_pip=True)
    env = {**os.environ, "SMOKE_LOCK": str(lock), "PYTHON": str(root / "bin" / "python")}
    wheels = tmp_path / "wheels"
    fetched = subprocess.run(
        ["bash", str(SMOKE / "fetch-wheels.sh"), str(wheels)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    assert fetched.returncode == 0, fetched.stderr
    assert "antlr4-python3-runtime has no wheel for CPython 3.12" in fetched.stdout
    assert len(list(wheels.glob("*.whl"))) == len(names) - 1 and list(wheels.glob("antlr4*.tar.gz"))
    installed = subprocess.run(
        ["bash", str(SMOKE / "install-wheels.sh"), str(wheels)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**env, "PIP_INDEX_URL": "http://127.0.0.1:9/"},
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    check = "import antlr4, idna, trainer_entry, tool_sandbox.sandbox._spawner"
    subprocess.run([str(root / "bin" / "python"), "-c", check], check=True, timeout=60)
